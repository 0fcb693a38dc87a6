"""Under ASGI the middleware chain runs in one worker thread (console.middleware.SyncMiddlewareChain).

Without it, every `MiddlewareMixin` middleware in async mode hops to a thread for
`process_request` and again for `process_response` (docs/BENCHMARKS.md, the HTTP floor).
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref import sync
from django.conf import settings
from django.test import AsyncClient


def _thread_hops(monkeypatch: pytest.MonkeyPatch, middleware: list[str]) -> tuple[int, int]:
    created = []
    original = sync.SyncToAsync.__init__

    def counting(self, func, *args, **kwargs):  # type: ignore[no-untyped-def]
        created.append(getattr(func, "__qualname__", repr(func)))
        original(self, func, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__init__", counting)

    async def one_request() -> int:
        response = await AsyncClient().get("/api/v1/no-such-endpoint/")
        return response.status_code

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "MIDDLEWARE", middleware)
        status = asyncio.run(one_request())
    return status, len(created)


@pytest.mark.django_db
def test_the_middleware_chain_costs_a_few_thread_hops_not_two_per_middleware(monkeypatch):
    assert settings.MIDDLEWARE[-1] == "console.middleware.SyncMiddlewareChain"
    status, with_chain = _thread_hops(monkeypatch, list(settings.MIDDLEWARE))
    assert status == 404
    _, without_chain = _thread_hops(monkeypatch, list(settings.MIDDLEWARE[:-1]))
    # 6 with it (request signals, the chain, the view); 17 without
    assert with_chain <= 6 and without_chain >= 2 * with_chain, (with_chain, without_chain)
