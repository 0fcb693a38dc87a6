"""Small input serializers (validate only, never save) and output serializers per answer.

Bounds are the database's: every string fits its column, every integer its column type, so no
input can reach the database and fail there (a 500) instead of being refused here (a 400).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from api.fields import (
    JSONObjectOrNullField,
    JSONValueField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
)
from api.permissions import API_STOP_REASONS
from handoff.models import ResolutionDecision
from runs import selectors as run_selectors
from runs import services
from runs.models import (
    Approval,
    ApprovalAppliesTo,
    ApprovalRisk,
    ApprovalStatus,
    ApprovalTarget,
    BulkStopOutcome,
    ExecutionState,
    RecoveryPolicy,
    RemoteCancelState,
    RunStatus,
    SideEffect,
    StepKind,
)
from runs.services.approval_rules import APPROVAL_TIMEOUT_MAX_SECONDS

INT32_MAX = 2**31 - 1  # PositiveIntegerField is `integer` on PostgreSQL
INT64_MAX = 2**63 - 1
MAX_EVENTS_PER_BATCH = 500
MAX_OBSERVATIONS = 200
MAX_PLANNED_STEPS = 500
RESULT_STATES = [
    ExecutionState.RUNNING,
    ExecutionState.SUCCEEDED,
    ExecutionState.FAILED,
    ExecutionState.NOT_STARTED,
    ExecutionState.UNKNOWN,
]


def epoch_field(**kwargs: Any) -> StrictIntegerField:
    return StrictIntegerField(min_value=0, max_value=INT32_MAX, **kwargs)


class AnyJSONField(serializers.JSONField):
    """Any JSON value (object, array, string, number, boolean, null)."""


# ---------------------------------------------------------------------------------------------
# errors


def refuse_unknown_fields(
    serializer: serializers.Serializer, attrs: dict[str, Any]
) -> dict[str, Any]:
    """A 400 naming the first field the body has and the serializer lacks: a typo ("tool_name")
    must not silently make a rule that matches everything, or a budget nobody set."""
    given = serializer.initial_data if isinstance(serializer.initial_data, dict) else {}
    unknown = sorted(set(given) - set(serializer.fields))
    if unknown:
        raise serializers.ValidationError(
            {unknown[0]: f"unknown field: the fields are {', '.join(serializer.fields)}"}
        )
    return attrs


class ErrorSerializer(serializers.Serializer):
    error = StrictCharField(help_text="stable machine-readable code, e.g. stale_epoch")
    detail = StrictCharField()
    field = StrictCharField(required=False, help_text="the first bad field (400 only)")
    status = serializers.ChoiceField(
        choices=RunStatus.choices, required=False, help_text="the run's current status (409)"
    )
    stop_epoch = StrictIntegerField(required=False, help_text="the run's current epoch (409)")
    errors = AnyJSONField(required=False, help_text="every field error (400 only)")  # type: ignore[assignment]


class PermitRefusalOut(ErrorSerializer):
    """A permit's 409. `tool_call_conflict` names what the id was first asked for."""

    tool_call_id = StrictCharField(
        required=False, help_text="tool_call_conflict: the id that names another call"
    )
    first_tool = StrictCharField(
        required=False, help_text="tool_call_conflict: the tool the id was first asked for"
    )
    first_arguments = AnyJSONField(
        required=False, help_text="tool_call_conflict: the arguments the id was first asked with"
    )


# ---------------------------------------------------------------------------------------------
# runs


class PlannedStepIn(serializers.Serializer):
    key = StrictCharField(max_length=120)
    name = StrictCharField(max_length=300, required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(
        choices=StepKind.choices, required=False, default=StepKind.MODEL_CALL
    )


class BudgetIn(serializers.Serializer):
    max_seconds = StrictIntegerField(
        min_value=1, max_value=INT32_MAX, required=False, allow_null=True
    )
    max_tool_calls = StrictIntegerField(
        min_value=0, max_value=INT32_MAX, required=False, allow_null=True
    )
    max_cost_usd = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        allow_null=True,
        help_text="USD; the run is stopped (budget_exhausted) once its cost reaches it",
    )
    max_tokens = StrictIntegerField(
        min_value=1,
        max_value=INT64_MAX,
        required=False,
        allow_null=True,
        help_text="input + output tokens; the run is stopped (budget_exhausted) once it reaches it",
    )


class RunCreateIn(serializers.Serializer):
    title = StrictCharField(max_length=300)
    agent = StrictCharField(max_length=120)
    steps = PlannedStepIn(many=True, required=False, max_length=MAX_PLANNED_STEPS)  # type: ignore[call-arg]
    budget = BudgetIn(required=False)
    idempotency_key = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="client id of this create: a retry returns the first run (200)",
    )

    def validate_steps(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keys = [step["key"] for step in steps]
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise serializers.ValidationError(
                f"step keys must be unique; repeated: {', '.join(duplicates)}"
            )
        return steps


class RunListQuery(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False)


class BudgetOut(serializers.Serializer):
    max_seconds = StrictIntegerField(allow_null=True)
    max_tool_calls = StrictIntegerField(allow_null=True)
    tool_calls_used = StrictIntegerField(source="tool_calls_count")
    max_cost_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, coerce_to_string=False, allow_null=True
    )
    max_tokens = StrictIntegerField(allow_null=True)


class TokensOut(serializers.Serializer):
    input = StrictIntegerField(source="input_tokens")
    output = StrictIntegerField(source="output_tokens")
    total = serializers.SerializerMethodField()

    def get_total(self, run: Any) -> int:
        return int(run.input_tokens + run.output_tokens)


