"""Every write of notifications: channels, subscriptions, and the deliveries' outbox.

1. The ledger listener (`deliveries_enqueue_for_entry`, registered by `notifications.apps`) runs
   inside the transaction of every ledger entry. For the few actions that need a person it
   writes one `Delivery` per subscribed channel and subscription, in a savepoint, with ON
   CONFLICT DO NOTHING: the row commits or rolls back with the event, a repeat writes nothing,
   and a failure here is logged and never fails the event.
2. The sender (`deliveries_send_due`; the embedded loop's periodic step or the Celery task)
   claims due rows, fairly across teams, with `SELECT … FOR UPDATE SKIP LOCKED` + a
   conditional update, sends each
   outside any transaction, and records sent / retry later (exponential backoff) / failed, with
   the status and the first bytes of the answer.
3. A sender that died mid-send leaves its rows `sending`; `deliveries_reap_stuck` puts them
   back (the retry carries the same id, so a receiver can drop the repeat).
"""

from __future__ import annotations

import fnmatch
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, Min, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext

from handoff.models import Handoff, HandoffStatus
from notifications.events import (
    Notice,
    event_for_entry,
    handoff_message,
    ledger_broken_message,
    sample_message,
)
from notifications.models import (
    ALL_EVENTS,
    TEST_EVENT,
    ChannelKind,
    Delivery,
    DeliveryStatus,
    Event,
    NotificationChannel,
    UserSubscription,
)
from notifications.transports import (
    Answer,
    Outgoing,
    mask_target,
    new_webhook_secret,
    send,
    validate_target,
)
from runs.actors import Actor
from runs.dispatch import dispatcher_name
from runs.errors import InvalidInput, NotFound
from runs.ledger import ChainBreak, VerifyProgress, ledger_append
from runs.ledger_checks import (
    verification_claim,
    verification_run,
    verification_start_scheduled,
)
from runs.ledger_queries import ledger_entry_team
from runs.models import LedgerEntry, Membership, Run, Team

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# 1. the transactional outbox: written with the event


def deliveries_enqueue_for_entry(entry: LedgerEntry, run: Run | None) -> None:
    """The ledger listener (`runs.hooks.on_entry_appended`). Cheap for the common case: an
    action that needs nobody returns before any query."""
    notice = event_for_entry(entry, run)
    if notice is None:
        return
    try:
        # A savepoint: whatever goes wrong here rolls back alone, never the event's transaction.
        with transaction.atomic():
            deliveries_enqueue(notice)
    except Exception:
        logger.exception("notification %s for %s not queued", notice.event, entry.run_id)


def _wants(events: Any, agent_glob: str, notice: Notice) -> bool:
    if notice.event not in (events or ()):
        return False
    # A run's agent filter says nothing about events without an agent (a broken ledger).
    return not (agent_glob and notice.agent) or fnmatch.fnmatchcase(notice.agent, agent_glob)


def deliveries_enqueue(notice: Notice) -> int:
    """One delivery per enabled channel and subscription of the team that wants this event.

    Returns how many rows were meant (a repeat of the same event key inserts none of them).
    """
    channels = [
        channel
        for channel in NotificationChannel.objects.filter(
            team_id=notice.team_id, enabled=True
        ).only("pk", "events", "agent_glob", "language")
        if _wants(channel.events, channel.agent_glob, notice)
    ]
    subscriptions = [
        subscription
        for subscription in _live_subscriptions(notice.team_id)
        .only("pk", "events", "agent_glob")
        .annotate(language=F("user__console_settings__language"))
        if _wants(subscription.events, subscription.agent_glob, notice)
    ]
    if not channels and not subscriptions:
        return 0
    now = timezone.now()
    common = {
        "team_id": notice.team_id,
        "run_id": notice.run_id,
        "event": notice.event,
        "event_key": notice.key[:200],
        "next_attempt_at": now,
    }
    # Each recipient reads it in their language: a channel's own, a subscriber's chosen one.
    messages: dict[str, dict[str, Any]] = {}

    def message_in(language: str | None) -> dict[str, Any]:
        language = language or settings.LANGUAGE_CODE
        if language not in messages:
            messages[language] = notice.message_in(language)
        return messages[language]

    rows = [
        Delivery(channel_id=channel.pk, **common, message=message_in(channel.language))
        for channel in channels
    ]
    rows += [
        Delivery(subscription_id=sub.pk, **common, message=message_in(sub.language))
        for sub in subscriptions
    ]
    Delivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _live_subscriptions(team_id: int) -> Any:
    """Subscriptions of active users who still belong to the team (or are staff)."""
    member = Membership.objects.filter(user_id=OuterRef("user_id"), team_id=team_id)
    return UserSubscription.objects.filter(team_id=team_id, user__is_active=True).filter(
        Q(Exists(member)) | Q(user__is_staff=True) | Q(user__is_superuser=True)
    )


