"""A cooperating `safestop_agent` worker, in its own process, driven over stdin/stdout.

For each `{"op": "lease", "run_id": ...}` line it leases the run with `AgentRun` (heartbeat
and websocket push listener, exactly as an agent runtime would), waits until the push socket
is open, answers `{"ready": run_id}`, then "works" in quanta of `--quantum` seconds, checking
its cancel token at every boundary between quanta (the safe boundary). When the stop arrives
it leaves the `with` block, which closes the listeners and reports `drained`, and answers:

    {"run_id", "signal_at", "noticed_at", "drained_sent_at", "drained_at", ...}
                                                  (time.monotonic() of this machine)

`signal_at` is taken inside `CancelToken.cancel`, the moment the pushed frame (or a heartbeat)
set the token. CLOCK_MONOTONIC is system-wide on Linux, so the orchestrator compares these with
its own monotonic clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import emit  # noqa: E402
from safestop_agent import CancelToken, SafestopClient  # noqa: E402
from safestop_agent.worker import AgentRun  # noqa: E402


class TimedToken(CancelToken):
    """Remembers when it was set, and by which path."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled_at: float | None = None

    def cancel(
        self,
        reason: str = "cancelled",
        stop_epoch: int | None = None,
        requested_by: str | None = None,
    ) -> bool:
        now = time.monotonic()
        applied = super().cancel(reason, stop_epoch, requested_by)
        if applied:
            self.cancelled_at = now
        return applied


def serve_one(
    client: SafestopClient, run_id: str, *, quantum: float, worker_id: str
) -> dict[str, Any]:
    token = TimedToken()
    # A long TTL keeps the heartbeat (ttl/3) out of the way: the push is what is measured.
    run = AgentRun(client, run_id, worker_id, ttl_seconds=120, token=token)
    phases: dict[str, float] = {}

    with run:
        listener = run._listener  # noqa: SLF001  (the bench waits for the socket, as tests do)
        connected = listener is not None and listener.connected.wait(10)
        # When the block's exit sends `drained`, and when its answer (`stopped_cleanly`) came.
        drained = run.client.drained

        def drained_timed(*args: Any, **kwargs: Any) -> Any:
            phases["drained_sent_at"] = time.monotonic()
            try:
                return drained(*args, **kwargs)
            finally:
                phases["drained_answered_at"] = time.monotonic()

        run.client.drained = drained_timed  # type: ignore[method-assign]
        emit({"ready": run_id, "push_connected": bool(connected)})
        while not token.cancelled:
            time.sleep(quantum)  # one unit of work; the token is checked between units
        noticed_at = time.monotonic()
    left_at = time.monotonic()
    run.client.drained = drained  # type: ignore[method-assign]
    return {
        "run_id": run_id,
        "signal_at": token.cancelled_at,
        "noticed_at": noticed_at,
        # The drained answer (the server's `stopped_cleanly`), not the block's end: the block
        # closes its listeners after it.
        "drained_at": phases.pop("drained_answered_at", left_at),
        "left_at": left_at,
        "reason": token.reason,
        **phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--quantum", type=float, default=0.005)
    parser.add_argument("--worker-id", default="bench-worker")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with SafestopClient(args.url, args.token) as client:
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("op") == "quit":
                break
            try:
                emit(
                    serve_one(
                        client, command["run_id"], quantum=args.quantum, worker_id=args.worker_id
                    )
                )
            except Exception as error:  # report, do not die: the orchestrator decides
                emit({"run_id": command.get("run_id"), "error": repr(error)})


if __name__ == "__main__":
    main()
