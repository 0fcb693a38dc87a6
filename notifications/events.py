"""Which ledger entries need a person, and what to tell them (DESIGN §11).

`event_for_entry` is the ledger listener's first step and costs no query: most actions map to
nothing and return None at once. A message says what happened and what a person must do, and
links to the exact console page. A link only opens that page; deciding is a POST made there by
a logged-in reviewer, so a mail scanner or a chat unfurler opening it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC
from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext, gettext_lazy, ngettext

from notifications.models import Event
from runs.labels import approval_reason_text, label_for
from runs.models import LedgerEntry, Run, StopReason


@dataclass(frozen=True)
class Notice:
    """One event that needs a person: what to deliver, to whom (a team), once (`key`)."""

    event: str
    key: str
    team_id: int
    agent: str
    run_id: str | None
    message: dict[str, Any]
    # Builds `message` again in the active language: each recipient reads it in theirs
    # (notifications.services.deliveries_enqueue calls it once per language).
    render: Callable[[], dict[str, Any]] | None = field(default=None, compare=False, repr=False)

    def message_in(self, language: str) -> dict[str, Any]:
        """The message in `language`, marked with it (the e-mail's own words follow it)."""
        with translation.override(language):
            message = self.render() if self.render is not None else self.message
        return {**message, "language": language}


@dataclass(frozen=True)
class Message:
    title: str
    text: str  # what happened and what to do, one or two sentences
    link: str  # the console page, absolute
    link_label: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    run_id: str = ""
    approval_id: str = ""

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["facts"] = [list(pair) for pair in self.facts]
        return data


def public_url(path: str) -> str:
    return settings.SAFESTOP_PUBLIC_URL.rstrip("/") + path


def readable_time(value: str) -> str:
    """An ISO timestamp from a ledger payload as a person reads it: "2026-12-03 11:42 UTC".
    Anything that is not one is shown as it is."""
    moment = parse_datetime(value) if value else None
    if moment is None:
        return value
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


# Actions that may need a person; anything else returns before any work is done.
WATCHED_ACTIONS = frozenset(
    {
        "approval.requested",
        "approval.escalated",
        "approval.expired",
        "run.stopped_dirty",
        "run.interrupted",
        "run.handed_off",
        "budget.warning",
        "run.stop_requested",  # only a policy's stop (reason policy_violation) notifies
        "policy.notified",
    }
)


def event_for_entry(entry: LedgerEntry, run: Run | None) -> Notice | None:
    """The notice a ledger entry calls for, or None (the common case, decided without a query)."""
    if entry.action not in WATCHED_ACTIONS or run is None:
        return None
    notice = _notice_for(entry, run)
    if notice is None:
        return None
    return replace(notice, render=lambda: _message_for(entry, run))


def _message_for(entry: LedgerEntry, run: Run) -> dict[str, Any]:
    notice = _notice_for(entry, run)
    assert notice is not None
    return notice.message


def _notice_for(entry: LedgerEntry, run: Run) -> Notice | None:
    payload = entry.payload or {}
    action = entry.action
    if action.startswith("approval."):
        return _approval_notice(action, payload, run)
    if action == "run.stopped_dirty":
        return _stopped_dirty_notice(entry, payload, run)
    if action == "run.interrupted":
        return _interrupted_notice(entry, payload, run)
    if action == "budget.warning":
        return _budget_warning_notice(payload, run)
    if action == "run.stop_requested":
        return _policy_stop_notice(entry, payload, run)
    if action == "policy.notified":
        return _policy_notice(entry, payload, run)
    return _handoff_notice(payload, run)


def _run_facts(run: Run) -> list[tuple[str, str]]:
    return [(gettext("Run"), f"{run.title} ({run.pk})"), (gettext("Agent"), run.agent)]


def _notice(event: str, key: str, run: Run, message: Message) -> Notice:
    return Notice(
        event=event,
        key=key,
        team_id=run.team_id,
        agent=run.agent,
        run_id=run.pk,
        message=message.as_json(),
    )


def _approval_notice(action: str, payload: dict[str, Any], run: Run) -> Notice:
    approval_id = str(payload.get("approval_id", ""))
    named = str(payload.get("subject", ""))
    subject = named or gettext("a held side effect")
    deadline = str(payload.get("deadline", ""))
    link = public_url(reverse("console:approval", args=[approval_id]))
    facts = [*_run_facts(run), (gettext("Approval"), approval_id)]
    if deadline:
        facts.append((gettext("Expires"), readable_time(deadline)))
    if action == "approval.requested":
        event = Event.APPROVAL_WAITING
        facts.insert(0, (gettext("Waiting for"), subject))
        if payload.get("risk"):
            facts.append((gettext("Risk"), label_for(payload["risk"])))
        if payload.get("why"):
            facts.append((gettext("Why held"), approval_reason_text(str(payload["why"]))[:200]))
        message = Message(
            title=gettext("Approval waiting: %(subject)s") % {"subject": subject},
            text=(
                gettext(
                    "The agent %(agent)s is waiting for a reviewer to approve or reject %(subject)s. Nothing runs until someone decides; with no decision it expires as a rejection."
                )
                % {"agent": run.agent, "subject": subject}
            ),
            link=link,
            link_label=gettext("Review the approval"),
            facts=facts,
            run_id=run.pk,
            approval_id=approval_id,
        )
    elif action == "approval.escalated":
        event = Event.APPROVAL_ESCALATED
        message = Message(
            title=gettext("Approval still waiting: %(subject)s") % {"subject": subject}
            if named
            else gettext("Approval still waiting"),
            text=(
                gettext(
                    "No reviewer has decided this approval yet and its rule escalates it now. "
                    "Approve or reject it before it expires."
                )
            ),
            link=link,
            link_label=gettext("Review the approval"),
            facts=facts,
            run_id=run.pk,
            approval_id=approval_id,
        )
    else:
        event = Event.APPROVAL_EXPIRED
        held = (
            gettext("the held outbox item was refused and will never be sent")
            if payload.get("outbox_id")
            else gettext("the held call was refused and will not run")
        )
        message = Message(
            title=gettext("Approval expired"),
            text=(
                gettext(
                    "No reviewer decided before the deadline, so %(held)s. Check whether the run "
                    "still needs a person."
                )
                % {"held": held}
            ),
            link=link,
            link_label=gettext("See the approval"),
            facts=facts,
            run_id=run.pk,
            approval_id=approval_id,
        )
    return _notice(event, f"{event}:{approval_id}", run, message)


def _stopped_dirty_notice(entry: LedgerEntry, payload: dict[str, Any], run: Run) -> Notice:
    reasons = [str(reason) for reason in payload.get("dirty_reasons", [])]
    stop_request = payload.get("stop_request_id") or f"seq{entry.run_seq}"
    link = public_url(reverse("console:packet_latest", args=[run.pk]))
    unknown = ", ".join(label_for(reason) for reason in reasons) or gettext("unknown outcomes")
    facts = [*_run_facts(run), (gettext("Unknown"), unknown)]
    if entry.reason == StopReason.DRAIN_DEADLINE:
        event = Event.DRAIN_DEADLINE_PASSED
        message = Message(
            title=gettext("Drain deadline passed: %(title)s") % {"title": run.title},
            text=(
                gettext(
                    "The worker did not confirm it had stopped before the drain deadline. It was "
                    "fenced off and the run is stopped dirty: resolve each unknown in the stop "
                    "packet before anyone resumes it."
                )
            ),
            link=link,
            link_label=gettext("Open the stop packet"),
            facts=facts,
            run_id=run.pk,
        )
    else:
        event = Event.RUN_STOPPED_DIRTY
        facts.append((gettext("Stop reason"), label_for(entry.reason) if entry.reason else "—"))
        message = Message(
            title=gettext("Run stopped dirty: %(title)s") % {"title": run.title},
            text=(
                gettext(
                    "The run stopped with outcomes nobody knows yet (%(unknown)s). Check what really happened and resolve each unknown in the stop packet before resuming."
                )
                % {"unknown": unknown}
            ),
            link=link,
            link_label=gettext("Open the stop packet"),
            facts=facts,
            run_id=run.pk,
        )
    return _notice(event, f"{event}:{run.pk}:{stop_request}", run, message)


def _interrupted_notice(entry: LedgerEntry, payload: dict[str, Any], run: Run) -> Notice | None:
    # Only unconfirmed writes need a person (a read in flight is simply lost work).
    in_flight = [
        str(item)
        for item in [*payload.get("writes_in_flight", []), *payload.get("outbox_in_flight", [])]
    ]
    if not in_flight:
        return None  # nothing unconfirmed: the run page says enough
    event = Event.RUN_INTERRUPTED
    message = Message(
        title=ngettext(
            "Run interrupted with %(n)s unconfirmed write: %(title)s",
            "Run interrupted with %(n)s unconfirmed writes: %(title)s",
            len(in_flight),
        )
        % {"n": len(in_flight), "title": run.title},
        text=(
            gettext(
                "The worker was lost (%(interrupted)s) while calls were running; their outcomes are unknown. Check them before resuming or closing the run."
            )
            % {"interrupted": label_for(entry.reason or "interrupted")}
        ),
        link=public_url(reverse("console:run", args=[run.pk])),
        link_label=gettext("Open the run"),
        facts=[*_run_facts(run), (gettext("Unconfirmed"), ", ".join(in_flight[:10]))],
        run_id=run.pk,
    )
    epoch = payload.get("stop_epoch", entry.run_seq)
    return _notice(event, f"{event}:{run.pk}:{epoch}", run, message)


# Read when the message is built, so in the recipient's language.
_BUDGET_PERIODS = {
    "team_daily_usd": gettext_lazy("daily"),
    "team_monthly_usd": gettext_lazy("monthly"),
}


def _budget_warning_notice(payload: dict[str, Any], run: Run) -> Notice:
    """80 % of a team budget is spent. The key names the budget and its period: one warning
    per budget and period, whatever run crossed it."""
    budget = str(payload.get("budget", ""))
    period = str(payload.get("period", ""))
    which = str(_BUDGET_PERIODS.get(budget, budget))
    spent, limit = str(payload.get("spent_usd", "")), str(payload.get("limit_usd", ""))
    amounts = {"which": which, "spent": spent, "limit": limit}
    message = Message(
        title=gettext("Team %(which)s budget 80 %% spent: %(spent)s of %(limit)s USD") % amounts,
        text=(
            gettext(
                "The team has spent %(spent)s USD of its %(which)s budget of %(limit)s USD "
                "(%(period)s, %(time_zone)s). At 100 %% its runs are stopped and it gets no new "
                "permits until an admin raises the budget or the period ends."
            )
            % {**amounts, "period": period, "time_zone": payload.get("time_zone", "UTC")}
        ),
        link=public_url(reverse("console:team_budget")),
        link_label=gettext("Open the team budget"),
        facts=[(gettext("Budget"), budget), (gettext("Period"), period), *_run_facts(run)],
        run_id=run.pk,
    )
    event = Event.BUDGET_WARNING
    return _notice(event, f"{event}:{run.team_id}:{budget}:{period}", run, message)


def _policy_stop_notice(entry: LedgerEntry, payload: dict[str, Any], run: Run) -> Notice | None:
    """A policy's stop (DESIGN §14): one notice per stop, from the stop's own ledger entry."""
    if entry.reason != StopReason.POLICY_VIOLATION:
        return None
    note = str(payload.get("note", ""))
    policy = entry.actor.removeprefix("policy:")
    message = Message(
        title=gettext("Policy %(policy)s stopped a run: %(title)s")
        % {"policy": policy, "title": run.title},
        text=(
            gettext(
                "The policy %(policy)s matched and stopped the run. The stop packet says what it "
                "saw and what was in flight; review it before resuming or closing the run."
            )
            % {"policy": policy}
        ),
        link=public_url(reverse("console:run", args=[run.pk])),
        link_label=gettext("Open the run"),
        facts=[*_run_facts(run), (gettext("Policy"), policy), (gettext("Why"), note[:300])],
        run_id=run.pk,
    )
    epoch = payload.get("stop_epoch", entry.run_seq)
    return _notice(Event.POLICY_STOPPED, f"{Event.POLICY_STOPPED}:{run.pk}:{epoch}", run, message)


def _policy_notice(entry: LedgerEntry, payload: dict[str, Any], run: Run) -> Notice:
    policy = str(payload.get("policy", ""))
    values = payload.get("values") or {}
    seen = ", ".join(f"{name}={value!r}" for name, value in values.items())[:300]
    message = Message(
        title=gettext("Policy %(policy)s matched: %(title)s")
        % {"policy": policy, "title": run.title},
        text=(
            gettext(
                "The policy %(policy)s (%(expression)s) matched on this run. Nothing was stopped "
                "or held: look at the run and decide whether it needs you."
            )
            % {"policy": policy, "expression": str(payload.get("expression", ""))[:200]}
        ),
        link=public_url(reverse("console:run", args=[run.pk])),
        link_label=gettext("Open the run"),
        facts=[*_run_facts(run), (gettext("Policy"), policy), (gettext("Saw"), seen or "—")],
        run_id=run.pk,
    )
    key = f"{Event.POLICY_NOTIFIED}:{run.pk}:{payload.get('policy_id', policy)}"
    return _notice(Event.POLICY_NOTIFIED, key, run, message)


def _handoff_notice(payload: dict[str, Any], run: Run) -> Notice:
    handoff_id = payload.get("handoff_id")
    assignee = payload.get("assignee")
    return _notice(
        Event.HANDOFF_WAITING,
        f"{Event.HANDOFF_WAITING}:{handoff_id}",
        run,
        handoff_message(run, handoff_id=handoff_id, assignee=assignee, reminder=False),
    )


def handoff_message(
    run: Run, *, handoff_id: Any, assignee: str | None, reminder: bool, waited: str = ""
) -> Message:
    who = gettext(" to %(assignee)s") % {"assignee": assignee} if assignee else ""
    facts = [*_run_facts(run), (gettext("Handoff"), str(handoff_id))]
    if waited:
        facts.append((gettext("Waiting for"), waited))
    return Message(
        title=(
            gettext("Handoff still waiting: %(title)s")
            if reminder
            else gettext("Handoff waiting: %(title)s")
        )
        % {"title": run.title},
        text=(
            gettext(
                "The run was handed off%(who)s and waits for a person to accept it and take over from its stop packet."
            )
            % {"who": who}
            + (gettext(" Nobody has accepted it yet.") if reminder else "")
        ),
        link=public_url(reverse("console:handoffs") + f"#handoff-{handoff_id}"),
        link_label=gettext("Open the handoffs"),
        facts=facts,
        run_id=run.pk,
    )


def ledger_broken_message(
    *, entry_id: int, run_id: str | None, run_seq: int, problem: str
) -> Message:
    where = (
        gettext("run %(run_id)s, entry #%(run_seq)s") % {"run_id": run_id, "run_seq": run_seq}
        if run_id
        else gettext("global entry #%(run_seq)s") % {"run_seq": run_seq}
    )
    return Message(
        title=gettext("Ledger chain broken"),
        text=(
            gettext(
                "The periodic verification found a broken hash chain (%(where)s): %(problem)s. The audit record may have been altered: investigate before trusting it."
            )
            % {"where": where, "problem": problem}
        ),
        link=public_url(reverse("console:audit")),
        link_label=gettext("Open the audit page"),
        facts=[
            (gettext("Entry"), str(entry_id)),
            (gettext("Where"), where),
            (gettext("Problem"), problem),
        ],
        run_id=run_id or "",
    )


def sample_message(channel_name: str) -> Message:
    """What "Send test" delivers."""
    return Message(
        title=gettext("Test notification from safestop"),
        text=(
            gettext(
                "This is a test of the channel %(repr)s. Real notifications say what happened and what a person must do, with a link to the console page."
            )
            % {"repr": f"“{channel_name}”"}
        ),
        link=public_url(reverse("console:runs")),
        link_label=gettext("Open the console"),
        facts=[(gettext("Channel"), channel_name)],
    )
