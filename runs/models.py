"""The records of DESIGN §3: runs, steps, execution records, outbox, leases, stops, ledger.

Invariants live in the database, not in Python: one live lease per run, unique
(run, tool_call_id), unique (run, event_id), unique (run, idempotency_key) for outbox items,
and an append-only ledger (a trigger installed by migration 0002 refuses UPDATE and DELETE).
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q


def new_run_id() -> str:
    return "run_" + secrets.token_hex(6)


class Team(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=120)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    REVIEWER = "reviewer", "Reviewer"
    ADMIN = "admin", "Admin"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} as {self.role}"


class TokenRole(models.TextChoices):
    AGENT = "agent", "Agent"
    REVIEWER = "reviewer", "Reviewer"


class ApiToken(models.Model):
    """A bearer token for an agent runtime or a reviewer script. Only its SHA-256 is stored."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=120)
    role = models.CharField(max_length=16, choices=TokenRole.choices, default=TokenRole.AGENT)
    prefix = models.CharField(max_length=16, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="apitoken_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug}, {self.role})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RunStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUSPENDED = "suspended", "Suspended"
    INTERRUPTED = "interrupted", "Interrupted"
    CANCEL_REQUESTED = "cancel_requested", "Cancel requested"
    DRAINING = "draining", "Draining"
    STOPPED_CLEANLY = "stopped_cleanly", "Stopped cleanly"
    STOPPED_DIRTY = "stopped_dirty", "Stopped dirty"
    HANDED_OFF = "handed_off", "Handed off"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# Statuses in which the entrance is open only for a running worker; everything else refuses
# permits, dispatch and new outbox items.
STOPPABLE_STATUSES = frozenset(
    {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.INTERRUPTED}
)
STOPPING_STATUSES = frozenset({RunStatus.CANCEL_REQUESTED, RunStatus.DRAINING})
STOPPED_STATUSES = frozenset({RunStatus.STOPPED_CLEANLY, RunStatus.STOPPED_DIRTY})
TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class StopReason(models.TextChoices):
    USER_STOP = "user_stop", "User stop"
    MANUAL_TAKEOVER = "manual_takeover", "Manual takeover"
    BUDGET_EXHAUSTED = "budget_exhausted", "Budget exhausted"
    TIMEOUT = "timeout", "Timeout"
    ADMIN_KILL = "admin_kill", "Admin kill"
    DEPENDENCY_FAILURE = "dependency_failure", "Dependency failure"
    LEASE_EXPIRED = "lease_expired", "Lease expired"
    DRAIN_DEADLINE = "drain_deadline", "Drain deadline"


# Reasons an agent token may use to stop its own run (DESIGN §5).
AGENT_STOP_REASONS = frozenset(
    {StopReason.BUDGET_EXHAUSTED, StopReason.TIMEOUT, StopReason.DEPENDENCY_FAILURE}
)


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=32, default=new_run_id, editable=False)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="runs")
    title = models.CharField(max_length=300)
    agent = models.CharField(max_length=120)
    status = models.CharField(max_length=24, choices=RunStatus.choices, default=RunStatus.PENDING)
    stop_epoch = models.PositiveIntegerField(default=1)
    # Bumped on every committed change of the run or its children; websocket frames carry it
    # so a viewer can detect a gap and refetch.
    change_seq = models.PositiveBigIntegerField(default=0)
    stop_reason = models.CharField(max_length=24, choices=StopReason.choices, blank=True)
    stop_requested_by = models.CharField(max_length=150, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    max_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    tool_calls_count = models.PositiveIntegerField(default=0)
    resume_from = models.CharField(max_length=120, blank=True)
    interruption = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    failure = models.JSONField(null=True, blank=True)
    # Facts that arrived after the stop (e.g. a completion at a stale epoch): kept, never applied.
    late_reports = models.JSONField(default=list, blank=True)
    late_writes_rejected = models.PositiveIntegerField(default=0)
    created_by = models.CharField(max_length=150, blank=True)
    # The client's id for this create, so a retried POST returns the first run (blank: none).
    idempotency_key = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Cost (DESIGN §13). The budgets, then the totals the events batch keeps incrementally, under
    # the run lock and in the usage rows' own transaction, so they always equal the rows' sums.
    # Kept after every other column: the events batch reads a prefix of them (`Model.from_db`).
    max_cost_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    # Tokens (input + output) of calls no price was found for: their cost is unknown, never $0.
    unpriced_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes = [
            # runs page: newest first, keyset on (created_at, id), optionally per status
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(fields=["team", "-created_at"], name="run_team_created_idx"),
            # runs page over a million runs: per-state counts capped by LIMIT read these
            # index-only, per team and per agent; the agent list walks the second one
            # (console.selectors.runs._capped_counts, _agents; docs/BENCHMARKS.md)
            models.Index(
                fields=["team", "status", "-created_at"], name="run_team_status_created_idx"
            ),
            models.Index(fields=["agent", "status", "team"], name="run_agent_status_team_idx"),
            # drain watchdog and budget enforcer scan only live runs
            models.Index(
                fields=["status", "stop_requested_at"],
                name="run_stopping_idx",
                condition=Q(status__in=["cancel_requested", "draining"]),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="run_unique_team_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.title}"


class StepKind(models.TextChoices):
    MODEL_CALL = "model_call", "Model call"
    TOOL_READ = "tool_read", "Tool (read)"
    TOOL_WRITE = "tool_write", "Tool (write)"
    EXTERNAL_ACTION = "external_action", "External action"


class StepStatus(models.TextChoices):
    PLANNED = "planned", "Planned"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    UNKNOWN = "unknown", "Unknown"


class Step(models.Model):
    # db_index=False on the run FKs of the busy child tables: Django would add two indexes per FK
    # (run_id and a varchar_pattern_ops twin, run ids being strings), each one more write per
    # row. A (run, ...) unique index or an explicit Index(fields=["run"]) serves run_id lookups
    # (docs/BENCHMARKS.md, outbox freeze: each extra index is one more write per frozen row).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    seq = models.PositiveIntegerField()
    key = models.CharField(max_length=120)
    name = models.CharField(max_length=300, blank=True)
    kind = models.CharField(max_length=24, choices=StepKind.choices, default=StepKind.MODEL_CALL)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PLANNED)
    epoch = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)
    reported_after_stop = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="step_unique_run_seq"),
            models.UniqueConstraint(fields=["run", "key"], name="step_unique_run_key"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.key}"


