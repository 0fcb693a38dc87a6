"""HTTP middleware of our own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse


class SyncMiddlewareChain:
    """Innermost middleware, sync only: it makes Django run the whole middleware chain in one
    thread under ASGI.

    Under ASGI Django runs an async-capable middleware (every `MiddlewareMixin` one) in async
    mode, and each of those hops to a worker thread for its `process_request` and again for its
    `process_response`: about a dozen thread hops per request with our stack, most of the cost
    of a request that does nothing (docs/BENCHMARKS.md, the HTTP floor). Django keeps every
    middleware outside a sync-only one in sync mode, so with this one last the chain costs one
    hop in, one back to the loop for the URL resolver, and one to the (sync) view.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)
