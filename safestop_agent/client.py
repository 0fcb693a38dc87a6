"""`SafestopClient`: the wire client plus `lease()`, the way into a worker's `AgentRun`.

The HTTP methods live in `wire.WireClient` and the worker in `worker.AgentRun`,
which builds on the wire client; this module sits on top of both, so no module
imports one that imports it back.
"""

from __future__ import annotations

from .wire import WireClient
from .worker import APPROVAL_POLL_SECONDS, AgentRun


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
        heartbeat_interval: float | None = None,
        approval_poll_interval: float = APPROVAL_POLL_SECONDS,
    ) -> AgentRun:
        """`with client.lease(run_id, worker_id) as run:` — see `AgentRun`.

        `heartbeat_interval` (seconds, default a third of `ttl_seconds`) is how
        often the lease is renewed and a stop is asked for when no push comes;
        `approval_poll_interval` how often a call waiting for a reviewer asks for
        the decision in case its push was missed.
        """
        return AgentRun(
            self,
            run_id,
            worker_id,
            ttl_seconds=ttl_seconds,
            push=push,
            heartbeat_interval=heartbeat_interval,
            approval_poll_interval=approval_poll_interval,
        )
