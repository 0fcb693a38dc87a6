"""Browser websocket routes: session auth + Origin check on every pattern."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator


def browser_only(app: Any) -> Any:
    return AllowedHostsOriginValidator(AuthMiddlewareStack(app))


websocket_urlpatterns: list[Any] = []