class SideEffect(models.TextChoices):
    NONE = "none", "None"
    WRITE = "write", "Write"


class ExecutionState(models.TextChoices):
    # Intent recorded, held by an approval gate (DESIGN §10): no permit exists yet.
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    PERMITTED = "permitted", "Permitted"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    NOT_STARTED = "not_started", "Not started"
    UNKNOWN = "unknown", "Unknown"


class RemoteCancelState(models.TextChoices):
    NOT_REQUESTED = "not_requested", "Not requested"
    REQUESTED = "requested", "Requested"
    CONFIRMED = "confirmed", "Confirmed"
    REFUSED = "refused", "Refused"


class SideEffectState(models.TextChoices):
    NONE = "none", "None"
    PENDING_VERIFICATION = "pending_verification", "Pending verification"
    APPLIED = "applied", "Applied"
    NOT_APPLIED = "not_applied", "Not applied"
    COMPENSATED = "compensated", "Compensated"


class RecoveryPolicy(models.TextChoices):
    QUERY_ORIGINAL = "query_original", "Query the original operation"
    REUSE_IDEMPOTENCY_KEY = "reuse_idempotency_key", "Reuse the idempotency key"
    MANUAL_CONFIRMATION = "manual_confirmation", "Manual confirmation"
    COMPENSATE = "compensate", "Compensate"


