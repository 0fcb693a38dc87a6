"""The production ASGI application plus a commit clock, for daphne B of the cross-process stop.

A stop taken by daphne B commits inside B, where the bench's own CommitClock cannot see it. This
module serves `console.asgi.application` unchanged and subscribes one `runs.notify` listener
ahead of the Channels publisher, as bench/hooks.py does in the bench process: it appends
`{"run_id", "kind", "at": time.monotonic()}` for each stop signal to the JSON-lines file named
by BENCH_COMMIT_LOG (one small write per stop; CLOCK_MONOTONIC is system-wide on Linux, so the
bench compares it with the worker's signal time).

    daphne --proxy-headers bench.asgi_clocked:application
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from console import realtime
from console.asgi import application
from runs import notify

_log = open(os.environ["BENCH_COMMIT_LOG"], "a", buffering=1)  # noqa: SIM115  (process-long)


def _stamp(event: dict[str, Any]) -> None:
    if event.get("kind") == "stop_signal":
        _log.write(
            json.dumps({"run_id": event["run_id"], "kind": event["kind"], "at": time.monotonic()})
            + "\n"
        )


notify.unsubscribe(realtime.publish)
notify.subscribe(_stamp)
notify.subscribe(realtime.publish)

__all__ = ["application"]