class RunOut(serializers.Serializer):
    id = StrictCharField()
    title = StrictCharField()
    agent = StrictCharField()
    team = StrictCharField(source="team.slug")
    status = serializers.ChoiceField(choices=RunStatus.choices)
    stop_epoch = StrictIntegerField()
    stop_reason = serializers.SerializerMethodField()
    stop_requested_by = serializers.SerializerMethodField()
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)
    resume_from = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()
    late_writes_rejected = StrictIntegerField()
    cost_usd = serializers.DecimalField(
        max_digits=20,
        decimal_places=10,
        coerce_to_string=False,
        help_text="USD spent by the priced calls; `unpriced_tokens` are not in it",
    )
    tokens = serializers.SerializerMethodField()
    unpriced_tokens = StrictIntegerField(
        help_text="input + output tokens of calls no price was found for (their cost is unknown)"
    )
    created_by = StrictCharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_stop_reason(self, run: Any) -> str | None:
        return run.stop_reason or None

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_stop_requested_by(self, run: Any) -> str | None:
        return run.stop_requested_by or None

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_resume_from(self, run: Any) -> str | None:
        return run.resume_from or None

    @extend_schema_field(BudgetOut)
    def get_budget(self, run: Any) -> dict[str, Any]:
        return BudgetOut(run).data

    @extend_schema_field(TokensOut)
    def get_tokens(self, run: Any) -> dict[str, Any]:
        return TokensOut(run).data


class RunDetailOut(RunOut):
    """One run, with how it ended: the agent's `run.completed` result or `run.failed` error."""

    result = serializers.JSONField(
        allow_null=True, help_text="what the agent gave `run.complete(...)`; null until completed"
    )
    failure = serializers.JSONField(
        allow_null=True, help_text="what the agent gave `run.fail(...)`; null unless it failed"
    )


class RunPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RunOut(many=True)


# ---------------------------------------------------------------------------------------------
# leases


class LeaseAcquireIn(serializers.Serializer):
    worker_id = StrictCharField(max_length=120)
    ttl_seconds = StrictFloatField(min_value=1, max_value=3600, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("ttl_seconds", settings.SAFESTOP_DEFAULT_LEASE_TTL)
        return attrs


class LeaseIn(serializers.Serializer):
    lease_id = StrictCharField(max_length=64)
    epoch = epoch_field()


class LeaseReleaseIn(LeaseIn):
    suspend = StrictBooleanField(
        required=False,
        default=False,
        help_text="Suspend the run instead of interrupting it: the worker stops on purpose to "
        "wait for reviewers. Waiting approvals stay open and may be decided while no process "
        "holds the run; the next lease (same epoch) picks the decisions up. Refused (409) "
        "while tool calls are in flight.",
    )
    reason = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="Why the run is suspended (default `waiting_for_approval`).",
    )


class LeaseOut(serializers.Serializer):
    lease_id = StrictCharField(source="token")
    epoch = StrictIntegerField()
    expires_at = serializers.DateTimeField()
    worker_id = StrictCharField()
    ttl_seconds = StrictFloatField()


class StopSignalOut(serializers.Serializer):
    type = serializers.ChoiceField(choices=["cancel_requested"])
    reason = StrictCharField()
    requested_by = StrictCharField()
    stop_epoch = StrictIntegerField()
    stop_request_id = StrictIntegerField()
    requested_at = serializers.DateTimeField()


class HeartbeatOut(serializers.Serializer):
    lease_id = StrictCharField()
    epoch = StrictIntegerField()
    expires_at = serializers.DateTimeField()
    signal = StopSignalOut(
        allow_null=True, help_text="null, or the stop request: stop starting work and drain"
    )


class LeaseReleaseOut(serializers.Serializer):
    lease_id = StrictCharField()
    released_at = serializers.DateTimeField(allow_null=True)
    release_reason = StrictCharField()
    status = serializers.ChoiceField(
        choices=RunStatus.choices, help_text="the run's status after the release"
    )
    stop_epoch = StrictIntegerField()


# ---------------------------------------------------------------------------------------------
# approvals (DESIGN §10)

MAX_APPROVAL_SUMMARY = 2000
MAX_APPROVAL_MESSAGE = 4000
APPROVAL_DECISIONS = ["approve", "reject"]
APPROVAL_LIST_STATUSES = [*ApprovalStatus.values, "all"]


