"""A Celery worker with tracemalloc on, for `SOAK_CELERY=1 SOAK_TRACEMALLOC=1 bench/soak.py`.

    python bench/soak_worker.py <snapshot dir> <seconds between snapshots> <celery worker args...>

Starts tracing before Celery, Django and the project are imported (so their allocations are
traced too), then runs `celery -A console worker ...` in this process. A daemon thread writes a
snapshot (`tracemalloc.Snapshot.dump`) every interval; the soak compares the first one taken
after warm-up with the last and prints where the memory that stayed was allocated. Tracing
costs memory and time of its own, so the RSS figures in docs/BENCHMARKS.md come from runs without it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 15


def _snapshots(directory: Path, every: float) -> None:
    started = time.monotonic()
    while True:
        time.sleep(every)
        elapsed = int(time.monotonic() - started)
        path = directory / f"snapshot-{elapsed:06d}.tracemalloc"
        # Renamed into place: a worker stopped mid-dump leaves no half-written snapshot.
        tracemalloc.take_snapshot().dump(str(path) + ".part")
        os.replace(str(path) + ".part", path)


def main() -> None:
    directory, every, celery_args = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    directory.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    threading.Thread(target=_snapshots, args=(directory, every), daemon=True).start()
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *celery_args]
    celery_main()


if __name__ == "__main__":
    main()