# An unconfirmed side effect: a write whose outcome is pending verification and that no reviewer
# has resolved. It makes a stop dirty, the packet lists it, the console counts it. The one
# definition: `ExecutionRecord.objects.unconfirmed()`, this Q where a query ORs it with another,
# `is_unconfirmed_side_effect` for a row already loaded (a model or a `.values()` dict).
UNCONFIRMED_SIDE_EFFECT = Q(
    side_effect=SideEffect.WRITE,
    side_effect_state=SideEffectState.PENDING_VERIFICATION,
    resolved=False,
)


def is_unconfirmed_side_effect(*, side_effect: str, side_effect_state: str, resolved: bool) -> bool:
    return (
        side_effect == SideEffect.WRITE
        and side_effect_state == SideEffectState.PENDING_VERIFICATION
        and not resolved
    )


class ExecutionRecordQuerySet(models.QuerySet["ExecutionRecord"]):
    def unconfirmed(self) -> ExecutionRecordQuerySet:
        return self.filter(UNCONFIRMED_SIDE_EFFECT)


class ExecutionRecord(models.Model):
    """One tool call: intent written before it runs (the permit), result after."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="execution_records", db_index=False
    )
    step = models.ForeignKey(
        Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="execution_records"
    )
    tool_call_id = models.CharField(max_length=120)
    tool = models.CharField(max_length=120)
    arguments = models.JSONField(default=dict, blank=True)
    operation_id = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True)
    side_effect = models.CharField(
        max_length=8, choices=SideEffect.choices, default=SideEffect.NONE
    )
    permit_epoch = models.PositiveIntegerField()
    execution_state = models.CharField(
        max_length=20, choices=ExecutionState.choices, default=ExecutionState.PERMITTED
    )
    cancel_requested = models.BooleanField(default=False)
    remote_cancel_state = models.CharField(
        max_length=16, choices=RemoteCancelState.choices, default=RemoteCancelState.NOT_REQUESTED
    )
    side_effect_state = models.CharField(
        max_length=24, choices=SideEffectState.choices, default=SideEffectState.NONE
    )
    last_observation = models.TextField(blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    observation_source = models.CharField(max_length=60, blank=True)
    output_truncated = models.BooleanField(default=False)
    recovery_policy = models.CharField(
        max_length=24, choices=RecoveryPolicy.choices, default=RecoveryPolicy.MANUAL_CONFIRMATION
    )
    recovery_action = models.TextField(blank=True)
    reported_after_stop = models.BooleanField(default=False)
    resolved = models.BooleanField(default=False)
    permitted_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ExecutionRecordQuerySet.as_manager()

    class Meta:
        ordering = ["permitted_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "tool_call_id"], name="exec_unique_run_tool_call"
            ),
        ]
        indexes = [
            # the few unconfirmed writes: which runs have one, without visiting every run
            # (console.selectors.needs_me._unknown_run_ids, for the nav's and the runs page's counts)
            models.Index(
                fields=["run"], name="exec_unconfirmed_idx", condition=UNCONFIRMED_SIDE_EFFECT
            ),
            # the settle decision and the stop packet look for calls whose outcome is open
            models.Index(
                fields=["run", "execution_state"],
                name="exec_open_idx",
                condition=Q(execution_state__in=["permitted", "running", "unknown"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_call_id} {self.tool} ({self.execution_state})"

    @property
    def permit_id(self) -> str:
        """The id a client starts the call with; a held call has none until approved."""
        return f"permit_{self.pk}"


class OutboxStatus(models.TextChoices):
    # Held by an approval gate (DESIGN §10): no dispatcher may claim it.
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    PENDING = "pending", "Pending"
    DISPATCHING = "dispatching", "Dispatching"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    FROZEN = "frozen", "Frozen"
    UNKNOWN = "unknown", "Unknown"
    RELEASED = "released", "Released"
    DISCARDED = "discarded", "Discarded"


# The outbox's unconfirmed side effect: an item claimed for sending whose outcome is not known
# (dispatching, or reaped to unknown) and that no reviewer has resolved.
OUTBOX_IN_FLIGHT_STATUSES = (OutboxStatus.DISPATCHING, OutboxStatus.UNKNOWN)


class OutboxItemQuerySet(models.QuerySet["OutboxItem"]):
    def unconfirmed(self) -> OutboxItemQuerySet:
        return self.filter(status__in=OUTBOX_IN_FLIGHT_STATUSES, resolved=False)


class OutboxItem(models.Model):
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="outbox_items", db_index=False
    )
    execution_record = models.ForeignKey(
        ExecutionRecord,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="outbox_items",
        db_index=False,
    )
    transport = models.CharField(max_length=16)
    destination = models.CharField(max_length=500)
    payload = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=200)
    status = models.CharField(
        max_length=20, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    enqueue_epoch = models.PositiveIntegerField()
    claim_epoch = models.PositiveIntegerField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=120, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    frozen_at = models.DateTimeField(null=True, blank=True)
    frozen_by_epoch = models.PositiveIntegerField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    resolved = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OutboxItemQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"], name="outbox_unique_run_key"
            ),
        ]
        indexes = [
            # the few items in flight or unknown: which runs have one (as exec_unconfirmed_idx)
            models.Index(
                fields=["run"],
                name="outbox_unconfirmed_idx",
                condition=Q(status__in=OUTBOX_IN_FLIGHT_STATUSES, resolved=False),
            ),
            # outbox_claim_next: the dispatcher scans pending items oldest first
            models.Index(
                fields=["created_at"], name="outbox_pending_idx", condition=Q(status="pending")
            ),
            # the stop's freeze: this run's pending items, and nothing else. Without it PostgreSQL
            # ANDed outbox_pending_idx into the freeze, which after a big freeze holds every
            # frozen item's dead entry until VACUUM: 28 ms a stop over 1.2M of them (BENCHMARKS).
            models.Index(
                fields=["run"], name="outbox_pending_run_idx", condition=Q(status="pending")
            ),
            # outbox_claim_next's second query: the few items a reviewer released after a stop
            models.Index(
                fields=["created_at"],
                name="outbox_released_idx",
                condition=Q(status="released"),
            ),
            # reaper: dispatching items whose claim is too old
            models.Index(
                fields=["claimed_at"],
                name="outbox_dispatching_idx",
                condition=Q(status="dispatching"),
            ),
            # Most items have no execution record; a full index would take a write per item on
            # every freeze (a status change is never a HOT update: `status` is in the predicates).
            models.Index(
                fields=["execution_record"],
                name="outbox_exec_record_idx",
                condition=Q(execution_record__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.transport} ({self.status})"

    @property
    def public_id(self) -> str:
        return f"outbox_{self.pk}"


class LeaseReleaseReason(models.TextChoices):
    RELEASED = "released", "Released"
    REVOKED_BY_STOP = "revoked_by_stop", "Revoked by stop"
    EXPIRED = "expired", "Expired"


class Lease(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="leases")
    worker_id = models.CharField(max_length=120)
    epoch = models.PositiveIntegerField()
    token = models.CharField(max_length=64, unique=True)
    acquired_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    ttl_seconds = models.FloatField(default=30)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=16, choices=LeaseReleaseReason.choices, blank=True)
    # A worker fenced off without confirming it stopped (drain deadline, or its lease expired
    # mid-stop) is itself an unknown until a reviewer confirms it did nothing further.
    fenced_unconfirmed = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # one live lease per run
            models.UniqueConstraint(
                fields=["run"], condition=Q(released_at__isnull=True), name="lease_one_live_per_run"
            ),
        ]
        indexes = [
            # workers fenced without confirming: which runs have one (as exec_unconfirmed_idx)
            models.Index(
                fields=["run"],
                name="lease_fenced_unconfirmed_idx",
                condition=Q(fenced_unconfirmed=True),
            ),
            # lease reaper: live leases by expiry
            models.Index(
                fields=["expires_at"],
                name="lease_live_expiry_idx",
                condition=Q(released_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.token} {self.worker_id} @{self.epoch}"


class StopRequest(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="stop_requests")
    signal = models.CharField(max_length=24, default="cancel_requested")
    requested_by = models.CharField(max_length=150)
    actor_kind = models.CharField(max_length=16)
    reason = models.CharField(max_length=24, choices=StopReason.choices)
    note = models.TextField(blank=True)
    takeover = models.BooleanField(default=False)
    requested_at = models.DateTimeField()
    epoch_before = models.PositiveIntegerField()
    epoch_after = models.PositiveIntegerField()
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    signal_delivered_at = models.DateTimeField(null=True, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    outcome_state = models.CharField(max_length=24, blank=True)
    dirty_reasons = models.JSONField(default=list, blank=True)
    drain_observations = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "epoch_after"], name="stoprequest_unique_run_epoch"
            ),
        ]

    def __str__(self) -> str:
        return f"stop {self.run_id} @{self.epoch_after} by {self.requested_by} ({self.reason})"


class Artifact(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    step = models.ForeignKey(
        Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts"
    )
    name = models.CharField(max_length=300)
    kind = models.CharField(max_length=60, blank=True)
    uri = models.CharField(max_length=1000, blank=True)
    content = models.TextField(blank=True)
    checksum = models.CharField(max_length=128, blank=True)
    reusable = models.BooleanField(default=False)
    evidence = models.BooleanField(default=False)
    epoch = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run"], name="artifact_run_idx")]

    def __str__(self) -> str:
        return self.name


class Checkpoint(models.Model):
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    step_seq = models.PositiveIntegerField(null=True, blank=True)
    label = models.CharField(max_length=120)
    state = models.JSONField(default=dict, blank=True)
    epoch = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["run"], name="checkpoint_run_idx")]

    def __str__(self) -> str:
        return self.label


class SteeringStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    APPLIED = "applied", "Applied"
    UNAPPLIED_AT_STOP = "unapplied_at_stop", "Unapplied at stop"
    CARRIED_OVER = "carried_over", "Carried over"
    DISCARDED = "discarded", "Discarded"


class SteeringMessage(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steering_messages")
    author = models.CharField(max_length=150)
    text = models.TextField()
    status = models.CharField(
        max_length=20, choices=SteeringStatus.choices, default=SteeringStatus.QUEUED
    )
    created_at = models.DateTimeField(auto_now_add=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.author}: {self.text[:40]}"


class EventReceipt(models.Model):
    """Dedup for batched events: a retried event_id answers `duplicate` with the first outcome."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="event_receipts", db_index=False
    )
    event_id = models.CharField(max_length=120)
    type = models.CharField(max_length=40)
    epoch = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16)
    code = models.CharField(max_length=40, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "event_id"], name="event_unique_run_event")
        ]

    def __str__(self) -> str:
        return f"{self.event_id} {self.outcome}"