def json_kind(value: Any) -> str:
    """How a JSON value is named in an error: "an array", "a string", ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "null"


class ApprovalAskIn(serializers.Serializer):
    """What a permit or an outbox item may add to ask for (or describe) a review."""

    needs_approval = StrictBooleanField(
        required=False,
        default=False,
        help_text="hold this for a reviewer even if no team rule matches",
    )
    summary = StrictCharField(
        max_length=MAX_APPROVAL_SUMMARY,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="for the reviewer: what this does and why",
    )
    risk = serializers.ChoiceField(
        choices=ApprovalRisk.choices,
        required=False,
        allow_blank=True,
        default="",
        help_text="the agent's estimate; blank: the matching rule's (medium when none)",
    )
    arguments_schema = JSONObjectOrNullField(
        required=False,
        allow_null=True,
        default=None,
        help_text="a JSON Schema (object) that a reviewer's edited arguments must match",
    )

    def validate_arguments_schema(self, schema: Any) -> dict[str, Any] | None:
        # The schema itself is checked by the service, before its lock: a refusal there has
        # its own code (`schema_remote_ref`, `schema_ref_loop`, ...; runs.argument_schemas).
        if schema is not None and not isinstance(schema, dict):
            raise serializers.ValidationError("must be a JSON Schema object")
        return schema


class _ApprovalFields(serializers.Serializer):
    """What the detail and the list both say about an approval (all but its arguments)."""

    id = StrictCharField(source="public_id", help_text="appr_<n>")
    run_id = StrictCharField()
    team = StrictCharField(source="team.slug")
    agent = StrictCharField()
    epoch = StrictIntegerField(help_text="the run's epoch when it was requested")
    target = serializers.ChoiceField(choices=ApprovalTarget.choices)
    tool_call_id = serializers.SerializerMethodField()
    outbox_id = serializers.SerializerMethodField()
    tool = StrictCharField(
        source="subject", help_text='the tool, or "<transport> → <destination>" for an item'
    )
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    rule = serializers.SerializerMethodField()
    match_reason = StrictCharField(help_text="why it is held, in words")
    summary = StrictCharField()
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices)
    edited = StrictBooleanField()
    message = StrictCharField(help_text="the reviewer's message to the agent")
    decided_by = serializers.SerializerMethodField()
    decided_at = serializers.DateTimeField(allow_null=True)
    requested_at = serializers.DateTimeField()
    deadline = serializers.DateTimeField()
    escalated_at = serializers.DateTimeField(allow_null=True)
    permit_id = serializers.SerializerMethodField()

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_tool_call_id(self, approval: Approval) -> str | None:
        record = approval.execution_record
        return record.tool_call_id if record is not None else None

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_outbox_id(self, approval: Approval) -> str | None:
        item = approval.outbox_item
        return item.public_id if item is not None else None

    @extend_schema_field(
        StrictCharField(
            allow_null=True, help_text="the team rule that matched; null when the agent asked"
        )
    )
    def get_rule(self, approval: Approval) -> str | None:
        return approval.rule_name or None

    @extend_schema_field(StrictCharField(allow_null=True))
    def get_decided_by(self, approval: Approval) -> str | None:
        return approval.decided_by or None

    @extend_schema_field(
        StrictCharField(allow_null=True, help_text="set once a tool call's approval is approved")
    )
    def get_permit_id(self, approval: Approval) -> str | None:
        if approval.status != ApprovalStatus.APPROVED or approval.execution_record is None:
            return None
        return approval.execution_record.permit_id


class ApprovalOut(_ApprovalFields):
    """One approval (DESIGN §10): the held call or item, its arguments whole, its decision."""

    original_arguments = AnyJSONField()
    arguments = AnyJSONField(help_text="the final arguments: the originals until edited")
    arguments_schema = serializers.JSONField(allow_null=True)


class ApprovalListItemOut(_ApprovalFields):
    """An approval in a list: its arguments summarised (`runs.selectors.approvals_summarised`);
    GET /api/v1/approvals/{id}/ has them whole."""

    arguments_summary = serializers.SerializerMethodField()
    arguments_chars = StrictIntegerField(
        help_text="the length of the final arguments' JSON text, in characters"
    )
    arguments_truncated = serializers.SerializerMethodField()
    has_arguments_schema = StrictBooleanField()

    @extend_schema_field(
        StrictCharField(
            help_text="the start of the final arguments' JSON text (at most "
            "SAFESTOP_API_LIST_ARGUMENTS_CHARS characters, 300 by default)"
        )
    )
    def get_arguments_summary(self, approval: Approval) -> str:
        return approval.arguments_head[: settings.SAFESTOP_API_LIST_ARGUMENTS_CHARS]  # type: ignore[attr-defined, no-any-return]

    @extend_schema_field(StrictBooleanField(help_text="true when the summary is cut short"))
    def get_arguments_truncated(self, approval: Approval) -> bool:
        return bool(approval.arguments_chars > settings.SAFESTOP_API_LIST_ARGUMENTS_CHARS)  # type: ignore[attr-defined]


class ApprovalListQuery(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=APPROVAL_LIST_STATUSES,
        required=False,
        default=ApprovalStatus.WAITING,
        help_text="default waiting; `all` for every status",
    )
    run = StrictCharField(max_length=32, required=False, help_text="a run id")
    agent = StrictCharField(max_length=120, required=False)
    tool = StrictCharField(
        max_length=300, required=False, help_text="part of the tool name (or item destination)"
    )
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices, required=False)


class ApprovalPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = ApprovalListItemOut(many=True)


class ApprovalDecideIn(serializers.Serializer):
    decision = serializers.ChoiceField(
        choices=APPROVAL_DECISIONS,
        error_messages={
            "invalid_choice": 'decision must be "approve" or "reject", not "{input}"',
        },
    )
    message = StrictCharField(
        max_length=MAX_APPROVAL_MESSAGE,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="goes back to the agent (why it was rejected, what was changed)",
    )
    arguments = JSONObjectOrNullField(
        required=False,
        allow_null=True,
        default=None,
        help_text="approve only: the edited arguments (an object; checked against the "
        "approval's arguments_schema). Omit to approve the originals.",
    )

    def validate_arguments(self, arguments: Any) -> dict[str, Any] | None:
        if arguments is not None and not isinstance(arguments, dict):
            raise serializers.ValidationError(
                f"the edited arguments must be a JSON object, not {json_kind(arguments)}"
            )
        return arguments

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["decision"] == "reject" and attrs.get("arguments") is not None:
            raise serializers.ValidationError(
                {"arguments": "a rejection carries a message, not arguments"}
            )
        return attrs


# ---------------------------------------------------------------------------------------------
# tool calls


class PermitIn(ApprovalAskIn):
    epoch = epoch_field()
    tool_call_id = StrictCharField(max_length=120)
    tool = StrictCharField(max_length=120)
    side_effect = serializers.ChoiceField(
        choices=SideEffect.choices, required=False, default=SideEffect.NONE
    )
    arguments = JSONValueField(required=False, default=dict)
    idempotency_key = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    operation_id = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    recovery_policy = serializers.ChoiceField(
        choices=RecoveryPolicy.choices, required=False, allow_blank=True, default=""
    )
    step_key = StrictCharField(max_length=120, required=False, allow_blank=True, default="")


@extend_schema_field(ApprovalOut)
class ApprovalFromContext(serializers.Field):
    """The approval a call or item went through, passed in the serializer's context by the view
    (it knows when there cannot be one, and so saves the query); left out when there is none."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(source="*", **kwargs)

    def get_attribute(self, instance: Any) -> Any:
        approval = self.context.get("approval")
        if approval is None:
            raise serializers.SkipField()
        return approval

    def to_representation(self, approval: Approval) -> dict[str, Any]:
        return dict(ApprovalOut(approval).data)


