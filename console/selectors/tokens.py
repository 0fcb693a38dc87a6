"""The API tokens page."""

from __future__ import annotations

from runs.models import (
    ApiToken,
    Team,
)


def api_tokens_of(*, teams: list[Team]) -> list[ApiToken]:
    """The teams' tokens (revoked ones too), by team and name."""
    return list(
        ApiToken.objects.select_related("team")
        .filter(team__in=teams)
        .order_by("team__slug", "name")
    )


def api_token_get(*, token_id: int, teams: list[Team]) -> ApiToken | None:
    """One token, if it belongs to one of `teams`."""
    return ApiToken.objects.filter(pk=token_id, team__in=teams).first()
