"""Where an app above `runs` does its part of a runs transition, inside that transaction.

Apps depend one way, `console` → `handoff` → `runs`: runs imports neither (docs/ARCHITECTURE.md,
"Layers"). Three moments of the stop belong to handoff but must happen in the transaction of the
runs transition, under its run lock (DESIGN §4):

- a stop settles → its stop packet is built, a snapshot of exactly the state it ended in;
- a takeover reaches `stopped_cleanly` → a handoff opens (the run moves to `handed_off`);
- a handed-off run is resumed or closed directly → its open handoffs end with it.

`handoff.apps.HandoffConfig.ready` registers the handlers (`register`). Handlers run under the
run row lock: they only write their own records, never publish, never call out.

Two open lists serve the apps further up (notifications, DESIGN §11):

- entry listeners (`on_entry_appended`): called by `runs.ledger.ledger_append` right after every
  entry is inserted, in the same transaction, so a notification row commits or rolls back with
  the event it is about (a transactional outbox). A listener must be cheap: it returns at once
  for actions it does not care about, and it never calls out;
- periodic steps (`on_periodic`): run by `runs.dispatch.run_periodic_work` after its own steps,
  in the embedded background loop (Celery beat schedules their tasks instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from runs import sql
from runs.actors import Actor
from runs.models import LedgerEntry, Run, StopRequest


@dataclass(frozen=True)
class HandoffOpened:
    """What the `handed_off` ledger entry says about the handoff that was opened."""

    handoff_id: int
    assignee: str | None
    # The assignee took the run over themselves: the handoff starts accepted.
    accepted: bool = False


StopSettled = Callable[[Run, StopRequest, sql.Deferred], Any]
"""Build the packet of the run's current stop epoch; returns it, opaque to runs. The settle's
writes are held back in the `sql.Deferred`: sent first, in the round trip of the packet's reads."""

HandOff = Callable[[Run, StopRequest, Actor, str, Any], HandoffOpened]
"""Open a handoff for a clean takeover: (run, stop_request, actor, note, packet or None)."""

HandoffsEnd = Callable[[Run, str], None]
"""End the run's open handoffs: (run, "returned" | "closed")."""


@dataclass(frozen=True)
class Hooks:
    stop_settled: StopSettled
    hand_off: HandOff
    handoffs_end: HandoffsEnd


_hooks: Hooks | None = None


def register(hooks: Hooks) -> None:
    global _hooks
    _hooks = hooks


def _registered() -> Hooks:
    if _hooks is None:
        raise ImproperlyConfigured(
            "no stop hooks registered: the handoff app must be in INSTALLED_APPS"
        )
    return _hooks


def stop_settled(run: Run, stop_request: StopRequest, writes: sql.Deferred) -> Any:
    return _registered().stop_settled(run, stop_request, writes)


def hand_off(
    run: Run, stop_request: StopRequest, *, actor: Actor, note: str, packet: Any
) -> HandoffOpened:
    return _registered().hand_off(run, stop_request, actor, note, packet)


def handoffs_end(run: Run, status: str) -> None:
    _registered().handoffs_end(run, status)


# --------------------------------------------------------------------------------------------
# open lists: ledger entry listeners and periodic steps

EntryAppended = Callable[[LedgerEntry, Run | None], None]
"""Told of every ledger entry inside its transaction: (entry, the locked run or None)."""

PeriodicStep = Callable[[], int]
"""One periodic step; returns how many things it changed or sent."""

Deadline = Callable[[], datetime | None]
"""When an app's periodic work is next due, or None."""

_entry_listeners: list[EntryAppended] = []
# Per listener, the actions it may act on; None: any.
_listened_actions: dict[EntryAppended, frozenset[str] | None] = {}
_periodic_steps: dict[str, PeriodicStep] = {}


def on_entry_appended(listener: EntryAppended, *, actions: frozenset[str] | None = None) -> None:
    """`actions`: the only actions the listener may write anything for. A transition whose
    entry no listener may act on sends its COMMIT with its last writes (`entry_listened`)."""
    if listener not in _entry_listeners:
        _entry_listeners.append(listener)
    _listened_actions[listener] = actions


