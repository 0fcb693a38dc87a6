"""Policies enforced where the facts change, in that change's own transaction (DESIGN §14).

`Checks` is what runs calls through `runs.hooks.policies()` (registered by
`policies.apps.PoliciesConfig.ready`): runs sits below policies and never imports it. Each
check runs under the run lock of the runs transition that asked, updates the run's aggregates
(`RunFacts`), evaluates the team's enabled policies and acts only through runs services:

- `stop` / `stop_and_take_over`: `stop_locked` with reason `policy_violation` and actor
  `policy:<name>` (one StopRequest, one ledger entry; the notification follows that entry); a
  run already stopping is left alone;
- `require_approval`: the call or outbox item being asked is held as an approval naming the
  policy; matched away from a side effect, the run's next side effect is held;
- `notify`: a `policy.notified` ledger entry, which the notification listener delivers;
- `observe` mode: a would-act `PolicyHit` and a `policy.observed` ledger entry, nothing else.

An evaluation error is counted on the policy and, in enforce mode, applies its `on_error`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import F

from policies import facts as aggregates
from policies.engine import (
    Compiled,
    Moment,
    PolicySet,
    Result,
    check,
    describe_values,
    team_policies,
)
from policies.models import (
    HitOutcome,
    Policy,
    PolicyAction,
    PolicyHit,
    PolicyMode,
    PolicyOnError,
    RunFacts,
)
from policies.reads import (
    RUN_COLUMNS,
    CheckReads,
    check_reads_of,
    policy_set_version,
    policy_version_statement,
    read_for_checks,
    read_for_checks_statement,
    save_facts,
)
from runs import sql
from runs.actors import Actor
from runs.hooks import NO_VERDICT, PolicyChecks, PolicyVerdict
from runs.ledger import ledger_append
from runs.models import ActorKind, Run, RunStatus, Step, StopReason, Team
from runs.services import TRANSITIONS
from runs.services.lifecycle import stop_locked

_STOPS = (PolicyAction.STOP, PolicyAction.STOP_AND_TAKE_OVER)


def policy_actor(policy: Compiled) -> Actor:
    return Actor(kind=ActorKind.SYSTEM, id=str(policy.id), name=f"policy:{policy.name}")


# --------------------------------------------------------------------------------------------
# the run's values, read once each and only when a policy reads them


class LiveRun:
    """The run's values, each computed when a policy first asks for it, from the run as the
    transition holds it or, for the columns an events batch leaves deferred, from the check's
    own read (`CheckReads.run_values`)."""

    def __init__(self, run: Run, reads: CheckReads, now: datetime) -> None:
        self.run, self.reads, self.now = run, reads, now

    @functools.cached_property
    def _deferred(self) -> set[str]:
        return self.run.get_deferred_fields()

    def _column(self, name: str) -> Any:
        if name not in self._deferred:
            return getattr(self.run, name)
        if name not in self.reads.run_values:  # SQLite: the ORM read has no run columns
            self.reads.run_values.update(
                Run.objects.filter(pk=self.run.pk).values(*RUN_COLUMNS).get()
            )
        return self.reads.run_values[name]

    def agent(self) -> str:
        return self._column("agent")

    def value(self, name: str) -> Any:
        run, column = self.run, self._column
        if name == "run.agent":
            return column("agent")
        if name == "run.team":
            if Run.team.is_cached(run):
                return run.team.slug
            return Team.objects.filter(pk=run.team_id).values_list("slug", flat=True).first()
        if name == "run.elapsed_seconds":
            started = column("started_at") or column("created_at")
            return max((self.now - started).total_seconds(), 0.0)
        if name == "run.steps":
            # Steps started so far (a planned step not yet started is not one), counted over
            # the run's own steps only, and only when a policy reads it.
            return Step.objects.filter(run_id=run.pk, started_at__isnull=False).count()
        if name == "run.tool_calls":
            return column("tool_calls_count")
        if name == "run.tool_failures_in_a_row":
            return self.reads.facts.tool_failures_in_a_row
        if name == "run.side_effects_last_minute":
            return aggregates.side_effects_last_minute(self.reads.facts, at=self.now.timestamp())
        if name == "run.cost_usd":
            return float(column("cost_usd") or 0)
        if name == "run.tokens":
            return int(column("input_tokens") or 0) + int(column("output_tokens") or 0)
        raise KeyError(name)


# --------------------------------------------------------------------------------------------
# acting


class _Acting:
    """What one moment's results do to the run, in order: the first stop ends the moment."""

    def __init__(self, run: Run, facts: RunFacts, moment: Moment, now: datetime) -> None:
        self.run, self.facts, self.moment, self.now = run, facts, moment, now
        self.stopped = ""
        self.hold = ("", "")
        self.facts_changed = False

    def apply(self, results: list[Result]) -> None:
        for result in results:
            if self.stopped:
                return
            policy = result.policy
            action = policy.action
            if result.error:
                self._error(result)
                if policy.mode == PolicyMode.OBSERVE or policy.on_error == PolicyOnError.IGNORE:
                    continue
                action = policy.on_error
            if policy.mode == PolicyMode.OBSERVE:
                self._observe(result)
            elif action in _STOPS:
                self._stop(result, takeover=action == PolicyAction.STOP_AND_TAKE_OVER)
            elif action == PolicyAction.REQUIRE_APPROVAL:
                self._require_approval(result)
            elif action == PolicyAction.NOTIFY:
                self._notify(result)

    def _hit(self, result: Result, outcome: str, action: str, **extra: Any) -> PolicyHit:
        policy = result.policy
        return PolicyHit.objects.create(
            policy_id=policy.id,
            team_id=self.run.team_id,
            run_id=self.run.pk,
            policy_name=policy.name,
            expression=policy.expression,
            mode=policy.mode,
            action=action,
            outcome=outcome,
            event_type=self.moment.event_type[:40],
            values=_json_values(result.values),
            error=result.error,
            created_at=self.now,
            **extra,
        )

    def _once(self, policy: Compiled, kind: str) -> bool:
        """True the first time this policy does `kind` on this run."""
        key = f"{policy.id}:{kind}"
        if key in self.facts.fired:
            return False
        self.facts.fired = [*self.facts.fired, key]
        self.facts_changed = True
        return True

    def _payload(self, result: Result) -> dict[str, Any]:
        return {
            "policy": result.policy.name,
            "policy_id": result.policy.id,
            "expression": result.policy.expression,
            "values": _json_values(result.values),
            "event_type": self.moment.event_type,
            "mode": result.policy.mode,
            "action": result.policy.action,
            **({"error": result.error} if result.error else {}),
        }

    def _error(self, result: Result) -> None:
        policy = result.policy
        Policy.objects.filter(pk=policy.id).update(
            errors_count=F("errors_count") + 1,
            last_error=f"run {self.run.pk} at {self.moment.event_type}: {result.error}"[:2000],
            last_error_at=self.now,
        )
        if self._once(policy, "error"):
            action = "" if policy.mode == PolicyMode.OBSERVE else policy.on_error
            self._hit(result, HitOutcome.ERROR, action)

    def _observe(self, result: Result) -> None:
        if not self._once(result.policy, "observe"):
            return
        self._hit(result, HitOutcome.WOULD_ACT, result.policy.action)
        ledger_append(
            run=self.run,
            actor=policy_actor(result.policy),
            action="policy.observed",
            payload=self._payload(result),
        )

    def _stop(self, result: Result, *, takeover: bool) -> None:
        policy = result.policy
        if RunStatus.CANCEL_REQUESTED not in TRANSITIONS[self.run.status]:
            return  # already stopping or finished: never a second stop
        why = f"evaluation error ({result.error}); on_error stops" if result.error else "matched"
        note = (
            f"policy {policy.name} {why}: {policy.expression} — saw "
            f"{describe_values(result.values)}"
        )
        stop_request = stop_locked(
            self.run,
            reason=StopReason.POLICY_VIOLATION,
            note=note[:4000],
            actor=policy_actor(policy),
            now=self.now,
            takeover=takeover,
        )
        self._hit(
            result,
            HitOutcome.ACTED,
            PolicyAction.STOP_AND_TAKE_OVER if takeover else PolicyAction.STOP,
            stop_request=stop_request,
        )
        self.stopped = f"the run was stopped by policy {policy.name!r} ({policy.expression})"

    def _require_approval(self, result: Result) -> None:
        policy = result.policy
        why = f"evaluation error ({result.error}); on_error holds" if result.error else "matched"
        reason = (
            f"policy {policy.name} {why}: {policy.expression} — saw "
            f"{describe_values(result.values)}"
        )[:500]
        if self.moment.is_side_effect:
            if not self.hold[0]:
                self.hold = (policy.name, reason)
                self._hit(result, HitOutcome.ACTED, PolicyAction.REQUIRE_APPROVAL)
        elif not self.facts.hold_name:
            # Matched away from a side effect: the run's next side effect waits for a person.
            self.facts.hold_name, self.facts.hold_reason = policy.name, reason
            self.facts_changed = True
            self._hit(result, HitOutcome.ACTED, PolicyAction.REQUIRE_APPROVAL)

    def _notify(self, result: Result) -> None:
        if not self._once(result.policy, "notify"):
            return
        self._hit(result, HitOutcome.ACTED, PolicyAction.NOTIFY)
        ledger_append(
            run=self.run,
            actor=policy_actor(result.policy),
            action="policy.notified",
            payload=self._payload(result),
        )

    def verdict(self) -> PolicyVerdict:
        if self.stopped:
            return PolicyVerdict(stopped=self.stopped)
        name, reason = self.hold
        if not name and self.moment.is_side_effect and self.facts.hold_name:
            # A hold an earlier moment asked for takes this side effect.
            name, reason = self.facts.hold_name, self.facts.hold_reason
            self.facts.hold_name = self.facts.hold_reason = ""
            self.facts_changed = True
        if not name:
            return NO_VERDICT
        return PolicyVerdict(hold=reason, hold_name=name)


