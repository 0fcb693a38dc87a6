"""safestop_agent: what an agent runtime needs to be stoppable (DESIGN §9).

- `SafestopClient` speaks the wire contract; `client.lease(...)` gives an `AgentRun`.
- `AgentRun` holds the lease, listens for stops (websocket push + heartbeat),
  and guards tool calls (`run.tool_call(...)`): permit before, outcome after.
- A tool call a reviewer must approve first (DESIGN §10) waits inside
  `run.tool_call(...)`; a rejection raises `ApprovalRejected` with the message.
- `CancelToken` / `Cancelled`: cooperative cancellation; `retry` waits on it.
- `collect_tool_calls` never lets half a streamed tool call run.
- `run_process` stops a whole process tree and never hangs on a held pipe.

This package never imports Django: it runs inside agent processes. It is its
own distribution, `safestop-agent` (agent/pyproject.toml), needing only httpx
and websockets; `__version__` is the wire contract's version (`_version.py`).
"""

from __future__ import annotations

from ._version import __version__
from .approvals import ApprovalDecision
from .cancel import Cancelled, CancelRequest, CancelToken
from .client import SafestopClient
from .errors import ApiError, ApprovalRejected, ClientTooOld, NoPermit, Refused, ToolCallConflict
from .process import ProcessResult, run_process
from .retry import is_transient, retry
from .stream import (
    CompleteToolCall,
    DiscardedToolCall,
    StreamOutcome,
    ToolCallAccumulator,
    collect_tool_calls,
)
from .worker import AgentRun, ToolCall

__all__ = [
    "__version__",
    "AgentRun",
    "ApiError",
    "ApprovalDecision",
    "ApprovalRejected",
    "CancelRequest",
    "CancelToken",
    "Cancelled",
    "ClientTooOld",
    "CompleteToolCall",
    "DiscardedToolCall",
    "NoPermit",
    "ProcessResult",
    "Refused",
    "SafestopClient",
    "StreamOutcome",
    "ToolCall",
    "ToolCallAccumulator",
    "ToolCallConflict",
    "collect_tool_calls",
    "is_transient",
    "retry",
    "run_process",
]
