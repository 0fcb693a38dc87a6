"""Random sequences of worker, reviewer and reaper actions against the real services.

After every step the invariants of DESIGN §1 must hold:
- no permit or outbox item is accepted at an epoch older than the run's;
- the epoch never decreases;
- every status change has its ledger entry, and the chain verifies;
- a verified success is never overwritten.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from handoff.services import resolution_record
from runs import services
from runs.actors import Actor
from runs.errors import DomainError
from runs.ledger import ledger_verify
from runs.models import (
    ExecutionRecord,
    ExecutionState,
    Lease,
    LedgerEntry,
    OutboxItem,
    Run,
    StopReason,
)
from runs.tokens import team_ensure
from tests.support.run_factories import run_complete

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
ALICE = Actor("user", "1", "alice")
RESULTS = st.sampled_from(["succeeded", "failed", "unknown", "not_started", "running"])


class StopProtocol(RuleBasedStateMachine):
    @initialize()
    def create_run(self) -> None:
        team = team_ensure(slug="machine")
        self.run = services.run_create(
            team=team,
            title="random walk",
            agent="bot",
            actor=AGENT,
            steps=[services.PlannedStep("a"), services.PlannedStep("b")],
        )
        self.lease: Lease | None = None
        self.max_epoch_seen = self.run.stop_epoch
        self.succeeded: set[str] = set()
        self.calls: list[str] = []
        self.counter = 0

    # -- helpers --------------------------------------------------------------------------
    def _fresh(self) -> Run:
        return Run.objects.get(pk=self.run.pk)

    def _next_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def _try(self, call):  # domain refusals are expected; anything else fails the test
        try:
            return call()
        except DomainError:
            return None

    # -- worker actions ---------------------------------------------------------------------
    @rule()
    def acquire(self) -> None:
        lease = self._try(
            lambda: services.lease_acquire(
                run_id=self.run.pk, worker_id="w", ttl_seconds=60, actor=AGENT
            )
        )
        if lease is not None:
            self.lease = lease

    @rule(side_effect=st.sampled_from(["none", "write"]))
    def permit(self, side_effect: str) -> None:
        if self.lease is None:
            return
        epoch_now = self._fresh().stop_epoch
        tool_call_id = self._next_id("call")
        result = self._try(
            lambda: services.permit_request(
                run_id=self.run.pk,
                epoch=self.lease.epoch,
                tool_call_id=tool_call_id,
                tool="t",
                side_effect=side_effect,
                actor=AGENT,
            )
        )
        if result is not None:
            record, _created = result
            assert record.permit_epoch == epoch_now, "a permit was granted at an old epoch"
            self.calls.append(tool_call_id)

    @rule(state=RESULTS, pick=st.integers(min_value=0, max_value=50))
    def report_result(self, state: str, pick: int) -> None:
        if not self.calls:
            return
        tool_call_id = self.calls[pick % len(self.calls)]
        record = self._try(
            lambda: services.tool_result_report(
                run_id=self.run.pk, tool_call_id=tool_call_id, execution_state=state, actor=AGENT
            )
        )
        if record is not None and record.execution_state == ExecutionState.SUCCEEDED:
            self.succeeded.add(tool_call_id)

    @rule()
    def enqueue(self) -> None:
        if self.lease is None:
            return
        epoch_now = self._fresh().stop_epoch
        result = self._try(
            lambda: services.outbox_enqueue(
                run_id=self.run.pk,
                epoch=self.lease.epoch,
                transport="email",
                destination="ops@example.com",
                payload={},
                idempotency_key=self._next_id("key"),
                actor=AGENT,
            )
        )
        if result is not None:
            item, _created = result
            assert item.enqueue_epoch == epoch_now, "an outbox item was accepted at an old epoch"

    @rule()
    def heartbeat(self) -> None:
        if self.lease is not None:
            self._try(
                lambda: services.lease_heartbeat(
                    run_id=self.run.pk,
                    lease_token=self.lease.token,
                    epoch=self.lease.epoch,
                    actor=AGENT,
                )
            )

    @rule()
    def drained(self) -> None:
        if self.lease is not None:
            self._try(
                lambda: services.run_drained(
                    run_id=self.run.pk,
                    lease_token=self.lease.token,
                    epoch=self.lease.epoch,
                    actor=AGENT,
                )
            )

    @rule()
    def complete(self) -> None:
        if self.lease is not None:
            self._try(lambda: run_complete(run_id=self.run.pk, epoch=self.lease.epoch, actor=AGENT))

    @rule()
    def dispatch_one(self) -> None:
        item_id = OutboxItem.objects.filter(run_id=self.run.pk).values_list("pk", flat=True).last()
        if (
            item_id is not None
            and services.outbox_claim(item_id=item_id, dispatcher="d") is not None
        ):
            services.outbox_record_outcome(item_id=item_id, outcome="sent")

    # -- humans and reapers -----------------------------------------------------------------
    @rule(reason=st.sampled_from(StopReason.values))
    def stop(self, reason: str) -> None:
        self._try(lambda: services.run_stop(run_id=self.run.pk, reason=reason, actor=ALICE))

    @rule(decision=st.sampled_from(["applied", "not_applied", "compensated"]))
    def resolve(self, decision: str) -> None:
        record = ExecutionRecord.objects.filter(
            run_id=self.run.pk, side_effect_state="pending_verification", resolved=False
        ).first()
        if record is not None:
            self._try(
                lambda: resolution_record(
                    run_id=self.run.pk,
                    target="tool_call",
                    target_id=record.tool_call_id,
                    decision=decision,
                    evidence="checked",
                    actor=ALICE,
                )
            )
        lease = Lease.objects.filter(run_id=self.run.pk, fenced_unconfirmed=True).first()
        if lease is not None:
            self._try(
                lambda: resolution_record(
                    run_id=self.run.pk,
                    target="worker",
                    target_id=lease.token,
                    decision="not_applied",
                    evidence="host gone",
                    actor=ALICE,
                )
            )

    @rule()
    def resume(self) -> None:
        self._try(lambda: services.run_resume(run_id=self.run.pk, actor=ALICE))

    @rule()
    def expire_lease(self) -> None:
        live = Lease.objects.filter(run_id=self.run.pk, released_at__isnull=True).first()
        if live is not None:
            Lease.objects.filter(pk=live.pk).update(
                expires_at=timezone.now() - timedelta(seconds=1)
            )
            services.lease_expire(lease_id=live.pk)

    @rule()
    def drain_deadline(self) -> None:
        Run.objects.filter(pk=self.run.pk, stop_requested_at__isnull=False).update(
            stop_requested_at=timezone.now() - timedelta(hours=1)
        )
        services.run_fence_overdue(run_id=self.run.pk)

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def epoch_never_decreases(self) -> None:
        epoch = self._fresh().stop_epoch
        assert epoch >= self.max_epoch_seen
        self.max_epoch_seen = epoch

    @invariant()
    def every_status_change_is_in_the_ledger(self) -> None:
        run = self._fresh()
        last_move = (
            LedgerEntry.objects.filter(run=run, payload__has_key="to")
            .order_by("-run_seq")
            .values_list("payload", flat=True)
            .first()
        )
        expected = last_move["to"] if last_move else "pending"
        assert run.status == expected, (
            f"status {run.status} but the ledger's last move is to {expected}"
        )

    @invariant()
    def chain_verifies(self) -> None:
        assert ledger_verify(run_id=self.run.pk)[1] is None

    @invariant()
    def verified_success_is_never_overwritten(self) -> None:
        if self.succeeded:
            states = set(
                ExecutionRecord.objects.filter(
                    run_id=self.run.pk, tool_call_id__in=self.succeeded
                ).values_list("execution_state", flat=True)
            )
            assert states == {ExecutionState.SUCCEEDED}

    @invariant()
    def nothing_was_permitted_or_enqueued_after_its_epochs_stop(self) -> None:
        run = self._fresh()
        for stop in run.stop_requests.all():
            assert not ExecutionRecord.objects.filter(
                run=run, permit_epoch=stop.epoch_before, permitted_at__gt=stop.requested_at
            ).exists()
            assert not OutboxItem.objects.filter(
                run=run, enqueue_epoch=stop.epoch_before, created_at__gt=stop.requested_at
            ).exists()


@pytest.mark.slow
def test_random_sequences_keep_the_stop_protocol_invariants(db):
    run_state_machine_as_test(
        StopProtocol,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
