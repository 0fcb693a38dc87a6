"""Test a policy against history (DESIGN §14): replay a team's recorded facts of the last N
days through an expression and answer how many runs it would have acted on, with examples.

The replay rebuilds each run's moments from its records — permits and results
(`ExecutionRecord`), outbox items, started and finished steps, model usage — in time order,
and moves the same aggregates enforcement keeps (`policies.facts`), so a rule counts here as
it would have live. A run counts once, at its first would-act moment (a stop ends a run; a
hold or a notice is what a person would have seen first). Evaluation errors are counted
apart: live, they would have applied the policy's `on_error`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from policies import facts as aggregates
from policies.engine import Moment
from policies.language import Program, activation, compile_expression, evaluate
from runs.models import ExecutionRecord, ExecutionState, OutboxItem, Run, Step, Usage

# Above this many recorded events, the test runs in the background with progress.
SYNC_EVENTS_MAX = 100_000
MAX_DAYS = 90
EXAMPLES = 5
PROGRESS_EVERY = 10_000

Progress = Callable[[int, int], None]


def _window(team_id: int, days: int) -> tuple[datetime, Any]:
    since = timezone.now() - timedelta(days=days)
    return since, Run.objects.filter(team_id=team_id, created_at__gte=since)


def events_count(*, team_id: int, days: int) -> int:
    """How many recorded events a test over these days would replay (four index counts)."""
    _since, runs = _window(team_id, days)
    ids = runs.values("pk")
    permits = ExecutionRecord.objects.filter(run_id__in=ids)
    return (
        permits.count()
        + permits.filter(execution_state__in=_RESULTS).count()
        + OutboxItem.objects.filter(run_id__in=ids).count()
        + Step.objects.filter(run_id__in=ids, started_at__isnull=False).count()
        + Usage.objects.filter(run_id__in=ids).count()
    )


_RESULTS = (ExecutionState.SUCCEEDED, ExecutionState.FAILED)

# A recorded event: (at, order within the same instant, kind, fields).
Event = tuple[datetime, int, str, tuple[Any, ...]]


def _events(run_ids: list[str]) -> dict[str, list[Event]]:
    by_run: dict[str, list[Event]] = defaultdict(list)
    for run_id, at, finished, tool, arguments, side_effect, state in ExecutionRecord.objects.filter(
        run_id__in=run_ids
    ).values_list(
        "run_id",
        "permitted_at",
        "finished_at",
        "tool",
        "arguments",
        "side_effect",
        "execution_state",
    ):
        by_run[run_id].append((at, 0, "tool.permit", (tool, arguments, side_effect)))
        if state in _RESULTS:
            by_run[run_id].append((finished or at, 1, "tool.result", (tool, state)))
    for run_id, at, transport, destination, payload in OutboxItem.objects.filter(
        run_id__in=run_ids
    ).values_list("run_id", "created_at", "transport", "destination", "payload"):
        by_run[run_id].append((at, 0, "outbox.enqueue", (transport, destination, payload)))
    for run_id, started, finished, status in Step.objects.filter(
        run_id__in=run_ids, started_at__isnull=False
    ).values_list("run_id", "started_at", "finished_at", "status"):
        if started is None:
            continue
        by_run[run_id].append((started, 0, "step.started", ()))
        if finished is not None and status in ("completed", "failed"):
            by_run[run_id].append((finished, 1, f"step.{status}", ()))
    for run_id, at, cost, tokens_in, tokens_out in Usage.objects.filter(
        run_id__in=run_ids
    ).values_list("run_id", "at", "cost_usd", "input_tokens", "output_tokens"):
        by_run[run_id].append((at, 0, "usage", (cost, tokens_in, tokens_out)))
    for events in by_run.values():
        events.sort(key=lambda event: (event[0], event[1]))
    return by_run


class _Replay:
    """One run's values as its events arrive."""

    def __init__(self, run: dict[str, Any], team_slug: str) -> None:
        self.run = run
        self.team_slug = team_slug
        self.facts = aggregates.ReplayFacts()
        self.tool_calls = self.steps = self.tokens = 0
        self.cost = Decimal(0)

    def moment(self, kind: str, fields: tuple[Any, ...], at: datetime) -> Moment:
        stamp = at.timestamp()
        if kind == "tool.permit":
            tool, arguments, side_effect = fields
            self.tool_calls += 1
            aggregates.record_call(
                self.facts, tool=tool, arguments=arguments, side_effect=side_effect, at=stamp
            )
            return Moment(
                kind,
                tool=tool,
                arguments=arguments if isinstance(arguments, dict) else {},
                side_effect=side_effect,
                destination_host=aggregates.call_host(arguments),
                repeats=self.facts.repeats,
                is_call=True,
            )
        if kind == "tool.result":
            tool, state = fields
            aggregates.record_result(self.facts, execution_state=state)
            return Moment(kind, tool=tool)
        if kind == "outbox.enqueue":
            transport, destination, payload = fields
            aggregates.record_side_effect(self.facts, at=stamp)
            return Moment(
                kind,
                tool=transport,
                arguments=payload if isinstance(payload, dict) else {},
                side_effect="write",
                destination_host=aggregates.host_of(destination),
                is_call=True,
            )
        if kind == "step.started":
            self.steps += 1
        elif kind == "usage":
            cost, tokens_in, tokens_out = fields
            self.cost += cost or 0
            self.tokens += (tokens_in or 0) + (tokens_out or 0)
        return Moment(kind)

    def value(self, name: str, at: datetime) -> Any:
        run = self.run
        values = {
            "run.agent": lambda: run["agent"],
            "run.team": lambda: self.team_slug,
            "run.elapsed_seconds": lambda: max(
                (at - (run["started_at"] or run["created_at"])).total_seconds(), 0.0
            ),
            "run.steps": lambda: self.steps,
            "run.tool_calls": lambda: self.tool_calls,
            "run.tool_failures_in_a_row": lambda: self.facts.tool_failures_in_a_row,
            "run.side_effects_last_minute": lambda: aggregates.side_effects_last_minute(
                self.facts, at=at.timestamp()
            ),
            "run.cost_usd": lambda: float(self.cost),
            "run.tokens": lambda: self.tokens,
        }
        return values[name]()