def entry_listened(action: str) -> bool:
    """Whether a listener may write something when an entry of `action` is appended: then the
    transition must leave its transaction open after the entry's INSERT, for what it writes."""
    return any(actions is None or action in actions for actions in _listened_actions.values())


def entry_appended(entry: LedgerEntry, run: Run | None) -> None:
    for listener in _entry_listeners:
        listener(entry, run)


def on_periodic(name: str, step: PeriodicStep) -> None:
    _periodic_steps[name] = step


_deadlines: dict[str, Deadline] = {}


def on_deadline(name: str, deadline: Deadline) -> None:
    """Register when an app's periodic work is next due (None: not before something happens);
    `runs.dispatch.next_deadline` includes it, so a wake is scheduled for it."""
    _deadlines[name] = deadline


def deadlines() -> list[tuple[str, Deadline]]:
    return list(_deadlines.items())


def periodic_steps() -> list[tuple[str, PeriodicStep]]:
    return list(_periodic_steps.items())


# --------------------------------------------------------------------------------------------
# policies (DESIGN §14): a team's rules, checked where the facts change, under the run lock


@dataclass(frozen=True)
class PolicyVerdict:
    """What the team's policies decided about a call or an outbox item, under the run lock.

    `stopped`: a policy stopped the run (through the stop service); the ask is refused with
    this detail. `hold`: hold the ask for a reviewer, why in words; `hold_name` is the policy
    the approval names.
    """

    stopped: str = ""
    hold: str = ""
    hold_name: str = ""


NO_VERDICT = PolicyVerdict()


class PolicyChecks:
    """The policies app's checks; this base is the "no policies" answer runs uses until the
    app registers its own (`policies.apps.PoliciesConfig.ready` → `register_policies`).

    Each check runs inside the runs transaction that changes the fact, after its lock, and
    acts only through runs services (the stop, the approval gate, the ledger)."""

    def read(self, run_id: str) -> tuple[str, list[Any]] | None:
        """A statement (and its parameters) whose row the checks of `run_id` need: a transition
        sends it in a round trip of its own (a permit and a result with their opening reads, an
        events batch after its writes) and passes the row on as `read`. None: each check reads
        for itself."""
        return None

    def quiet(self, read: Sequence[Any] | None) -> bool:
        """Whether the team's policies have nothing to say given this `read` row (the team never
        had a policy): `tool_result` writes nothing, so the result may send its COMMIT with its
        own writes, and no permit can be held or stopped by a policy."""
        return True

    def version_read(self, run_id: str) -> tuple[str, list[Any]] | None:
        """A statement whose one row says which policies the run's team has, for an events
        batch to send with its opening (`events_quiet`). None: it cannot be told beforehand."""
        return None

    def events_quiet(self, team_id: int, version: Sequence[Any] | None) -> bool:
        """Whether `events` writes nothing for any batch of the team whose `version_read` row
        this is: no policy of the team looks at events."""
        return True

    def permit(
        self,
        run: Run,
        *,
        tool: str,
        arguments: dict[str, Any],
        side_effect: str,
        now: datetime,
        read: Sequence[Any] | None = None,
    ) -> PolicyVerdict:
        return NO_VERDICT

    def outbox(
        self, run: Run, *, transport: str, destination: str, payload: dict[str, Any], now: datetime
    ) -> PolicyVerdict:
        return NO_VERDICT

    def tool_result(
        self,
        run: Run,
        *,
        tool: str,
        execution_state: str,
        now: datetime,
        read: Sequence[Any] | None = None,
    ) -> None:
        return None

    def events(
        self,
        run: Run,
        event_types: list[str],
        *,
        now: datetime,
        read: Sequence[Any] | None = None,
    ) -> None:
        return None


_policy_checks = PolicyChecks()


def register_policies(checks: PolicyChecks) -> None:
    global _policy_checks
    _policy_checks = checks


def policies() -> PolicyChecks:
    return _policy_checks