# --------------------------------------------------------------------------------------------
# 2. the sender: claim, send outside any transaction, record


def backoff_seconds(attempts: int) -> float:
    """Delay before attempt `attempts + 1`: base · 2^(attempts-1), capped."""
    base = settings.SAFESTOP_NOTIFY_RETRY_BASE_SECONDS
    return float(
        min(base * (2 ** max(attempts - 1, 0)), settings.SAFESTOP_NOTIFY_RETRY_MAX_SECONDS)
    )


def deliveries_claim_due(*, limit: int, claimer: str, now: Any = None) -> list[int]:
    """Claim up to `limit` due deliveries for `claimer`, fairly across teams; two senders never
    claim the same row (skip-locked rows, then a conditional update under that lock).

    Fair: one team's flood must not delay every other team's notifications behind it. The teams
    with due deliveries are read first, the longest-waiting first; each gets an equal share of
    the claim (at least one row), its oldest due rows; what a team could not use goes to the
    oldest due rows of any team. So a team with one delivery waiting is served in the first
    claim however many thousands another team queued, and a lone team still gets the whole
    claim. Reads `delivery_team_due_idx`.
    """
    now = now or timezone.now()
    due = Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
    with transaction.atomic(durable=True):
        teams = _teams_with_due_deliveries(now=now, limit=limit)
        if not teams:
            return []
        share = max(1, limit // len(teams))
        ids: list[int] = []
        for team_id in teams:
            ids += (
                due.filter(team_id=team_id)
                .select_for_update(skip_locked=True)
                .order_by("next_attempt_at")
                .values_list("pk", flat=True)[: min(share, limit - len(ids))]
            )
        if len(ids) < limit:
            ids += (
                due.exclude(pk__in=ids)
                .select_for_update(skip_locked=True)
                .order_by("next_attempt_at")
                .values_list("pk", flat=True)[: limit - len(ids)]
            )
        if not ids:
            return []
        Delivery.objects.filter(pk__in=ids, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.SENDING,
            claimed_at=now,
            claimed_by=claimer[:120],
            attempts=F("attempts") + 1,
        )
    return ids


# The teams with pending deliveries, one index probe each (a loose index scan over
# `delivery_team_due_idx`), and each one's oldest due row, longest-waiting team first: its cost
# grows with the number of teams, not with the size of a flood (a GROUP BY would read every
# pending row at each claim). Plain SQL that PostgreSQL and SQLite both run (a recursive CTE and
# correlated subqueries, no LATERAL).
_TEAMS_WITH_DUE_SQL = """
WITH RECURSIVE teams(team_id) AS (
    SELECT MIN(team_id) FROM {table} WHERE status = 'pending'
    UNION ALL
    SELECT (SELECT MIN(team_id) FROM {table} WHERE status = 'pending' AND team_id > teams.team_id)
    FROM teams WHERE teams.team_id IS NOT NULL
)
SELECT team_id FROM (
    SELECT team_id, (
        SELECT MIN(next_attempt_at) FROM {table}
        WHERE status = 'pending' AND team_id = teams.team_id AND next_attempt_at <= %s
    ) AS oldest
    FROM teams WHERE team_id IS NOT NULL
) AS due WHERE oldest IS NOT NULL ORDER BY oldest, team_id LIMIT %s
"""


def _teams_with_due_deliveries(*, now: Any, limit: int) -> list[int]:
    sql = _TEAMS_WITH_DUE_SQL.format(table=connection.ops.quote_name(Delivery._meta.db_table))
    with connection.cursor() as cursor:
        cursor.execute(sql, [connection.ops.adapt_datetimefield_value(now), limit])
        return [row[0] for row in cursor.fetchall()]


def delivery_record(*, delivery_id: int, claimer: str, answer: Answer, now: Any = None) -> str:
    """What the target answered: sent, pending again after a backoff, or failed for good.

    Only the claimer's own claim is recorded (a late answer after a reaper gave the row to
    another sender changes nothing). Returns the new status, or "" when not recorded.
    """
    now = now or timezone.now()
    delivery = Delivery.objects.filter(pk=delivery_id).only("attempts").first()
    if delivery is None:
        return ""
    if answer.ok:
        status, fields = DeliveryStatus.SENT, {"sent_at": now}
    elif answer.retry and delivery.attempts < settings.SAFESTOP_NOTIFY_MAX_ATTEMPTS:
        later = now + timedelta(seconds=backoff_seconds(delivery.attempts))
        status, fields = DeliveryStatus.PENDING, {"next_attempt_at": later}
    else:
        status, fields = DeliveryStatus.FAILED, {}
    changed = Delivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.SENDING, claimed_by=claimer[:120]
    ).update(
        status=status,
        response_status=answer.status,
        response_excerpt=answer.excerpt[:500],
        last_error=answer.error[:2000],
        **fields,
    )
    return status if changed else ""


