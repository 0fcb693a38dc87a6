"""Stop: the server's time to record a stop, the push to the worker, and the whole stop.

1. `run_stop` server time — a running run with a live lease, 1,000 pending outbox items and
   three tool calls in flight; the call is timed in this process around the very service the
   API and the console call (it includes the commit and the on-commit publish to Redis). The
   same with 10,000 and 100,000 pending items: the stop's epoch freezes them (no row is
   rewritten in the stop), and the relabel that follows is timed apart, in rows per second.
   The 1,000-item setup is also stopped through `POST /api/v1/runs/{id}/cancel/` for the HTTP
   round trip.
2. stop commit → signal received — a `safestop_agent` worker in another process holds the lease
   and its push socket to daphne; the stop commits here, the frame goes through Redis to daphne
   and down the agent websocket; the worker's `CancelToken.cancel` time minus the commit time.
3. stop request → `stopped_cleanly` — a reviewer token POSTs `/cancel/`; the worker notices at
   its next safe boundary (5 ms work quanta), leaves its block, which reports `drained`; timed
   from before the POST to the worker's drained answer, from the POST's answer (what a person
   who pressed Stop waits for after the button answered), and server-side (`stopped_at -
   requested_at` of the StopRequest, the stop-quality figure). Where the time after the answer
   goes: the worker's own stamps and the StopRequest's (`acknowledged_at`, `drained_at`: the
   moments the ack and the drained answer held the run lock), on one clock.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from bench.common import PYTHON, ROOT, Row, latency_row
from bench.fixtures import copy_rows
from bench.hooks import CommitClock
from bench.stack import LineProcess, Stack

OUTBOX_ITEMS = 1000
LARGE_OUTBOX_ITEMS = 10_000
HUGE_OUTBOX_ITEMS = 100_000


def _reviewer_actor(stack: Stack) -> Any:
    from django.contrib.auth import get_user_model

    from runs.actors import Actor

    return Actor.for_user(get_user_model().objects.get(username=stack.reviewer_username))


def _running_run_with_outbox(
    stack: Stack, index: int, *, outbox_items: int = OUTBOX_ITEMS
) -> tuple[Any, Any]:
    from runs import services
    from runs.actors import Actor
    from runs.models import ExecutionRecord, OutboxItem, SideEffect, SideEffectState, Team

    system = Actor.system("bench")
    team = Team.objects.get(pk=stack.team_id)
    run = services.run_create(
        team=team,
        title=f"Nightly billing sync #{index}",
        agent="billing-agent",
        actor=system,
        steps=[services.PlannedStep(f"step-{n}", f"Step {n}") for n in range(1, 11)],
    )
    lease = services.lease_acquire(
        run_id=run.pk, worker_id=f"worker-{index}", ttl_seconds=600, actor=system
    )
    # COPY, not bulk_create: 100 runs of 10,000 items each are a million rows of setup.
    copy_rows(
        OutboxItem,
        (
            {
                "run_id": run.pk,
                "transport": "webhook",
                "destination": f"https://hooks.bench.test/notify/{n % 7}",
                "payload": {
                    "invoice": f"inv-{index}-{n}",
                    "amount_cents": 1000 + n,
                    "currency": "EUR",
                },
                "idempotency_key": f"notify-{index}-{n}",
                "enqueue_epoch": lease.epoch,
            }
            for n in range(outbox_items)
        ),
    )
    ExecutionRecord.objects.bulk_create(
        ExecutionRecord(
            run_id=run.pk,
            tool_call_id=f"call_{index}_{n}",
            tool="charge_card",
            side_effect=SideEffect.WRITE,
            permit_epoch=lease.epoch,
            side_effect_state=SideEffectState.PENDING_VERIFICATION,
            arguments={"invoice": f"inv-{index}-{n}"},
            idempotency_key=f"charge-{index}-{n}",
        )
        for n in range(3)
    )
    return run, lease


def _time_run_stops(
    stack: Stack,
    clock: CommitClock,
    *,
    outbox_items: int,
    first_index: int,
    iterations: int,
    warmup: int = 5,
) -> tuple[list[float], list[float]]:
    """`run_stop` of `iterations` fresh runs with `outbox_items` pending items each (after
    `warmup` untimed ones); returns (server time, commit → published) in ms."""
    from runs import frozen, services
    from runs.actors import Actor
    from runs.models import OutboxItem, RunStatus, StopReason

    reviewer = _reviewer_actor(stack)
    server_ms: list[float] = []
    publish_ms: list[float] = []
    for index in range(iterations + warmup):
        run, lease = _running_run_with_outbox(stack, first_index + index, outbox_items=outbox_items)
        started = time.perf_counter()
        outcome = services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=reviewer)
        elapsed = (time.perf_counter() - started) * 1000
        committed = clock.committed(run.pk, "stop_signal") or clock.committed(
            run.pk, "run.stop_requested"
        )
        published = clock.published(run.pk, "stop_signal")
        if index == 0:  # the stop did what it says: the entrance is closed, the outbox frozen
            assert outcome.created and outcome.status == RunStatus.CANCEL_REQUESTED, outcome
            count = OutboxItem.objects.filter(frozen.frozen_q(), run_id=run.pk).count()
            assert count == outbox_items, count
        if index >= warmup:
            server_ms.append(elapsed)
            if committed is not None and published is not None:
                publish_ms.append((published - committed) * 1000)
        # settle it, so no watchdog fences a hundred abandoned stops later in the bench
        services.run_drained(
            run_id=run.pk,
            lease_token=lease.token,
            epoch=lease.epoch,
            actor=Actor.system("bench"),
        )
    return server_ms, publish_ms


def bench_run_stop_server_time(stack: Stack) -> list[Row]:
    clock = CommitClock().install()
    try:
        server_ms, publish_ms = _time_run_stops(
            stack,
            clock,
            outbox_items=OUTBOX_ITEMS,
            first_index=0,
            iterations=stack.n(100, 15),
        )
        large_ms, _ = _time_run_stops(
            stack,
            clock,
            outbox_items=LARGE_OUTBOX_ITEMS,
            first_index=20_000,
            iterations=stack.n(100, 5),
        )
        huge_ms, _ = _time_run_stops(
            stack,
            clock,
            outbox_items=HUGE_OUTBOX_ITEMS,
            first_index=30_000,
            iterations=stack.n(20, 3),
            warmup=1,
        )
    finally:
        clock.uninstall()
    relabelled, relabel_s = _relabel_everything()
    rows = [
        latency_row(
            "stop",
            "run_stop server time (live lease, 1,000 pending outbox items)",
            server_ms,
            target_key="p99",
            target_ms=25,
        ),
        latency_row("stop", "  of which on-commit publish to Redis (3 group_send)", publish_ms),
        latency_row(
            "stop",
            "run_stop server time (live lease, 10,000 pending outbox items)",
            large_ms,
            target_key="p99",
            target_ms=20,
        ),
        latency_row(
            "stop",
            "run_stop server time (live lease, 100,000 pending outbox items)",
            huge_ms,
            target_key="p99",
            target_ms=20,
        ),
        Row(
            "stop",
            "  relabel after the stops (batches of 1,000, in this process)",
            {
                "rows": relabelled,
                "seconds": round(relabel_s, 2),
                "rows_per_s": round(relabelled / relabel_s) if relabel_s else 0,
            },
            "rows/s",
        ),
    ]
    rows.append(_http_cancel_round_trip(stack))
    return rows


def _relabel_everything() -> tuple[int, float]:
    """Relabel every frozen-by-epoch row the stops above left (what the Celery task does after
    a stop), here, so the queued relabels find nothing once the worker starts; (rows, s)."""
    from runs import selectors, services

    started = time.perf_counter()
    done = 0
    while run_ids := selectors.runs_with_frozen_by_epoch(limit=100):
        for run_id in run_ids:
            while (batch := services.outbox_relabel_frozen(run_id=run_id)) > 0:
                done += batch
    return done, time.perf_counter() - started


def _http_cancel_round_trip(stack: Stack) -> Row:
    from runs import services
    from runs.actors import Actor

    iterations, warmup = stack.n(50, 10), 3
    samples: list[float] = []
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.reviewer_token}"}
    ) as http:
        for index in range(iterations + warmup):
            run, lease = _running_run_with_outbox(stack, 10_000 + index)
            started = time.perf_counter()
            response = http.post(
                f"/api/v1/runs/{run.pk}/cancel/", json={"reason": "user_stop", "note": "bench"}
            )
            elapsed = (time.perf_counter() - started) * 1000
            assert response.status_code == 202, response.text
            if index >= warmup:
                samples.append(elapsed)
            services.run_drained(
                run_id=run.pk,
                lease_token=lease.token,
                epoch=lease.epoch,
                actor=Actor.system("bench"),
            )
    return latency_row("stop", "POST /cancel/ round trip (same setup, reviewer token)", samples)


def bench_stop_end_to_end(stack: Stack) -> list[Row]:
    from runs import services
    from runs.actors import Actor
    from runs.models import RunStatus, StopReason, StopRequest, Team

    system = Actor.system("bench")
    reviewer = _reviewer_actor(stack)
    team = Team.objects.get(pk=stack.team_id)
    worker = LineProcess(
        [
            PYTHON,
            str(ROOT / "bench" / "agent_worker.py"),
            "--url",
            stack.base_url,
            "--token",
            stack.agent_token,
            "--quantum",
            "0.005",
        ],
        stack.env,
        stack.log_dir / "agent_worker.log",
    )
    clock = CommitClock().install()
    iterations, warmup = stack.n(100, 20), 5
    commit_to_signal: list[float] = []
    commit_to_drained: list[float] = []
    request_to_signal: list[float] = []
    answer_to_signal: list[float] = []
    request_to_drained: list[float] = []
    answer_to_drained: list[float] = []
    # After the answer: (signal → drained sent) the worker; (drained sent → ack locked, ack
    # locked → drained locked, drained locked → its answer) the server's share.
    signal_to_drained_sent: list[float] = []
    drained_sent_to_ack_locked: list[float] = []
    ack_locked_to_drained_locked: list[float] = []
    drained_locked_to_answer: list[float] = []
    noticed_to_drained_sent: list[float] = []
    drained_sent_to_answer: list[float] = []
    server_request_to_stopped: list[float] = []
    not_clean: list[str] = []

    def leased_run(title: str) -> Any:
        run = services.run_create(
            team=team,
            title=title,
            agent="support-agent",
            actor=system,
            steps=[services.PlannedStep("triage"), services.PlannedStep("reply")],
        )
        worker.send({"op": "lease", "run_id": run.pk})
        ready = worker.receive(timeout=20)
        if "error" in ready:
            raise RuntimeError(f"agent worker failed: {ready['error']}")
        if not ready.get("push_connected"):
            raise RuntimeError("the agent worker's push socket did not connect")
        return run

    def finished(run_id: str) -> dict[str, Any]:
        answer = worker.receive(timeout=30)
        if answer.get("error") or answer.get("run_id") != run_id:
            raise RuntimeError(f"agent worker: {answer}")
        return answer

    # The server's timestamps (CLOCK_REALTIME) onto this machine's CLOCK_MONOTONIC.
    realtime_offset = time.time() - time.monotonic()

    def monotonic(stamp: Any) -> float:
        return float(stamp.timestamp() - realtime_offset)

    def server_side(run_id: str, answer: dict[str, Any]) -> None:
        stop = StopRequest.objects.get(run_id=run_id)
        sent = answer.get("drained_sent_at")
        if sent and stop.acknowledged_at and stop.drained_at:
            acked, drained = monotonic(stop.acknowledged_at), monotonic(stop.drained_at)
            signal_to_drained_sent.append((sent - answer["signal_at"]) * 1000)
            drained_sent_to_ack_locked.append((acked - sent) * 1000)
            ack_locked_to_drained_locked.append((drained - acked) * 1000)
            drained_locked_to_answer.append((answer["drained_at"] - drained) * 1000)
        if stop.outcome_state != RunStatus.STOPPED_CLEANLY or stop.stopped_at is None:
            not_clean.append(f"{run_id}:{stop.outcome_state}")
        else:
            server_request_to_stopped.append(
                (stop.stopped_at - stop.requested_at).total_seconds() * 1000
            )

    try:
        # 2. stop commit → signal at the worker (the stop commits in this process)
        for index in range(iterations + warmup):
            run = leased_run(f"Refund ticket #{index}")
            services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=reviewer)
            committed = clock.committed(run.pk, "stop_signal")
            answer = finished(run.pk)
            if index >= warmup and committed is not None and answer["signal_at"] is not None:
                commit_to_signal.append((answer["signal_at"] - committed) * 1000)
                commit_to_drained.append((answer["drained_at"] - committed) * 1000)
        # 3. stop request (HTTP, reviewer token) → stopped_cleanly
        with httpx.Client(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.reviewer_token}"}
        ) as http:
            for index in range(iterations + warmup):
                run = leased_run(f"Draft contract #{index}")
                requested = time.monotonic()
                response = http.post(f"/api/v1/runs/{run.pk}/cancel/", json={"reason": "user_stop"})
                answered = time.monotonic()
                assert response.status_code == 202, response.text
                answer = finished(run.pk)
                if index >= warmup:
                    request_to_signal.append((answer["signal_at"] - requested) * 1000)
                    answer_to_signal.append((answer["signal_at"] - answered) * 1000)
                    request_to_drained.append((answer["drained_at"] - requested) * 1000)
                    answer_to_drained.append((answer["drained_at"] - answered) * 1000)
                    if answer.get("drained_sent_at"):
                        noticed_to_drained_sent.append(
                            (answer["drained_sent_at"] - answer["noticed_at"]) * 1000
                        )
                        drained_sent_to_answer.append(
                            (answer["drained_at"] - answer["drained_sent_at"]) * 1000
                        )
                    server_side(run.pk, answer)
    finally:
        clock.uninstall()
        worker.close()
    note = (
        f"{len(not_clean)} not clean: {not_clean[:3]}"
        if not_clean
        else "every run ended stopped_cleanly"
    )
    return [
        latency_row(
            "stop",
            "stop commit → signal at a connected safestop_agent worker",
            commit_to_signal,
            target_key="p99",
            target_ms=10,  # a stop must reach a connected worker within a heartbeat's jitter
            note="Redis → daphne → agent websocket (heartbeat every 40 s, so the push is what is timed)",
        ),
        latency_row("stop", "stop commit → worker drained (cooperating worker)", commit_to_drained),
        latency_row("stop", "POST /cancel/ → signal at the worker", request_to_signal),
        latency_row(
            "stop",
            "  its answer → signal at the worker (negative: the signal came first)",
            answer_to_signal,
        ),
        latency_row(
            "stop",
            "POST /cancel/ → stopped_cleanly (worker's drained answer)",
            request_to_drained,
            target_key="p95",
            target_ms=100,  # a person pressing Stop sees it stopped at once
            note=note,
        ),
        latency_row(
            "stop",
            "POST /cancel/'s answer → stopped_cleanly (worker's drained answer)",
            answer_to_drained,
            target_key="p95",
            target_ms=60,  # and p50 ≤ 30: the production shape's target (docs/BENCHMARKS.md)
        ),
        latency_row("stop", "  server-side: requested_at → stopped_at", server_request_to_stopped),
        latency_row("stop", "  worker: signal → POST /drained/ sent", signal_to_drained_sent),
        latency_row(
            "stop",
            "  server: drained sent → the ack holds the run lock (negative: before)",
            drained_sent_to_ack_locked,
        ),
        latency_row(
            "stop",
            "  server: the ack → the drained answer holds the lock",
            ack_locked_to_drained_locked,
        ),
        latency_row(
            "stop",
            "  server: the drained answer holds the lock → its answer at the worker",
            drained_locked_to_answer,
        ),
        latency_row("stop", "  worker: noticed → POST /drained/ sent", noticed_to_drained_sent),
        latency_row("stop", "  worker: POST /drained/ sent → its answer", drained_sent_to_answer),
    ]