def history_test(
    *,
    team_id: int,
    team_slug: str,
    expression: str,
    days: int = 7,
    agent_glob: str = "*",
    tool_glob: str = "*",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Replay; raises `ExpressionError` for an expression that does not compile."""
    from policies.engine import Compiled

    program = compile_expression(expression)
    scope = Compiled(
        id=0,
        updated_at=timezone.now(),
        name="test",
        expression=expression,
        action="",
        mode="",
        on_error="",
        agent_glob=agent_glob or "*",
        tool_glob=tool_glob or "*",
        program=program,
    )
    since, runs = _window(team_id, days)
    rows = {
        row["id"]: row
        for row in runs.values("id", "title", "agent", "status", "created_at", "started_at")
    }
    by_run = _events(list(rows))
    total = sum(len(events) for events in by_run.values())
    done = 0
    acted: list[dict[str, Any]] = []
    errors = 0
    for run_id, events in by_run.items():
        replay = _Replay(rows[run_id], team_slug)
        hit, failed = _replay_run(replay, events, program, scope)
        done += len(events)
        if (
            progress is not None
            and done // PROGRESS_EVERY != (done - len(events)) // PROGRESS_EVERY
        ):
            progress(done, total)
        errors += failed
        if hit is not None:
            acted.append(hit)
    acted.sort(key=lambda hit: hit["at"], reverse=True)
    if progress is not None:
        progress(total, total)
    return {
        "days": days,
        "since": since.isoformat(),
        "events": total,
        "runs": len(rows),
        "runs_acted_on": len(acted),
        "runs_with_errors": errors,
        "examples": acted[:EXAMPLES],
    }


def _replay_run(
    replay: _Replay, events: list[Event], program: Program, scope: Any
) -> tuple[dict[str, Any] | None, int]:
    run = replay.run
    failed = 0
    for at, _order, kind, fields in events:
        moment = replay.moment(kind, fields, at)
        if not scope.applies(lambda: run["agent"], moment):
            continue
        data = {
            "call.tool": moment.tool,
            "call.arguments": moment.arguments,
            "call.side_effect": moment.side_effect,
            "call.destination_host": moment.destination_host,
            "call.repeats": moment.repeats,
            "event.type": moment.event_type,
        }
        for name in program.names:
            if name.startswith("run."):
                data[name] = replay.value(name, at)
        matched, error = evaluate(program, activation(data))
        if error:
            failed = 1
            continue
        if matched:
            return {
                "run_id": run["id"],
                "title": run["title"],
                "agent": run["agent"],
                "status": run["status"],
                "at": at.isoformat(),
                "event_type": moment.event_type,
                "values": {name: data[name] for name in program.names},
            }, failed
    return None, failed
