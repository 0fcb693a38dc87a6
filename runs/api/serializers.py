"""Small input serializers (validate only, never save) and output serializers per answer.

Bounds are the database's: every string fits its column, every integer its column type, so no
input can reach the database and fail there (a 500) instead of being refused here (a 400).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from handoff.models import ResolutionDecision
from runs import services
from runs.api.permissions import API_STOP_REASONS
from runs.errors import InvalidInput
from runs.models import (
    Approval,
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


def epoch_field(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=INT32_MAX, **kwargs)


class AnyJSONField(serializers.JSONField):
    """Any JSON value (object, array, string, number, boolean, null)."""


# ---------------------------------------------------------------------------------------------
# errors


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="stable machine-readable code, e.g. stale_epoch")
    detail = serializers.CharField()
    field = serializers.CharField(required=False, help_text="the first bad field (400 only)")
    status = serializers.ChoiceField(
        choices=RunStatus.choices, required=False, help_text="the run's current status (409)"
    )
    stop_epoch = serializers.IntegerField(required=False, help_text="the run's current epoch (409)")
    errors = AnyJSONField(required=False, help_text="every field error (400 only)")  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------
# runs


class PlannedStepIn(serializers.Serializer):
    key = serializers.CharField(max_length=120)
    name = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(
        choices=StepKind.choices, required=False, default=StepKind.MODEL_CALL
    )


class BudgetIn(serializers.Serializer):
    max_seconds = serializers.IntegerField(
        min_value=1, max_value=INT32_MAX, required=False, allow_null=True
    )
    max_tool_calls = serializers.IntegerField(
        min_value=0, max_value=INT32_MAX, required=False, allow_null=True
    )


class RunCreateIn(serializers.Serializer):
    title = serializers.CharField(max_length=300)
    agent = serializers.CharField(max_length=120)
    steps = PlannedStepIn(many=True, required=False, max_length=MAX_PLANNED_STEPS)  # type: ignore[call-arg]
    budget = BudgetIn(required=False)
    idempotency_key = serializers.CharField(
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
    max_seconds = serializers.IntegerField(allow_null=True)
    max_tool_calls = serializers.IntegerField(allow_null=True)
    tool_calls_used = serializers.IntegerField(source="tool_calls_count")


class RunOut(serializers.Serializer):
    id = serializers.CharField()
    title = serializers.CharField()
    agent = serializers.CharField()
    team = serializers.CharField(source="team.slug")
    status = serializers.ChoiceField(choices=RunStatus.choices)
    stop_epoch = serializers.IntegerField()
    stop_reason = serializers.SerializerMethodField()
    stop_requested_by = serializers.SerializerMethodField()
    stop_requested_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)
    resume_from = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()
    late_writes_rejected = serializers.IntegerField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_stop_reason(self, run: Any) -> str | None:
        return run.stop_reason or None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_stop_requested_by(self, run: Any) -> str | None:
        return run.stop_requested_by or None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_resume_from(self, run: Any) -> str | None:
        return run.resume_from or None

    @extend_schema_field(BudgetOut)
    def get_budget(self, run: Any) -> dict[str, Any]:
        return BudgetOut(run).data


class RunPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RunOut(many=True)


# ---------------------------------------------------------------------------------------------
# leases


class LeaseAcquireIn(serializers.Serializer):
    worker_id = serializers.CharField(max_length=120)
    ttl_seconds = serializers.FloatField(min_value=1, max_value=3600, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("ttl_seconds", settings.SAFESTOP_DEFAULT_LEASE_TTL)
        return attrs


class LeaseIn(serializers.Serializer):
    lease_id = serializers.CharField(max_length=64)
    epoch = epoch_field()


class LeaseOut(serializers.Serializer):
    lease_id = serializers.CharField(source="token")
    epoch = serializers.IntegerField()
    expires_at = serializers.DateTimeField()
    worker_id = serializers.CharField()
    ttl_seconds = serializers.FloatField()


class StopSignalOut(serializers.Serializer):
    type = serializers.ChoiceField(choices=["cancel_requested"])
    reason = serializers.CharField()
    requested_by = serializers.CharField()
    stop_epoch = serializers.IntegerField()
    stop_request_id = serializers.IntegerField()
    requested_at = serializers.DateTimeField()


class HeartbeatOut(serializers.Serializer):
    lease_id = serializers.CharField()
    epoch = serializers.IntegerField()
    expires_at = serializers.DateTimeField()
    signal = StopSignalOut(
        allow_null=True, help_text="null, or the stop request: stop starting work and drain"
    )


class LeaseReleaseOut(serializers.Serializer):
    lease_id = serializers.CharField()
    released_at = serializers.DateTimeField(allow_null=True)
    release_reason = serializers.CharField()
    status = serializers.ChoiceField(
        choices=RunStatus.choices, help_text="the run's status after the release"
    )
    stop_epoch = serializers.IntegerField()


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

    needs_approval = serializers.BooleanField(
        required=False,
        default=False,
        help_text="hold this for a reviewer even if no team rule matches",
    )
    summary = serializers.CharField(
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
    arguments_schema = AnyJSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text="a JSON Schema (object) that a reviewer's edited arguments must match",
    )

    def validate_arguments_schema(self, schema: Any) -> dict[str, Any] | None:
        if schema is None:
            return None
        if not isinstance(schema, dict):
            raise serializers.ValidationError("must be a JSON Schema object")
        try:
            return services.validate_arguments_schema(schema)
        except InvalidInput as error:
            raise serializers.ValidationError(error.detail) from None


class ApprovalOut(serializers.Serializer):
    """One approval (DESIGN §10): the held call or item, and its decision."""

    id = serializers.CharField(source="public_id", help_text="appr_<n>")
    run_id = serializers.CharField()
    team = serializers.CharField(source="team.slug")
    agent = serializers.CharField()
    epoch = serializers.IntegerField(help_text="the run's epoch when it was requested")
    target = serializers.ChoiceField(choices=ApprovalTarget.choices)
    tool_call_id = serializers.SerializerMethodField()
    outbox_id = serializers.SerializerMethodField()
    tool = serializers.CharField(
        source="subject", help_text='the tool, or "<transport> → <destination>" for an item'
    )
    status = serializers.ChoiceField(choices=ApprovalStatus.choices)
    rule = serializers.SerializerMethodField()
    match_reason = serializers.CharField(help_text="why it is held, in words")
    summary = serializers.CharField()
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices)
    original_arguments = AnyJSONField()
    arguments = AnyJSONField(help_text="the final arguments: the originals until edited")
    arguments_schema = serializers.JSONField(allow_null=True)
    edited = serializers.BooleanField()
    message = serializers.CharField(help_text="the reviewer's message to the agent")
    decided_by = serializers.SerializerMethodField()
    decided_at = serializers.DateTimeField(allow_null=True)
    requested_at = serializers.DateTimeField()
    deadline = serializers.DateTimeField()
    escalated_at = serializers.DateTimeField(allow_null=True)
    permit_id = serializers.SerializerMethodField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_tool_call_id(self, approval: Approval) -> str | None:
        record = approval.execution_record
        return record.tool_call_id if record is not None else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_outbox_id(self, approval: Approval) -> str | None:
        item = approval.outbox_item
        return item.public_id if item is not None else None

    @extend_schema_field(
        serializers.CharField(
            allow_null=True, help_text="the team rule that matched; null when the agent asked"
        )
    )
    def get_rule(self, approval: Approval) -> str | None:
        return approval.rule_name or None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_decided_by(self, approval: Approval) -> str | None:
        return approval.decided_by or None

    @extend_schema_field(
        serializers.CharField(
            allow_null=True, help_text="set once a tool call's approval is approved"
        )
    )
    def get_permit_id(self, approval: Approval) -> str | None:
        if approval.status != ApprovalStatus.APPROVED or approval.execution_record is None:
            return None
        return approval.execution_record.permit_id


class ApprovalListQuery(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=APPROVAL_LIST_STATUSES,
        required=False,
        default=ApprovalStatus.WAITING,
        help_text="default waiting; `all` for every status",
    )
    run = serializers.CharField(max_length=32, required=False, help_text="a run id")
    agent = serializers.CharField(max_length=120, required=False)
    tool = serializers.CharField(
        max_length=300, required=False, help_text="part of the tool name (or item destination)"
    )
    risk = serializers.ChoiceField(choices=ApprovalRisk.choices, required=False)


class ApprovalPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = ApprovalOut(many=True)


class ApprovalDecideIn(serializers.Serializer):
    decision = serializers.ChoiceField(
        choices=APPROVAL_DECISIONS,
        error_messages={
            "invalid_choice": 'decision must be "approve" or "reject", not "{input}"',
        },
    )
    message = serializers.CharField(
        max_length=MAX_APPROVAL_MESSAGE,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text="goes back to the agent (why it was rejected, what was changed)",
    )
    arguments = AnyJSONField(
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
    tool_call_id = serializers.CharField(max_length=120)
    tool = serializers.CharField(max_length=120)
    side_effect = serializers.ChoiceField(
        choices=SideEffect.choices, required=False, default=SideEffect.NONE
    )
    arguments = AnyJSONField(required=False, default=dict)
    idempotency_key = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    operation_id = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    recovery_policy = serializers.ChoiceField(
        choices=RecoveryPolicy.choices, required=False, allow_blank=True, default=""
    )
    step_key = serializers.CharField(max_length=120, required=False, allow_blank=True, default="")


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
    tool_call_id = serializers.CharField()
    epoch = serializers.IntegerField(source="permit_epoch")
    tool = serializers.CharField()
    side_effect = serializers.CharField()
    execution_state = serializers.CharField()
    idempotency_key = serializers.CharField()
    arguments = AnyJSONField(help_text="the final arguments: run these (a reviewer may edit them)")
    approval = ApprovalFromContext(help_text="when the call went through an approval")

    def get_permit_id(self, record: Any) -> str:
        return str(record.permit_id)


class PermitWaitingOut(serializers.Serializer):
    """202: the call waits for a reviewer. There is no permit yet: do not start the call."""

    tool_call_id = serializers.CharField()
    epoch = serializers.IntegerField(source="permit_epoch")
    approval = ApprovalFromContext(required=True)


class ToolResultIn(serializers.Serializer):
    execution_state = serializers.ChoiceField(choices=RESULT_STATES)
    operation_id = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    observation = serializers.CharField(
        max_length=100_000, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    output_truncated = serializers.BooleanField(required=False, default=False)
    remote_cancel_state = serializers.ChoiceField(
        choices=RemoteCancelState.choices, required=False, allow_blank=True, default=""
    )
    recovery_action = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class ToolCallOut(serializers.Serializer):
    tool_call_id = serializers.CharField()
    tool = serializers.CharField()
    execution_state = serializers.CharField()
    side_effect = serializers.CharField()
    side_effect_state = serializers.CharField()
    remote_cancel_state = serializers.CharField()
    operation_id = serializers.CharField()
    output_truncated = serializers.BooleanField()
    reported_after_stop = serializers.BooleanField()
    permit_epoch = serializers.IntegerField()


# ---------------------------------------------------------------------------------------------
# events


class EventIn(serializers.Serializer):
    """One event. Type-specific fields (key, name, kind, label, state, result, error, ...) pass
    through to the run; the few that land in bounded columns are checked here."""

    event_id = serializers.CharField(max_length=120)
    type = serializers.CharField(max_length=40)
    step_seq = serializers.IntegerField(
        min_value=0, max_value=INT32_MAX, required=False, allow_null=True
    )
    steering_id = serializers.IntegerField(
        min_value=1, max_value=INT64_MAX, required=False, allow_null=True
    )


class EventsIn(serializers.Serializer):
    epoch = epoch_field()
    events = serializers.ListField(
        child=AnyJSONField(),
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
            identity = EventIn(
                data={key: event[key] for key in ("event_id", "type") if key in event}
            )
            errors.append({} if identity.is_valid() else identity.errors)
        if any(errors):
            raise serializers.ValidationError(errors)
        return events


class EventAnswerOut(serializers.Serializer):
    event_id = serializers.CharField()
    status = serializers.ChoiceField(choices=["accepted", "duplicate", "rejected"])
    code = serializers.CharField(required=False, help_text="why it was rejected, e.g. stale_epoch")
    detail = serializers.CharField(required=False)


class EventsOut(serializers.Serializer):
    results = EventAnswerOut(many=True)
    accepted = serializers.IntegerField()
    duplicate = serializers.IntegerField()
    rejected = serializers.IntegerField()


# ---------------------------------------------------------------------------------------------
# outbox, drain


class OutboxIn(ApprovalAskIn):
    epoch = epoch_field()
    transport = serializers.ChoiceField(choices=["webhook", "email"])
    destination = serializers.CharField(max_length=500)
    payload = AnyJSONField(required=False, default=dict)
    idempotency_key = serializers.CharField(max_length=200)
    tool_call_id = serializers.CharField(
        max_length=120, required=False, allow_blank=True, default=""
    )


class OutboxOut(serializers.Serializer):
    id = serializers.CharField(source="public_id")
    status = serializers.CharField(help_text="awaiting_approval while a reviewer decides")
    idempotency_key = serializers.CharField()
    transport = serializers.CharField()
    destination = serializers.CharField()
    enqueue_epoch = serializers.IntegerField()
    approval = ApprovalFromContext(help_text="when the item waits for (or went through) one")


class ObservationIn(serializers.Serializer):
    # Both optional: a drain report also carries observations that are not a tool call's
    # outcome (safestop_agent sends `{"kind": "stop_seen", ...}` and already-reported calls
    # without a state); the service applies only those that name a call and a state.
    tool_call_id = serializers.CharField(
        max_length=120, required=False, allow_blank=True, default=""
    )
    execution_state = serializers.ChoiceField(
        choices=RESULT_STATES, required=False, allow_blank=True, default=""
    )
    operation_id = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default=""
    )
    observation = serializers.CharField(
        max_length=10_000, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    output_truncated = serializers.BooleanField(required=False, default=False)
    remote_cancel_state = serializers.ChoiceField(
        choices=RemoteCancelState.choices, required=False, allow_blank=True, default=""
    )
    recovery_action = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class DrainedIn(serializers.Serializer):
    lease_id = serializers.CharField(max_length=64)
    epoch = epoch_field(help_text="the lease's epoch (not the new stop epoch)")
    observations = ObservationIn(many=True, required=False, max_length=MAX_OBSERVATIONS)  # type: ignore[call-arg]
    stop_epoch = epoch_field(
        required=False, help_text="informational: the stop epoch the worker saw"
    )


# ---------------------------------------------------------------------------------------------
# stop and reviewer actions


class StopIn(serializers.Serializer):
    reason = serializers.ChoiceField(choices=API_STOP_REASONS, required=False, default="user_stop")
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class NoteIn(serializers.Serializer):
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class ResumeIn(NoteIn):
    checkpoint = serializers.CharField(max_length=120, required=False, allow_blank=True, default="")
    carry_over_steering = serializers.BooleanField(required=False, default=False)


class StopRequestOut(serializers.Serializer):
    id = serializers.IntegerField(source="pk")
    reason = serializers.CharField()
    requested_by = serializers.CharField()
    requested_at = serializers.DateTimeField()
    note = serializers.CharField()
    takeover = serializers.BooleanField()


class StopOut(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices)
    stop_epoch = serializers.IntegerField()
    created = serializers.BooleanField(help_text="false when this repeats an earlier stop")
    stop_request = StopRequestOut()


class BulkStopIn(serializers.Serializer):
    """DESIGN §12. Every filter field given must match; at least one, or `all`."""

    agent = serializers.CharField(max_length=120, required=False, allow_blank=True, default="")
    team = serializers.CharField(
        max_length=64, required=False, allow_blank=True, default="", help_text="team slug"
    )
    status = serializers.ChoiceField(
        choices=RunStatus.choices, required=False, allow_blank=True, default=""
    )
    tool = serializers.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        default="",
        help_text="runs with a tool call of this tool (exact name)",
    )
    ids = serializers.ListField(
        child=serializers.CharField(max_length=32),
        required=False,
        default=list,
        max_length=services.MAX_BULK_IDS,
        help_text="explicit run ids; an id that is not yours or does not exist is `not_found`",
    )
    all = serializers.BooleanField(
        required=False,
        default=False,
        help_text="the kill switch: every run of your teams (an empty filter is refused)",
    )
    reason = serializers.ChoiceField(
        choices=services.BULK_STOP_REASONS, required=False, default="user_stop"
    )
    note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="answer the preview; stop nothing"
    )
    idempotency_key = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="client id of this bulk stop: a retry answers the first one (200)",
    )
    confirm = serializers.BooleanField(
        required=False,
        default=False,
        help_text="needed to stop more than the limit (10,000 runs) at once",
    )


class BulkPreviewOut(serializers.Serializer):
    dry_run = serializers.BooleanField(default=True)
    matching = serializers.IntegerField(help_text="runs the filter selects, in any state")
    by_status = serializers.DictField(child=serializers.IntegerField())
    will_stop = serializers.IntegerField()
    already_stopping = serializers.IntegerField()
    already_stopped = serializers.IntegerField(help_text="stopped cleanly or dirty, handed off")
    already_finished = serializers.IntegerField(help_text="left alone unless named in `ids`")
    not_allowed = serializers.IntegerField()
    not_allowed_because = serializers.ListField(child=serializers.CharField(), source="refusals")
    not_found = serializers.ListField(child=serializers.CharField())
    limit = serializers.IntegerField()
    needs_confirm = serializers.BooleanField()


class BulkStopResultOut(serializers.Serializer):
    run_id = serializers.CharField()
    outcome = serializers.ChoiceField(choices=BulkStopOutcome.choices)
    status = serializers.CharField(help_text="the run's status after this stop (blank: not found)")
    stop_epoch = serializers.IntegerField(allow_null=True)
    stop_request_id = serializers.IntegerField(allow_null=True)
    detail = serializers.CharField()


class BulkStopOut(serializers.Serializer):
    BULK_FIELDS = (
        "bulk_id",
        "requested_by",
        "reason",
        "note",
        "filter",
        "requested",
        "counts",
        "created_at",
        "finished_at",
    )

    bulk_id = serializers.CharField()
    requested_by = serializers.CharField()
    reason = serializers.CharField()
    note = serializers.CharField()
    filter = AnyJSONField()  # type: ignore[assignment]
    requested = serializers.IntegerField(help_text="runs with a result below")
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="per outcome")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    results = BulkStopResultOut(many=True)


class ResolutionIn(serializers.Serializer):
    target = serializers.ChoiceField(choices=["tool_call", "outbox", "worker"])
    id = serializers.CharField(
        max_length=120, help_text="tool_call_id, outbox item id (outbox_12) or lease_id"
    )
    decision = serializers.ChoiceField(choices=ResolutionDecision.choices)
    evidence = serializers.CharField(max_length=5000, help_text="how you know")


class ResolutionOut(serializers.Serializer):
    target = serializers.CharField()
    id = serializers.CharField(source="target_id")
    decision = serializers.CharField()
    created = serializers.BooleanField()
    run_status = serializers.ChoiceField(choices=RunStatus.choices)


class SteeringIn(serializers.Serializer):
    text = serializers.CharField(max_length=10_000)


class SteeringOut(serializers.Serializer):
    id = serializers.IntegerField()
    text = serializers.CharField()
    author = serializers.CharField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()


# ---------------------------------------------------------------------------------------------
# stop packet


class StopPacketOut(serializers.Serializer):
    """DESIGN §4 (fields may be added, never renamed), plus the resolutions recorded since."""

    run_id = serializers.CharField()
    stop_epoch = serializers.IntegerField()
    stop_reason = serializers.CharField()
    requested_by = serializers.CharField()
    requested_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)
    state = serializers.CharField()
    lease_released = serializers.BooleanField()
    resume_from = serializers.CharField(allow_null=True)
    frozen_outbox_ids = serializers.ListField(child=serializers.CharField())
    in_flight_outbox_ids = serializers.ListField(child=serializers.CharField())
    completed_steps = serializers.ListField(child=serializers.DictField())
    pending_steps = serializers.ListField(child=serializers.DictField())
    artifacts = serializers.ListField(child=serializers.DictField())
    unconfirmed_side_effects = serializers.ListField(child=serializers.DictField())
    unapplied_steering = serializers.ListField(child=serializers.DictField())
    late_writes_rejected = serializers.IntegerField()
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

    kind = serializers.CharField(help_text='"interruption"')
    run_id = serializers.CharField()
    stop_epoch = serializers.IntegerField()
    state = serializers.CharField()
    interruption = serializers.DictField(help_text="the interruption point, as kept on the run")
    interrupted_at = serializers.DateTimeField(allow_null=True)
    interruption_reason = serializers.CharField()
    dirty_reasons = serializers.ListField(
        child=serializers.CharField(), help_text="unknown now; resume is refused while any holds"
    )
    lease_released = serializers.BooleanField()
    resume_from = serializers.CharField(allow_null=True)
    frozen_outbox_ids = serializers.ListField(child=serializers.CharField())
    in_flight_outbox_ids = serializers.ListField(child=serializers.CharField())
    completed_steps = serializers.ListField(child=serializers.DictField())
    pending_steps = serializers.ListField(child=serializers.DictField())
    artifacts = serializers.ListField(child=serializers.DictField())
    tool_calls = serializers.ListField(child=serializers.DictField())
    unconfirmed_side_effects = serializers.ListField(
        child=serializers.DictField(),
        help_text="the writes the interruption left unknown (resolved ones stay listed) and any "
        "unconfirmed now",
    )
    late_writes_rejected = serializers.IntegerField()
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
    run = serializers.CharField(max_length=32, required=False)
    actor = serializers.CharField(max_length=150, required=False)
    action = serializers.CharField(max_length=60, required=False)


class LedgerEntryOut(serializers.Serializer):
    seq = serializers.IntegerField(source="pk")
    at = serializers.DateTimeField()
    run_id = serializers.CharField(allow_null=True)
    run_seq = serializers.IntegerField()
    actor = serializers.CharField()
    actor_kind = serializers.CharField()
    action = serializers.CharField()
    reason = serializers.CharField()
    payload = serializers.DictField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()


class LedgerPageOut(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = LedgerEntryOut(many=True)


class LatencyOut(serializers.Serializer):
    count = serializers.IntegerField()
    p50_ms = serializers.FloatField(allow_null=True)
    p95_ms = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)


class StopLatencyOut(serializers.Serializer):
    to_stopped = LatencyOut()
    to_worker_signal = LatencyOut()


class LeakageOut(serializers.Serializer):
    permits_after_stop = serializers.IntegerField()
    dispatches_after_stop = serializers.IntegerField()
    total = serializers.IntegerField(help_text="must be 0")


class InterruptionsOut(serializers.Serializer):
    interrupted = serializers.IntegerField()
    recovered_cleanly = serializers.IntegerField()
    rate = serializers.FloatField(allow_null=True)


class HandoffsOut(serializers.Serializer):
    handoffs = serializers.IntegerField()
    finished = serializers.IntegerField()
    rate = serializers.FloatField(allow_null=True)


class PeriodOut(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()


class ApprovalFiguresOut(serializers.Serializer):
    requested = serializers.IntegerField()
    time_to_decision = LatencyOut(help_text="request → a reviewer approved or rejected")
    approved = serializers.IntegerField()
    approved_with_edits = serializers.IntegerField(help_text="included in approved")
    rejected = serializers.IntegerField()
    expired = serializers.IntegerField()
    void = serializers.IntegerField()
    waiting = serializers.IntegerField()


class StopQualityOut(serializers.Serializer):
    period = PeriodOut()
    stops = serializers.IntegerField()
    stopped_cleanly = serializers.IntegerField()
    stopped_dirty = serializers.IntegerField(help_text="stops that ended dirty, resolved or not")
    stopped_dirty_resolved = serializers.IntegerField(
        help_text="of those, how many a reviewer has since resolved"
    )
    stop_latency = StopLatencyOut()
    side_effect_leakage = LeakageOut()
    late_writes_rejected = serializers.IntegerField()
    interruptions_recovered_cleanly = InterruptionsOut()
    handoff_completion = HandoffsOut()
    approvals = ApprovalFiguresOut(help_text="approvals requested in the period (DESIGN §10)")


class DenialOut(serializers.Serializer):
    window_start = serializers.DateTimeField()
    reason = serializers.CharField()
    team = serializers.CharField(source="team_slug")
    credential = serializers.CharField(
        help_text="token:<name>, user:<name>, revoked token:<name>, unknown, malformed"
    )
    client_ip = serializers.CharField()
    route = serializers.CharField()
    count = serializers.IntegerField()
    first_at = serializers.DateTimeField()
    last_at = serializers.DateTimeField()
    last_detail = serializers.CharField()


class DenialsOut(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    total = serializers.IntegerField()
    by_reason = serializers.DictField(child=serializers.IntegerField())
    results = DenialOut(many=True)