class PriceSource(models.TextChoices):
    PROVIDER = "provider", "Reported by the provider"
    TABLE = "table", "Price table"
    TEAM = "team", "Team price"
    UNPRICED = "unpriced", "Unpriced"


class Usage(models.Model):
    """One model call's tokens and what it cost (DESIGN §13), from a `usage` event.

    Priced once, when it arrives: `price_source` says where the cost came from and
    `price_version` which table, so a newer price table never changes a stored cost. An unknown
    model is `unpriced` with `cost_usd` null, never $0.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="usages", db_index=False)
    event_id = models.CharField(max_length=120)
    epoch = models.PositiveIntegerField()
    step_key = models.CharField(max_length=120, blank=True)
    model = models.CharField(max_length=200)
    provider = models.CharField(max_length=100, blank=True)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True)
    price_source = models.CharField(max_length=16, choices=PriceSource.choices)
    price_version = models.CharField(max_length=60, blank=True)
    at = models.DateTimeField()

    class Meta:
        constraints = [
            # also the (run, ...) index every per-run read uses
            models.UniqueConstraint(fields=["run", "event_id"], name="usage_unique_run_event")
        ]
        indexes = [models.Index(fields=["run", "at"], name="usage_run_at_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.model} {self.input_tokens}+{self.output_tokens}"


class RejectedWrite(models.Model):
    """A stale-epoch write that was refused: counted for the stop-quality figures."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rejected_writes")
    kind = models.CharField(max_length=40)
    epoch = models.PositiveIntegerField()
    run_epoch = models.PositiveIntegerField()
    code = models.CharField(max_length=40)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["at"], name="rejectedwrite_at_idx")]

    def __str__(self) -> str:
        return f"{self.kind} @{self.epoch} < {self.run_epoch}"