def _destination(delivery: Delivery) -> tuple[str, str, str] | str:
    """(kind, target, secret), or why there is nowhere to send it."""
    if delivery.channel is not None:
        channel = delivery.channel
        if not channel.enabled and delivery.event != TEST_EVENT:
            return "the channel was disabled"
        return channel.kind, channel.target, channel.secret
    subscription = delivery.subscription
    assert subscription is not None
    email = subscription.user.email
    if not email:
        return "the subscriber has no email address"
    return ChannelKind.EMAIL, email, ""


def _outgoing(delivery: Delivery) -> Outgoing:
    return Outgoing(
        id=delivery.public_id,
        event=delivery.event,
        message=delivery.message,
        created_at=delivery.created_at,
    )


def delivery_send(delivery: Delivery) -> Answer:
    """Send one claimed delivery. Never call it inside a transaction."""
    destination = _destination(delivery)
    if isinstance(destination, str):
        return Answer.refused(destination)
    kind, target, secret = destination
    return send(kind=kind, target=target, secret=secret, outgoing=_outgoing(delivery))


def deliveries_send_due(
    *, limit: int = 50, max_seconds: float | None = None, sender: str = ""
) -> int:
    """Claim and send due deliveries until none is left, `limit` were sent, or (with
    `max_seconds`) no new claim is started after that long. Returns how many were sent."""
    claimer = sender or dispatcher_name()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    sent = attempted = 0
    while attempted < limit and (deadline is None or time.monotonic() < deadline):
        ids = deliveries_claim_due(limit=min(5, limit - attempted), claimer=claimer)
        if not ids:
            break
        deliveries = Delivery.objects.filter(pk__in=ids).select_related(
            "channel", "subscription__user"
        )
        for delivery in deliveries:
            attempted += 1
            answer = delivery_send(delivery)
            if not answer.ok:
                logger.info(
                    "notification %s (%s) not delivered: %s",
                    delivery.public_id,
                    delivery.event,
                    answer.error,
                )
            sent += delivery_record(delivery_id=delivery.pk, claimer=claimer, answer=answer) == (
                DeliveryStatus.SENT
            )
    return sent


