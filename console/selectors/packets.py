"""The stop packet and interruption pages, and a run's stop history."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.utils.translation import gettext

from handoff.models import Resolution, StopPacket
from handoff.packets import interruption_packet
from runs import frozen
from runs.labels import label_for
from runs.models import (
    OUTBOX_IN_FLIGHT_STATUSES,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    OutboxItem,
    Run,
    StepStatus,
    StopRequest,
    is_unconfirmed_side_effect,
)

# The stop packet page likewise shows the newest completed steps, tool calls and artifacts of the
# snapshot; pending steps, unknowns and frozen or in-flight outbox items are always shown whole.
# A 5,000-step packet rendered in ~430 ms p95 (docs/BENCHMARKS.md). "Show all" lifts the window.
PACKET_WINDOW = 200


@dataclass
class Unknown:
    """One thing the packet said nobody knew, and what is known about it now."""

    target: str  # tool_call | outbox | worker
    target_id: str
    snapshot: dict[str, Any]
    current_state: str
    open: bool
    resolution: Resolution | None = None


@dataclass
class FrozenItem:
    public_id: str
    item_id: int
    snapshot: dict[str, Any]
    current_status: str

    @property
    def open(self) -> bool:
        return self.current_status == "frozen"


@dataclass
class PacketView:
    packet: StopPacket | None  # None: an interruption packet, read now and never stored
    snap: dict[str, Any]
    is_current: bool
    unknowns: list[Unknown]
    frozen: list[FrozenItem]
    resolutions: list[Resolution]
    # What the page lists: the snapshot's lists, windowed unless `everything` (see _packet_window).
    completed_steps: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    everything: bool = False

    @property
    def open_unknowns(self) -> int:
        return sum(1 for unknown in self.unknowns if unknown.open)

    @property
    def completed_total(self) -> int:
        return len(self.snap.get("completed_steps", []))

    @property
    def calls_total(self) -> int:
        return len(self.snap.get("tool_calls", []))

    @property
    def artifacts_total(self) -> int:
        return len(self.snap.get("artifacts", []))

    @property
    def unfinished_steps(self) -> list[dict[str, Any]]:
        """Steps that had started and not completed at the stop."""
        return [
            step
            for step in self.snap.get("pending_steps", [])
            if step.get("status") != StepStatus.PLANNED
        ]

    @property
    def unstarted_steps(self) -> list[dict[str, Any]]:
        """Planned steps that never started: nothing of them was left half done."""
        return [
            step
            for step in self.snap.get("pending_steps", [])
            if step.get("status") == StepStatus.PLANNED
        ]

    @property
    def reported_after_stop(self) -> list[dict[str, Any]]:
        """Every fact the worker reported after the stop, from the whole snapshot: the outcomes
        kept instead of applied (a completion that lost the race), then each completed step and
        each tool call the packet tags "after stop"."""
        facts = [
            {
                "what": gettext("%(type)s at epoch %(epoch)s")
                % {"type": report.get("type"), "epoch": report.get("epoch")},
                "at": report.get("at"),
            }
            for report in self.snap.get("reported_after_stop", [])
        ]
        facts += [
            {
                "what": gettext("step %(seq)s %(name)s completed")
                % {"seq": step["seq"], "name": step.get("name") or step["key"]},
                "at": step.get("finished_at"),
            }
            for step in self.snap.get("completed_steps", [])
            if step.get("reported_after_stop")
        ]
        facts += [
            {
                "what": gettext("tool call %(id)s (%(tool)s) %(state)s")
                % {
                    "id": call["tool_call_id"],
                    "tool": call["tool"],
                    "state": label_for(call["execution_state"]),
                },
                "at": call.get("last_observed_at"),
            }
            for call in self.snap.get("tool_calls", [])
            if call.get("reported_after_stop")
        ]
        return facts

    @cached_property
    def stop_history(self) -> StopHistory | None:
        """This packet's stop as it happened, if it settled dirty, and what came after it."""
        if self.packet is None:
            return None
        stop_request = StopRequest.objects.filter(
            run_id=self.packet.run_id, epoch_after=self.packet.stop_epoch
        ).first()
        return stop_history(stop_request=stop_request) if stop_request else None

    @property
    def windowed(self) -> bool:
        """Some rows of the snapshot are not on the page (the JSON download has them all)."""
        return (
            self.completed_total > len(self.completed_steps)
            or self.calls_total > len(self.tool_calls)
            or self.artifacts_total > len(self.artifacts)
        )


