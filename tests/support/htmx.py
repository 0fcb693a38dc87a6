"""Request headers of htmx: what the console's partial answers key on."""

from __future__ import annotations

HTMX = {"HTTP_HX_REQUEST": "true"}


def htmx(target: str = "") -> dict[str, str]:
    """Headers of an htmx request (optionally aimed at an element id)."""
    return {**HTMX, **({"HTTP_HX_TARGET": target} if target else {})}