def deliveries_reap_stuck(*, older_than_seconds: float | None = None) -> int:
    """Deliveries left `sending` by a sender that died go back to pending (`delivery_sending_idx`)."""
    seconds = (
        settings.SAFESTOP_NOTIFY_STUCK_SECONDS if older_than_seconds is None else older_than_seconds
    )
    cutoff = timezone.now() - timedelta(seconds=seconds)
    return Delivery.objects.filter(status=DeliveryStatus.SENDING, claimed_at__lt=cutoff).update(
        status=DeliveryStatus.PENDING, next_attempt_at=timezone.now(), claimed_by=""
    )


def deliveries_next_due() -> Any:
    """When the sender next has work: the earliest pending attempt, or a `sending` row's stuck
    deadline; None when no delivery waits (`runs.hooks.on_deadline`)."""
    pending = Delivery.objects.filter(status=DeliveryStatus.PENDING).aggregate(
        at=Min("next_attempt_at")
    )["at"]
    sending = Delivery.objects.filter(status=DeliveryStatus.SENDING).aggregate(
        at=Min("claimed_at")
    )["at"]
    if sending is not None:
        sending += timedelta(seconds=settings.SAFESTOP_NOTIFY_STUCK_SECONDS)
    due = [at for at in (pending, sending) if at is not None]
    return min(due) if due else None


# --------------------------------------------------------------------------------------------
# channels (team admins) and subscriptions (everyone)


def _clean_events(events: Iterable[str]) -> list[str]:
    chosen = [event for event in ALL_EVENTS if event in set(events)]
    unknown = set(events) - set(ALL_EVENTS)
    if unknown:
        raise InvalidInput(f"unknown events: {', '.join(sorted(unknown))}", field="events")
    return chosen


def _clean_glob(agent_glob: str) -> str:
    agent_glob = agent_glob.strip()
    if len(agent_glob) > 120:
        raise InvalidInput("the agent filter is at most 120 characters", field="agent_glob")
    return agent_glob


def _ledger(channel: NotificationChannel, action: str, actor: Actor, **extra: Any) -> None:
    # The target is masked: Slack and Apprise URLs carry a token, and the ledger is read by
    # every reviewer. The secret is never written anywhere but the channel row.
    ledger_append(
        run=None,
        actor=actor,
        action=action,
        team_slug=channel.team.slug,
        payload={
            "channel": channel.name,
            "kind": channel.kind,
            "target": mask_target(channel.kind, channel.target),
            **extra,
        },
    )


@dataclass(frozen=True)
class CreatedChannel:
    channel: NotificationChannel
    secret: str  # the signing secret, to show once ("" for kinds that sign nothing)


def _clean_language(language: str) -> str:
    """A channel's language: one the console speaks; blank is the default (English)."""
    if not language:
        return settings.LANGUAGE_CODE
    if language not in {code for code, _name in settings.LANGUAGES}:
        raise InvalidInput(f"unknown language {language!r}", field="language")
    return language


def channel_create(
    *,
    team: Team,
    name: str,
    kind: str,
    target: str,
    actor: Actor,
    events: Iterable[str] = ALL_EVENTS,
    agent_glob: str = "",
    language: str = "",
) -> CreatedChannel:
    name, target = name.strip(), target.strip()
    if not name:
        raise InvalidInput("a channel needs a name", field="name")
    if kind not in ChannelKind.values:
        raise InvalidInput("kind must be webhook, slack, email or apprise", field="kind")
    validate_target(kind, target)
    secret = new_webhook_secret() if kind == ChannelKind.WEBHOOK else ""
    with transaction.atomic(durable=True):
        if NotificationChannel.objects.filter(team=team, name=name).exists():
            raise InvalidInput(f"team {team.slug} already has a channel {name!r}", field="name")
        channel = NotificationChannel.objects.create(
            team=team,
            name=name,
            kind=kind,
            target=target,
            secret=secret,
            events=_clean_events(events),
            agent_glob=_clean_glob(agent_glob),
            language=_clean_language(language),
            created_by=actor.name,
        )
        _ledger(channel, "notification_channel.created", actor)
    return CreatedChannel(channel, secret)


