"""A training-style loop that follows labq's checkpoint contract (stdlib only).

labq gives every job LABQ_CHECKPOINT_DIR (the same folder in every attempt) and,
to preempt it, sends the signal named in LABQ_PREEMPT_SIGNAL (default SIGUSR1),
waits the grace period, then SIGTERM, then SIGKILL. This script:
  * resumes from $LABQ_CHECKPOINT_DIR/state.json when it exists,
  * saves atomically (temp file, fsync, os.replace) so a kill never tears it,
  * touches $LABQ_CHECKPOINT_DIR/.labq-checkpoint after every completed save,
  * on the signal only sets a flag; the loop checks it between steps, saves, exits 0.
Replace `time.sleep(args.step_time)` with one real step of your own work.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=100, help="total steps (default 100)")
parser.add_argument("--step-time", type=float, default=0.1, help="seconds per step (default 0.1)")
parser.add_argument("--save-every", type=float, default=0,
                    help="seconds between periodic checkpoints (default 0: only on the signal)")
parser.add_argument("--no-save-on-signal", action="store_true",
                    help="on the signal, stop at once without saving (only periodic saves count)")
args = parser.parse_args()

ckpt_dir = os.environ.get("LABQ_CHECKPOINT_DIR")
if not ckpt_dir:  # outside labq: still runnable, but nothing survives this run
    ckpt_dir = tempfile.mkdtemp(prefix="labq-ckpt-")
    print(f"LABQ_CHECKPOINT_DIR is not set; using {ckpt_dir}", file=sys.stderr, flush=True)
state_path = os.path.join(ckpt_dir, "state.json")
marker_path = os.path.join(ckpt_dir, ".labq-checkpoint")
attempt = os.environ.get("LABQ_ATTEMPT", "1")


def save(step):
    """Write the state atomically, then tell labq a checkpoint completed."""
    tmp = state_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "saved_at": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())          # the bytes are on disk before the rename
    os.replace(tmp, state_path)       # atomic: readers see the old or the new file, never half
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)              # make the rename itself durable
    finally:
        os.close(dir_fd)
    with open(marker_path, "a"):      # create the marker if missing...
        pass
    os.utime(marker_path)             # ...and set its mtime to now: labq reads this time


# Resume if an earlier attempt left a checkpoint.
step = 0
if os.path.exists(state_path):
    with open(state_path) as f:
        step = json.load(f)["step"]
    print(f"attempt {attempt}: resumed at step {step}", flush=True)
else:
    print(f"attempt {attempt}: starting at step 0", flush=True)

# The handler only sets a flag: saving inside a signal handler could interrupt
# a save already in progress, or any other half-done work.
stop_requested = False


def on_preempt(signum, frame):
    global stop_requested
    stop_requested = True


sig_name = os.environ.get("LABQ_PREEMPT_SIGNAL") or "SIGUSR1"
sig_name = sig_name.upper() if sig_name.upper().startswith("SIG") else "SIG" + sig_name.upper()
signal.signal(getattr(signal, sig_name), on_preempt)

last_save = last_log = time.monotonic()
while step < args.steps:
    if stop_requested:  # checked between steps, never mid-step
        if args.no_save_on_signal:
            print(f"stopping at step {step} without saving", flush=True)
        else:
            save(step)
            print(f"checkpointed at step {step}", flush=True)
        sys.exit(0)

    time.sleep(args.step_time)  # <- one step of real work goes here
    step += 1

    now = time.monotonic()
    if now - last_log >= 1.0:  # about one log line a second keeps logs small
        print(f"step {step}", flush=True)
        last_log = now
    if args.save_every > 0 and now - last_save >= args.save_every:
        save(step)
        print(f"periodic checkpoint at step {step}", flush=True)
        last_save = now

print(f"done: {args.steps} steps", flush=True)
