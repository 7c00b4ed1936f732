#!/bin/sh
# The checkpoint contract in plain busybox sh (no bash, no python), for a
# `FROM scratch` busybox image.   Usage: sh train.sh STEPS STEP_TIME
#
# Resumes from $LABQ_CHECKPOINT_DIR/step, and on the signal named in
# $LABQ_PREEMPT_SIGNAL (default SIGUSR1) writes the step atomically, touches
# $LABQ_CHECKPOINT_DIR/.labq-checkpoint and exits 0.

STEPS=${1:-100}
STEP_TIME=${2:-0.1}

DIR=$LABQ_CHECKPOINT_DIR
if [ -z "$DIR" ]; then  # outside labq: still runnable, nothing survives
    DIR=$(mktemp -d) || exit 1
    echo "LABQ_CHECKPOINT_DIR is not set; using $DIR" >&2
fi

SIG=${LABQ_PREEMPT_SIGNAL:-SIGUSR1}
SIG=${SIG#SIG}  # trap wants USR1, not SIGUSR1

# Resume if an earlier attempt left a checkpoint.
step=0
if [ -f "$DIR/step" ]; then
    read -r step < "$DIR/step"
    echo "attempt ${LABQ_ATTEMPT:-1}: resumed at step $step"
else
    echo "attempt ${LABQ_ATTEMPT:-1}: starting at step 0"
fi

# The trap only sets a flag; the loop saves between steps.
stop=0
trap 'stop=1' "$SIG"

while [ "$step" -lt "$STEPS" ]; do
    # sh runs a trap only after the foreground command ends, so sleep in the
    # background and `wait`: wait returns at once (non-zero) on the signal.
    sleep "$STEP_TIME" &
    pid=$!
    if wait "$pid"; then
        step=$((step + 1))
        [ $((step % 10)) -eq 0 ] && echo "step $step"
    elif [ "$stop" = 0 ]; then
        echo "sleep failed (bad STEP_TIME '$STEP_TIME'?)" >&2
        exit 1
    fi

    if [ "$stop" = 1 ]; then
        kill "$pid" 2>/dev/null  # drop the half-done step; it is not counted
        # Atomic save: write a temp file, flush it to disk, rename over the old one.
        echo "$step" > "$DIR/step.tmp" && sync "$DIR/step.tmp" && mv "$DIR/step.tmp" "$DIR/step" || exit 1
        touch "$DIR/.labq-checkpoint"  # tell labq a checkpoint completed (now)
        echo "checkpointed at step $step"
        exit 0
    fi
done

echo "done: $STEPS steps"