def channel_update(
    *,
    channel_id: int,
    actor: Actor,
    name: str,
    target: str,
    events: Iterable[str],
    agent_glob: str,
    enabled: bool,
    language: str = "",
) -> NotificationChannel:
    """Change a channel. The secret stays; an empty target keeps the current one (a Slack or
    Apprise URL is never sent back to the browser, so the form shows it blank)."""
    name, target = name.strip(), target.strip()
    with transaction.atomic(durable=True):
        channel = (
            NotificationChannel.objects.select_for_update()
            .select_related("team")
            .filter(pk=channel_id)
            .first()
        )
        if channel is None:
            raise NotFound(f"no notification channel {channel_id}")
        if not name:
            raise InvalidInput("a channel needs a name", field="name")
        if target:
            validate_target(channel.kind, target)
            channel.target = target
        if (
            NotificationChannel.objects.filter(team_id=channel.team_id, name=name)
            .exclude(pk=channel.pk)
            .exists()
        ):
            raise InvalidInput(f"the team already has a channel {name!r}", field="name")
        channel.name = name
        channel.events = _clean_events(events)
        channel.agent_glob = _clean_glob(agent_glob)
        channel.enabled = enabled
        if language:
            channel.language = _clean_language(language)
        channel.save(
            update_fields=["name", "target", "events", "agent_glob", "enabled", "language"]
        )
        _ledger(channel, "notification_channel.updated", actor, enabled=enabled)
    return channel


def channel_delete(*, channel_id: int, actor: Actor) -> None:
    with transaction.atomic(durable=True):
        channel = (
            NotificationChannel.objects.select_for_update()
            .select_related("team")
            .filter(pk=channel_id)
            .first()
        )
        if channel is None:
            raise NotFound(f"no notification channel {channel_id}")
        _ledger(channel, "notification_channel.deleted", actor)
        channel.delete()


def channel_send_test(*, channel_id: int, actor: Actor) -> tuple[Delivery, Answer]:
    """Deliver a sample now and answer with what the target said ("Send test").

    Recorded as a delivery (event `test`) so the deliveries page shows it too. Called by a
    request, outside any transaction; the transport's timeouts bound the wait.
    """
    channel = NotificationChannel.objects.select_related("team").filter(pk=channel_id).first()
    if channel is None:
        raise NotFound(f"no notification channel {channel_id}")
    claimer = f"test by {actor.name}"[:120]
    now = timezone.now()
    delivery = Delivery.objects.create(
        team=channel.team,
        channel=channel,
        event=TEST_EVENT,
        event_key=f"{TEST_EVENT}:{uuid.uuid4().hex}",
        message=Notice(
            event=TEST_EVENT,
            key="",
            team_id=channel.team_id,
            agent="",
            run_id=None,
            message={},
            render=lambda: sample_message(channel.name).as_json(),
        ).message_in(channel.language or settings.LANGUAGE_CODE),
        status=DeliveryStatus.SENDING,
        attempts=1,
        next_attempt_at=now,
        claimed_at=now,
        claimed_by=claimer,
    )
    answer = send(
        kind=channel.kind,
        target=channel.target,
        secret=channel.secret,
        outgoing=_outgoing(delivery),
    )
    # A test is one attempt: never retried later.
    final = answer if answer.ok else Answer.refused(answer.error, answer.status, answer.excerpt)
    delivery_record(delivery_id=delivery.pk, claimer=claimer, answer=final)
    delivery.refresh_from_db()
    return delivery, answer


def subscription_set(
    *, user: Any, team: Team, events: Iterable[str], agent_glob: str = ""
) -> UserSubscription | None:
    """A user's own email subscription to events of one of their teams; no events removes it."""
    chosen = _clean_events(events)
    glob = _clean_glob(agent_glob)
    with transaction.atomic(durable=True):
        if not chosen:
            UserSubscription.objects.filter(user=user, team=team).delete()
            return None
        subscription, _ = UserSubscription.objects.update_or_create(
            user=user, team=team, defaults={"events": chosen, "agent_glob": glob}
        )
    return subscription


