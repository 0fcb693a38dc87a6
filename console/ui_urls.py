from __future__ import annotations

from typing import Any

app_name = "console"
urlpatterns: list[Any] = []
