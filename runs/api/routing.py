"""Agent websocket routes (token-authorised). Filled by the API layer."""

from __future__ import annotations

from typing import Any

agent_websocket_urlpatterns: list[Any] = []
