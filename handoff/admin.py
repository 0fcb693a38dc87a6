"""Django admin for stop packets, resolutions and handoffs: view-only (writes go through the
services so each is ledgered; a stop packet is immutable by design)."""

from __future__ import annotations

from django.contrib import admin

from handoff.models import Handoff, Resolution, StopPacket
from runs.admin import ReadOnlyAdmin


@admin.register(StopPacket)
class StopPacketAdmin(ReadOnlyAdmin):
    list_display = ["run", "stop_epoch", "created_at"]
    search_fields = ["run__id"]
    list_select_related = ["run"]


@admin.register(Resolution)
class ResolutionAdmin(ReadOnlyAdmin):
    list_display = ["run", "target", "target_id", "decision", "by", "at"]
    list_filter = ["target", "decision"]
    search_fields = ["run__id", "target_id", "by", "evidence"]
    list_select_related = ["run"]


@admin.register(Handoff)
class HandoffAdmin(ReadOnlyAdmin):
    list_display = [
        "run",
        "status",
        "assignee",
        "created_by",
        "created_at",
        "accepted_at",
        "closed_at",
    ]
    list_filter = ["status"]
    search_fields = ["run__id", "assignee__username", "note"]
    list_select_related = ["run", "assignee"]
