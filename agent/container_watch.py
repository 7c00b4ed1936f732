"""The watchdog of one container: it stops the container once its agent has lost the leader.

Process jobs have a shim that fences them; a container has no such parent, so
the Docker runtime starts one of these beside each container, detached in its
own session. It outlives the agent, reads the agent's heartbeat file, and when
the heartbeat is older than ``fence_after`` it asks the job to checkpoint (its
signal), waits the grace, stops the container, and leaves a marker so the exit
is reported as fenced. It exits when the container does.

    python -m labq.agent.container_watch ROOT NAME FENCE_AFTER_S SIGNAL GRACE_S [CHECKPOINT_DIR]

SIGNAL is empty when the job declared none at launch: then the one it names in
its checkpoint marker by the time of the fence, else TERM.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

WATCH_EVERY_S = 1.0


def main(argv: list[str]) -> int:
    import docker
    import docker.errors

    from labq.agent.stops import marker_signal

    root, name = Path(argv[1]), argv[2]
    fence_after, signal_name, grace = float(argv[3]), argv[4], float(argv[5])
    checkpoint_dir = argv[6] if len(argv) > 6 and argv[6] else None
    client = docker.from_env()
    heartbeat = root / "heartbeat"
    while True:
        try:
            container = client.containers.get(name)
        except docker.errors.NotFound:
            return 0
        if container.status not in ("running", "created", "restarting"):
            return 0
        try:
            age = time.time() - heartbeat.stat().st_mtime
        except OSError:
            age = None
        if age is not None and age > fence_after:
            (root / "fenced").mkdir(exist_ok=True)
            (root / "fenced" / name).touch()
            try:
                container.kill(signal=signal_name or marker_signal(checkpoint_dir) or "SIGTERM")
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline:
                    container.reload()
                    if container.status != "running":
                        return 0
                    time.sleep(0.2)
                container.stop(timeout=10)
            except docker.errors.APIError:
                pass  # gone meanwhile
            return 0
        time.sleep(WATCH_EVERY_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