class ActorKind(models.TextChoices):
    USER = "user", "User"
    API_CLIENT = "api_client", "API client"
    SYSTEM = "system", "System"


class LedgerEntry(models.Model):
    """Append-only, hash-chained per run. UPDATE and DELETE are refused by a trigger."""

    # Keeps Django's run_id indexes: on SQLite an index change remakes the table, which would
    # drop the append-only triggers (migration 0002).
    run = models.ForeignKey(
        Run,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="ledger_entries",
        db_constraint=True,
    )
    run_seq = models.PositiveIntegerField()
    at = models.DateTimeField()
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    actor = models.CharField(max_length=150)
    team_slug = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=60)
    reason = models.CharField(max_length=60, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)
    # How `hash` was made (runs/ledger.py): 1, a plain SHA-256 that leaves out team_slug (entries
    # written before the chain was keyed; only anchored ones verify); 2, an HMAC-SHA256 over every
    # column but the database id, with the ledger key `key_id` names (runs/ledger_keys.py).
    hash_version = models.PositiveSmallIntegerField()
    key_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["run", "run_seq"], name="ledger_unique_run_seq"),
            models.UniqueConstraint(
                fields=["run_seq"], condition=Q(run__isnull=True), name="ledger_unique_global_seq"
            ),
        ]
        indexes = [
            models.Index(fields=["action", "at"], name="ledger_action_at_idx"),
            models.Index(fields=["actor", "at"], name="ledger_actor_at_idx"),
            models.Index(fields=["team_slug", "at"], name="ledger_team_at_idx"),
            models.Index(fields=["at"], name="ledger_at_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} by {self.actor}"

    @property
    def seq(self) -> int:
        return self.pk


class LedgerVerification(models.Model):
    """One walk of every hash chain: who asked (a person, or `scheduled`), when it ran, how many
    entries it checked and the first break it found. Walks run in a worker, never in a page
    request (runs/ledger_checks.py); the audit page shows the latest one."""

    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    checked = models.PositiveBigIntegerField(default=0)
    broken_entry_id = models.BigIntegerField(null=True, blank=True)
    broken_run_id = models.CharField(max_length=32, blank=True)
    broken_run_seq = models.PositiveIntegerField(null=True, blank=True)
    problem = models.TextField(blank=True)
    # Why the walk could not finish (the database went away, ...): not a break, not a pass.
    error = models.TextField(blank=True)
    # Chain heads an earlier walk anchored outside the database and this one found again
    # (runs/ledger_anchors.py); the anchor this walk wrote, or why it could not write one.
    anchored_heads = models.PositiveIntegerField(default=0)
    anchor_written = models.CharField(max_length=200, blank=True)
    anchor_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["-requested_at"], name="ledger_verification_idx")]

    def __str__(self) -> str:
        return f"ledger verification #{self.pk} ({self.requested_by})"


