"""Clocks on the commit of a run change, through `runs.notify`'s public subscribe API.

`runs.notify` calls its listeners in order, from `transaction.on_commit`. We put one listener
*before* the Channels publisher (`console.realtime.publish`) — its time is the commit — and one
after it, so `published - committed` is what the publisher cost the committing thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from console import realtime
from runs import notify


class CommitClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (run_id, kind) -> list of (seq, committed_at, published_at)
        self.marks: dict[tuple[str, str], list[list[Any]]] = {}

    def _first(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.marks.setdefault((event["run_id"], event["kind"]), []).append(
                [event.get("seq"), time.monotonic(), None]
            )

    def _last(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            entries = self.marks.get((event["run_id"], event["kind"]))
            if entries:
                entries[-1][2] = now

    def install(self) -> CommitClock:
        notify.unsubscribe(realtime.publish)
        notify.subscribe(self._first)
        notify.subscribe(realtime.publish)
        notify.subscribe(self._last)
        return self

    def uninstall(self) -> None:
        notify.unsubscribe(self._first)
        notify.unsubscribe(self._last)

    def committed(self, run_id: str, kind: str) -> float | None:
        entries = self.marks.get((run_id, kind))
        return entries[-1][1] if entries else None

    def published(self, run_id: str, kind: str) -> float | None:
        entries = self.marks.get((run_id, kind))
        return entries[-1][2] if entries else None

    def by_seq(self, run_id: str) -> dict[int, float]:
        """seq -> commit time, for every change of one run."""
        out: dict[int, float] = {}
        with self._lock:
            for (rid, _kind), entries in self.marks.items():
                if rid == run_id:
                    for seq, committed, _published in entries:
                        out[int(seq)] = committed
        return out

    def clear(self) -> None:
        with self._lock:
            self.marks.clear()
