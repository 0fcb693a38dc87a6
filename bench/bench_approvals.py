"""Approvals (DESIGN §10): decision commit → the waiting worker's tool body, and the inbox.

1. decision commit → tool body starts — a `safestop_agent` worker in its own process (this
   file, `worker` mode: no Django) holds a lease and its push socket to daphne, and enters
   `run.tool_call(..., needs_approval=True)`: the permit answers 202 and the call waits. The
   worker says so (from inside `wait_for_approval`, with the approval's id); this process then
   decides through `services.approval_decide` — what the API and the console call — so the
   decision commits here, goes through Redis to daphne and down the agent websocket as an
   `approval.decided` frame. The commit is stamped by a `runs.notify` listener placed ahead
   of the Channels publisher (bench/hooks.py, the same clock as the stop bench), the body's
   start by the worker's first statement inside the `with` block; both CLOCK_MONOTONIC,
   system-wide on Linux. The worker polls the approval's GET only every 600 s, so the push
   is what is timed (the polls are counted and reported). Half the approvals edit the
   arguments (the body must see the edited ones); every fifth call is rejected instead, and
   commit → `ApprovalRejected` at the caller is its own row.
2. the inbox — 10,000 waiting approvals (and 5,000 decided ones) over 1,000 running runs in
   five teams, COPYed (bench/fixtures.py); `/approvals/` as staff (every team) and as a team
   reviewer, and `GET /api/v1/approvals/` with the reviewer token, through Django's test client
   in this process (the whole middleware stack, no network) as bench/bench_pages.py does. Query
   counts are taken with 10 waiting approvals, then again with 10,000.

Standalone (its own database and lock, so it runs beside `make bench`):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/8 \\
        .venv/bin/python bench/bench_approvals.py [--quick] [--keep-db]

which is `bench/run_all.py --only approvals` on the database `safestop_bench_approvals`
(`BENCH_DB_NAME`) and the Redis database REDIS_URL names (`BENCH_REDIS_DB`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, ROOT, Row, emit, latency_row  # noqa: E402

# The worker polls the approval's GET this seldom: a decision that arrives is the push.
WORKER_POLL_SECONDS = 600.0
SCHEMA = {
    "type": "object",
    "properties": {
        "amount_cents": {"type": "integer", "minimum": 1},
        "currency": {"type": "string"},
        "memo": {"type": "string"},
    },
    "required": ["amount_cents", "currency"],
}
WAITING = 10_000
DECIDED = 5_000
RUNS = 1_000


# --------------------------------------------------------------------------------------------
# the worker: its own process, `safestop_agent` only


def _worker(argv: list[str]) -> None:
    from safestop_agent import ApprovalRejected, SafestopClient
    from safestop_agent.worker import AgentRun

    parser = argparse.ArgumentParser(prog="bench_approvals.py worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--worker-id", default="bench-approvals-worker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    commands = (json.loads(line) for line in sys.stdin)

    def serve(client: SafestopClient, run_id: str) -> bool:
        """Lease `run_id` and run the calls asked for; True when told to quit."""
        # A long TTL keeps the heartbeat (ttl/3) out of the way.
        run = AgentRun(
            client,
            run_id,
            args.worker_id,
            ttl_seconds=120,
            approval_poll_interval=WORKER_POLL_SECONDS,
        )
        polls = [0]
        quit_ = False
        with run:
            listener = run._listener  # noqa: SLF001  (the bench waits for the socket, as tests do)
            connected = listener is not None and listener.connected.wait(10)
            waiting_for = run.wait_for_approval
            poll = run._poll_approval  # noqa: SLF001

            def announce(approval_id: str, **kwargs: Any) -> Any:
                emit({"waiting": approval_id, "at": time.monotonic()})
                return waiting_for(approval_id, **kwargs)

            def counted(approval_id: str) -> Any:
                polls[0] += 1
                return poll(approval_id)

            run.wait_for_approval = announce  # type: ignore[method-assign]
            run._poll_approval = counted  # type: ignore[method-assign]  # noqa: SLF001
            emit({"ready": run_id, "push_connected": bool(connected)})
            for command in commands:
                if command.get("op") != "call":
                    quit_ = command.get("op") == "quit"
                    break
                answer: dict[str, Any] = {"tool_call_id": command["tool_call_id"]}
                try:
                    with run.tool_call(
                        "charge_card",
                        command["arguments"],
                        side_effect="write",
                        tool_call_id=command["tool_call_id"],
                        needs_approval=True,
                        summary="Charge the customer's card",
                        risk="high",
                        arguments_schema=SCHEMA,
                    ) as call:
                        answer["body_at"] = time.monotonic()  # the body's first statement
                        answer["arguments"] = call.arguments
                        answer["edited"] = call.arguments_edited
                        call.result = {"charged": call.arguments["amount_cents"]}
                except ApprovalRejected as rejected:
                    answer["rejected_at"] = time.monotonic()
                    answer["message"] = rejected.message
                answer["polls"] = polls[0]
                emit(answer)
        emit({"released": run_id})
        return quit_

    with SafestopClient(args.url, args.token) as client:
        for command in commands:
            if command.get("op") != "lease":
                break
            try:
                if serve(client, command["run_id"]):
                    break
            except Exception as error:  # report, do not die: the orchestrator decides
                emit({"run_id": command.get("run_id"), "error": repr(error)})


# --------------------------------------------------------------------------------------------
# 1. decision commit → tool body


def bench_decision_to_body(stack: Any) -> list[Row]:
    from django.db.models import Count

    from bench.bench_stop import _reviewer_actor
    from bench.hooks import CommitClock
    from bench.stack import LineProcess
    from runs import services
    from runs.actors import Actor
    from runs.models import Approval, ExecutionRecord, Team

    system = Actor.system("bench")
    reviewer = _reviewer_actor(stack)
    team = Team.objects.get(pk=stack.team_id)
    runs, calls, warmup = stack.n(12, 2), stack.n(25, 10), 5
    worker = LineProcess(
        [
            PYTHON,
            str(ROOT / "bench" / "bench_approvals.py"),
            "worker",
            "--url",
            stack.base_url,
            "--token",
            stack.agent_token,
        ],
        stack.env,
        stack.log_dir / "approval_worker.log",
    )
    clock = CommitClock().install()
    approve_ms: list[float] = []
    approve_edited_ms: list[float] = []
    reject_ms: list[float] = []
    decide_ms: list[float] = []
    publish_ms: list[float] = []
    wrong: list[str] = []
    polls = 0

    def answer(timeout: float = 30) -> dict[str, Any]:
        line = worker.receive(timeout)
        if "error" in line:
            raise RuntimeError(f"approval worker: {line['error']}")
        return line

    try:
        for r in range(runs):
            run = services.run_create(
                team=team, title=f"Pay supplier batch #{r}", agent="payments-agent", actor=system
            )
            worker.send({"op": "lease", "run_id": run.pk})
            ready = answer(20)
            if not ready.get("push_connected"):
                raise RuntimeError("the approval worker's push socket did not connect")
            for c in range(calls):
                index = r * calls + c
                tool_call_id = f"call_{r}_{c}"
                original = {"amount_cents": 1000 + index, "currency": "EUR"}
                worker.send({"op": "call", "tool_call_id": tool_call_id, "arguments": original})
                waiting = answer()
                approval_id = services.parse_approval_id(waiting["waiting"])
                reject = c % 5 == 4
                edited = None if reject or c % 2 == 0 else {**original, "memo": "split: part 1"}
                started = time.monotonic()
                services.approval_decide(
                    approval_id=approval_id,
                    decision="reject" if reject else "approve",
                    actor=reviewer,
                    message="over the daily limit" if reject else "ok",
                    arguments=edited,
                )
                decided = time.monotonic()
                kind = "approval.rejected" if reject else "approval.approved"
                committed = clock.committed(run.pk, kind)
                published = clock.published(run.pk, "approval_decided")
                done = answer()
                polls = done["polls"]
                if done["tool_call_id"] != tool_call_id:
                    raise RuntimeError(f"approval worker answered for {done['tool_call_id']}")
                if reject:
                    if done.get("message") != "over the daily limit" or "body_at" in done:
                        wrong.append(f"{tool_call_id}: {done}")
                elif done.get("arguments") != (edited or original) or done.get("edited") != bool(
                    edited
                ):
                    wrong.append(f"{tool_call_id}: ran with {done.get('arguments')}")
                if index < warmup or committed is None:
                    continue
                decide_ms.append((decided - started) * 1000)
                if published is not None:
                    publish_ms.append((published - committed) * 1000)
                if reject:
                    reject_ms.append((done["rejected_at"] - committed) * 1000)
                else:
                    (approve_edited_ms if edited else approve_ms).append(
                        (done["body_at"] - committed) * 1000
                    )
            worker.send({"op": "release"})
            released = answer(20)
            if released.get("released") != run.pk:
                raise RuntimeError(f"approval worker: {released}")
        # what the server holds agrees: every approved call ran, every rejected one never did
        states = dict(
            ExecutionRecord.objects.filter(run__agent="payments-agent", run__team=team)
            .values_list("execution_state")
            .annotate(n=Count("id"))
        )
        statuses = dict(
            Approval.objects.filter(agent="payments-agent")
            .values_list("status")
            .annotate(n=Count("id"))
        )
    finally:
        clock.uninstall()
        worker.close()
    both = approve_ms + approve_edited_ms
    checks = (
        f"{len(wrong)} wrong: {wrong[:2]}"
        if wrong
        else "every body ran with the final arguments; every rejection's message reached the caller"
    )
    return [
        latency_row(
            "approvals",
            "decision commit → tool body starts (waiting safestop_agent worker)",
            both,
            target_key="p99",
            target_ms=50,
            note=f"Redis → daphne → agent websocket; worker GET polls during the waits: {polls} "
            f"(poll interval {WORKER_POLL_SECONDS:.0f} s); {checks}",
        ),
        latency_row("approvals", "  approved as is", approve_ms),
        latency_row("approvals", "  approved with edited arguments", approve_edited_ms),
        latency_row("approvals", "decision commit → ApprovalRejected at the caller", reject_ms),
        latency_row(
            "approvals",
            "  services.approval_decide (lock, write, ledger, commit, publish)",
            decide_ms,
            note=f"records {states}; approvals {statuses}",
        ),
        latency_row("approvals", "  of which on-commit publish of the decision", publish_ms),
    ]


# --------------------------------------------------------------------------------------------
# 2. the inbox at 10,000 waiting approvals


def _load_approvals(
    team_ids: list[int], *, runs: int, waiting: int, decided: int, prefix: str
) -> int:
    """`runs` running runs over the teams, each holding its share of waiting and decided tool
    calls; rows shaped as `services.permit_request` + `approval_decide` leave them."""
    from django.db import transaction
    from django.utils import timezone

    from bench.fixtures import AGENTS, TITLES, copy_rows
    from runs.models import Approval, ExecutionRecord, Run

    now = timezone.now()
    tools = ("charge_card", "refund_payment", "deploy_service", "send_email", "delete_records")
    risks = ("low", "medium", "high")
    # One letter + 11 hex digits, like real ids; not bench/fixtures.py's "b" (the pages' runs
    # share the database under `make bench`).
    assert len(prefix) == 1 and prefix != "b", prefix
    run_ids = [f"run_{prefix}{n:011x}" for n in range(runs)]
    with transaction.atomic():
        copy_rows(
            Run,
            (
                {
                    "id": run_id,
                    "team_id": team_ids[n % len(team_ids)],
                    "title": f"{TITLES[n % len(TITLES)]} #{n}",
                    "agent": AGENTS[n % len(AGENTS)],
                    "status": "running",
                    "stop_epoch": 1,
                    "change_seq": 5,
                    "created_by": "bench",
                    "created_at": now - timedelta(minutes=30),
                    "started_at": now - timedelta(minutes=29),
                    "updated_at": now,
                }
                for n, run_id in enumerate(run_ids)
            ),
        )

        def calls() -> Iterable[dict[str, Any]]:
            for n in range(waiting + decided):
                run_n = n % runs
                held = n < waiting
                yield {
                    "run_id": run_ids[run_n],
                    "tool_call_id": f"call_{prefix}_{n}",
                    "tool": tools[n % len(tools)],
                    "arguments": {"amount_cents": 100 + n, "currency": "EUR", "to": f"c-{n}"},
                    "side_effect": "write",
                    "permit_epoch": 1,
                    "execution_state": "awaiting_approval" if held else "succeeded",
                    "side_effect_state": "not_applied" if held else "applied",
                }

        copy_rows(ExecutionRecord, calls())
        records = dict(
            ExecutionRecord.objects.filter(run_id__in=run_ids).values_list("tool_call_id", "pk")
        )

        def approvals() -> Iterable[dict[str, Any]]:
            for n in range(waiting + decided):
                run_n = n % runs
                held = n < waiting
                requested = now - timedelta(seconds=n % 600)
                arguments = {"amount_cents": 100 + n, "currency": "EUR", "to": f"c-{n}"}
                yield {
                    "run_id": run_ids[run_n],
                    "team_id": team_ids[run_n % len(team_ids)],
                    "agent": AGENTS[run_n % len(AGENTS)],
                    "epoch": 1,
                    "target": "tool_call",
                    "execution_record_id": records[f"call_{prefix}_{n}"],
                    "subject": tools[n % len(tools)],
                    "rule_name": "payments and deploys",
                    "match_reason": "rule 'payments and deploys' matched tool 'charge_*'",
                    "summary": f"Charge customer c-{n}",
                    "risk": risks[n % len(risks)],
                    "original_arguments": arguments,
                    "arguments": arguments,
                    "status": "waiting" if held else ("approved" if n % 3 else "rejected"),
                    "decided_by": "" if held else "alice",
                    "decided_by_kind": "" if held else "user",
                    "decided_at": None if held else requested + timedelta(seconds=40),
                    "requested_at": requested,
                    "deadline": requested + timedelta(seconds=900 + (n * 37) % 3600),
                }

        copy_rows(Approval, approvals())
    return waiting + decided


def _time_get(
    client: Any, url: str, iterations: int, warmup: int
) -> tuple[list[float], int, int, float]:
    """(server times ms, query count, response bytes, SQL ms of one request): bench_pages's
    `_time_page`, plus where the time goes — the queries' own time on one more request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.bench_pages import _time_page

    samples, queries, size = _time_page(client, url, iterations, warmup)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    sql_ms = sum(float(query["time"]) for query in captured.captured_queries) * 1000
    return samples, queries, size, sql_ms


