"""The sign-in settings, read when asked (never at import), so a test or a live server that
overrides them sees its own values."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from runs.models import Role


def sso_enabled() -> bool:
    return bool(issuer() and client_id())


def issuer() -> str:
    return str(getattr(settings, "SAFESTOP_OIDC_ISSUER", "") or "").rstrip("/")


def client_id() -> str:
    return str(getattr(settings, "SAFESTOP_OIDC_CLIENT_ID", "") or "")


def client_secret() -> str:
    return str(getattr(settings, "SAFESTOP_OIDC_CLIENT_SECRET", "") or "")


def groups_claim() -> str:
    return str(getattr(settings, "SAFESTOP_OIDC_GROUPS_CLAIM", "") or "groups")


def provider_name() -> str:
    """What the sign-in button says: `SAFESTOP_OIDC_PROVIDER_NAME`, else the issuer's host."""
    name = str(getattr(settings, "SAFESTOP_OIDC_PROVIDER_NAME", "") or "")
    return name or urlsplit(issuer()).hostname or issuer()


def password_login_for_everyone() -> bool:
    """`SAFESTOP_PASSWORD_LOGIN=off` leaves password sign-in to superusers (break glass)."""
    return bool(getattr(settings, "SAFESTOP_PASSWORD_LOGIN", True))


def scim_token() -> str:
    return str(getattr(settings, "SAFESTOP_SCIM_TOKEN", "") or "")


@dataclass(frozen=True)
class SeedRow:
    group: str
    team_slug: str
    role: str


def parse_group_roles(raw: str) -> list[SeedRow]:
    """`SAFESTOP_OIDC_GROUP_ROLES`: a JSON object, IdP group → "team:role". Raises ValueError
    with a message an operator can act on."""
    if not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"SAFESTOP_OIDC_GROUP_ROLES is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError('SAFESTOP_OIDC_GROUP_ROLES must be a JSON object {"group": "team:role"}')
    rows = []
    for group, target in value.items():
        if not isinstance(target, str) or target.count(":") != 1:
            raise ValueError(
                f'SAFESTOP_OIDC_GROUP_ROLES[{group!r}] must be "team:role", not {target!r}'
            )
        team_slug, role = (part.strip() for part in target.split(":"))
        if role not in Role.values or not team_slug or not group.strip():
            raise ValueError(
                f"SAFESTOP_OIDC_GROUP_ROLES[{group!r}]: role must be one of "
                f"{', '.join(Role.values)} and the team and group must not be empty"
            )
        rows.append(SeedRow(group=group.strip(), team_slug=team_slug, role=role))
    return rows


def group_roles_seed_rows() -> list[SeedRow]:
    return parse_group_roles(str(getattr(settings, "SAFESTOP_OIDC_GROUP_ROLES", "") or ""))