class PermitOut(serializers.Serializer):
    permit_id = serializers.SerializerMethodField()
    tool_call_id = StrictCharField()
    epoch = StrictIntegerField(source="permit_epoch")
    tool = StrictCharField()
    side_effect = StrictCharField()
    execution_state = StrictCharField()
    idempotency_key = StrictCharField()
    arguments = AnyJSONField(help_text="the final arguments: run these (a reviewer may edit them)")
    approval = ApprovalFromContext(help_text="when the call went through an approval")

    def get_permit_id(self, record: Any) -> str:
        return str(record.permit_id)


class PermitWaitingOut(serializers.Serializer):
    """202: the call waits for a reviewer. There is no permit yet: do not start the call."""

    tool_call_id = StrictCharField()
    epoch = StrictIntegerField(source="permit_epoch")
    approval = ApprovalFromContext(required=True)


class ToolResultIn(serializers.Serializer):
    execution_state = serializers.ChoiceField(choices=RESULT_STATES)
    operation_id = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    observation = StrictCharField(
        max_length=100_000, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    output_truncated = StrictBooleanField(required=False, default=False)
    remote_cancel_state = serializers.ChoiceField(
        choices=RemoteCancelState.choices, required=False, allow_blank=True, default=""
    )
    recovery_action = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class ToolCallOut(serializers.Serializer):
    tool_call_id = StrictCharField()
    tool = StrictCharField()
    execution_state = StrictCharField()
    side_effect = StrictCharField()
    side_effect_state = StrictCharField()
    remote_cancel_state = StrictCharField()
    operation_id = StrictCharField()
    output_truncated = StrictBooleanField()
    reported_after_stop = StrictBooleanField()
    permit_epoch = StrictIntegerField()


# ---------------------------------------------------------------------------------------------
# events


class EventIdentityIn(serializers.Serializer):
    """What every event of a batch must carry, or the batch is a 400: no answer could name it.
    Every other field is checked per event (a bad one is that event's `rejected`, `invalid`)."""

    event_id = StrictCharField(max_length=120)
    type = StrictCharField(max_length=40)


class EventIn(EventIdentityIn):
    """One event. Type-specific fields (key, name, kind, label, state, result, error, ...) pass
    through to the run; the few that land in bounded columns are checked here."""

    step_seq = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True)
    steering_id = StrictIntegerField(
        min_value=1, max_value=INT64_MAX, required=False, allow_null=True
    )


@extend_schema_field(EventIdentityIn)
class EventItemField(serializers.JSONField):
    """One event as the batch receives it: an object whose identity the batch checks; its
    other fields (any, see EventIn) are checked by the event's own answer."""


class EventsIn(serializers.Serializer):
    epoch = epoch_field()
    events = serializers.ListField(
        child=EventItemField(),
        max_length=MAX_EVENTS_PER_BATCH,
        help_text=f"at most {MAX_EVENTS_PER_BATCH} events, each {{event_id, type, ...}}",
    )

    def validate_events(self, events: list[Any]) -> list[Any]:
        # The identity of every event must be sound, or no answer could name it: that is a
        # 400 for the batch. Anything else wrong with one event is that event's `rejected`.
        errors: list[Any] = []
        for event in events:
            if not isinstance(event, dict):
                errors.append({"non_field_errors": ["each event must be an object"]})
                continue
            identity = EventIdentityIn(
                data={key: event[key] for key in ("event_id", "type") if key in event}
            )
            errors.append({} if identity.is_valid() else identity.errors)
        if any(errors):
            raise serializers.ValidationError(errors)
        return events


class EventAnswerOut(serializers.Serializer):
    event_id = StrictCharField()
    status = serializers.ChoiceField(choices=["accepted", "duplicate", "rejected"])
    code = StrictCharField(required=False, help_text="why it was rejected, e.g. stale_epoch")
    detail = StrictCharField(required=False)


class EventsOut(serializers.Serializer):
    results = EventAnswerOut(many=True)
    accepted = StrictIntegerField()
    duplicate = StrictIntegerField()
    rejected = StrictIntegerField()


# ---------------------------------------------------------------------------------------------
# outbox, drain


class OutboxIn(ApprovalAskIn):
    epoch = epoch_field()
    transport = serializers.ChoiceField(choices=["webhook", "email"])
    destination = StrictCharField(max_length=500)
    payload = JSONValueField(required=False, default=dict)
    idempotency_key = StrictCharField(max_length=200)
    tool_call_id = StrictCharField(max_length=120, required=False, allow_blank=True, default="")


