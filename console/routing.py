"""Browser websocket routes: session auth + Origin check on every pattern, and under daphne a
direct frame writer per socket (console/wire.py)."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

import console.converters  # noqa: F401  (registers <run_id:...>)
from console.consumers import RunConsumer, TeamRunsConsumer
from console.wire import with_wire


def browser_only(app: Any) -> Any:
    # `with_wire` outermost: it must see the ASGI `send` daphne made, before the session
    # middleware wraps it (console/wire.py).
    return with_wire(AllowedHostsOriginValidator(AuthMiddlewareStack(app)))


websocket_urlpatterns: list[Any] = [
    path("ws/runs/", browser_only(TeamRunsConsumer.as_asgi())),
    path("ws/runs/<run_id:run_id>/", browser_only(RunConsumer.as_asgi())),
]
