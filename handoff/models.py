"""Stop packets, resolutions of unknowns, and handoffs to humans (DESIGN §3, §4)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.models import Run


class StopPacket(models.Model):
    """One immutable snapshot per stop epoch; resolution status is shown on top of it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="stop_packets")
    stop_epoch = models.PositiveIntegerField()
    snapshot = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-stop_epoch"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "stop_epoch"], name="stoppacket_unique_run_epoch"
            ),
        ]

    def __str__(self) -> str:
        return f"packet {self.run_id} @{self.stop_epoch}"


class ResolutionTarget(models.TextChoices):
    TOOL_CALL = "tool_call", _("Tool call")
    OUTBOX = "outbox", _("Outbox item")
    WORKER = "worker", _("Fenced worker")


class ResolutionDecision(models.TextChoices):
    APPLIED = "applied", _("Applied")
    NOT_APPLIED = "not_applied", _("Not applied")
    COMPENSATED = "compensated", _("Compensated")


class Resolution(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="resolutions")
    target = models.CharField(max_length=16, choices=ResolutionTarget.choices)
    target_id = models.CharField(max_length=120)
    decision = models.CharField(max_length=16, choices=ResolutionDecision.choices)
    evidence = models.TextField()
    by = models.CharField(max_length=150)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at"]
        constraints = [
            # resolving twice (a double click) must not record two decisions
            models.UniqueConstraint(
                fields=["run", "target", "target_id"], name="resolution_unique_target"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.target} {self.target_id}: {self.decision}"


class HandoffStatus(models.TextChoices):
    OPEN = "open", _("Open")
    ACCEPTED = "accepted", _("Accepted")
    COMPLETED = "completed", _("Completed")
    RETURNED = "returned", _("Returned to automation")
    CLOSED = "closed", _("Closed")


class Handoff(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="handoffs")
    stop_packet = models.ForeignKey(
        StopPacket, on_delete=models.PROTECT, null=True, blank=True, related_name="handoffs"
    )
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="handoffs",
    )
    created_by = models.CharField(max_length=150)
    status = models.CharField(
        max_length=16, choices=HandoffStatus.choices, default=HandoffStatus.OPEN
    )
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "-created_at"], name="handoff_status_idx")]

    def __str__(self) -> str:
        return f"handoff {self.run_id} ({self.status})"