class OutboxOut(serializers.Serializer):
    id = StrictCharField(source="public_id")
    status = StrictCharField(help_text="awaiting_approval while a reviewer decides")
    idempotency_key = StrictCharField()
    transport = StrictCharField()
    destination = StrictCharField()
    enqueue_epoch = StrictIntegerField()
    approval = ApprovalFromContext(help_text="when the item waits for (or went through) one")


class ObservationIn(serializers.Serializer):
    # Both optional: a drain report also carries observations that are not a tool call's
    # outcome (safestop_agent sends `{"kind": "stop_seen", ...}` and already-reported calls
    # without a state); the service applies only those that name a call and a state.
    tool_call_id = StrictCharField(max_length=120, required=False, allow_blank=True, default="")
    execution_state = serializers.ChoiceField(
        choices=RESULT_STATES, required=False, allow_blank=True, default=""
    )
    operation_id = StrictCharField(max_length=200, required=False, allow_blank=True, default="")
    observation = StrictCharField(
        max_length=10_000, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    output_truncated = StrictBooleanField(required=False, default=False)
    remote_cancel_state = serializers.ChoiceField(
        choices=RemoteCancelState.choices, required=False, allow_blank=True, default=""
    )
    recovery_action = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class DrainedIn(serializers.Serializer):
    lease_id = StrictCharField(max_length=64)
    epoch = epoch_field(help_text="the lease's epoch (not the new stop epoch)")
    observations = ObservationIn(many=True, required=False, max_length=MAX_OBSERVATIONS)  # type: ignore[call-arg]
    stop_epoch = epoch_field(
        required=False, help_text="informational: the stop epoch the worker saw"
    )


# ---------------------------------------------------------------------------------------------
# stop and reviewer actions


class StopIn(serializers.Serializer):
    reason = serializers.ChoiceField(choices=API_STOP_REASONS, required=False, default="user_stop")
    note = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class NoteIn(serializers.Serializer):
    note = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class ResumeIn(NoteIn):
    checkpoint = StrictCharField(max_length=120, required=False, allow_blank=True, default="")
    carry_over_steering = StrictBooleanField(required=False, default=False)


class StopRequestOut(serializers.Serializer):
    id = StrictIntegerField(source="pk")
    reason = StrictCharField()
    requested_by = StrictCharField()
    requested_at = serializers.DateTimeField()
    note = StrictCharField()
    takeover = StrictBooleanField()


class StopOut(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices)
    stop_epoch = StrictIntegerField()
    created = StrictBooleanField(help_text="false when this repeats an earlier stop")
    stop_request = StopRequestOut()


class BulkStopIn(serializers.Serializer):
    """DESIGN §12. Every filter field given must match; at least one, or `all`."""

    agent = StrictCharField(max_length=120, required=False, allow_blank=True, default="")
    team = StrictCharField(
        max_length=64, required=False, allow_blank=True, default="", help_text="team slug"
    )
    status = serializers.ChoiceField(
        choices=RunStatus.choices, required=False, allow_blank=True, default=""
    )
    tool = StrictCharField(
        max_length=120,
        required=False,
        allow_blank=True,
        default="",
        help_text="runs with a tool call of this tool (exact name)",
    )
    ids = serializers.ListField(
        child=StrictCharField(
            max_length=32,
            trim_whitespace=False,  # " run_1" is not a run id, as the service says
            validators=[RegexValidator(services.RUN_ID_PATTERN, message="not a run id")],
        ),
        required=False,
        default=list,
        max_length=services.MAX_BULK_IDS,
        help_text="explicit run ids; an id that is not yours or does not exist is `not_found`",
    )
    all = StrictBooleanField(
        required=False,
        default=False,
        help_text="the kill switch: every run of your teams (an empty filter is refused)",
    )
    reason = serializers.ChoiceField(
        choices=services.BULK_STOP_REASONS, required=False, default="user_stop"
    )
    note = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")
    dry_run = StrictBooleanField(
        required=False, default=False, help_text="answer the preview; stop nothing"
    )
    idempotency_key = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="client id of this bulk stop: a retry answers the first one (200)",
    )
    confirm = StrictBooleanField(
        required=False,
        default=False,
        help_text="needed to stop more than the limit (10,000 runs) at once",
    )
    preview_id = StrictCharField(
        max_length=32,
        required=False,
        allow_blank=True,
        default="",
        help_text="the dry run's `preview_id`: stop exactly the runs that preview listed (the "
        "filter fields are then taken from the preview); runs that began to match since are "
        "counted in `new_since_preview`, not stopped. Without it the filter's set at this moment "
        "is stopped.",
    )


class BulkPreviewOut(serializers.Serializer):
    dry_run = StrictBooleanField(default=True)
    matching = StrictIntegerField(help_text="runs the filter selects, in any state")
    by_status = serializers.DictField(child=StrictIntegerField())
    will_stop = StrictIntegerField()
    already_stopping = StrictIntegerField()
    already_stopped = StrictIntegerField(help_text="stopped cleanly or dirty, handed off")
    already_finished = StrictIntegerField(help_text="left alone unless named in `ids`")
    not_allowed = StrictIntegerField()
    not_allowed_because = serializers.ListField(child=StrictCharField(), source="refusals")
    not_found = serializers.ListField(child=StrictCharField())
    limit = StrictIntegerField()
    needs_confirm = StrictBooleanField()
    preview_id = StrictCharField(
        help_text="name it in the confirm (`preview_id`) to stop exactly the runs in `ids`"
    )
    ids = serializers.SerializerMethodField(
        help_text="the runs a confirm naming `preview_id` stops (the first `limit` of them)"
    )

    def get_ids(self, preview: Any) -> list[str]:
        return list(preview.run_ids[: preview.limit])


