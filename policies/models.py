"""Policies (DESIGN §14): a team's rules, what they did, and the per-run facts they read."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.models import Run, StopRequest, Team


class PolicyAction(models.TextChoices):
    NOTIFY = "notify", _("Notify")
    REQUIRE_APPROVAL = "require_approval", _("Require approval")
    STOP = "stop", _("Stop")
    STOP_AND_TAKE_OVER = "stop_and_take_over", _("Stop and take over")


class PolicyMode(models.TextChoices):
    OBSERVE = "observe", _("Observe")
    ENFORCE = "enforce", _("Enforce")


class PolicyOnError(models.TextChoices):
    REQUIRE_APPROVAL = "require_approval", _("Require approval")
    STOP = "stop", _("Stop")
    IGNORE = "ignore", _("Ignore")


class Policy(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="policies")
    name = models.CharField(max_length=120)
    description = models.CharField(max_length=500, blank=True)
    # A CEL boolean, compiled and type-checked when saved (policies.language).
    expression = models.TextField()
    action = models.CharField(max_length=24, choices=PolicyAction.choices)
    mode = models.CharField(max_length=12, choices=PolicyMode.choices, default=PolicyMode.OBSERVE)
    on_error = models.CharField(
        max_length=24, choices=PolicyOnError.choices, default=PolicyOnError.REQUIRE_APPROVAL
    )
    # Scope: globs over the run's agent and the call's tool ("*": every one).
    agent_glob = models.CharField(max_length=200, default="*")
    tool_glob = models.CharField(max_length=200, default="*")
    enabled = models.BooleanField(default=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The compile cache is keyed by (id, updated_at): an edit is seen by the next evaluation.
    updated_at = models.DateTimeField(auto_now=True)
    # Evaluation errors, counted; the last one is shown on the policy.
    errors_count = models.PositiveBigIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="policy_unique_team_name")
        ]
        indexes = [models.Index(fields=["team", "enabled"], name="policy_team_enabled_idx")]
        ordering = ["team_id", "name"]

    def __str__(self) -> str:
        return self.name


class PolicySetVersion(models.Model):
    """A team's policy set, as a number each process compares with its cached compile of it.

    Every change to a team's policies (create, update, delete: `policies.services`) writes a
    new number here in the change's own transaction, and every check reads it in the run's
    transaction (`policies.reads`): a process recompiles the set only when the number differs.
    A random number rather than a counter, so a rolled-back change cannot leave behind a number
    that a later, different change reuses. No foreign key: a team deleted with its policies
    leaves at most this one row, and nothing reads it."""

    team_id = models.BigIntegerField(primary_key=True)
    version = models.BigIntegerField()

    def __str__(self) -> str:
        return f"policies of team {self.team_id}: version {self.version}"


class HitOutcome(models.TextChoices):
    ACTED = "acted", _("Acted")
    WOULD_ACT = "would_act", _("Would act (observe)")
    ERROR = "error", _("Evaluation error")


class PolicyHit(models.Model):
    """One time a policy matched (or failed to evaluate) on a run, and what it did."""

    policy = models.ForeignKey(Policy, on_delete=models.SET_NULL, null=True, related_name="hits")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="policy_hits")
    # The policy as it was when it acted (it may be edited or deleted later).
    policy_name = models.CharField(max_length=120)
    expression = models.TextField()
    mode = models.CharField(max_length=12, choices=PolicyMode.choices)
    action = models.CharField(max_length=24)  # what it did: an action, or on_error's
    outcome = models.CharField(max_length=12, choices=HitOutcome.choices)
    event_type = models.CharField(max_length=40)
    values = models.JSONField(default=dict)  # the context values the expression read
    error = models.TextField(blank=True)
    stop_request = models.ForeignKey(
        StopRequest, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["run", "created_at"], name="policyhit_run_idx"),
            models.Index(fields=["policy", "created_at"], name="policyhit_policy_idx"),
        ]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.policy_name} {self.outcome} on {self.run_id}"


class RunFacts(models.Model):
    """The aggregates policies read, kept incrementally on the run (never recomputed by
    scanning): one row per run, written under the run lock by the transaction that changes
    the fact. A model of its own, not columns on `Run`: the events batch builds runs from a
    fixed column list."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    tool_failures_in_a_row = models.PositiveIntegerField(default=0)
    # The last call's tool and canonical arguments (a digest) and how often in a row.
    last_call_key = models.CharField(max_length=64, blank=True)
    repeats = models.PositiveIntegerField(default=0)
    # Epoch seconds of the side effects of the last minute (pruned as it goes).
    side_effect_times = models.JSONField(default=list)
    # A require_approval policy that matched away from a side effect holds the next one.
    hold_name = models.CharField(max_length=120, blank=True)
    hold_reason = models.CharField(max_length=500, blank=True)
    # Policies that already notified or observed this run ("<id>:<kind>"): once per run.
    fired = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"facts of {self.run_id}"


class PolicyTestStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")


class PolicyTest(models.Model):
    """A test against history too large to answer in the request: run in the background, its
    progress readable while it runs."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    requested_by = models.CharField(max_length=150)
    expression = models.TextField()
    days = models.PositiveIntegerField()
    agent_glob = models.CharField(max_length=200, default="*")
    tool_glob = models.CharField(max_length=200, default="*")
    status = models.CharField(
        max_length=12, choices=PolicyTestStatus.choices, default=PolicyTestStatus.QUEUED
    )
    done = models.PositiveBigIntegerField(default=0)
    total = models.PositiveBigIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"policy test {self.pk} ({self.status})"
