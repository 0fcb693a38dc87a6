"""Policies as team configuration (DESIGN §14): create, update and delete, each validated
(the expression compiled and type-checked against the context) and ledgered.

Like approval rules these lock no run: the ledger entries are global ones carrying the team's
slug. Each writes a new version of the team's policy set in its own transaction
(`policies_changed`), so the next check after its commit, in any process, drops its cached
compile of the set; runs in flight see the new expression at their next fact.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from policies.history import MAX_DAYS, SYNC_EVENTS_MAX, events_count, history_test
from policies.language import ExpressionError, compile_expression
from policies.models import (
    Policy,
    PolicyAction,
    PolicyMode,
    PolicyOnError,
    PolicyTest,
    PolicyTestStatus,
)
from policies.reads import policies_changed
from runs.actors import Actor
from runs.errors import InvalidInput, NotFound
from runs.ledger import ledger_append
from runs.models import Team
from runs.services.approval_gate import approval_rule_validate_glob

POLICY_FIELDS = (
    "name",
    "description",
    "expression",
    "action",
    "mode",
    "on_error",
    "agent_glob",
    "tool_glob",
    "enabled",
)
_TEXT = tuple(name for name in POLICY_FIELDS if name != "enabled")
_CHOICES = {
    "action": PolicyAction.values,
    "mode": PolicyMode.values,
    "on_error": PolicyOnError.values,
}
_MAX = {"name": 120, "description": 500, "agent_glob": 200, "tool_glob": 200}


def expression_check(text: str) -> None:
    """Refuse an expression that does not compile to a boolean, at the field, with the line
    and column of the first error."""
    try:
        compile_expression(text)
    except ExpressionError as error:
        raise InvalidInput(
            f"expression: {error}", field="expression", line=error.line, column=error.column
        ) from None


def _clean_fields(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(POLICY_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    clean: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _TEXT:
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be text", field=name)
            value = value if name == "expression" else value.strip()
            if "\x00" in value:
                raise InvalidInput(f"{name}: NUL is not allowed", field=name)
            if name in _MAX and len(value) > _MAX[name]:
                raise InvalidInput(f"{name}: at most {_MAX[name]} characters", field=name)
        if name in ("agent_glob", "tool_glob"):
            value = approval_rule_validate_glob(value, field=name) or "*"
        if name in _CHOICES and value not in _CHOICES[name]:
            raise InvalidInput(f"{name} must be one of {', '.join(_CHOICES[name])}", field=name)
        if name == "enabled" and not isinstance(value, bool):
            raise InvalidInput("enabled must be true or false", field="enabled")
        clean[name] = value
    if "name" in clean and not clean["name"]:
        raise InvalidInput("name is required", field="name")
    if "expression" in clean:
        expression_check(clean["expression"])
    return clean


def policy_validate(**fields: Any) -> dict[str, Any]:
    """Check fields without saving (the console's form); returns them normalised."""
    return _clean_fields(fields)


def _snapshot(policy: Policy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def _save(policy: Policy, **kwargs: Any) -> None:
    try:
        with transaction.atomic():
            policy.save(**kwargs)
    except IntegrityError:
        raise InvalidInput(
            f"team {policy.team.slug} already has a policy named {policy.name!r}", field="name"
        ) from None


def _locked_policy(policy_id: int) -> Policy:
    policy = (
        Policy.objects.select_for_update(of=("self",))
        .select_related("team")
        .filter(pk=policy_id)
        .first()
    )
    if policy is None:
        raise NotFound(f"policy {policy_id} does not exist")
    return policy


def policy_create(*, team_id: int, actor: Actor, **fields: Any) -> Policy:
    clean = _clean_fields(fields)
    for required in ("name", "expression", "action"):
        if required not in clean:
            raise InvalidInput(f"{required} is required", field=required)
    with transaction.atomic():
        team = Team.objects.filter(pk=team_id).first()
        if team is None:
            raise NotFound(f"team {team_id} does not exist")
        policy = Policy(team=team, created_by=actor.name[:150], **clean)
        _save(policy)
        policies_changed(team.pk)
        ledger_append(
            run=None,
            actor=actor,
            action="policy.created",
            team_slug=team.slug,
            payload={"policy_id": policy.pk, **_snapshot(policy)},
        )
    return policy


def policy_update(*, policy_id: int, actor: Actor, **fields: Any) -> Policy:
    """Change some fields; the ledger keeps each changed field's old and new value."""
    clean = _clean_fields(fields)
    with transaction.atomic():
        policy = _locked_policy(policy_id)
        before = _snapshot(policy)
        for name, value in clean.items():
            setattr(policy, name, value)
        changes = {
            name: {"from": before[name], "to": value}
            for name, value in _snapshot(policy).items()
            if value != before[name]
        }
        if not changes:
            return policy
        if "expression" in changes:
            # A new expression starts with a clean error record.
            policy.last_error, policy.last_error_at = "", None
            changes_fields = [*changes, "last_error", "last_error_at", "updated_at"]
        else:
            changes_fields = [*changes, "updated_at"]
        _save(policy, update_fields=changes_fields)
        policies_changed(policy.team_id)
        ledger_append(
            run=None,
            actor=actor,
            action="policy.updated",
            team_slug=policy.team.slug,
            payload={"policy_id": policy.pk, "name": policy.name, "changes": changes},
        )
    return policy


def policy_delete(*, policy_id: int, actor: Actor) -> None:
    """Delete a policy; its hits keep its name and expression."""
    with transaction.atomic():
        policy = _locked_policy(policy_id)
        snapshot = {"policy_id": policy.pk, **_snapshot(policy)}
        team_slug = policy.team.slug
        policy.delete()
        policies_changed(policy.team_id)
        ledger_append(
            run=None, actor=actor, action="policy.deleted", team_slug=team_slug, payload=snapshot
        )


# --------------------------------------------------------------------------------------------
# test against history


def policy_test(
    *,
    team: Team,
    actor: Actor,
    expression: str,
    days: int = 7,
    agent_glob: str = "*",
    tool_glob: str = "*",
) -> dict[str, Any] | PolicyTest:
    """Replay the team's last `days` of recorded events through `expression`: the answer at
    once up to `SYNC_EVENTS_MAX` events, else a queued `PolicyTest` run in the background."""
    expression_check(expression)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise InvalidInput(f"days must be a whole number from 1 to {MAX_DAYS}", field="days")
    agent_glob = approval_rule_validate_glob(agent_glob or "*", field="agent_glob") or "*"
    tool_glob = approval_rule_validate_glob(tool_glob or "*", field="tool_glob") or "*"
    total = events_count(team_id=team.pk, days=days)
    if total <= SYNC_EVENTS_MAX:
        return history_test(
            team_id=team.pk,
            team_slug=team.slug,
            expression=expression,
            days=days,
            agent_glob=agent_glob,
            tool_glob=tool_glob,
        )
    test = PolicyTest.objects.create(
        team=team,
        requested_by=actor.name[:150],
        expression=expression,
        days=days,
        agent_glob=agent_glob,
        tool_glob=tool_glob,
        total=total,
    )
    transaction.on_commit(lambda: policy_test_soon(test.pk))
    return test


def policy_test_soon(test_id: int) -> None:
    """Run a queued test outside the request: a Celery task when Celery does the background
    work, else a thread of this process (the embedded default has no worker)."""
    from runs.background import background_runs_in_process

    if background_runs_in_process():
        import threading

        threading.Thread(
            target=_policy_test_in_thread, args=(test_id,), daemon=True, name="policy-test"
        ).start()
    else:
        from policies.tasks import history_test_task

        history_test_task.delay(test_id)


def _policy_test_in_thread(test_id: int) -> None:
    from django.db import close_old_connections

    try:
        policy_test_run(test_id)
    finally:
        close_old_connections()


def policy_test_run(test_id: int) -> PolicyTest | None:
    """Run a queued test, recording progress as it goes; its result (or error) at the end."""
    test = PolicyTest.objects.select_related("team").filter(pk=test_id).first()
    if test is None or test.status != PolicyTestStatus.QUEUED:
        return test
    PolicyTest.objects.filter(pk=test_id).update(status=PolicyTestStatus.RUNNING)

    def progress(done: int, total: int) -> None:
        PolicyTest.objects.filter(pk=test_id).update(done=done, total=total)

    try:
        result = history_test(
            team_id=test.team_id,
            team_slug=test.team.slug,
            expression=test.expression,
            days=test.days,
            agent_glob=test.agent_glob,
            tool_glob=test.tool_glob,
            progress=progress,
        )
    except Exception as error:  # a failed test is reported on the test, not lost in a log
        PolicyTest.objects.filter(pk=test_id).update(
            status=PolicyTestStatus.FAILED, error=str(error)[:2000], finished_at=timezone.now()
        )
    else:
        PolicyTest.objects.filter(pk=test_id).update(
            status=PolicyTestStatus.DONE,
            result=result,
            done=result["events"],
            total=result["events"],
            finished_at=timezone.now(),
        )
    return PolicyTest.objects.filter(pk=test_id).first()