# --------------------------------------------------------------------------------------------
# periodic checks: a handoff nobody accepted, a broken ledger


def _enqueue_new(notices: list[Notice]) -> int:
    """Enqueue notices whose key has no delivery yet (one query to skip the ones done)."""
    done = set(
        Delivery.objects.filter(event_key__in=[notice.key for notice in notices]).values_list(
            "event_key", flat=True
        )
    )
    queued = 0
    for notice in notices:
        if notice.key not in done:
            with transaction.atomic():
                queued += deliveries_enqueue(notice)
    return queued


def handoffs_remind_waiting(*, now: Any = None, limit: int = 200) -> int:
    """`handoff.waiting` again for each handoff still open (nobody accepted it) after
    `SAFESTOP_HANDOFF_REMIND_SECONDS`: once per handoff (its own event key)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SAFESTOP_HANDOFF_REMIND_SECONDS)
    waiting = list(
        Handoff.objects.filter(status=HandoffStatus.OPEN, created_at__lt=cutoff)
        .select_related("run", "assignee")
        .order_by("created_at")[:limit]
    )
    notices = []
    for handoff in waiting:
        run = handoff.run
        minutes = int((now - handoff.created_at).total_seconds() // 60)

        def build(run: Any = run, handoff: Any = handoff, minutes: int = minutes) -> Any:
            return handoff_message(
                run,
                handoff_id=handoff.pk,
                assignee=handoff.assignee.get_username() if handoff.assignee else None,
                reminder=True,
                waited=gettext("%(n)s min") % {"n": minutes},
            ).as_json()

        notices.append(
            Notice(
                event=Event.HANDOFF_WAITING,
                key=f"{Event.HANDOFF_WAITING}:{handoff.pk}:still-waiting",
                team_id=run.team_id,
                agent=run.agent,
                run_id=run.pk,
                message=build(),
                render=build,
            )
        )
    return _enqueue_new(notices)


def _log_verify_progress(progress: VerifyProgress) -> None:
    # The scheduled walk of a million entries takes tens of seconds: the worker's log shows it
    # advancing, and its rate.
    logger.info(
        "ledger verification: %s entries in %.1f s (%.0f entries/s)%s",
        progress.checked,
        progress.seconds,
        progress.rate,
        ", done" if progress.done else "",
    )


def ledger_check(verification_id: int | None = None) -> ChainBreak | None:
    """Verify every ledger chain and record the walk (`runs.ledger_checks`): the one a person
    asked for (`verification_id`), else a new scheduled one. A break is `ledger.broken` for the
    team it belongs to (every team, for a break in the global chain), once per broken entry.
    None when every chain verifies, or when another worker had already claimed that walk."""
    if verification_id is None:
        verification = verification_start_scheduled()
    else:
        claimed = verification_claim(verification_id)
        if claimed is None:
            return None
        verification = claimed
    broken = verification_run(verification, progress=_log_verify_progress)
    if broken is None:
        return None
    logger.error("ledger chain broken at entry %s: %s", broken.entry_id, broken.problem)
    slug = ledger_entry_team(entry_id=broken.entry_id, run_id=broken.run_id)
    teams = Team.objects.filter(slug=slug) if slug else Team.objects.all()

    def build() -> dict[str, Any]:
        return ledger_broken_message(
            entry_id=broken.entry_id,
            run_id=broken.run_id,
            run_seq=broken.run_seq,
            problem=broken.problem,
        ).as_json()

    _enqueue_new(
        [
            Notice(
                event=Event.LEDGER_BROKEN,
                key=f"{Event.LEDGER_BROKEN}:{broken.entry_id}",
                team_id=team_id,
                agent="",
                run_id=None,
                message=build(),
                render=build,
            )
            for team_id in teams.values_list("pk", flat=True)
        ]
    )
    return broken
