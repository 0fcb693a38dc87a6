"""Read queries over handoff records — the console's handoff inbox and cards, and the
stop-quality figures that combine them with the runs figures (`runs.selectors`). Used by the
API, the console and the metrics endpoint."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.contrib.auth import get_user_model

from handoff.models import Handoff, HandoffStatus
from runs.access import ROLE_CAPABILITIES, Capability
from runs.models import (
    Checkpoint,
    Membership,
    RejectedWrite,
    Role,
    SteeringMessage,
    SteeringStatus,
    StopRequest,
)
from runs.selectors import (
    approval_figures,
    interruptions_recovered,
    latency_summary,
    side_effect_leakage,
    team_filter,
)


def stop_quality(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    """The five stop-quality figures of DESIGN §7 for stops requested in [since, until), and
    the approval figures of DESIGN §10 for approvals requested in the same period."""
    stops = team_filter(
        StopRequest.objects.filter(requested_at__gte=since, requested_at__lt=until),
        team_ids,
        "run__team_id",
    )
    stop_rows = list(
        stops.values(
            "requested_at", "stopped_at", "signal_delivered_at", "outcome_state", "dirty_reasons"
        )
    )
    to_stopped = [
        (row["stopped_at"] - row["requested_at"]).total_seconds() * 1000
        for row in stop_rows
        if row["stopped_at"]
    ]
    to_signal = [
        (row["signal_delivered_at"] - row["requested_at"]).total_seconds() * 1000
        for row in stop_rows
        if row["signal_delivered_at"]
    ]
    return {
        "period": {"since": since.isoformat(), "until": until.isoformat()},
        "stops": len(stop_rows),
        # A stop is counted as it ended: a dirty stop stays dirty here after a reviewer resolved
        # its unknowns (its outcome_state follows the run to clean; its dirty_reasons do not).
        "stopped_cleanly": sum(
            1
            for row in stop_rows
            if row["outcome_state"] == "stopped_cleanly" and not row["dirty_reasons"]
        ),
        "stopped_dirty": sum(1 for row in stop_rows if _ended_dirty(row)),
        "stopped_dirty_resolved": sum(
            1
            for row in stop_rows
            if _ended_dirty(row) and row["outcome_state"] == "stopped_cleanly"
        ),
        "stop_latency": {
            "to_stopped": latency_summary(to_stopped),
            "to_worker_signal": latency_summary(to_signal),
        },
        "side_effect_leakage": side_effect_leakage(since=since, until=until, team_ids=team_ids),
        "late_writes_rejected": team_filter(
            RejectedWrite.objects.filter(at__gte=since, at__lt=until), team_ids, "run__team_id"
        ).count(),
        "interruptions_recovered_cleanly": interruptions_recovered(
            since=since, until=until, team_ids=team_ids
        ),
        "handoff_completion": handoff_completion(since=since, until=until, team_ids=team_ids),
        "approvals": approval_figures(since=since, until=until, team_ids=team_ids),
    }


def handoff_completion(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    handoffs = team_filter(
        Handoff.objects.filter(created_at__gte=since, created_at__lt=until),
        team_ids,
        "run__team_id",
    )
    total = handoffs.count()
    done = handoffs.filter(
        status__in=(HandoffStatus.COMPLETED, HandoffStatus.RETURNED, HandoffStatus.CLOSED)
    ).count()
    return {"handoffs": total, "finished": done, "rate": (done / total) if total else None}


def _ended_dirty(row: dict[str, Any]) -> bool:
    return row["stopped_at"] is not None and (
        bool(row["dirty_reasons"]) or row["outcome_state"] == "stopped_dirty"
    )


# --------------------------------------------------------------------------------------------
# the console's handoff inbox


class TeamScope(Protocol):
    """What the inbox asks of the reader's access (the console's `Access` answers it)."""

    @property
    def all_teams(self) -> bool: ...

    @property
    def team_ids(self) -> list[int] | None: ...

    def can_act(self, team_id: int) -> bool: ...


OPEN_HANDOFF = (HandoffStatus.OPEN, HandoffStatus.ACCEPTED)


@dataclass
class HandoffCard:
    handoff: Handoff
    checkpoints: list[Checkpoint]
    unapplied: list[SteeringMessage]
    can_act: bool = False
    # Who may take it: the reviewers and admins of the run's team (the assign control's choices).
    teammates: list[str] = field(default_factory=list)


# The inbox's assignee filter: everyone's, mine, nobody's, or one person's (a username).
ASSIGNEE_ME = "me"
ASSIGNEE_NONE = "none"


def _reviewer_roles() -> list[str]:
    return [role for role in Role.values if Capability.REVIEW in ROLE_CAPABILITIES[role]]


def handoff_teammates(team_ids: list[int] | None) -> dict[int, list[str]]:
    """Per team, the usernames of who may take a handoff (active reviewers and admins), sorted;
    one query."""
    members = Membership.objects.filter(role__in=_reviewer_roles(), user__is_active=True)
    if team_ids is not None:
        members = members.filter(team_id__in=team_ids)
    teammates: dict[int, list[str]] = defaultdict(list)
    for team_id, username in members.order_by("user__username").values_list(
        "team_id", "user__username"
    )[:2000]:
        teammates[team_id].append(username)
    return teammates


def handoff_inbox(
    access: TeamScope, *, user_id: int | None, assignee: str = "", oldest_first: bool = True
) -> tuple[list[HandoffCard], list[Handoff], dict[int, list[str]]]:
    """Open handoffs of the user's teams — all, the user's (`ASSIGNEE_ME`), nobody's
    (`ASSIGNEE_NONE`) or one person's (a username) — by age, oldest first unless asked; the
    recently ended ones; and the teammates per team (for the assign controls and the filter).

    Five queries: open handoffs, their checkpoints, their unapplied steering, the ended ones,
    the teammates.
    """
    handoffs = Handoff.objects.select_related("run", "run__team", "assignee", "stop_packet")
    if not access.all_teams:
        handoffs = handoffs.filter(run__team_id__in=access.team_ids or [])
    open_handoffs = handoffs.filter(status__in=OPEN_HANDOFF)
    if assignee == ASSIGNEE_ME:
        open_handoffs = open_handoffs.filter(assignee_id=user_id)
    elif assignee == ASSIGNEE_NONE:
        open_handoffs = open_handoffs.filter(assignee__isnull=True)
    elif assignee:
        open_handoffs = open_handoffs.filter(assignee__username=assignee)
    order = ("created_at", "pk") if oldest_first else ("-created_at", "-pk")
    open_list = list(open_handoffs.order_by(*order)[:100])
    run_ids = [handoff.run_id for handoff in open_list]
    checkpoints: dict[str, list[Checkpoint]] = defaultdict(list)
    for checkpoint in Checkpoint.objects.filter(run_id__in=run_ids).order_by("pk"):
        checkpoints[checkpoint.run_id].append(checkpoint)
    unapplied: dict[str, list[SteeringMessage]] = defaultdict(list)
    for message in SteeringMessage.objects.filter(
        run_id__in=run_ids, status=SteeringStatus.UNAPPLIED_AT_STOP
    ).order_by("pk"):
        unapplied[message.run_id].append(message)
    teammates = handoff_teammates(access.team_ids)
    cards = [
        HandoffCard(
            handoff,
            checkpoints[handoff.run_id],
            unapplied[handoff.run_id],
            can_act=access.can_act(handoff.run.team_id),
            teammates=teammates.get(handoff.run.team_id, []),
        )
        for handoff in open_list
    ]
    ended = list(handoffs.exclude(status__in=OPEN_HANDOFF).order_by("-closed_at", "-pk")[:20])
    return cards, ended, teammates


def handoff_card(handoff_id: int) -> HandoffCard | None:
    handoff = (
        Handoff.objects.select_related("run", "run__team", "assignee", "stop_packet")
        .filter(pk=handoff_id)
        .first()
    )
    if handoff is None:
        return None
    return HandoffCard(
        handoff,
        list(Checkpoint.objects.filter(run_id=handoff.run_id).order_by("pk")),
        list(
            SteeringMessage.objects.filter(
                run_id=handoff.run_id, status=SteeringStatus.UNAPPLIED_AT_STOP
            ).order_by("pk")
        ),
        teammates=handoff_teammates([handoff.run.team_id]).get(handoff.run.team_id, []),
    )


def user_by_username(*, username: str) -> Any:
    """An active user by username, or None (whether they may take a handoff is the service's
    question)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()


def handoff_get(*, handoff_id: int) -> Handoff | None:
    """One handoff with its run (the run's team decides who may act on it)."""
    return Handoff.objects.select_related("run").filter(pk=handoff_id).first()


def latest_handoff_id(*, run_id: str) -> int | None:
    """The run's newest handoff (a run handed off again after a return has several)."""
    return (
        Handoff.objects.filter(run_id=run_id)
        .order_by("-created_at", "-pk")
        .values_list("pk", flat=True)
        .first()
    )
