"""API tokens: made once, shown once, stored as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.errors import InvalidInput
from runs.ledger import ledger_append
from runs.models import ApiToken, Team, TokenRole

TOKEN_PREFIX = "ss_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def team_ensure(*, slug: str, name: str = "") -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return team


def api_token_create(
    *, team_slug: str, name: str, role: str, actor: Actor | None = None
) -> tuple[ApiToken, str]:
    """Create a token (and its team if needed); return it with the raw secret, the only copy."""
    if role not in TokenRole.values:
        raise InvalidInput(f"role must be one of {', '.join(TokenRole.values)}", field="role")
    if not name.strip():
        raise InvalidInput("name is required", field="name")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        team = team_ensure(slug=team_slug)
        if ApiToken.objects.filter(team=team, name=name).exists():
            raise InvalidInput(f"team {team_slug} already has a token named {name!r}", field="name")
        token = ApiToken.objects.create(
            team=team, name=name, role=role, prefix=raw[:10], token_hash=hash_token(raw)
        )
        ledger_append(
            run=None,
            actor=actor or Actor.system("create_api_token"),
            action="token.created",
            team_slug=team.slug,
            payload={"token": name, "role": role, "prefix": token.prefix},
        )
    return token, raw


def api_token_authenticate(raw: str) -> ApiToken | None:
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = (
        ApiToken.objects.select_related("team")
        .filter(token_hash=hash_token(raw), revoked_at__isnull=True)
        .first()
    )
    if token is not None:
        now = timezone.now()
        # Throttled write: last_used_at within a minute is good enough and saves a write per call.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
    return token


def api_token_revoke(*, token_id: int, actor: Actor) -> ApiToken:
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().select_related("team").get(pk=token_id)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            notify.token_revoked(token)
            ledger_append(
                run=None,
                actor=actor,
                action="token.revoked",
                team_slug=token.team.slug,
                payload={"token": token.name},
            )
    return token
