from __future__ import annotations

from typing import Any

app_name = "api"
urlpatterns: list[Any] = []
