"""`SafestopClient`: the wire client plus `lease()`, the way into a worker's `AgentRun`.

The HTTP methods live in `wire.WireClient` and the worker in `worker.AgentRun`,
which builds on the wire client; this module sits on top of both, so no module
imports one that imports it back.
"""

from __future__ import annotations

from .wire import WireClient
from .worker import AgentRun


class SafestopClient(WireClient):
    """Talks to one safestop server with one bearer token; see `WireClient` for the endpoints.

    The underlying `httpx.Client` is shared by the worker's heartbeat thread and
    the agent's own thread; httpx's connection pool is safe for that.
    """

    def lease(
        self,
        run_id: str,
        worker_id: str,
        *,
        ttl_seconds: float = 30,
        push: bool = True,
    ) -> AgentRun:
        """`with client.lease(run_id, worker_id) as run:` — see `AgentRun`."""
        return AgentRun(self, run_id, worker_id, ttl_seconds=ttl_seconds, push=push)
