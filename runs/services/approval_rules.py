"""Approval rules (DESIGN §10): a team admin's rules that hold matching tool calls and outbox
items for a reviewer. Create, update and delete, each validated and ledgered.

Rules are team configuration, not run state: no run row is locked, and the ledger entries are
global ones carrying the team's slug (`ledger_append(run=None, team_slug=...)`). A rule change
applies to permits and outbox items asked for after its commit; approvals already waiting keep
the rule's name and reason as they were (`Approval.rule_name`, `match_reason`).
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from runs.actors import Actor
from runs.errors import InvalidInput, NotFound
from runs.ledger import ledger_append
from runs.models import ApprovalAppliesTo, ApprovalRisk, ApprovalRule, SideEffect, Team
from runs.services.approval_gate import approval_rule_validate_glob
from runs.services.outbox import TRANSPORTS

# What a caller may set. Anything else is refused by name: a typo ("tool_name") must not
# silently make a rule that matches everything.
APPROVAL_RULE_FIELDS = (
    "name",
    "enabled",
    "position",
    "applies_to",
    "tool_glob",
    "side_effect",
    "agent_glob",
    "transport",
    "destination_glob",
    "risk",
    "timeout_seconds",
    "escalate_after_seconds",
)
_GLOBS = ("tool_glob", "agent_glob", "destination_glob")
# A day: an approval nobody can decide for longer than that is a queue, not a gate.
APPROVAL_TIMEOUT_MAX_SECONDS = 86_400
_CALL_ONLY = ("tool_glob", "side_effect")
_OUTBOX_ONLY = ("transport", "destination_glob")


def _clean_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Normalise and check each given field on its own (no cross-field rules here)."""
    unknown = sorted(set(fields) - set(APPROVAL_RULE_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    clean: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _GLOBS or name in ("name", "transport", "side_effect", "applies_to", "risk"):
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be text", field=name)
            value = value.strip()
        if name in _GLOBS:
            value = approval_rule_validate_glob(value, field=name)
        clean[name] = value
    if "name" in clean and not clean["name"]:
        raise InvalidInput("name is required", field="name")
    if "name" in clean and len(clean["name"]) > 120:
        raise InvalidInput("name: at most 120 characters", field="name")
    if "applies_to" in clean and clean["applies_to"] not in ApprovalAppliesTo.values:
        raise InvalidInput(
            f"applies_to must be one of {', '.join(ApprovalAppliesTo.values)}", field="applies_to"
        )
    # "write" holds only side-effecting calls; blank holds any call. ("none" would hold only
    # calls that change nothing, which no one means.)
    if "side_effect" in clean and clean["side_effect"] not in ("", SideEffect.WRITE):
        raise InvalidInput("side_effect must be 'write' or blank (any call)", field="side_effect")
    if "transport" in clean and clean["transport"] not in ("", *TRANSPORTS):
        raise InvalidInput(
            f"unknown transport {clean['transport']!r}: use one of {', '.join(TRANSPORTS)}",
            field="transport",
        )
    if "risk" in clean and clean["risk"] not in ApprovalRisk.values:
        raise InvalidInput(f"risk must be one of {', '.join(ApprovalRisk.values)}", field="risk")
    if "enabled" in clean and not isinstance(clean["enabled"], bool):
        raise InvalidInput("enabled must be true or false", field="enabled")
    for name in ("position", "timeout_seconds", "escalate_after_seconds"):
        if name not in clean or (name == "escalate_after_seconds" and clean[name] is None):
            continue
        value = clean[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInput(f"{name} must be a whole number", field=name)
    if "position" in clean and not 0 <= clean["position"] <= 1_000_000:
        raise InvalidInput("position must be between 0 and 1000000", field="position")
    if "timeout_seconds" in clean and not (
        1 <= clean["timeout_seconds"] <= APPROVAL_TIMEOUT_MAX_SECONDS
    ):
        raise InvalidInput(
            f"timeout_seconds must be between 1 and {APPROVAL_TIMEOUT_MAX_SECONDS}",
            field="timeout_seconds",
        )
    return clean


def _check_rule(rule: ApprovalRule) -> None:
    """The rule as a whole, after the changes: it must be able to match something."""
    after = rule.escalate_after_seconds
    if after is not None and not 1 <= after < rule.timeout_seconds:
        raise InvalidInput(
            "escalate_after_seconds must be at least 1 and less than timeout_seconds "
            f"({rule.timeout_seconds}): escalating after the deadline would reach no one in time",
            field="escalate_after_seconds",
        )
    # The matcher never lets a tool call meet an outbox criterion, or the reverse
    # (runs.services.approvals): such a rule would be saved and never hold anything.
    if rule.applies_to == ApprovalAppliesTo.TOOL_CALL:
        wrong = [name for name in _OUTBOX_ONLY if getattr(rule, name)]
        if wrong:
            raise InvalidInput(
                f"{wrong[0]}: a rule for tool calls cannot match an outbox transport or "
                "destination",
                field=wrong[0],
            )
    if rule.applies_to == ApprovalAppliesTo.OUTBOX:
        wrong = [name for name in _CALL_ONLY if getattr(rule, name)]
        if wrong:
            raise InvalidInput(
                f"{wrong[0]}: a rule for outbox items cannot match a tool name or side effect",
                field=wrong[0],
            )
    if any(getattr(rule, name) for name in _CALL_ONLY) and any(
        getattr(rule, name) for name in _OUTBOX_ONLY
    ):
        raise InvalidInput(
            "a rule matches either tool calls (tool, side effect) or outbox items (transport, "
            "destination), not both: make two rules",
            field="transport",
        )


def approval_rule_validate(**fields: Any) -> dict[str, Any]:
    """Check a whole rule without saving it (the Django admin's form asks before its save);
    returns the normalised fields. The same checks run again inside create and update."""
    clean = _clean_fields(fields)
    _check_rule(ApprovalRule(**clean))
    return clean


def _snapshot(rule: ApprovalRule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in APPROVAL_RULE_FIELDS}


def _save(rule: ApprovalRule, **kwargs: Any) -> None:
    """Save inside a savepoint: a duplicate name is a form error, not a broken transaction."""
    try:
        with transaction.atomic():
            rule.save(**kwargs)
    except IntegrityError:
        raise InvalidInput(
            f"team {rule.team.slug} already has a rule named {rule.name!r}", field="name"
        ) from None


def approval_rule_create(*, team_id: int, actor: Actor, **fields: Any) -> ApprovalRule:
    """A new rule for the team; its ledger entry records every field."""
    clean = _clean_fields(fields)
    if "name" not in clean:
        raise InvalidInput("name is required", field="name")
    with transaction.atomic():
        team = Team.objects.filter(pk=team_id).first()
        if team is None:
            raise NotFound(f"team {team_id} does not exist")
        rule = ApprovalRule(team=team, created_by=actor.name, **clean)
        _check_rule(rule)
        _save(rule)
        ledger_append(
            run=None,
            actor=actor,
            action="approval_rule.created",
            team_slug=team.slug,
            payload={"rule_id": rule.pk, **_snapshot(rule)},
        )
    return rule


def approval_rule_update(*, rule_id: int, actor: Actor, **fields: Any) -> ApprovalRule:
    """Change some fields of a rule; the ledger entry keeps each changed field's old and new
    value. Nothing changed: nothing is written."""
    clean = _clean_fields(fields)
    with transaction.atomic():
        # Locked: two admins saving at once each see the other's result, and each ledger
        # entry's "before" is what the row really held.
        rule = (
            ApprovalRule.objects.select_for_update(of=("self",))
            .select_related("team")
            .filter(pk=rule_id)
            .first()
        )
        if rule is None:
            raise NotFound(f"approval rule {rule_id} does not exist")
        before = _snapshot(rule)
        for name, value in clean.items():
            setattr(rule, name, value)
        changes = {
            name: {"from": before[name], "to": value}
            for name, value in _snapshot(rule).items()
            if value != before[name]
        }
        if not changes:
            return rule
        _check_rule(rule)
        _save(rule, update_fields=[*changes, "updated_at"])
        ledger_append(
            run=None,
            actor=actor,
            action="approval_rule.updated",
            team_slug=rule.team.slug,
            payload={"rule_id": rule.pk, "name": rule.name, "changes": changes},
        )
    return rule


def approval_rule_delete(*, rule_id: int, actor: Actor) -> None:
    """Delete a rule. Approvals it made keep its name and reason (their `rule` becomes null)."""
    with transaction.atomic():
        rule = (
            ApprovalRule.objects.select_for_update(of=("self",))
            .select_related("team")
            .filter(pk=rule_id)
            .first()
        )
        if rule is None:
            raise NotFound(f"approval rule {rule_id} does not exist")
        snapshot = {"rule_id": rule.pk, **_snapshot(rule)}
        team_slug = rule.team.slug
        rule.delete()
        ledger_append(
            run=None,
            actor=actor,
            action="approval_rule.deleted",
            team_slug=team_slug,
            payload=snapshot,
        )