def bench_inbox(stack: Any) -> list[Row]:
    from django.test import Client

    from bench.bench_pages import _client, _teams
    from bench.fixtures import analyze
    from runs.models import Approval

    team_ids = _teams(stack.team_id)
    staff = _client(stack.staff_username)
    reviewer = _client(stack.reviewer_username)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {stack.reviewer_token}")
    cases = [
        ("approvals inbox /approvals/, staff (every team)", staff, "/approvals/"),
        ("approvals inbox, reviewer (one team)", reviewer, "/approvals/"),
        ("approvals inbox, filter risk=high", staff, "/approvals/?risk=high"),
        ("approvals inbox, htmx region refresh", staff, "/approvals/"),
        ("GET /api/v1/approvals/?status=waiting, reviewer token", api, "/api/v1/approvals/"),
    ]
    api_there = api.get("/api/v1/approvals/").status_code == 200

    def measure(iterations: int) -> dict[str, tuple[list[float], int, int, float]]:
        out = {}
        for label, client, url in cases:
            if url.startswith("/api/") and not api_there:
                continue
            extra = (
                {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "approvals-region"}
                if "htmx" in label
                else {}
            )
            client.defaults.update(extra)
            if url.startswith("/api/"):
                url += "?status=waiting"
            out[label] = _time_get(client, url, iterations, warmup=1 if iterations < 5 else 3)
            for key in extra:
                client.defaults.pop(key, None)
        return out

    _load_approvals(team_ids, runs=5, waiting=10, decided=0, prefix="y")
    small = measure(2)
    started = time.perf_counter()
    waiting, decided = stack.n(WAITING, 2_000), stack.n(DECIDED, 1_000)
    _load_approvals(
        team_ids, runs=stack.n(RUNS, 200), waiting=waiting - 10, decided=decided, prefix="x"
    )
    analyze("runs_run", "runs_executionrecord", "runs_approval", vacuum=True)
    load_seconds = time.perf_counter() - started
    total_waiting = Approval.objects.filter(status="waiting").count()
    big = measure(stack.n(40, 8))
    rows = []
    for label, (samples, queries, size, sql_ms) in big.items():
        small_queries = small[label][1]
        constant = "constant" if small_queries == queries else "NOT constant"
        rows.append(
            latency_row(
                "approvals",
                f"{label} — {total_waiting:,} waiting",
                samples,
                target_key="p95",
                target_ms=150,
                figure=f"approvals inbox and API at {total_waiting:,} waiting",
                note=f"{queries} queries ({small_queries} with 10 waiting: {constant}) taking "
                f"{sql_ms:.1f} ms of one request, {size / 1024:.0f} KiB",
            )
        )
    if not api_there:
        rows.append(
            Row("approvals", "GET /api/v1/approvals/", {}, "", note="not measured: no endpoint")
        )
    rows.append(
        Row(
            "approvals",
            "inbox fixtures",
            {"value": load_seconds},
            "s",
            note=f"COPY of {total_waiting:,} waiting + {decided:,} decided approvals over "
            f"{stack.n(RUNS, 200):,} running runs in {len(team_ids)} teams",
        )
    )
    return rows


def run(stack: Any) -> list[Row]:
    return bench_decision_to_body(stack) + bench_inbox(stack)


# --------------------------------------------------------------------------------------------
# standalone


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        _worker(argv[1:])
        return
    os.environ.setdefault("BENCH_DB_NAME", "safestop_bench_approvals")
    redis_db = urlsplit(os.environ.get("REDIS_URL", "")).path.strip("/")
    os.environ.setdefault("BENCH_REDIS_DB", redis_db if redis_db.isdigit() else "8")
    from bench import run_all

    sys.argv = [sys.argv[0], "--only", "approvals", *argv]
    run_all.main()


if __name__ == "__main__":
    main(sys.argv[1:])
