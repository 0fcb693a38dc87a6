"""Adapters for agent frameworks, each an optional extra of `safestop-agent`.

- `safestop_agent.integrations.langgraph` (`safestop-agent[langgraph]`): a compiled
  LangGraph graph under a safestop lease.
- `safestop_agent.integrations.openai_agents` (`safestop-agent[openai-agents]`): OpenAI
  Agents SDK function tools and run hooks.

Each module imports its framework at the top, so importing it without the extra
installed fails at once with the package name to install; `safestop_agent` itself
never imports them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_OFFLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("safestop_offline", default=False)


@contextmanager
def offline() -> Iterator[None]:
    """Run guarded tools outside a run, for tests and scripts: no permit, nothing reported.

        with offline():
            assert lookup("A-1") == "order A-1: shipped"

    Without it, a guarded tool called outside a run raises `RuntimeError` (it
    must never run unguarded by accident). Threads and tasks started inside the
    block inherit it.
    """
    token = _OFFLINE.set(True)
    try:
        yield
    finally:
        _OFFLINE.reset(token)


def is_offline() -> bool:
    """True inside `offline()`."""
    return _OFFLINE.get()


__all__ = ["is_offline", "offline"]
