"""`/static/` served by daphne itself (the embedded console; SAFESTOP_SERVE_STATIC=1)."""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.http import Http404


class StaticFiles(ASGIStaticFilesHandler):
    """Django's handler, with one difference: a path no file can have — `..` past the static
    root (`SuspiciousFileOperation`), a NUL byte (`ValueError` from the file system) — is a 404
    like any missing file. Django's handler turns only `Http404` into an answer; anything else
    would be a 500."""

    def serve(self, request: Any) -> Any:
        try:
            return super().serve(request)
        except (SuspiciousOperation, ValueError) as exc:
            raise Http404("no such static file") from exc
