"""Path converters of the console's URLs."""

from __future__ import annotations

from django.urls import register_converter


class RunIdConverter:
    """What a run id can be (`run_` + hex today; the API's `plausible_run_id` rule: ASCII
    letters, digits, `_` and `-`, at most 32). Anything else is a 404 before a query runs: a NUL
    byte in a path segment would make PostgreSQL raise instead of answering "no such run"."""

    regex = r"[A-Za-z0-9_-]{1,32}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


# Registered once, here: both the pages (`console.ui_urls`) and the browser websockets
# (`console.routing`) name runs as `<run_id:run_id>`.
register_converter(RunIdConverter, "run_id")
