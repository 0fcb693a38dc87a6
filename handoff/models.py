"""Stop packets, resolutions of unknowns, and handoffs to humans (DESIGN §3, §4)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.models import Run


class StopPacket(models.Model):
    """One immutable snapshot per stop epoch; resolution status is shown on top of it."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="stop_packets", verbose_name=_("run")
    )
    stop_epoch = models.PositiveIntegerField(verbose_name=_("stop epoch"))
    snapshot = models.JSONField(verbose_name=_("snapshot"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("stop packet")
        verbose_name_plural = _("stop packets")
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
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="resolutions", verbose_name=_("run")
    )
    target = models.CharField(
        max_length=16, choices=ResolutionTarget.choices, verbose_name=_("target")
    )
    target_id = models.CharField(max_length=120, verbose_name=_("target ID"))
    decision = models.CharField(
        max_length=16, choices=ResolutionDecision.choices, verbose_name=_("decision")
    )
    evidence = models.TextField(verbose_name=_("evidence"))
    by = models.CharField(max_length=150, verbose_name=_("by whom"))
    at = models.DateTimeField(auto_now_add=True, verbose_name=_("time"))

    class Meta:
        verbose_name = _("resolution")
        verbose_name_plural = _("resolutions")
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
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="handoffs", verbose_name=_("run")
    )
    stop_packet = models.ForeignKey(
        StopPacket,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="handoffs",
        verbose_name=_("stop packet"),
    )
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="handoffs",
        verbose_name=_("assignee"),
    )
    created_by = models.CharField(max_length=150, verbose_name=_("created by"))
    status = models.CharField(
        max_length=16,
        choices=HandoffStatus.choices,
        default=HandoffStatus.OPEN,
        verbose_name=_("status"),
    )
    note = models.TextField(blank=True, verbose_name=_("note"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    accepted_at = models.DateTimeField(null=True, blank=True, verbose_name=_("accepted at"))
    closed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("closed at"))

    class Meta:
        verbose_name = _("handoff")
        verbose_name_plural = _("handoffs")
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "-created_at"], name="handoff_status_idx")]

    def __str__(self) -> str:
        return f"handoff {self.run_id} ({self.status})"
