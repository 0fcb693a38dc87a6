"""Agent websocket routes: token-authorised per run, no Origin check (agents are not browsers)."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from api.consumers import AgentRunConsumer

agent_websocket_urlpatterns: list[Any] = [
    re_path(r"^ws/agent/runs/(?P<run_id>[^/]+)/$", AgentRunConsumer.as_asgi()),
]
