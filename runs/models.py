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
from django.utils.translation import gettext_lazy as _


def new_run_id() -> str:
    return "run_" + secrets.token_hex(6)


def validate_time_zone(value: str) -> None:
    """An IANA time zone name (`Asia/Shanghai`, `UTC`)."""
    import zoneinfo

    from django.core.exceptions import ValidationError

    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            _("%(zone)s is not a time zone name such as Asia/Shanghai or UTC."),
            params={"zone": value},
        ) from None


class Team(models.Model):
    slug = models.SlugField(max_length=64, unique=True, verbose_name=_("slug"))
    name = models.CharField(max_length=120, verbose_name=_("name"))
    # The console shows this team's times in it (the middleware activates it per reader).
    time_zone = models.CharField(
        max_length=64, default="UTC", validators=[validate_time_zone], verbose_name=_("time zone")
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("team")
        verbose_name_plural = _("teams")

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    VIEWER = "viewer", _("Viewer")
    REVIEWER = "reviewer", _("Reviewer")
    ADMIN = "admin", _("Admin")


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name=_("user"),
    )
    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="memberships", verbose_name=_("team")
    )
    role = models.CharField(
        max_length=16, choices=Role.choices, default=Role.VIEWER, verbose_name=_("role")
    )

    class Meta:
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} as {self.role}"


class TokenRole(models.TextChoices):
    AGENT = "agent", _("Agent")
    REVIEWER = "reviewer", _("Reviewer")