class BulkStopResultOut(serializers.Serializer):
    run_id = StrictCharField()
    outcome = serializers.ChoiceField(choices=BulkStopOutcome.choices)
    state = serializers.SerializerMethodField(
        help_text="what the result says now: for a stop this bulk stop requested, `requested` "
        "until the run reaches its end (then `stopped_cleanly`, `stopped_dirty` — needs "
        "resolution — or `handed_off`); otherwise the outcome"
    )
    status = StrictCharField(help_text="the run's status after this stop (blank: not found)")
    stop_epoch = StrictIntegerField(allow_null=True)
    stop_request_id = StrictIntegerField(allow_null=True)
    detail = StrictCharField()

    def get_state(self, result: Any) -> str:
        statuses = self.context.get("run_statuses", {})
        return run_selectors.bulk_result_state(result.outcome, statuses.get(result.run_id))


class BulkStopOut(serializers.Serializer):
    BULK_FIELDS = (
        "bulk_id",
        "requested_by",
        "reason",
        "note",
        "filter",
        "requested",
        "counts",
        "preview_id",
        "new_since_preview",
        "created_at",
        "finished_at",
    )

    bulk_id = StrictCharField()
    requested_by = StrictCharField()
    reason = StrictCharField()
    note = StrictCharField()
    filter = AnyJSONField()  # type: ignore[assignment]
    requested = StrictIntegerField(help_text="runs with a result below")
    counts = serializers.DictField(child=StrictIntegerField(), help_text="per outcome")
    preview_id = StrictCharField(
        help_text="the preview this stop acted on; blank: the filter's set at the confirm"
    )
    new_since_preview = StrictIntegerField(
        help_text="runs that began to match the filter after the preview: not stopped"
    )
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    results = BulkStopResultOut(many=True)


class ResolutionIn(serializers.Serializer):
    target = serializers.ChoiceField(choices=["tool_call", "outbox", "worker"])
    id = StrictCharField(
        max_length=120, help_text="tool_call_id, outbox item id (outbox_12) or lease_id"
    )
    decision = serializers.ChoiceField(choices=ResolutionDecision.choices)
    evidence = StrictCharField(max_length=5000, help_text="how you know")


# The schema of ResolutionIn, one shape per target: what `id` must look like depends on it
# (an outbox item id that is not `outbox_<n>` is a 400, see runs.services.parse_outbox_id).
# Documentation only; the view parses with ResolutionIn.


class ToolCallResolutionIn(ResolutionIn):
    target = serializers.ChoiceField(choices=["tool_call"])
    id = StrictCharField(max_length=120, help_text="the tool_call_id")


class OutboxResolutionIn(ResolutionIn):
    target = serializers.ChoiceField(choices=["outbox"])
    id = StrictCharField(
        max_length=120,
        validators=[RegexValidator(r"^(outbox_)?[0-9]+$")],
        help_text="the outbox item id, e.g. outbox_12",
    )


class WorkerResolutionIn(ResolutionIn):
    target = serializers.ChoiceField(choices=["worker"])
    id = StrictCharField(max_length=120, help_text="the lease_id of the fenced worker")


RESOLUTION_IN_SCHEMA = PolymorphicProxySerializer(
    component_name="ResolutionByTarget",
    serializers={
        "tool_call": ToolCallResolutionIn,
        "outbox": OutboxResolutionIn,
        "worker": WorkerResolutionIn,
    },
    resource_type_field_name="target",
)


class ResolutionOut(serializers.Serializer):
    target = StrictCharField()
    id = StrictCharField(source="target_id")
    decision = StrictCharField()
    created = StrictBooleanField()
    run_status = serializers.ChoiceField(choices=RunStatus.choices)


class SteeringIn(serializers.Serializer):
    text = StrictCharField(max_length=10_000)


class SteeringOut(serializers.Serializer):
    id = StrictIntegerField()
    text = StrictCharField()
    author = StrictCharField()
    status = StrictCharField()
    created_at = serializers.DateTimeField()


# ---------------------------------------------------------------------------------------------
# stop packet


class StopPacketOut(serializers.Serializer):
    """DESIGN §4 (fields may be added, never renamed), plus the resolutions recorded since."""

    run_id = StrictCharField()
    stop_epoch = StrictIntegerField()
    stop_reason = StrictCharField()
    requested_by = StrictCharField()
    requested_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)
    state = StrictCharField()
    lease_released = StrictBooleanField()
    resume_from = StrictCharField(allow_null=True)
    frozen_outbox_ids = serializers.ListField(child=StrictCharField())
    in_flight_outbox_ids = serializers.ListField(child=StrictCharField())
    completed_steps = serializers.ListField(child=serializers.DictField())
    pending_steps = serializers.ListField(child=serializers.DictField())
    artifacts = serializers.ListField(child=serializers.DictField())
    unconfirmed_side_effects = serializers.ListField(child=serializers.DictField())
    unapplied_steering = serializers.ListField(child=serializers.DictField())
    late_writes_rejected = StrictIntegerField()
    cost = serializers.DictField(
        required=False,
        help_text="cost_usd_until_stop, tokens_until_stop, unpriced_tokens_until_stop, "
        "late_cost_usd / late_tokens / late_unpriced_tokens (reported after the stop request), "
        "by_model, and budget ({name, limit}) when a budget stopped the run",
    )
    packet_created_at = serializers.DateTimeField()
    run_status = serializers.ChoiceField(
        choices=RunStatus.choices, help_text="the run's status now"
    )
    resolutions = serializers.ListField(
        child=serializers.DictField(), help_text="decisions recorded on top"
    )