def _json_values(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items()}


# --------------------------------------------------------------------------------------------
# the checks runs calls


def _moment_at(
    run: Run,
    moment: Moment,
    *,
    now: datetime,
    reads: CheckReads,
    policies: PolicySet,
    facts_changed: bool = False,
) -> PolicyVerdict:
    """Evaluate `policies` at `moment` and act; save the run's facts if they moved
    (`facts_changed`: the caller already moved them)."""
    acting = _Acting(run, reads.facts, moment, now)
    if policies:
        live = LiveRun(run, reads, now)
        acting.apply(check(policies, agent=live.agent, moment=moment, run_value=live.value))
    verdict = acting.verdict()
    if acting.facts_changed or facts_changed:
        save_facts(reads.facts)
    return verdict


def _never_had_policies(reads: CheckReads) -> bool:
    """The team never had a policy: no version of its set was ever written (the first policy
    writes one, and a version is never removed). Such a team's checks keep no facts: the
    upsert of the facts row was a statement in every permit, result and outbox item of every
    team, most of which have no policy. Facts start with the team's first policy (a run's
    calls before it are not counted); a team whose policies were all deleted keeps its facts,
    so a policy created again never reads facts that stopped moving."""
    return not reads.version


def _reads(run: Run, read: Sequence[Any] | None) -> CheckReads:
    """What a check decides on: the row its transition read for it (`Checks.read`), or a read of
    its own."""
    return check_reads_of(run, read) if read is not None else read_for_checks(run)