def _packet_window(
    snap: dict[str, Any], window: int | None
) -> tuple[list[Any], list[Any], list[Any]]:
    """(completed steps, tool calls, artifacts) to list: the newest `window` of each, and every call
    the packet names as an unconfirmed side effect, whatever its age. The snapshot keeps each list
    oldest first (steps by seq, calls by permit time, artifacts by id), so the newest are its tail."""
    completed = snap.get("completed_steps", [])
    calls = snap.get("tool_calls", [])
    artifacts = snap.get("artifacts", [])
    if window is None:
        return completed, calls, artifacts
    unconfirmed = {entry["tool_call_id"] for entry in snap.get("unconfirmed_side_effects", [])}
    cut = max(len(calls) - window, 0)
    shown_calls = [call for call in calls[:cut] if call["tool_call_id"] in unconfirmed] + calls[
        cut:
    ]
    return (
        completed[max(len(completed) - window, 0) :],
        shown_calls,
        artifacts[max(len(artifacts) - window, 0) :],
    )


def packet_view(run: Run, packet: StopPacket, *, everything: bool = False) -> PacketView:
    """The snapshot with what is true now about each unknown; a fixed number of queries.

    Without `everything`, only the newest PACKET_WINDOW completed steps, tool calls and artifacts
    are listed; pending steps, unknowns, frozen and in-flight outbox items are always listed whole:
    they are what a reviewer must act on."""
    return _packet_view(
        run,
        packet.snapshot,
        packet=packet,
        is_current=packet.stop_epoch == run.stop_epoch,
        everything=everything,
    )


def interruption_view(run: Run, *, everything: bool = False) -> PacketView:
    """An interrupted run's packet (`handoff.packets.interruption_packet`) shown as a stop
    packet is: each unknown the interruption left, with what is true now and its resolution."""
    return _packet_view(
        run, interruption_packet(run), packet=None, is_current=True, everything=everything
    )