class InterruptionPacketOut(serializers.Serializer):
    """An interrupted run's packet: the stop packet's lists (DESIGN §4), read now, with the
    interruption point and what is unknown now."""

    kind = StrictCharField(help_text='"interruption"')
    run_id = StrictCharField()
    stop_epoch = StrictIntegerField()
    state = StrictCharField()
    interruption = serializers.DictField(help_text="the interruption point, as kept on the run")
    interrupted_at = serializers.DateTimeField(allow_null=True)
    interruption_reason = StrictCharField()
    dirty_reasons = serializers.ListField(
        child=StrictCharField(), help_text="unknown now; resume is refused while any holds"
    )
    lease_released = StrictBooleanField()
    resume_from = StrictCharField(allow_null=True)
    frozen_outbox_ids = serializers.ListField(child=StrictCharField())
    in_flight_outbox_ids = serializers.ListField(child=StrictCharField())
    completed_steps = serializers.ListField(child=serializers.DictField())
    pending_steps = serializers.ListField(child=serializers.DictField())
    artifacts = serializers.ListField(child=serializers.DictField())
    tool_calls = serializers.ListField(child=serializers.DictField())
    unconfirmed_side_effects = serializers.ListField(
        child=serializers.DictField(),
        help_text="the writes the interruption left unknown (resolved ones stay listed) and any "
        "unconfirmed now",
    )
    late_writes_rejected = StrictIntegerField()
    run_status = serializers.ChoiceField(choices=RunStatus.choices)
    resolutions = serializers.ListField(
        child=serializers.DictField(), help_text="decisions recorded on top"
    )


# ---------------------------------------------------------------------------------------------
# ledger, metrics, denials


class PeriodQuery(serializers.Serializer):
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and since >= until:
            raise serializers.ValidationError({"since": "since must be before until"})
        return attrs


class LedgerQuery(PeriodQuery):
    run = StrictCharField(max_length=32, required=False)
    actor = StrictCharField(max_length=150, required=False)
    action = StrictCharField(max_length=60, required=False)


class LedgerEntryOut(serializers.Serializer):
    seq = StrictIntegerField(source="pk")
    at = serializers.DateTimeField()
    run_id = StrictCharField(allow_null=True)
    run_seq = StrictIntegerField()
    actor = StrictCharField()
    actor_kind = StrictCharField()
    action = StrictCharField()
    reason = StrictCharField()
    payload = serializers.DictField()
    prev_hash = StrictCharField()
    hash = StrictCharField()


class LedgerPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = LedgerEntryOut(many=True)


class LatencyOut(serializers.Serializer):
    count = StrictIntegerField()
    p50_ms = StrictFloatField(allow_null=True)
    p95_ms = StrictFloatField(allow_null=True)
    p99_ms = StrictFloatField(allow_null=True)


class StopLatencyOut(serializers.Serializer):
    to_stopped = LatencyOut()
    to_worker_signal = LatencyOut()


class LeakageOut(serializers.Serializer):
    permits_after_stop = StrictIntegerField()
    dispatches_after_stop = StrictIntegerField()
    total = StrictIntegerField(help_text="must be 0")


class InterruptionsOut(serializers.Serializer):
    interrupted = StrictIntegerField()
    recovered_cleanly = StrictIntegerField()
    rate = StrictFloatField(allow_null=True)


class HandoffsOut(serializers.Serializer):
    handoffs = StrictIntegerField()
    finished = StrictIntegerField()
    rate = StrictFloatField(allow_null=True)