class Checks(PolicyChecks):
    """One statement reads what a check needs (`read_for_checks`), the team's compiled policies
    come from this process's cache while their version holds (`team_policies`), and one
    statement writes the facts when they moved: 50 policies cost the statements 0 do."""

    def read(self, run_id: str) -> tuple[str, list[Any]] | None:
        return read_for_checks_statement(run_id) if sql.prepared_statements() else None

    def quiet(self, read: Sequence[Any] | None) -> bool:
        # The row of `read_for_checks_statement`: the policy set's version first.
        return read is not None and not read[0]

    def version_read(self, run_id: str) -> tuple[str, list[Any]] | None:
        return policy_version_statement(run_id) if sql.prepared_statements() else None

    def events_quiet(self, team_id: int, version: Sequence[Any] | None) -> bool:
        if version is None:
            return False
        # Never had a policy, or none of its policies is evaluated at a batch.
        return not version[0] or not team_policies(team_id, version[0]).batch

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
        reads = _reads(run, read)
        if _never_had_policies(reads):
            return NO_VERDICT
        facts = reads.facts
        aggregates.record_call(
            facts, tool=tool, arguments=arguments, side_effect=side_effect, at=now.timestamp()
        )
        moment = Moment(
            "tool.permit",
            tool=tool,
            arguments=arguments,
            side_effect=side_effect,
            destination_host=aggregates.call_host(arguments),
            repeats=facts.repeats,
            is_call=True,
        )
        policies = team_policies(run.team_id, reads.version).all
        return _moment_at(run, moment, now=now, reads=reads, policies=policies, facts_changed=True)

    def outbox(
        self, run: Run, *, transport: str, destination: str, payload: dict[str, Any], now: datetime
    ) -> PolicyVerdict:
        reads = read_for_checks(run)
        if _never_had_policies(reads):
            return NO_VERDICT
        aggregates.record_side_effect(reads.facts, at=now.timestamp())
        moment = Moment(
            "outbox.enqueue",
            tool=transport,
            arguments=payload,
            side_effect="write",
            destination_host=aggregates.host_of(destination),
            is_call=True,
        )
        policies = team_policies(run.team_id, reads.version).all
        return _moment_at(run, moment, now=now, reads=reads, policies=policies, facts_changed=True)

    def tool_result(
        self,
        run: Run,
        *,
        tool: str,
        execution_state: str,
        now: datetime,
        read: Sequence[Any] | None = None,
    ) -> None:
        reads = _reads(run, read)
        if _never_had_policies(reads):
            return
        aggregates.record_result(reads.facts, execution_state=execution_state)
        if run.status != RunStatus.RUNNING:
            save_facts(reads.facts)
            return
        policies = team_policies(run.team_id, reads.version).all
        moment = Moment("tool.result", tool=tool)
        _moment_at(run, moment, now=now, reads=reads, policies=policies, facts_changed=True)

    def events(
        self,
        run: Run,
        event_types: list[str],
        *,
        now: datetime,
        read: Sequence[Any] | None = None,
    ) -> None:
        """Each accepted type once, in batch order. A policy that does not read `event.type`
        sees the same values at every type of one batch, so it is evaluated at the first only."""
        types = list(dict.fromkeys(event_types))
        if not types:
            return
        reads = _reads(run, read)
        policies = team_policies(run.team_id, reads.version)
        if not policies.batch:
            return
        _moment_at(run, Moment(types[0][:40]), now=now, reads=reads, policies=policies.batch)
        for event_type in types[1:] if policies.batch_typed else ():
            if run.status != RunStatus.RUNNING:
                return
            moment = Moment(event_type[:40])
            _moment_at(run, moment, now=now, reads=reads, policies=policies.batch_typed)


def time_policies(team_id: int) -> PolicySet:
    return team_policies(team_id, policy_set_version(team_id)).time


def tick_run(run: Run, policies: PolicySet, *, now: datetime) -> None:
    """A periodic look at a running run, for rules of time (`run.elapsed_seconds`)."""
    if run.status == RunStatus.RUNNING and policies:
        _moment_at(run, Moment("tick"), now=now, reads=read_for_checks(run), policies=policies)
