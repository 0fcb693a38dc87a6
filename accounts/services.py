"""Every write of the sign-in domain: identity links, the group → team-role table and its
application at sign-in, and deprovisioning (DESIGN §16).

The console's views, the OIDC backend, the SCIM endpoint, the Django admin and the start-up seed
all call these functions; none of them write the models themselves.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts import conf
from accounts.models import (
    GroupRole,
    GroupRoleSource,
    IdentityLink,
    SignedInSession,
    UserSettings,
)
from handoff.models import Handoff
from handoff.services import OPEN_HANDOFF, handoff_assign
from runs.access import ROLE_CAPABILITIES
from runs.actors import Actor
from runs.errors import DomainError
from runs.ledger import ledger_append
from runs.models import ActorKind, ApiToken, LedgerEntry, Membership, Team, TokenRole
from runs.tokens import api_token_revoke, team_ensure

logger = logging.getLogger("safestop.sso")

SSO_ACTOR = Actor.system("sso")


class SignInRefused(Exception):
    """The IdP vouched for the person, but safestop will not let them in. `code` is stable (it
    is logged and chooses the page's text); `detail` is for the log."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


# --------------------------------------------------------------------------------------------
# the group → team-role table


@dataclass
class SeedResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def group_roles_seed() -> SeedResult:
    """Make the rows `SAFESTOP_OIDC_GROUP_ROLES` names exist (at start, and before a sign-in
    in a process that has not seeded yet). Rows an admin made or changed are never touched:
    the table is the admins'; the setting only seeds it. Rows the setting made and no longer
    names are removed, so taking a group out of the setting takes its role away."""
    rows = conf.group_roles_seed_rows()
    result = SeedResult()
    with transaction.atomic():
        wanted: set[tuple[str, int]] = set()
        for row in rows:
            team = team_ensure(slug=row.team_slug)
            wanted.add((row.group, team.pk))
            existing = GroupRole.objects.filter(group=row.group, team=team).first()
            label = f"{row.group} → {team.slug}:{row.role}"
            if existing is None:
                GroupRole.objects.create(
                    group=row.group, team=team, role=row.role, source=GroupRoleSource.SETTINGS
                )
                result.created.append(label)
            elif existing.source == GroupRoleSource.SETTINGS and existing.role != row.role:
                existing.role = row.role
                existing.save(update_fields=["role"])
                result.updated.append(label)
        for stale in GroupRole.objects.filter(source=GroupRoleSource.SETTINGS).select_related(
            "team"
        ):
            if (stale.group, stale.team_id) not in wanted:
                result.removed.append(str(stale))
                stale.delete()
    if result.created or result.updated or result.removed:
        logger.info(
            "sso.group_roles_seeded created=%d updated=%d removed=%d",
            len(result.created),
            len(result.updated),
            len(result.removed),
        )
    return result


_seeded_in_this_process = False


def group_roles_seed_once() -> None:
    """The seed, once per process: a web process started without `manage.py serve` (daphne
    behind a proxy) still applies the setting before its first sign-in."""
    global _seeded_in_this_process
    if not _seeded_in_this_process:
        group_roles_seed()
        _seeded_in_this_process = True


def _highest(roles: list[str]) -> str:
    # The roles' capabilities are nested (runs.access), so the one granting most is the highest.
    return max(roles, key=lambda role: len(ROLE_CAPABILITIES[role]))


@dataclass(frozen=True)
class RoleChange:
    team: str
    previous: str | None
    role: str | None


def _wanted_roles(groups: list[str]) -> tuple[dict[int, str], set[int], list[str]]:
    """(team id → role the groups give, every team a mapping names, the groups that matched)."""
    by_team: dict[int, list[str]] = {}
    mapped_teams: set[int] = set()
    matched: set[str] = set()
    member_of = set(groups)
    for group, team_id, role in GroupRole.objects.values_list("group", "team_id", "role"):
        mapped_teams.add(team_id)
        if group in member_of:
            matched.add(group)
            by_team.setdefault(team_id, []).append(role)
    return (
        {team_id: _highest(roles) for team_id, roles in by_team.items()},
        mapped_teams,
        sorted(matched),
    )


def roles_apply(*, user: Any, groups: list[str], actor: Actor = SSO_ACTOR) -> list[RoleChange]:
    """Give `user` exactly the roles their IdP groups map to, on the teams the table names.

    Memberships on teams no mapping names are left alone (an admin made them by hand). Each
    change is one ledger entry (`membership.changed`, with the previous and the new role; a
    role of null is a removal), written in the same transaction as the change.
    """
    changes: list[RoleChange] = []
    with transaction.atomic():
        wanted, mapped_teams, matched = _wanted_roles(groups)
        current = {
            membership.team_id: membership
            for membership in Membership.objects.select_for_update()
            .filter(user=user, team_id__in=mapped_teams)
            .select_related("team")
        }
        slugs = dict(Team.objects.filter(pk__in=mapped_teams).values_list("pk", "slug"))
        for team_id in sorted(mapped_teams):
            membership = current.get(team_id)
            previous = membership.role if membership is not None else None
            role = wanted.get(team_id)
            if previous == role:
                continue
            if role is None:
                assert membership is not None
                membership.delete()
            elif membership is None:
                Membership.objects.create(user=user, team_id=team_id, role=role)
            else:
                membership.role = role
                membership.save(update_fields=["role"])
            change = RoleChange(team=slugs[team_id], previous=previous, role=role)
            changes.append(change)
            ledger_append(
                run=None,
                actor=actor,
                action="membership.changed",
                team_slug=change.team,
                payload={
                    "user": user.get_username(),
                    "user_id": user.pk,
                    "previous": previous,
                    "role": role,
                    "groups": matched,
                    "via": "oidc",
                },
            )
    return changes


# --------------------------------------------------------------------------------------------
# signing in


_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


def _username_for(claims: dict[str, Any]) -> str:
    """A readable, unique username: `preferred_username`, else e-mail, else the subject. It is a
    label (and SCIM's `userName`), never the key: the key is the identity link."""
    base = ""
    for claim in ("preferred_username", "email", "sub"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            base = _USERNAME_UNSAFE.sub("_", value.strip())[:140]
            break
    base = base or "sso-user"
    User = get_user_model()
    candidate, n = base, 1
    while User.objects.filter(username=candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def groups_from_claims(claims: dict[str, Any]) -> list[str]:
    """The groups claim must be a list of strings: a string is refused, never split or taken as
    one group (an IdP sending `"admins"` where a list belongs is misconfigured, and guessing
    what it meant could grant a role nobody intended)."""
    name = conf.groups_claim()
    value = claims.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SignInRefused(
            "groups_claim_invalid", f"claim {name!r} is {type(value).__name__}, not a list"
        )
    return value


def sign_in(*, issuer: str, claims: dict[str, Any]) -> Any:
    """The IdP vouched for `claims` (already verified): find or make the user of (issuer, sub),
    apply their group roles, and return the user, or raise SignInRefused.

    1. the groups claim must be a list of strings;
    2. a person none of whose groups is mapped is refused — and a returning person loses the
       roles the mappings gave them (their groups were taken away at the IdP);
    3. a new (issuer, sub) gets a new user; an existing link signs in its own user, whatever
       the e-mail says;
    4. a deactivated user is refused: only an admin or SCIM reactivates.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise SignInRefused("no_subject", "the ID token has no subject")
    groups = groups_from_claims(claims)
    group_roles_seed_once()
    link = (
        IdentityLink.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    )
    _, _, matched = _wanted_roles(groups)
    if not matched:
        if link is not None:
            roles_apply(user=link.user, groups=[])
        raise SignInRefused("no_mapped_group", f"groups {groups!r} map to no team")
    if link is None:
        link = _link_create(issuer=issuer, subject=subject, claims=claims)
    user = link.user
    if not user.is_active:
        raise SignInRefused("deactivated", f"user {user.pk} is deactivated")
    _profile_update(user, claims)
    roles_apply(user=user, groups=groups)
    IdentityLink.objects.filter(pk=link.pk).update(last_login_at=timezone.now())
    return user


def _link_create(*, issuer: str, subject: str, claims: dict[str, Any]) -> IdentityLink:
    User = get_user_model()
    try:
        with transaction.atomic():
            user = User.objects.create_user(
                username=_username_for(claims),
                email=claims.get("email") if isinstance(claims.get("email"), str) else "",
            )
            user.set_unusable_password()  # only the IdP signs this person in
            user.save(update_fields=["password"])
            return IdentityLink.objects.create(issuer=issuer, subject=subject, user=user)
    except IntegrityError:
        # The same person's first sign-in in two tabs at once: the other one made the link.
        return IdentityLink.objects.select_related("user").get(issuer=issuer, subject=subject)


def _profile_update(user: Any, claims: dict[str, Any]) -> None:
    fields = []
    for attr, claim in (
        ("email", "email"),
        ("first_name", "given_name"),
        ("last_name", "family_name"),
    ):
        value = claims.get(claim)
        if isinstance(value, str) and getattr(user, attr) != value[:150]:
            setattr(user, attr, value[:150])
            fields.append(attr)
    if fields:
        user.save(update_fields=fields)


def on_user_logged_in(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    """`user_logged_in` (wired in accounts.apps): remember the session, so deactivating the user
    can end it at once."""
    session = getattr(request, "session", None)
    if user is not None and session is not None:
        preferences_to_session(session=session, user=user)
    session_key = getattr(session, "session_key", None)
    if user is None or not session_key:
        return
    SignedInSession.objects.get_or_create(session_key=session_key, defaults={"user": user})
    # Rows of sessions that have expired by now (their cookies' age): kept from growing.
    SignedInSession.objects.filter(
        user=user,
        created_at__lt=timezone.now() - timedelta(seconds=settings.SESSION_COOKIE_AGE),
    ).delete()


# The session keys the sign-in fills from the user's settings and team, so the console's
# middleware chooses the language and the time zone without a query per request.
SESSION_LANGUAGE = "safestop_language"
# A user's team time zone, cached per user: the middleware reads it on every request, and a
# change (an admin edits the team's zone, a membership comes or goes) forgets the affected
# users' entries, so the next request reads the new zone. With a per-process cache (the default
# local memory) the forgetting reaches only the process that saved; the entry's lifetime bounds
# how long another process may still show the old zone.
TIME_ZONE_CACHE_SECONDS = 60
_TIME_ZONE_KEY = "safestop:time-zone:user:{}"


def user_time_zone(*, user: Any) -> str:
    """The time zone of the user's first team (by id); UTC with no team."""
    zone = (
        Team.objects.filter(memberships__user=user)
        .order_by("id")
        .values_list("time_zone", flat=True)
        .first()
    )
    return zone or "UTC"


def user_time_zone_cached(*, user: Any) -> str:
    """`user_time_zone`, from the cache when a request already read it."""
    key = _TIME_ZONE_KEY.format(user.pk)
    zone = cache.get(key)
    if zone is None:
        zone = user_time_zone(user=user)
        cache.set(key, zone, TIME_ZONE_CACHE_SECONDS)
    return str(zone)


def time_zones_forget(*, user_ids: Iterable[int]) -> None:
    """Drop the cached time zones of these users: their next request reads the zone again.

    Now, and again when the saving transaction commits: a request that read the old zone
    between the two would otherwise cache it again for the entry's whole lifetime."""
    keys = [_TIME_ZONE_KEY.format(user_id) for user_id in user_ids]
    if keys:
        cache.delete_many(keys)
        transaction.on_commit(lambda: cache.delete_many(keys))


def on_team_saved(sender: Any, instance: Team, update_fields: Any = None, **kwargs: Any) -> None:
    """`post_save` of a team (wired in accounts.apps): a zone that may have changed is forgotten
    for every member. A save naming other fields (counters, budgets) costs nothing."""
    if update_fields is not None and "time_zone" not in update_fields:
        return
    time_zones_forget(
        user_ids=Membership.objects.filter(team_id=instance.pk).values_list("user_id", flat=True)
    )


def on_membership_changed(sender: Any, instance: Membership, **kwargs: Any) -> None:
    """`post_save` / `post_delete` of a membership: the user's first team may be another now."""
    time_zones_forget(user_ids=[instance.user_id])


def preferences_to_session(*, session: Any, user: Any) -> None:
    """Copy the user's language into the session at sign-in, so the middleware reads it with the
    session instead of a query per request; read the team's time zone into the cache."""
    language = (
        UserSettings.objects.filter(user=user).values_list("language", flat=True).first() or ""
    )
    if language:
        session[SESSION_LANGUAGE] = language
    else:
        session.pop(SESSION_LANGUAGE, None)
    time_zones_forget(user_ids=[user.pk])
    user_time_zone_cached(user=user)


def user_language_set(*, user: Any, language: str) -> UserSettings:
    """Save the user's console language ("" = follow the browser)."""
    if language and language not in {code for code, _name in settings.LANGUAGES}:
        raise ValueError(f"unknown language {language!r}")
    user_settings, _created = UserSettings.objects.update_or_create(
        user=user, defaults={"language": language}
    )
    return user_settings


def user_language(*, user: Any) -> str:
    """The language to write to this user in (notifications): their choice, else English."""
    chosen = UserSettings.objects.filter(user=user).values_list("language", flat=True).first()
    return chosen or settings.LANGUAGE_CODE


# --------------------------------------------------------------------------------------------
# deprovisioning


@dataclass
class Deactivation:
    user_id: int
    changed: bool
    sessions_ended: int = 0
    tokens_revoked: list[str] = field(default_factory=list)
    handoffs_returned: list[int] = field(default_factory=list)


def _reviewer_tokens_made_by(user_id: int) -> list[int]:
    """The reviewer tokens this person made, read from the ledger's `token.created` entries (the
    token table does not say who made a token; the ledger always has)."""
    made = LedgerEntry.objects.filter(
        action="token.created", actor_kind=ActorKind.USER, actor_id=str(user_id)
    ).values_list("team_slug", "payload")
    ids = []
    for team_slug, payload in made:
        token_id = (
            ApiToken.objects.filter(
                team__slug=team_slug,
                name=(payload or {}).get("token", ""),
                role=TokenRole.REVIEWER,
                revoked_at__isnull=True,
            )
            .values_list("pk", flat=True)
            .first()
        )
        if token_id is not None:
            ids.append(token_id)
    return ids


def _sessions_end(user_id: int) -> int:
    store = import_module(settings.SESSION_ENGINE).SessionStore
    keys = list(
        SignedInSession.objects.filter(user_id=user_id).values_list("session_key", flat=True)
    )
    for key in keys:
        store(session_key=key).delete()
    SignedInSession.objects.filter(user_id=user_id).delete()
    return len(keys)


def user_deactivate(*, user_id: int, actor: Actor, via: str) -> Deactivation:
    """Deprovision a person at once (an admin in the console, or the IdP through SCIM).

    1. in one transaction, the user row locked: `is_active` off (which, on commit, tells every
       open browser socket of the user to re-check: console.realtime.membership_changed), every
       session they signed in with deleted (so the re-check finds the session gone and closes
       the socket, 4401, and the page reloads onto the sign-in page), the reviewer tokens they
       made revoked, and one `user.deactivated` ledger entry saying all of it;
    2. then, each in its run's own transaction (a handoff transition locks its run first, and
       must not nest in ours): their unfinished handoffs go back to the team's queue.

    Deactivating an inactive user changes nothing and writes nothing (SCIM retries).
    """
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user_id)
        if not user.is_active:
            return Deactivation(user_id=user_id, changed=False)
        user.is_active = False
        user.save(update_fields=["is_active"])
        result = Deactivation(user_id=user_id, changed=True, sessions_ended=_sessions_end(user_id))
        for token_id in _reviewer_tokens_made_by(user_id):
            token = api_token_revoke(token_id=token_id, actor=actor)
            result.tokens_revoked.append(f"{token.team.slug}/{token.name}")
        result.handoffs_returned = list(
            Handoff.objects.filter(assignee_id=user_id, status__in=OPEN_HANDOFF)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        ledger_append(
            run=None,
            actor=actor,
            action="user.deactivated",
            payload={
                "user": user.get_username(),
                "user_id": user.pk,
                "via": via,
                "sessions_ended": result.sessions_ended,
                "tokens_revoked": result.tokens_revoked,
                "handoffs_returned": result.handoffs_returned,
            },
        )
    # After the commit (at once when no outer transaction is open; the Django admin saves
    # inside one): each return locks its run in a durable transaction of its own.
    handoff_ids = list(result.handoffs_returned)
    transaction.on_commit(lambda: _handoffs_return(handoff_ids, actor))
    logger.info(
        "sso.user_deactivated user=%s via=%s sessions=%d tokens=%d handoffs=%d",
        user_id,
        via,
        result.sessions_ended,
        len(result.tokens_revoked),
        len(handoff_ids),
    )
    return result


def _handoffs_return(handoff_ids: list[int], actor: Actor) -> None:
    for handoff_id in handoff_ids:
        try:
            handoff_assign(handoff_id=handoff_id, assignee=None, actor=actor)
        except DomainError as exc:  # ended meanwhile (completed, closed): nothing to return
            logger.info("sso.handoff_not_returned handoff=%s reason=%s", handoff_id, exc)


def user_reactivate(*, user_id: int, actor: Actor, via: str) -> bool:
    """SCIM `active: true` (or an admin): the person may sign in again. Their roles come back at
    their next sign-in, from their groups; tokens stay revoked."""
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user_id)
        if user.is_active:
            return False
        user.is_active = True
        user.save(update_fields=["is_active"])
        ledger_append(
            run=None,
            actor=actor,
            action="user.reactivated",
            payload={"user": user.get_username(), "user_id": user.pk, "via": via},
        )
    return True