def _packet_view(
    run: Run,
    snap: dict[str, Any],
    *,
    packet: StopPacket | None,
    is_current: bool,
    everything: bool,
) -> PacketView:
    resolutions = list(Resolution.objects.filter(run=run).order_by("at"))
    resolved = {(resolution.target, resolution.target_id): resolution for resolution in resolutions}
    call_ids = [entry["tool_call_id"] for entry in snap.get("unconfirmed_side_effects", [])]
    calls = {
        call.tool_call_id: call
        for call in ExecutionRecord.objects.filter(run=run, tool_call_id__in=call_ids)
    }
    outbox_ids = [*snap.get("in_flight_outbox_ids", []), *snap.get("frozen_outbox_ids", [])]
    numeric = [
        int(value.split("_", 1)[1]) for value in outbox_ids if value.split("_", 1)[-1].isdigit()
    ]
    items = {
        item.public_id: item
        for item in frozen.present(run, OutboxItem.objects.filter(run=run, pk__in=numeric))
    }
    outbox_snap = {entry["id"]: entry for entry in snap.get("outbox", [])}
    lease_tokens = [
        lease["lease_id"] for lease in snap.get("leases", []) if lease.get("fenced_unconfirmed")
    ]
    fenced_now = set(
        Lease.objects.filter(run=run, token__in=lease_tokens, fenced_unconfirmed=True).values_list(
            "token", flat=True
        )
    )

    unknowns: list[Unknown] = []
    for entry in snap.get("unconfirmed_side_effects", []):
        call = calls.get(entry["tool_call_id"])
        state = call.side_effect_state if call else "missing"
        unknowns.append(
            Unknown(
                "tool_call",
                entry["tool_call_id"],
                entry,
                state,
                open=bool(
                    call
                    and is_unconfirmed_side_effect(
                        side_effect=call.side_effect,
                        side_effect_state=state,
                        resolved=call.resolved,
                    )
                ),
                resolution=resolved.get(("tool_call", entry["tool_call_id"])),
            )
        )
    for public_id in snap.get("in_flight_outbox_ids", []):
        item = items.get(public_id)
        state = item.status if item else "missing"
        unknowns.append(
            Unknown(
                "outbox",
                public_id,
                outbox_snap.get(public_id, {"id": public_id}),
                state,
                open=bool(item and state in OUTBOX_IN_FLIGHT_STATUSES and not item.resolved),
                resolution=resolved.get(("outbox", public_id)),
            )
        )
    for lease in snap.get("leases", []):
        if lease.get("fenced_unconfirmed"):
            token = lease["lease_id"]
            unknowns.append(
                Unknown(
                    "worker",
                    token,
                    lease,
                    "fenced_unconfirmed" if token in fenced_now else "confirmed",
                    open=token in fenced_now,
                    resolution=resolved.get(("worker", token)),
                )
            )
    frozen_items = [
        FrozenItem(
            public_id, items[public_id].pk, outbox_snap.get(public_id, {}), items[public_id].status
        )
        for public_id in snap.get("frozen_outbox_ids", [])
        if public_id in items
    ]
    completed_steps, tool_calls, artifacts = _packet_window(
        snap, None if everything else PACKET_WINDOW
    )
    return PacketView(
        packet=packet,
        snap=snap,
        is_current=is_current,
        unknowns=unknowns,
        frozen=frozen_items,
        resolutions=resolutions,
        completed_steps=completed_steps,
        tool_calls=tool_calls,
        artifacts=artifacts,
        everything=everything,
    )


def stop_packet_get(*, run: Run, epoch: int | None = None) -> StopPacket | None:
    """The run's packet of `epoch`, or its latest packet."""
    packets = StopPacket.objects.filter(run=run)
    if epoch is not None:
        return packets.filter(stop_epoch=epoch).first()
    return packets.order_by("-stop_epoch").first()


def stop_packet_epochs(*, run: Run) -> list[int]:
    """The epochs of the run's packets, newest first."""
    return list(
        StopPacket.objects.filter(run=run)
        .order_by("-stop_epoch")
        .values_list("stop_epoch", flat=True)
    )


@dataclass
class StopHistory:
    """A stop that settled dirty, as it happened, then what came after it: each resolution of
    its unknowns and the moment the run became clean. The StopRequest's `outcome_state` follows
    the run to clean when the last unknown goes, while its `dirty_reasons` stay as they were at
    the settle: the pages read the reasons to say how the stop ended."""

    stop_request: StopRequest
    resolutions: list[Resolution]
    cleaned: LedgerEntry | None  # run.stopped_cleanly after the dirty settle, if it came


def stop_history(*, stop_request: StopRequest) -> StopHistory | None:
    """None unless the stop settled dirty; else three queries (the next stop bounds the window,
    so an older packet's history is its own)."""
    if not stop_request.dirty_reasons or stop_request.stopped_at is None:
        return None
    run_id = stop_request.run_id
    until = (
        StopRequest.objects.filter(run_id=run_id, epoch_after__gt=stop_request.epoch_after)
        .order_by("epoch_after")
        .values_list("requested_at", flat=True)
        .first()
    )
    resolutions = Resolution.objects.filter(run_id=run_id, at__gte=stop_request.stopped_at)
    cleaned = LedgerEntry.objects.filter(
        run_id=run_id, action="run.stopped_cleanly", at__gte=stop_request.stopped_at
    )
    if until is not None:
        resolutions = resolutions.filter(at__lt=until)
        cleaned = cleaned.filter(at__lt=until)
    return StopHistory(
        stop_request=stop_request,
        resolutions=list(resolutions.order_by("at", "pk")),
        cleaned=cleaned.order_by("run_seq").first(),
    )
