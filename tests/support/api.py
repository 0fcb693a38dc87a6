"""The API tests' helpers: a JSON client that speaks the wire contract, paths, and a stop."""

from __future__ import annotations

import json
import time
from typing import Any

from django.test import Client

from api.ratelimit import WINDOW_SECONDS
from runs import services
from runs.actors import Actor
from runs.models import Lease, Run


class Api:
    """`api.post(path, body, token)`; `token` is an IssuedToken (or None for the session)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _headers(self, token: Any) -> dict[str, str]:
        return token.header if token is not None else {}

    def get(self, path: str, token: Any = None, **params: Any) -> Any:
        return self.client.get(path, params, **self._headers(token))

    def post(
        self,
        path: str,
        body: Any = None,
        token: Any = None,
        *,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
    ) -> Any:
        data = raw if raw is not None else json.dumps({} if body is None else body)
        return self.client.post(path, data=data, content_type=content_type, **self._headers(token))


def url(run: Run | str, suffix: str = "") -> str:
    run_id = run if isinstance(run, str) else run.pk
    return f"/api/v1/runs/{run_id}/{suffix}"


def stop(run: Run, reason: str = "user_stop") -> Any:
    return services.run_stop(run_id=run.pk, reason=reason, actor=Actor.system("test"))


def lease_body(lease: Lease, **extra: Any) -> dict[str, Any]:
    return {"lease_id": lease.token, "epoch": lease.epoch, **extra}


def with_time_left_in_the_window(needed: float = 20.0) -> None:
    """Per-address and per-caller budgets count per clock minute (`api.ratelimit`): a test
    that spends a budget and then expects the refusal must not straddle a window's end, or the
    budget starts over midway and the refusal never comes. When fewer than `needed` seconds are
    left in this window, wait for the next one. (A live server is another process: its clock
    cannot be frozen from the test.)"""
    left = WINDOW_SECONDS - time.time() % WINDOW_SECONDS
    if left < needed:
        time.sleep(left + 0.2)
