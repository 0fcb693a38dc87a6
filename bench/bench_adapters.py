"""Stop latency through the framework adapters, and how many lines each integration takes.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/bench_adapters.py [--iterations 20]

A live server (daphne on a database of its own, `safestop_bench_adapters`); a worker thread in
this process runs the real framework under a lease, busy in the middle of its work; a reviewer
token POSTs `/cancel/`. Timed from before that POST to the moment the framework call raises
`Cancelled` in the worker (the graph or agent has stopped: its open steps and, for LangGraph,
its checkpoint are reported by then; the lease block's `drained` comes after):

- LangGraph sync: `SafestopGraph(run, graph).invoke()`, a node watching `current_token()`.
- LangGraph async: `await SafestopGraph(...).ainvoke()`, an async node in 5 ms `await` quanta.
- OpenAI Agents SDK streamed: `run_agent_streamed` + `stream_events`, the model "thinking".

Then the integration lines: the safestop-specific lines of the runnable blocks in
docs/agents.md (imports, guard/wrapper, lease, run, complete), per framework.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PYTHON,
    free_port,
    recreate_database,
    start,
    summary,
    wait_for_port,
)
from bench.run_all import _environment, _principals, _setup_django  # noqa: E402

DB_NAME = "safestop_bench_adapters"


def _timed_stops(
    reviewer: Any,
    agent: Any,
    iterations: int,
    work: Callable[[Any, threading.Event], None],
    title: str,
) -> list[tuple[float, float]]:
    """`work(run, busy)` runs the framework in a worker thread.

    Returns, per stop, seconds from the cancel POST to the worker's stop signal (the token
    set, by push) and to the framework call raising `Cancelled`.
    """
    from safestop_agent import Cancelled

    samples: list[tuple[float, float]] = []
    for index in range(iterations):
        run_id = agent.create_run(f"{title} #{index}", "bench-adapters")["id"]
        busy, stopped_at = threading.Event(), {}

        def worker(run_id: str = run_id, busy: threading.Event = busy, at: dict = stopped_at):
            try:
                with agent.lease(run_id, "bench-worker", ttl_seconds=30) as run:
                    run.token.on_cancel(lambda: at.setdefault("signal", time.perf_counter()))
                    try:
                        work(run, busy)
                    except Cancelled:
                        at["stopped"] = time.perf_counter()
                        raise
            except BaseException as error:
                at["error"] = error
                busy.set()
                raise

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        if not busy.wait(30):
            raise RuntimeError(f"{title}: the worker never got busy")
        time.sleep(0.05)  # well inside its work
        sent = time.perf_counter()
        reviewer.cancel(run_id, "user_stop", note="bench")
        thread.join(30)
        if "stopped" not in stopped_at:
            raise RuntimeError(f"{title}: the worker did not stop: {stopped_at.get('error')!r}")
        samples.append((stopped_at["signal"] - sent, stopped_at["stopped"] - sent))
    return samples


def langgraph_sync(run: Any, busy: threading.Event) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    from safestop_agent.integrations.langgraph import SafestopGraph, current_token

    def think(state: MessagesState) -> dict[str, Any]:
        busy.set()
        current_token().wait(30)  # a long node that watches the token
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("think", think)
    builder.add_node("after", lambda state: {})
    builder.add_edge(START, "think")
    builder.add_edge("think", "after")
    builder.add_edge("after", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    SafestopGraph(run, graph).invoke({"messages": [("user", "go")]})


def langgraph_async(run: Any, busy: threading.Event) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    from safestop_agent.integrations.langgraph import SafestopGraph, current_token

    async def think(state: MessagesState) -> dict[str, Any]:
        busy.set()
        token = current_token()
        while not token.cancelled:
            await asyncio.sleep(0.005)  # async work in 5 ms quanta
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("think", think)
    builder.add_node("after", lambda state: {})
    builder.add_edge(START, "think")
    builder.add_edge("think", "after")
    builder.add_edge("after", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    asyncio.run(SafestopGraph(run, graph).ainvoke({"messages": [("user", "go")]}))


def openai_streamed(run: Any, busy: threading.Event) -> None:
    from agents import Agent, set_tracing_disabled

    from safestop_agent.integrations.openai_agents import (
        guard_agent,
        run_agent_streamed,
        stream_events,
    )
    from tests.support.scripted_model import ScriptedModel, say

    set_tracing_disabled(True)

    class Busy(ScriptedModel):
        async def _next(self, input: Any) -> list[Any]:
            busy.set()
            return await super()._next(input)

    model = Busy([[say("never")]], hold={1: 30.0})  # the model thinks for a long time
    agent = guard_agent(Agent(name="bench", model=model))

    async def main() -> None:
        result = run_agent_streamed(run, agent, "go")
        async for _event in stream_events(run, result):
            pass

    asyncio.run(main())


def integration_lines() -> dict[str, int]:
    """Safestop lines of the runnable LangGraph / OpenAI Agents blocks of docs/agents.md."""
    text = (ROOT / "docs" / "agents.md").read_text()
    counts: dict[str, int] = {}
    for heading, framework in (
        ("## LangGraph:", "LangGraph"),
        ("## OpenAI Agents SDK:", "OpenAI Agents SDK"),
    ):
        section = text[text.index(heading) :]
        block = re.search(r"```python\n(.*?)```", section, re.S)
        assert block is not None
        lines = [
            line
            for line in block.group(1).splitlines()
            if re.search(r"safestop|Safestop|guard_agent|run_agent|client\.|run\.complete", line)
        ]
        counts[framework] = len(lines)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    os.environ["BENCH_DB_NAME"] = DB_NAME
    admin_url, db_name, _url, env = _environment(args)
    env["OPENAI_API_KEY"] = os.environ.get("OPENAI_API_KEY", "sk-dummy-never-used")
    os.environ["OPENAI_API_KEY"] = env["OPENAI_API_KEY"]
    recreate_database(admin_url, db_name)
    log_dir = ROOT / "bench" / "results" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    _setup_django(env)
    principals = _principals()
    port = free_port()
    daphne = start(
        "daphne-adapters",
        [PYTHON, "manage.py", "serve", "--no-demo", "--host", "127.0.0.1", "--port", str(port)],
        env,
        log_dir,
    )
    try:
        wait_for_port(port, timeout=60, process=daphne.process)
        from safestop_agent import SafestopClient

        url = f"http://127.0.0.1:{port}"
        agent = SafestopClient(url, str(principals["agent_token"]))
        reviewer = SafestopClient(url, str(principals["reviewer_token"]))
        print(
            f"stop latency from the cancel POST: to the framework call raising Cancelled "
            f"(stopped), and to the worker's token being set (signal); {args.iterations} runs"
        )
        for name, work in (
            ("LangGraph sync (invoke)", langgraph_sync),
            ("LangGraph async (ainvoke)", langgraph_async),
            ("OpenAI Agents SDK streamed", openai_streamed),
        ):
            samples = _timed_stops(reviewer, agent, args.iterations, work, name)
            signal = summary([s * 1000 for s, _stopped in samples])
            stopped = summary([s * 1000 for _signal, s in samples])
            print(
                f"  {name:28s} stopped p50 {stopped['p50']:6.1f} ms p95 {stopped['p95']:6.1f} ms"
                f" max {stopped['max']:6.1f} ms  (signal p50 {signal['p50']:6.1f} ms)"
            )
        print("integration lines (safestop-specific lines of the docs/agents.md blocks)")
        for framework, count in integration_lines().items():
            print(f"  {framework:30s} {count} lines")
    finally:
        daphne.stop()


if __name__ == "__main__":
    main()
