"""The events path with `usage` events against the same path without them (DESIGN §13).

Both are batches of 100 events from 4 agents, each on its own leased run, in interleaved rounds
(with, then without, then again: on a shared machine the load moves within a minute). Without
usage: `bench_ingest.batch_events` (45 steps started and completed, 5 artifacts, 5
checkpoints). With usage: 30 model calls (each a step started, completed and its `usage`
event), 5 artifacts and 5 checkpoints. The usage events name models of the price table with
prices by the token (gpt-4o, gpt-4o-mini, gemini-2.0-flash), one model it lacks (unpriced),
with token counts that differ per call, so no price is a repeat; the run's team has a daily
budget, so each batch also moves the team's counters. Target: with usage at >= 90 % of
without, in events/s.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.bench_ingest import ARTIFACTS_PER_BATCH, BATCH, CHECKPOINTS_PER_BATCH, api_batches
from bench.common import Row
from bench.stack import Stack

MODEL_CALLS = 30
MODELS = [
    ("gpt-4o", "openai"),
    ("gpt-4o-mini", "openai"),
    ("gemini-2.0-flash", "google"),
    ("acme-internal-llm", ""),
]
TARGET = 0.90


def usage_batch_events(client: int, batch: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n in range(MODEL_CALLS):
        key = f"u{batch}-m{n}"
        model, provider = MODELS[n % len(MODELS)]
        events.append(
            {
                "event_id": f"c{client}-b{batch}-m{n}-start",
                "type": "step.started",
                "key": key,
                "name": f"Call the model ({n})",
                "kind": "model_call",
            }
        )
        events.append(
            {
                "event_id": f"c{client}-b{batch}-m{n}-usage",
                "type": "usage",
                "model": model,
                **({"provider": provider} if provider else {}),
                "input_tokens": 1_200 + batch * 7 + n * 13,
                "output_tokens": 150 + n,
                "cache_read_tokens": 400 if n % 3 == 0 else 0,
                "step_key": key,
            }
        )
        events.append(
            {
                "event_id": f"c{client}-b{batch}-m{n}-done",
                "type": "step.completed",
                "key": key,
                "detail": {"summary": "ok"},
            }
        )
    for n in range(ARTIFACTS_PER_BATCH):
        events.append(
            {
                "event_id": f"c{client}-b{batch}-a{n}",
                "type": "artifact.added",
                "name": f"notes-{batch}-{n}.md",
                "kind": "text/markdown",
                "uri": f"s3://bench/notes/{client}/{batch}/{n}.md",
                "checksum": "sha256:" + "ab" * 32,
                "reusable": True,
            }
        )
    for n in range(CHECKPOINTS_PER_BATCH):
        events.append(
            {
                "event_id": f"c{client}-b{batch}-k{n}",
                "type": "checkpoint.saved",
                "label": f"checkpoint_{batch:03d}_{n}",
                "state": {"cursor": batch * 100 + n, "open": [1, 2]},
            }
        )
    assert len(events) == BATCH
    return events


def _team_budget(stack: Stack) -> None:
    """A budget far above what the bench spends: counted on every batch, never reached."""
    from runs import services
    from runs.actors import Actor

    services.team_budget_set(
        team_id=stack.team_id,
        actor=Actor.system("bench"),
        time_zone="Europe/Paris",
        daily_usd="1000000",
        monthly_usd="10000000",
    )


def run(stack: Stack) -> list[Row]:
    from bench.fixtures import analyze

    _team_budget(stack)
    api_batches(stack, 1, 3, 10, events_for=usage_batch_events)  # warm both paths
    api_batches(stack, 1, 3, 10)
    analyze("runs_step", "runs_eventreceipt", "runs_usage", "runs_run", "runs_teambudget")
    rounds = stack.n(5, 2)
    batches = stack.n(10, 2)
    with_usage: list[float] = []
    without: list[float] = []
    for _ in range(rounds):
        wall, done, _latencies = api_batches(stack, 4, batches, 60, events_for=usage_batch_events)
        with_usage.append(done / wall)
        wall, done, _latencies = api_batches(stack, 4, batches, 60)
        without.append(done / wall)
    ratios = [a / b for a, b in zip(with_usage, without, strict=True)]
    median = statistics.median(ratios)
    rates = "/".join(f"{rate:,.0f}" for rate in with_usage)
    plain = "/".join(f"{rate:,.0f}" for rate in without)
    return [
        Row(
            "usage",
            "batches of 100 with 30 usage events / without, 4 clients, interleaved rounds",
            {"rate": median * 100, "ratios": ratios, "with": with_usage, "without": without},
            "%",
            f"≥ {TARGET:.0%}",
            median * 100,
            median >= TARGET,
            f"median of {len(ratios)} rounds; rounds {', '.join(f'{r:.0%}' for r in ratios)}; "
            f"events/s with usage {rates} vs without {plain}",
        )
    ]