class PeriodOut(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()


class ApprovalFiguresOut(serializers.Serializer):
    requested = StrictIntegerField()
    time_to_decision = LatencyOut(help_text="request → a reviewer approved or rejected")
    approved = StrictIntegerField()
    approved_with_edits = StrictIntegerField(help_text="included in approved")
    rejected = StrictIntegerField()
    expired = StrictIntegerField()
    void = StrictIntegerField()
    waiting = StrictIntegerField()


class LateSpendOut(serializers.Serializer):
    cost_usd = StrictFloatField(help_text="priced late calls only")
    tokens = StrictIntegerField()
    unpriced_tokens = StrictIntegerField(help_text="late tokens no price is known for")
    calls = StrictIntegerField()
    runs = StrictIntegerField()


class StopQualityOut(serializers.Serializer):
    period = PeriodOut()
    stops = StrictIntegerField()
    stopped_cleanly = StrictIntegerField()
    stopped_dirty = StrictIntegerField(help_text="stops that ended dirty, resolved or not")
    stopped_dirty_resolved = StrictIntegerField(
        help_text="of those, how many a reviewer has since resolved"
    )
    stop_latency = StopLatencyOut()
    side_effect_leakage = LeakageOut()
    late_writes_rejected = StrictIntegerField()
    interruptions_recovered_cleanly = InterruptionsOut()
    handoff_completion = HandoffsOut()
    approvals = ApprovalFiguresOut(help_text="approvals requested in the period (DESIGN §10)")
    late_spend = LateSpendOut(
        help_text="model calls of a stopped epoch reported after its stop request (DESIGN §13)"
    )


class DenialOut(serializers.Serializer):
    window_start = serializers.DateTimeField()
    reason = StrictCharField()
    team = StrictCharField(source="team_slug")
    credential = StrictCharField(
        help_text="token:<name>, user:<name>, revoked token:<name>, unknown, malformed"
    )
    client_ip = StrictCharField()
    route = StrictCharField()
    count = StrictIntegerField()
    first_at = serializers.DateTimeField()
    last_at = serializers.DateTimeField()
    last_detail = StrictCharField()


class DenialsOut(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    total = StrictIntegerField()
    by_reason = serializers.DictField(child=StrictIntegerField())
    results = DenialOut(many=True)


# ---------------------------------------------------------------------------------------------
# approval rules (DESIGN §10)

# ("", any call) or only side-effecting calls; the same for transports.
RULE_SIDE_EFFECTS = [("", "any call"), (SideEffect.WRITE, "side-effecting calls")]
RULE_TRANSPORTS = [("", "any transport"), *((name, name) for name in services.TRANSPORTS)]


class ApprovalRuleOut(serializers.Serializer):
    id = StrictIntegerField()
    team = StrictCharField(source="team.slug")
    name = StrictCharField()
    enabled = StrictBooleanField()
    position = StrictIntegerField(help_text="rules are tried in this order; the first match holds")
    applies_to = serializers.ChoiceField(choices=ApprovalAppliesTo.choices)
    tool_glob = StrictCharField(help_text="fnmatch glob on the tool name; blank matches any")
    side_effect = serializers.ChoiceField(choices=RULE_SIDE_EFFECTS, allow_blank=True)
    agent_glob = StrictCharField(help_text="fnmatch glob on the run's agent; blank matches any")
    transport = serializers.ChoiceField(choices=RULE_TRANSPORTS, allow_blank=True)
    destination_glob = StrictCharField(help_text="fnmatch glob on an outbox destination")
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices)
    timeout_seconds = StrictIntegerField()
    escalate_after_seconds = StrictIntegerField(allow_null=True)
    created_by = StrictCharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ApprovalRuleListOut(serializers.Serializer):
    results = ApprovalRuleOut(many=True)


class ApprovalRuleListQuery(serializers.Serializer):
    team = StrictCharField(max_length=64, required=False, help_text="one team's rules (its slug)")


class ApprovalRuleChangeIn(serializers.Serializer):
    """The fields a PATCH may change; every one optional. Unknown fields are refused by name."""

    closed = True  # api.schema: additionalProperties false

    name = StrictCharField(max_length=120, required=False)
    enabled = StrictBooleanField(required=False)
    position = StrictIntegerField(min_value=0, max_value=1_000_000, required=False)
    applies_to = serializers.ChoiceField(choices=ApprovalAppliesTo.choices, required=False)
    tool_glob = StrictCharField(max_length=200, required=False, allow_blank=True)
    side_effect = serializers.ChoiceField(
        choices=RULE_SIDE_EFFECTS, required=False, allow_blank=True
    )
    agent_glob = StrictCharField(max_length=200, required=False, allow_blank=True)
    transport = serializers.ChoiceField(choices=RULE_TRANSPORTS, required=False, allow_blank=True)
    destination_glob = StrictCharField(max_length=500, required=False, allow_blank=True)
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices, required=False)
    timeout_seconds = StrictIntegerField(
        min_value=1, max_value=APPROVAL_TIMEOUT_MAX_SECONDS, required=False
    )
    escalate_after_seconds = StrictIntegerField(
        min_value=1,
        max_value=APPROVAL_TIMEOUT_MAX_SECONDS - 1,
        required=False,
        allow_null=True,
        help_text="less than timeout_seconds; null: never escalate",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return refuse_unknown_fields(self, attrs)


class ApprovalRuleCreateIn(ApprovalRuleChangeIn):
    """A new rule: `name` is required, every other field has the model's default."""

    team = StrictCharField(
        max_length=64,
        required=False,
        help_text="the team's slug; may be left out by an admin of exactly one team",
    )
    name = StrictCharField(max_length=120)


# ---------------------------------------------------------------------------------------------
# team budgets (DESIGN §13)


class TeamBudgetIn(serializers.Serializer):
    """The team's budgets; a field left out clears it (no limit). Unknown fields are refused."""

    closed = True  # api.schema: additionalProperties false

    time_zone = StrictCharField(
        max_length=64, required=False, help_text="IANA time zone of the days and months (UTC)"
    )
    daily_usd = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        allow_null=True,
        help_text="USD per day in the team's time zone; null: no daily budget",
    )
    monthly_usd = serializers.DecimalField(
        max_digits=14,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        allow_null=True,
        help_text="USD per calendar month in the team's time zone; null: no monthly budget",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return refuse_unknown_fields(self, attrs)


class TeamBudgetOut(serializers.Serializer):
    team = StrictCharField()
    time_zone = StrictCharField()
    daily_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, allow_null=True, coerce_to_string=False
    )
    monthly_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, allow_null=True, coerce_to_string=False
    )
    day = serializers.DateField(allow_null=True, help_text="today in the team's time zone")
    day_spent_usd = serializers.DecimalField(
        max_digits=20, decimal_places=10, coerce_to_string=False
    )
    month = serializers.DateField(allow_null=True, help_text="the current month's first day")
    month_spent_usd = serializers.DecimalField(
        max_digits=20, decimal_places=10, coerce_to_string=False
    )
    exhausted = StrictCharField(
        help_text="team_daily_usd or team_monthly_usd when used up (permits answer 409 "
        "budget_exhausted), else blank"
    )
    updated_by = StrictCharField()