class ApprovalAppliesTo(models.TextChoices):
    ANY = "any", "Tool calls and outbox items"
    TOOL_CALL = "tool_call", "Tool calls"
    OUTBOX = "outbox", "Outbox items"


class ApprovalRule(models.Model):
    """A team's rule that holds a matching tool call or outbox item for a reviewer (DESIGN §10).

    Globs use `fnmatch` syntax; a blank glob matches anything. Rules are tried in `position`
    order and the first match decides.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="approval_rules")
    name = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    position = models.PositiveIntegerField(default=100)
    applies_to = models.CharField(
        max_length=16, choices=ApprovalAppliesTo.choices, default=ApprovalAppliesTo.ANY
    )
    tool_glob = models.CharField(max_length=200, blank=True)
    # "write" matches only side-effecting calls; blank matches any call.
    side_effect = models.CharField(max_length=8, choices=SideEffect.choices, blank=True)
    agent_glob = models.CharField(max_length=200, blank=True)
    transport = models.CharField(max_length=16, blank=True)
    destination_glob = models.CharField(max_length=500, blank=True)
    risk = models.CharField(max_length=8, default="medium")
    timeout_seconds = models.PositiveIntegerField(default=900)
    escalate_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="approvalrule_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug})"


class ApprovalRisk(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"


class ApprovalStatus(models.TextChoices):
    WAITING = "waiting", "Waiting"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    VOID = "void", "Void"


class ApprovalTarget(models.TextChoices):
    TOOL_CALL = "tool_call", "Tool call"
    OUTBOX = "outbox", "Outbox item"


class Approval(models.Model):
    """One held side effect waiting for (or decided by) a reviewer (DESIGN §10).

    `team` and `agent` copy the run's so the inbox filters and sorts on one table.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="approvals")
    agent = models.CharField(max_length=120)
    epoch = models.PositiveIntegerField()
    target = models.CharField(max_length=12, choices=ApprovalTarget.choices)
    execution_record = models.OneToOneField(
        ExecutionRecord,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="approval",
    )
    outbox_item = models.OneToOneField(
        OutboxItem, on_delete=models.CASCADE, null=True, blank=True, related_name="approval"
    )
    # What is held, for people: a tool name, or "webhook → https://…" for an outbox item.
    subject = models.CharField(max_length=300)
    rule = models.ForeignKey(
        ApprovalRule, on_delete=models.SET_NULL, null=True, blank=True, related_name="approvals"
    )
    # The rule's name at request time (a rule may be renamed or deleted later), or blank when
    # the agent asked for approval itself.
    rule_name = models.CharField(max_length=120, blank=True)
    match_reason = models.CharField(max_length=500, blank=True)
    summary = models.TextField(blank=True)
    risk = models.CharField(max_length=8, choices=ApprovalRisk.choices, default=ApprovalRisk.MEDIUM)
    original_arguments = models.JSONField(default=dict, blank=True)
    arguments_schema = models.JSONField(null=True, blank=True)
    arguments = models.JSONField(default=dict, blank=True)
    edited = models.BooleanField(default=False)
    status = models.CharField(
        max_length=12, choices=ApprovalStatus.choices, default=ApprovalStatus.WAITING
    )
    message = models.TextField(blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decided_by_kind = models.CharField(max_length=16, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    requested_at = models.DateTimeField()
    deadline = models.DateTimeField()
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["deadline", "id"]
        indexes = [
            # the inbox and the expiry sweep: waiting approvals by deadline
            models.Index(
                fields=["deadline", "id"],
                name="approval_waiting_idx",
                condition=Q(status="waiting"),
            ),
            models.Index(
                fields=["team", "deadline"],
                name="approval_team_waiting_idx",
                condition=Q(status="waiting"),
            ),
            # the escalation sweep
            models.Index(
                fields=["escalate_at"],
                name="approval_escalate_idx",
                condition=Q(status="waiting", escalated_at__isnull=True),
            ),
            models.Index(fields=["run", "status"], name="approval_run_status_idx"),
            models.Index(fields=["decided_at"], name="approval_decided_idx"),
            # The per-team request rate (`_check_team_approval_rate`): a team's newest requests.
            models.Index(fields=["team", "-requested_at"], name="approval_team_requested_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(target="tool_call", execution_record__isnull=False, outbox_item__isnull=True)
                    | Q(target="outbox", outbox_item__isnull=False)
                ),
                name="approval_target_matches",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.subject} ({self.status})"

    @property
    def public_id(self) -> str:
        return f"appr_{self.pk}"


def new_bulk_id() -> str:
    return "bulk_" + secrets.token_hex(6)


def new_preview_id() -> str:
    return "bprev_" + secrets.token_hex(8)


class BulkStopPreview(models.Model):
    """What a bulk stop's dry run showed one caller (DESIGN §12): the runs a stop would change.

    The confirm names it and stops exactly these runs. A filter is a question asked at a moment:
    runs that begin to match it between the preview and the confirm were never shown to the
    reviewer, so they are counted (`new_since_preview`), not stopped.
    """

    preview_id = models.CharField(
        max_length=32, unique=True, default=new_preview_id, editable=False
    )
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    filter = models.JSONField(default=dict, blank=True)
    # The ids of the runs a stop would change when the preview was made (stoppable, allowed).
    run_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.preview_id}: {len(self.run_ids)} runs"


class BulkStopOutcome(models.TextChoices):
    # Written with the BulkStop, before any run is stopped: a row still pending after the
    # bulk finished names a run the process never reached (it died midway).
    PENDING = "pending", "Pending"
    STOPPED = "stopped", "Stopped"
    ALREADY_STOPPING = "already_stopping", "Already stopping"
    ALREADY_STOPPED = "already_stopped", "Already stopped"
    ALREADY_FINISHED = "already_finished", "Already finished"
    NOT_ALLOWED = "not_allowed", "Not allowed"
    NOT_FOUND = "not_found", "Not found"
    # The stop service refused (a run in a state no stop can reach); `detail` says why.
    FAILED = "failed", "Failed"


class BulkStop(models.Model):
    """Many runs stopped at once (DESIGN §12): who, why, which filter, and one result per run.

    Each run is stopped by `run_stop` in its own transaction (its own StopRequest, epoch bump and
    ledger entry, whose payload names `bulk_id`); this record only ties them together.
    """

    bulk_id = models.CharField(max_length=32, unique=True, default=new_bulk_id, editable=False)
    requested_by = models.CharField(max_length=150)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_id = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=24, choices=StopReason.choices)
    note = models.TextField(blank=True)
    filter = models.JSONField(default=dict, blank=True)
    # The client's id for this bulk stop, so a retried POST answers the first one (blank: none).
    idempotency_key = models.CharField(max_length=200, blank=True)
    requested = models.PositiveIntegerField(default=0)
    counts = models.JSONField(default=dict, blank=True)
    # The preview the reviewer confirmed (blank: a script's confirm, which took the filter's set
    # at that moment), and how many runs began to match the filter since and were left alone.
    preview_id = models.CharField(max_length=32, blank=True)
    new_since_preview = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["actor_kind", "actor_id", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="bulkstop_unique_actor_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.bulk_id} by {self.requested_by} ({self.reason}, {self.requested} runs)"


class BulkStopResult(models.Model):
    """What a bulk stop did to one run. `run_id` is plain text: an id the caller named may not
    exist (or not be theirs to see), and that answer is a result too."""

    # No index of its own: the unique (bulk, run_id) index serves every lookup by bulk.
    bulk = models.ForeignKey(
        BulkStop, on_delete=models.CASCADE, related_name="results", db_index=False
    )
    run_id = models.CharField(max_length=64)
    outcome = models.CharField(
        max_length=20, choices=BulkStopOutcome.choices, default=BulkStopOutcome.PENDING
    )
    status = models.CharField(max_length=24, blank=True)
    stop_epoch = models.PositiveIntegerField(null=True, blank=True)
    stop_request = models.ForeignKey(
        StopRequest, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    detail = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["bulk", "run_id"], name="bulkresult_unique_bulk_run"),
        ]

    def __str__(self) -> str:
        return f"{self.bulk_id} {self.run_id}: {self.outcome}"