class ApiToken(models.Model):
    """A bearer token for an agent runtime or a reviewer script. Only its SHA-256 is stored."""

    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="tokens", verbose_name=_("team")
    )
    name = models.CharField(max_length=120, verbose_name=_("name"))
    role = models.CharField(
        max_length=16, choices=TokenRole.choices, default=TokenRole.AGENT, verbose_name=_("role")
    )
    prefix = models.CharField(max_length=16, db_index=True, verbose_name=_("prefix"))
    token_hash = models.CharField(max_length=64, unique=True, verbose_name=_("token hash"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    last_used_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last used at"))
    revoked_at = models.DateTimeField(null=True, blank=True, verbose_name=_("revoked at"))

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="apitoken_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug}, {self.role})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class RunStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    SUSPENDED = "suspended", _("Suspended")
    INTERRUPTED = "interrupted", _("Interrupted")
    CANCEL_REQUESTED = "cancel_requested", _("Cancel requested")
    DRAINING = "draining", _("Draining")
    STOPPED_CLEANLY = "stopped_cleanly", _("Stopped cleanly")
    STOPPED_DIRTY = "stopped_dirty", _("Stopped dirty")
    HANDED_OFF = "handed_off", _("Handed off")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


# Statuses in which the entrance is open only for a running worker; everything else refuses
# permits, dispatch and new outbox items.
STOPPABLE_STATUSES = frozenset(
    {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.INTERRUPTED}
)
STOPPING_STATUSES = frozenset({RunStatus.CANCEL_REQUESTED, RunStatus.DRAINING})
STOPPED_STATUSES = frozenset({RunStatus.STOPPED_CLEANLY, RunStatus.STOPPED_DIRTY})
TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class StopReason(models.TextChoices):
    USER_STOP = "user_stop", _("User stop")
    MANUAL_TAKEOVER = "manual_takeover", _("Manual takeover")
    BUDGET_EXHAUSTED = "budget_exhausted", _("Budget exhausted")
    TIMEOUT = "timeout", _("Timeout")
    ADMIN_KILL = "admin_kill", _("Admin kill")
    DEPENDENCY_FAILURE = "dependency_failure", _("Dependency failure")
    LEASE_EXPIRED = "lease_expired", _("Lease expired")
    DRAIN_DEADLINE = "drain_deadline", _("Drain deadline")
    # A team's policy (DESIGN §14) acted; the actor is `policy:<name>`.
    POLICY_VIOLATION = "policy_violation", _("Policy violation")


# Reasons an agent token may use to stop its own run (DESIGN §5).
AGENT_STOP_REASONS = frozenset(
    {StopReason.BUDGET_EXHAUSTED, StopReason.TIMEOUT, StopReason.DEPENDENCY_FAILURE}
)


class Run(models.Model):
    id = models.CharField(
        primary_key=True, max_length=32, default=new_run_id, editable=False, verbose_name=_("ID")
    )
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, related_name="runs", verbose_name=_("team")
    )
    title = models.CharField(max_length=300, verbose_name=_("title"))
    agent = models.CharField(max_length=120, verbose_name=_("agent"))
    status = models.CharField(
        max_length=24,
        choices=RunStatus.choices,
        default=RunStatus.PENDING,
        verbose_name=_("status"),
    )
    stop_epoch = models.PositiveIntegerField(default=1, verbose_name=_("stop epoch"))
    # Bumped on every committed change of the run or its children; websocket frames carry it
    # so a viewer can detect a gap and refetch.
    change_seq = models.PositiveBigIntegerField(default=0, verbose_name=_("change sequence"))
    stop_reason = models.CharField(
        max_length=24, choices=StopReason.choices, blank=True, verbose_name=_("stop reason")
    )
    stop_requested_by = models.CharField(
        max_length=150, blank=True, verbose_name=_("stop requested by")
    )
    stop_requested_at = models.DateTimeField(
        null=True, blank=True, verbose_name=_("stop requested at")
    )
    stopped_at = models.DateTimeField(null=True, blank=True, verbose_name=_("stopped at"))
    max_seconds = models.PositiveIntegerField(null=True, blank=True, verbose_name=_("max seconds"))
    max_tool_calls = models.PositiveIntegerField(
        null=True, blank=True, verbose_name=_("max tool calls")
    )
    tool_calls_count = models.PositiveIntegerField(default=0, verbose_name=_("tool calls count"))
    resume_from = models.CharField(max_length=120, blank=True, verbose_name=_("resume from"))
    interruption = models.JSONField(default=dict, blank=True, verbose_name=_("interruption"))
    result = models.JSONField(null=True, blank=True, verbose_name=_("result"))
    failure = models.JSONField(null=True, blank=True, verbose_name=_("failure"))
    # Facts that arrived after the stop (e.g. a completion at a stale epoch): kept, never applied.
    late_reports = models.JSONField(default=list, blank=True, verbose_name=_("late reports"))
    late_writes_rejected = models.PositiveIntegerField(
        default=0, verbose_name=_("late writes rejected")
    )
    created_by = models.CharField(max_length=150, blank=True, verbose_name=_("created by"))
    # The client's id for this create, so a retried POST returns the first run (blank: none).
    idempotency_key = models.CharField(
        max_length=200, blank=True, verbose_name=_("idempotency key")
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    started_at = models.DateTimeField(null=True, blank=True, verbose_name=_("started at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))
    # Cost (DESIGN §13). The budgets, then the totals the events batch keeps incrementally, under
    # the run lock and in the usage rows' own transaction, so they always equal the rows' sums.
    # Kept after every other column: the events batch reads a prefix of them (`Model.from_db`).
    max_cost_usd = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True, verbose_name=_("max cost (USD)")
    )
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True, verbose_name=_("max tokens"))
    cost_usd = models.DecimalField(
        max_digits=20, decimal_places=10, default=0, verbose_name=_("cost (USD)")
    )
    input_tokens = models.PositiveBigIntegerField(default=0, verbose_name=_("input tokens"))
    output_tokens = models.PositiveBigIntegerField(default=0, verbose_name=_("output tokens"))
    # Tokens (input + output) of calls no price was found for: their cost is unknown, never $0.
    unpriced_tokens = models.PositiveBigIntegerField(default=0, verbose_name=_("unpriced tokens"))

    class Meta:
        verbose_name = _("run")
        verbose_name_plural = _("runs")
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
    MODEL_CALL = "model_call", _("Model call")
    TOOL_READ = "tool_read", _("Tool (read)")
    TOOL_WRITE = "tool_write", _("Tool (write)")
    EXTERNAL_ACTION = "external_action", _("External action")


class StepStatus(models.TextChoices):
    PLANNED = "planned", _("Planned")
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")
    UNKNOWN = "unknown", _("Unknown")


class Step(models.Model):
    # db_index=False on the run FKs of the busy child tables: Django would add two indexes per FK
    # (run_id and a varchar_pattern_ops twin, run ids being strings), each one more write per
    # row. A (run, ...) unique index or an explicit Index(fields=["run"]) serves run_id lookups
    # (docs/BENCHMARKS.md, outbox freeze: each extra index is one more write per frozen row).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, verbose_name=_("run")
    )
    seq = models.PositiveIntegerField(verbose_name=_("sequence"))
    key = models.CharField(max_length=120, verbose_name=_("key"))
    name = models.CharField(max_length=300, blank=True, verbose_name=_("name"))
    kind = models.CharField(
        max_length=24, choices=StepKind.choices, default=StepKind.MODEL_CALL, verbose_name=_("kind")
    )
    status = models.CharField(
        max_length=16,
        choices=StepStatus.choices,
        default=StepStatus.PLANNED,
        verbose_name=_("status"),
    )
    epoch = models.PositiveIntegerField(default=0, verbose_name=_("epoch"))
    detail = models.JSONField(default=dict, blank=True, verbose_name=_("detail"))
    reported_after_stop = models.BooleanField(default=False, verbose_name=_("reported after stop"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    started_at = models.DateTimeField(null=True, blank=True, verbose_name=_("started at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))

    class Meta:
        verbose_name = _("step")
        verbose_name_plural = _("steps")
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="step_unique_run_seq"),
            models.UniqueConstraint(fields=["run", "key"], name="step_unique_run_key"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.key}"


class SideEffect(models.TextChoices):
    NONE = "none", _("None")
    WRITE = "write", _("Write")


class ExecutionState(models.TextChoices):
    # Intent recorded, held by an approval gate (DESIGN §10): no permit exists yet.
    AWAITING_APPROVAL = "awaiting_approval", _("Awaiting approval")
    PERMITTED = "permitted", _("Permitted")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    NOT_STARTED = "not_started", _("Not started")
    UNKNOWN = "unknown", _("Unknown")


class RemoteCancelState(models.TextChoices):
    NOT_REQUESTED = "not_requested", _("Not requested")
    REQUESTED = "requested", _("Requested")
    CONFIRMED = "confirmed", _("Confirmed")
    REFUSED = "refused", _("Refused")


class SideEffectState(models.TextChoices):
    NONE = "none", _("None")
    PENDING_VERIFICATION = "pending_verification", _("Pending verification")
    APPLIED = "applied", _("Applied")
    NOT_APPLIED = "not_applied", _("Not applied")
    COMPENSATED = "compensated", _("Compensated")


class RecoveryPolicy(models.TextChoices):
    QUERY_ORIGINAL = "query_original", _("Query the original operation")
    REUSE_IDEMPOTENCY_KEY = "reuse_idempotency_key", _("Reuse the idempotency key")
    MANUAL_CONFIRMATION = "manual_confirmation", _("Manual confirmation")
    COMPENSATE = "compensate", _("Compensate")


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

    # Not a column: what `permit_request` learnt writing this record's permit. False when the
    # team has no approval rule and never had a policy, so nothing could have held the call;
    # the MCP gateway then forwards a session's next read beside its permit (DESIGN §15).
    holds_possible = True

    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="execution_records",
        db_index=False,
        verbose_name=_("run"),
    )
    step = models.ForeignKey(
        Step,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="execution_records",
        verbose_name=_("step"),
    )
    tool_call_id = models.CharField(max_length=120, verbose_name=_("tool call ID"))
    tool = models.CharField(max_length=120, verbose_name=_("tool"))
    arguments = models.JSONField(default=dict, blank=True, verbose_name=_("arguments"))
    operation_id = models.CharField(max_length=200, blank=True, verbose_name=_("operation ID"))
    idempotency_key = models.CharField(
        max_length=200, blank=True, verbose_name=_("idempotency key")
    )
    side_effect = models.CharField(
        max_length=8,
        choices=SideEffect.choices,
        default=SideEffect.NONE,
        verbose_name=_("side effect"),
    )
    permit_epoch = models.PositiveIntegerField(verbose_name=_("permit epoch"))
    execution_state = models.CharField(
        max_length=20,
        choices=ExecutionState.choices,
        default=ExecutionState.PERMITTED,
        verbose_name=_("execution state"),
    )
    cancel_requested = models.BooleanField(default=False, verbose_name=_("cancel requested"))
    remote_cancel_state = models.CharField(
        max_length=16,
        choices=RemoteCancelState.choices,
        default=RemoteCancelState.NOT_REQUESTED,
        verbose_name=_("remote cancel state"),
    )
    side_effect_state = models.CharField(
        max_length=24,
        choices=SideEffectState.choices,
        default=SideEffectState.NONE,
        verbose_name=_("side effect state"),
    )
    last_observation = models.TextField(blank=True, verbose_name=_("last observation"))
    observed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("observed at"))
    observation_source = models.CharField(
        max_length=60, blank=True, verbose_name=_("observation source")
    )
    output_truncated = models.BooleanField(default=False, verbose_name=_("output truncated"))
    recovery_policy = models.CharField(
        max_length=24,
        choices=RecoveryPolicy.choices,
        default=RecoveryPolicy.MANUAL_CONFIRMATION,
        verbose_name=_("recovery policy"),
    )
    recovery_action = models.TextField(blank=True, verbose_name=_("recovery action"))
    reported_after_stop = models.BooleanField(default=False, verbose_name=_("reported after stop"))
    resolved = models.BooleanField(default=False, verbose_name=_("resolved"))
    permitted_at = models.DateTimeField(auto_now_add=True, verbose_name=_("permitted at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))

    objects = ExecutionRecordQuerySet.as_manager()

    class Meta:
        verbose_name = _("execution record")
        verbose_name_plural = _("execution records")
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
    AWAITING_APPROVAL = "awaiting_approval", _("Awaiting approval")
    PENDING = "pending", _("Pending")
    DISPATCHING = "dispatching", _("Dispatching")
    SENT = "sent", _("Sent")
    FAILED = "failed", _("Failed")
    FROZEN = "frozen", _("Frozen")
    UNKNOWN = "unknown", _("Unknown")
    RELEASED = "released", _("Released")
    DISCARDED = "discarded", _("Discarded")


# The outbox's unconfirmed side effect: an item claimed for sending whose outcome is not known
# (dispatching, or reaped to unknown) and that no reviewer has resolved.
OUTBOX_IN_FLIGHT_STATUSES = (OutboxStatus.DISPATCHING, OutboxStatus.UNKNOWN)


class OutboxItemQuerySet(models.QuerySet["OutboxItem"]):
    def unconfirmed(self) -> OutboxItemQuerySet:
        return self.filter(status__in=OUTBOX_IN_FLIGHT_STATUSES, resolved=False)


class OutboxItem(models.Model):
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="outbox_items",
        db_index=False,
        verbose_name=_("run"),
    )
    execution_record = models.ForeignKey(
        ExecutionRecord,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="outbox_items",
        db_index=False,
        verbose_name=_("execution record"),
    )
    transport = models.CharField(max_length=16, verbose_name=_("transport"))
    destination = models.CharField(max_length=500, verbose_name=_("destination"))
    payload = models.JSONField(default=dict, blank=True, verbose_name=_("payload"))
    idempotency_key = models.CharField(max_length=200, verbose_name=_("idempotency key"))
    status = models.CharField(
        max_length=20,
        choices=OutboxStatus.choices,
        default=OutboxStatus.PENDING,
        verbose_name=_("status"),
    )
    enqueue_epoch = models.PositiveIntegerField(verbose_name=_("enqueue epoch"))
    claim_epoch = models.PositiveIntegerField(null=True, blank=True, verbose_name=_("claim epoch"))
    claimed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("claimed at"))
    claimed_by = models.CharField(max_length=120, blank=True, verbose_name=_("claimed by"))
    attempts = models.PositiveSmallIntegerField(default=0, verbose_name=_("attempts"))
    frozen_at = models.DateTimeField(null=True, blank=True, verbose_name=_("frozen at"))
    frozen_by_epoch = models.PositiveIntegerField(
        null=True, blank=True, verbose_name=_("frozen by epoch")
    )
    sent_at = models.DateTimeField(null=True, blank=True, verbose_name=_("sent at"))
    last_error = models.TextField(blank=True, verbose_name=_("last error"))
    response_status = models.PositiveSmallIntegerField(
        null=True, blank=True, verbose_name=_("response status")
    )
    resolved = models.BooleanField(default=False, verbose_name=_("resolved"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    objects = OutboxItemQuerySet.as_manager()

    class Meta:
        verbose_name = _("outbox item")
        verbose_name_plural = _("outbox items")
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
    RELEASED = "released", _("Released")
    REVOKED_BY_STOP = "revoked_by_stop", _("Revoked by stop")
    EXPIRED = "expired", _("Expired")


class Lease(models.Model):
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="leases", verbose_name=_("run")
    )
    worker_id = models.CharField(max_length=120, verbose_name=_("worker ID"))
    epoch = models.PositiveIntegerField(verbose_name=_("epoch"))
    token = models.CharField(max_length=64, unique=True, verbose_name=_("token"))
    acquired_at = models.DateTimeField(verbose_name=_("acquired at"))
    heartbeat_at = models.DateTimeField(verbose_name=_("heartbeat at"))
    expires_at = models.DateTimeField(verbose_name=_("expires at"))
    ttl_seconds = models.FloatField(default=30, verbose_name=_("TTL seconds"))
    released_at = models.DateTimeField(null=True, blank=True, verbose_name=_("released at"))
    release_reason = models.CharField(
        max_length=16,
        choices=LeaseReleaseReason.choices,
        blank=True,
        verbose_name=_("release reason"),
    )
    # A worker fenced off without confirming it stopped (drain deadline, or its lease expired
    # mid-stop) is itself an unknown until a reviewer confirms it did nothing further.
    fenced_unconfirmed = models.BooleanField(default=False, verbose_name=_("fenced unconfirmed"))

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
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
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="stop_requests", verbose_name=_("run")
    )
    signal = models.CharField(max_length=24, default="cancel_requested", verbose_name=_("signal"))
    requested_by = models.CharField(max_length=150, verbose_name=_("requested by"))
    actor_kind = models.CharField(max_length=16, verbose_name=_("actor kind"))
    reason = models.CharField(max_length=24, choices=StopReason.choices, verbose_name=_("reason"))
    note = models.TextField(blank=True, verbose_name=_("note"))
    takeover = models.BooleanField(default=False, verbose_name=_("takeover"))
    requested_at = models.DateTimeField(verbose_name=_("requested at"))
    epoch_before = models.PositiveIntegerField(verbose_name=_("epoch before"))
    epoch_after = models.PositiveIntegerField(verbose_name=_("epoch after"))
    acknowledged_at = models.DateTimeField(null=True, blank=True, verbose_name=_("acknowledged at"))
    signal_delivered_at = models.DateTimeField(
        null=True, blank=True, verbose_name=_("signal delivered at")
    )
    drained_at = models.DateTimeField(null=True, blank=True, verbose_name=_("drained at"))
    stopped_at = models.DateTimeField(null=True, blank=True, verbose_name=_("stopped at"))
    outcome_state = models.CharField(max_length=24, blank=True, verbose_name=_("outcome state"))
    dirty_reasons = models.JSONField(default=list, blank=True, verbose_name=_("dirty reasons"))
    drain_observations = models.JSONField(
        default=list, blank=True, verbose_name=_("drain observations")
    )

    class Meta:
        verbose_name = _("stop request")
        verbose_name_plural = _("stop requests")
        ordering = ["-requested_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "epoch_after"], name="stoprequest_unique_run_epoch"
            ),
        ]

    def __str__(self) -> str:
        return f"stop {self.run_id} @{self.epoch_after} by {self.requested_by} ({self.reason})"


class Artifact(models.Model):
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="artifacts",
        db_index=False,
        verbose_name=_("run"),
    )
    step = models.ForeignKey(
        Step,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="artifacts",
        verbose_name=_("step"),
    )
    name = models.CharField(max_length=300, verbose_name=_("name"))
    kind = models.CharField(max_length=60, blank=True, verbose_name=_("kind"))
    uri = models.CharField(max_length=1000, blank=True, verbose_name=_("URI"))
    content = models.TextField(blank=True, verbose_name=_("content"))
    checksum = models.CharField(max_length=128, blank=True, verbose_name=_("checksum"))
    reusable = models.BooleanField(default=False, verbose_name=_("reusable"))
    evidence = models.BooleanField(default=False, verbose_name=_("evidence"))
    epoch = models.PositiveIntegerField(default=0, verbose_name=_("epoch"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("artifact")
        verbose_name_plural = _("artifacts")
        ordering = ["id"]
        indexes = [models.Index(fields=["run"], name="artifact_run_idx")]

    def __str__(self) -> str:
        return self.name


class Checkpoint(models.Model):
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="checkpoints",
        db_index=False,
        verbose_name=_("run"),
    )
    step_seq = models.PositiveIntegerField(null=True, blank=True, verbose_name=_("step sequence"))
    label = models.CharField(max_length=120, verbose_name=_("label"))
    state = models.JSONField(default=dict, blank=True, verbose_name=_("state"))
    epoch = models.PositiveIntegerField(default=0, verbose_name=_("epoch"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        ordering = ["id"]
        indexes = [models.Index(fields=["run"], name="checkpoint_run_idx")]

    def __str__(self) -> str:
        return self.label


class SteeringStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    APPLIED = "applied", _("Applied")
    UNAPPLIED_AT_STOP = "unapplied_at_stop", _("Unapplied at stop")
    CARRIED_OVER = "carried_over", _("Carried over")
    DISCARDED = "discarded", _("Discarded")


class SteeringMessage(models.Model):
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steering_messages", verbose_name=_("run")
    )
    author = models.CharField(max_length=150, verbose_name=_("author"))
    text = models.TextField(verbose_name=_("text"))
    status = models.CharField(
        max_length=20,
        choices=SteeringStatus.choices,
        default=SteeringStatus.QUEUED,
        verbose_name=_("status"),
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    applied_at = models.DateTimeField(null=True, blank=True, verbose_name=_("applied at"))

    class Meta:
        verbose_name = _("steering message")
        verbose_name_plural = _("steering messages")
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.author}: {self.text[:40]}"


class EventReceipt(models.Model):
    """Dedup for batched events: a retried event_id answers `duplicate` with the first outcome."""

    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        related_name="event_receipts",
        db_index=False,
        verbose_name=_("run"),
    )
    event_id = models.CharField(max_length=120, verbose_name=_("event ID"))
    type = models.CharField(max_length=40, verbose_name=_("type"))
    epoch = models.PositiveIntegerField(verbose_name=_("epoch"))
    outcome = models.CharField(max_length=16, verbose_name=_("outcome"))
    code = models.CharField(max_length=40, blank=True, verbose_name=_("code"))
    received_at = models.DateTimeField(auto_now_add=True, verbose_name=_("received at"))

    class Meta:
        verbose_name = _("event receipt")
        verbose_name_plural = _("event receipts")
        constraints = [
            models.UniqueConstraint(fields=["run", "event_id"], name="event_unique_run_event")
        ]

    def __str__(self) -> str:
        return f"{self.event_id} {self.outcome}"


class PriceSource(models.TextChoices):
    PROVIDER = "provider", _("Reported by the provider")
    TABLE = "table", _("Price table")
    TEAM = "team", _("Team price")
    UNPRICED = "unpriced", _("Unpriced")


class Usage(models.Model):
    """One model call's tokens and what it cost (DESIGN §13), from a `usage` event.

    Priced once, when it arrives: `price_source` says where the cost came from and
    `price_version` which table, so a newer price table never changes a stored cost. An unknown
    model is `unpriced` with `cost_usd` null, never $0.
    """

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="usages", db_index=False, verbose_name=_("run")
    )
    event_id = models.CharField(max_length=120, verbose_name=_("event ID"))
    epoch = models.PositiveIntegerField(verbose_name=_("epoch"))
    step_key = models.CharField(max_length=120, blank=True, verbose_name=_("step key"))
    model = models.CharField(max_length=200, verbose_name=_("model"))
    provider = models.CharField(max_length=100, blank=True, verbose_name=_("provider"))
    input_tokens = models.PositiveBigIntegerField(default=0, verbose_name=_("input tokens"))
    output_tokens = models.PositiveBigIntegerField(default=0, verbose_name=_("output tokens"))
    cache_read_tokens = models.PositiveBigIntegerField(
        default=0, verbose_name=_("cache read tokens")
    )
    cache_write_tokens = models.PositiveBigIntegerField(
        default=0, verbose_name=_("cache write tokens")
    )
    cost_usd = models.DecimalField(
        max_digits=20, decimal_places=10, null=True, blank=True, verbose_name=_("cost (USD)")
    )
    price_source = models.CharField(
        max_length=16, choices=PriceSource.choices, verbose_name=_("price source")
    )
    price_version = models.CharField(max_length=60, blank=True, verbose_name=_("price version"))
    at = models.DateTimeField(verbose_name=_("time"))

    class Meta:
        verbose_name = _("usage")
        verbose_name_plural = _("usages")
        constraints = [
            # also the (run, ...) index every per-run read uses
            models.UniqueConstraint(fields=["run", "event_id"], name="usage_unique_run_event")
        ]
        indexes = [models.Index(fields=["run", "at"], name="usage_run_at_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.model} {self.input_tokens}+{self.output_tokens}"


class TeamBudget(models.Model):
    """A team's daily and monthly spend limits, in the team's time zone (DESIGN §13).

    Also what the team has spent in the current day and month: the events batch adds each
    priced call to these counters under this row's lock, so many runs on one budget see one
    total, and a new day or month starts the counter at zero. `day_warned` / `month_warned`
    name the period whose 80 % warning was sent: one warning per budget and period.
    """

    team = models.OneToOneField(
        Team,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="budget",
        verbose_name=_("team"),
    )
    time_zone = models.CharField(max_length=64, default="UTC", verbose_name=_("time zone"))
    daily_usd = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True, verbose_name=_("daily budget (USD)")
    )
    monthly_usd = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        verbose_name=_("monthly budget (USD)"),
    )
    day = models.DateField(null=True, blank=True, verbose_name=_("day"))
    day_spent_usd = models.DecimalField(
        max_digits=20, decimal_places=10, default=0, verbose_name=_("day spent (USD)")
    )
    month = models.DateField(
        null=True, blank=True, verbose_name=_("month")
    )  # the month's first day
    month_spent_usd = models.DecimalField(
        max_digits=20, decimal_places=10, default=0, verbose_name=_("month spent (USD)")
    )
    day_warned = models.DateField(null=True, blank=True, verbose_name=_("day warned"))
    month_warned = models.DateField(null=True, blank=True, verbose_name=_("month warned"))
    updated_by = models.CharField(max_length=150, blank=True, verbose_name=_("updated by"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("team budget")
        verbose_name_plural = _("team budgets")

    def __str__(self) -> str:
        return f"{self.team_id} daily={self.daily_usd} monthly={self.monthly_usd}"


class TeamPrice(models.Model):
    """A team's own price for a model (USD per million tokens), used before the price table:
    for models the table lacks (Qwen, Doubao, a private deployment) or a negotiated rate.

    `version` grows with every change; a usage row priced by it keeps `team:<id>:v<version>`,
    so a later change never rewrites a stored cost."""

    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="prices", verbose_name=_("team")
    )
    model = models.CharField(max_length=200, verbose_name=_("model"))
    # Blank: any provider. A price naming the call's provider wins over a blank one.
    provider = models.CharField(max_length=100, blank=True, verbose_name=_("provider"))
    input_usd_per_mtok = models.DecimalField(
        max_digits=14, decimal_places=6, verbose_name=_("input USD per million tokens")
    )
    output_usd_per_mtok = models.DecimalField(
        max_digits=14, decimal_places=6, verbose_name=_("output USD per million tokens")
    )
    # Blank: cached tokens cost what other input tokens cost.
    cache_read_usd_per_mtok = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        verbose_name=_("cache read USD per million tokens"),
    )
    cache_write_usd_per_mtok = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        verbose_name=_("cache write USD per million tokens"),
    )
    version = models.PositiveIntegerField(default=1, verbose_name=_("version"))
    updated_by = models.CharField(max_length=150, blank=True, verbose_name=_("updated by"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("team price")
        verbose_name_plural = _("team prices")
        constraints = [
            models.UniqueConstraint(
                fields=["team", "model", "provider"], name="teamprice_unique_team_model"
            )
        ]

    def __str__(self) -> str:
        return f"{self.team_id} {self.model} {self.provider or '*'}"


class RejectedWrite(models.Model):
    """A stale-epoch write that was refused: counted for the stop-quality figures."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="rejected_writes", verbose_name=_("run")
    )
    kind = models.CharField(max_length=40, verbose_name=_("kind"))
    epoch = models.PositiveIntegerField(verbose_name=_("epoch"))
    run_epoch = models.PositiveIntegerField(verbose_name=_("run epoch"))
    code = models.CharField(max_length=40, verbose_name=_("code"))
    at = models.DateTimeField(auto_now_add=True, verbose_name=_("time"))

    class Meta:
        verbose_name = _("rejected write")
        verbose_name_plural = _("rejected writes")
        indexes = [models.Index(fields=["at"], name="rejectedwrite_at_idx")]

    def __str__(self) -> str:
        return f"{self.kind} @{self.epoch} < {self.run_epoch}"


class ActorKind(models.TextChoices):
    USER = "user", _("User")
    API_CLIENT = "api_client", _("API client")
    SYSTEM = "system", _("System")


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
        verbose_name=_("run"),
    )
    run_seq = models.PositiveIntegerField(verbose_name=_("run sequence"))
    at = models.DateTimeField(verbose_name=_("time"))
    actor_kind = models.CharField(
        max_length=16, choices=ActorKind.choices, verbose_name=_("actor kind")
    )
    actor_id = models.CharField(max_length=64, blank=True, verbose_name=_("actor ID"))
    actor = models.CharField(max_length=150, verbose_name=_("actor"))
    team_slug = models.CharField(max_length=64, blank=True, verbose_name=_("team slug"))
    action = models.CharField(max_length=60, verbose_name=_("action"))
    reason = models.CharField(max_length=60, blank=True, verbose_name=_("reason"))
    payload = models.JSONField(default=dict, blank=True, verbose_name=_("payload"))
    prev_hash = models.CharField(max_length=64, verbose_name=_("previous hash"))
    hash = models.CharField(max_length=64, unique=True, verbose_name=_("hash"))
    # How `hash` was made (runs/ledger.py): 1, a plain SHA-256 that leaves out team_slug (entries
    # written before the chain was keyed; only anchored ones verify); 2, an HMAC-SHA256 over every
    # column but the database id, with the ledger key `key_id` names (runs/ledger_keys.py).
    hash_version = models.PositiveSmallIntegerField(verbose_name=_("hash version"))
    key_id = models.CharField(max_length=32, blank=True, default="", verbose_name=_("key ID"))

    class Meta:
        verbose_name = _("ledger entry")
        ordering = ["id"]
        verbose_name_plural = _("ledger entries")
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

    requested_by = models.CharField(max_length=150, verbose_name=_("requested by"))
    requested_at = models.DateTimeField(verbose_name=_("requested at"))
    started_at = models.DateTimeField(null=True, blank=True, verbose_name=_("started at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))
    checked = models.PositiveBigIntegerField(default=0, verbose_name=_("entries checked"))
    broken_entry_id = models.BigIntegerField(
        null=True, blank=True, verbose_name=_("broken entry ID")
    )
    broken_run_id = models.CharField(max_length=32, blank=True, verbose_name=_("broken run ID"))
    broken_run_seq = models.PositiveIntegerField(
        null=True, blank=True, verbose_name=_("broken run sequence")
    )
    problem = models.TextField(blank=True, verbose_name=_("problem"))
    # Why the walk could not finish (the database went away, ...): not a break, not a pass.
    error = models.TextField(blank=True, verbose_name=_("error"))
    # Chain heads an earlier walk anchored outside the database and this one found again
    # (runs/ledger_anchors.py); the anchor this walk wrote, or why it could not write one.
    anchored_heads = models.PositiveIntegerField(default=0, verbose_name=_("anchored heads"))
    anchor_written = models.CharField(max_length=200, blank=True, verbose_name=_("anchor written"))
    anchor_error = models.TextField(blank=True, verbose_name=_("anchor error"))

    class Meta:
        verbose_name = _("ledger verification")
        verbose_name_plural = _("ledger verifications")
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["-requested_at"], name="ledger_verification_idx")]

    def __str__(self) -> str:
        return f"ledger verification #{self.pk} ({self.requested_by})"


class ApprovalAppliesTo(models.TextChoices):
    ANY = "any", _("Tool calls and outbox items")
    TOOL_CALL = "tool_call", _("Tool calls")
    OUTBOX = "outbox", _("Outbox items")


class ApprovalRule(models.Model):
    """A team's rule that holds a matching tool call or outbox item for a reviewer (DESIGN §10).

    Globs use `fnmatch` syntax; a blank glob matches anything. Rules are tried in `position`
    order and the first match decides.
    """

    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="approval_rules", verbose_name=_("team")
    )
    name = models.CharField(max_length=120, verbose_name=_("name"))
    enabled = models.BooleanField(default=True, verbose_name=_("enabled"))
    position = models.PositiveIntegerField(default=100, verbose_name=_("position"))
    applies_to = models.CharField(
        max_length=16,
        choices=ApprovalAppliesTo.choices,
        default=ApprovalAppliesTo.ANY,
        verbose_name=_("applies to"),
    )
    tool_glob = models.CharField(max_length=200, blank=True, verbose_name=_("tool glob"))
    # "write" matches only side-effecting calls; blank matches any call.
    side_effect = models.CharField(
        max_length=8, choices=SideEffect.choices, blank=True, verbose_name=_("side effect")
    )
    agent_glob = models.CharField(max_length=200, blank=True, verbose_name=_("agent glob"))
    transport = models.CharField(max_length=16, blank=True, verbose_name=_("transport"))
    destination_glob = models.CharField(
        max_length=500, blank=True, verbose_name=_("destination glob")
    )
    risk = models.CharField(max_length=8, default="medium", verbose_name=_("risk"))
    timeout_seconds = models.PositiveIntegerField(default=900, verbose_name=_("timeout seconds"))
    escalate_after_seconds = models.PositiveIntegerField(
        null=True, blank=True, verbose_name=_("escalate after seconds")
    )
    created_by = models.CharField(max_length=150, blank=True, verbose_name=_("created by"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("approval rule")
        verbose_name_plural = _("approval rules")
        ordering = ["team", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="approvalrule_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug})"


class ApprovalRisk(models.TextChoices):
    LOW = "low", _("Low")
    MEDIUM = "medium", _("Medium")
    HIGH = "high", _("High")


class ApprovalStatus(models.TextChoices):
    WAITING = "waiting", _("Waiting")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")
    EXPIRED = "expired", _("Expired")
    VOID = "void", _("Void")


class ApprovalTarget(models.TextChoices):
    TOOL_CALL = "tool_call", _("Tool call")
    OUTBOX = "outbox", _("Outbox item")


class Approval(models.Model):
    """One held side effect waiting for (or decided by) a reviewer (DESIGN §10).

    `team` and `agent` copy the run's so the inbox filters and sorts on one table.
    """

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="approvals", verbose_name=_("run")
    )
    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="approvals", verbose_name=_("team")
    )
    agent = models.CharField(max_length=120, verbose_name=_("agent"))
    epoch = models.PositiveIntegerField(verbose_name=_("epoch"))
    target = models.CharField(
        max_length=12, choices=ApprovalTarget.choices, verbose_name=_("target")
    )
    execution_record = models.OneToOneField(
        ExecutionRecord,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="approval",
        verbose_name=_("execution record"),
    )
    outbox_item = models.OneToOneField(
        OutboxItem,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="approval",
        verbose_name=_("outbox item"),
    )
    # What is held, for people: a tool name, or "webhook → https://…" for an outbox item.
    subject = models.CharField(max_length=300, verbose_name=_("subject"))
    rule = models.ForeignKey(
        ApprovalRule,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="approvals",
        verbose_name=_("rule"),
    )
    # The rule's name at request time (a rule may be renamed or deleted later), or blank when
    # the agent asked for approval itself.
    rule_name = models.CharField(max_length=120, blank=True, verbose_name=_("rule name"))
    match_reason = models.CharField(max_length=500, blank=True, verbose_name=_("match reason"))
    summary = models.TextField(blank=True, verbose_name=_("summary"))
    risk = models.CharField(
        max_length=8,
        choices=ApprovalRisk.choices,
        default=ApprovalRisk.MEDIUM,
        verbose_name=_("risk"),
    )
    original_arguments = models.JSONField(
        default=dict, blank=True, verbose_name=_("original arguments")
    )
    arguments_schema = models.JSONField(null=True, blank=True, verbose_name=_("arguments schema"))
    arguments = models.JSONField(default=dict, blank=True, verbose_name=_("arguments"))
    edited = models.BooleanField(default=False, verbose_name=_("edited"))
    status = models.CharField(
        max_length=12,
        choices=ApprovalStatus.choices,
        default=ApprovalStatus.WAITING,
        verbose_name=_("status"),
    )
    message = models.TextField(blank=True, verbose_name=_("message"))
    decided_by = models.CharField(max_length=150, blank=True, verbose_name=_("decided by"))
    decided_by_kind = models.CharField(max_length=16, blank=True, verbose_name=_("decided by kind"))
    decided_at = models.DateTimeField(null=True, blank=True, verbose_name=_("decided at"))
    requested_at = models.DateTimeField(verbose_name=_("requested at"))
    deadline = models.DateTimeField(verbose_name=_("deadline"))
    escalate_at = models.DateTimeField(null=True, blank=True, verbose_name=_("escalate at"))
    escalated_at = models.DateTimeField(null=True, blank=True, verbose_name=_("escalated at"))

    class Meta:
        verbose_name = _("approval")
        verbose_name_plural = _("approvals")
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
        max_length=32,
        unique=True,
        default=new_preview_id,
        editable=False,
        verbose_name=_("preview ID"),
    )
    actor_kind = models.CharField(
        max_length=16, choices=ActorKind.choices, verbose_name=_("actor kind")
    )
    actor_id = models.CharField(max_length=64, blank=True, verbose_name=_("actor ID"))
    filter = models.JSONField(default=dict, blank=True, verbose_name=_("filter"))
    # The ids of the runs a stop would change when the preview was made (stoppable, allowed).
    run_ids = models.JSONField(default=list, blank=True, verbose_name=_("run IDs"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("bulk stop preview")
        verbose_name_plural = _("bulk stop previews")

    def __str__(self) -> str:
        return f"{self.preview_id}: {len(self.run_ids)} runs"


class BulkStopOutcome(models.TextChoices):
    # Written with the BulkStop, before any run is stopped: a row still pending after the
    # bulk finished names a run the process never reached (it died midway).
    PENDING = "pending", _("Pending")
    STOPPED = "stopped", _("Stopped")
    ALREADY_STOPPING = "already_stopping", _("Already stopping")
    ALREADY_STOPPED = "already_stopped", _("Already stopped")
    ALREADY_FINISHED = "already_finished", _("Already finished")
    NOT_ALLOWED = "not_allowed", _("Not allowed")
    NOT_FOUND = "not_found", _("Not found")
    # The stop service refused (a run in a state no stop can reach); `detail` says why.
    FAILED = "failed", _("Failed")


class BulkStop(models.Model):
    """Many runs stopped at once (DESIGN §12): who, why, which filter, and one result per run.

    Each run is stopped by `run_stop` in its own transaction (its own StopRequest, epoch bump and
    ledger entry, whose payload names `bulk_id`); this record only ties them together.
    """

    bulk_id = models.CharField(
        max_length=32, unique=True, default=new_bulk_id, editable=False, verbose_name=_("bulk ID")
    )
    requested_by = models.CharField(max_length=150, verbose_name=_("requested by"))
    actor_kind = models.CharField(
        max_length=16, choices=ActorKind.choices, verbose_name=_("actor kind")
    )
    actor_id = models.CharField(max_length=64, blank=True, verbose_name=_("actor ID"))
    reason = models.CharField(max_length=24, choices=StopReason.choices, verbose_name=_("reason"))
    note = models.TextField(blank=True, verbose_name=_("note"))
    filter = models.JSONField(default=dict, blank=True, verbose_name=_("filter"))
    # The client's id for this bulk stop, so a retried POST answers the first one (blank: none).
    idempotency_key = models.CharField(
        max_length=200, blank=True, verbose_name=_("idempotency key")
    )
    requested = models.PositiveIntegerField(default=0, verbose_name=_("runs requested"))
    counts = models.JSONField(default=dict, blank=True, verbose_name=_("counts"))
    # The preview the reviewer confirmed (blank: a script's confirm, which took the filter's set
    # at that moment), and how many runs began to match the filter since and were left alone.
    preview_id = models.CharField(max_length=32, blank=True, verbose_name=_("preview ID"))
    new_since_preview = models.PositiveIntegerField(default=0, verbose_name=_("new since preview"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))

    class Meta:
        verbose_name = _("bulk stop")
        verbose_name_plural = _("bulk stops")
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
        BulkStop,
        on_delete=models.CASCADE,
        related_name="results",
        db_index=False,
        verbose_name=_("bulk stop"),
    )
    run_id = models.CharField(max_length=64, verbose_name=_("run ID"))
    outcome = models.CharField(
        max_length=20,
        choices=BulkStopOutcome.choices,
        default=BulkStopOutcome.PENDING,
        verbose_name=_("outcome"),
    )
    status = models.CharField(max_length=24, blank=True, verbose_name=_("status"))
    stop_epoch = models.PositiveIntegerField(null=True, blank=True, verbose_name=_("stop epoch"))
    stop_request = models.ForeignKey(
        StopRequest,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("stop request"),
    )
    detail = models.CharField(max_length=300, blank=True, verbose_name=_("detail"))

    class Meta:
        verbose_name = _("bulk stop result")
        verbose_name_plural = _("bulk stop results")
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["bulk", "run_id"], name="bulkresult_unique_bulk_run"),
        ]

    def __str__(self) -> str:
        return f"{self.bulk_id} {self.run_id}: {self.outcome}"
