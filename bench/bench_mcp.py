"""The MCP gateway's cost (DESIGN §15): p50 added latency per `tools/call`, and a stop's latency.

Against `@modelcontextprotocol/server-everything` (tests/mcp, `make mcp-servers`), its `echo`
tool, sequential calls, one client, the `mcp` SDK's client everywhere:

1. direct, stdio — the SDK client spawns server-everything itself (what an agent does without
   safestop);
2. direct, streamable HTTP — server-everything in its HTTP mode on a local port (the same
   transport the gateway speaks to the agent);
3. through the gateway — the SDK client over streamable HTTP to daphne's `/mcp/everything/`,
   which asks a permit, forwards over stdio to its own server-everything and records the result.
   Added latency = p50(3) − p50(2) (same client transport), and p50(3) − p50(1) (what an
   agent switching from a local stdio server pays).
   Run 3 also reads daphne's own CPU time (`/proc`), divided by the calls (and run 2 the
   node server's): on a shared machine the wall-clock figures measure the queue for its cores,
   the CPU time does not.
   `echo` is a read (`readOnlyHint`) and the bench's team has no approval rule and no policy,
   so each call goes upstream beside its permit (DESIGN §15).
4. 2 and 3 again with a pause between calls (`PAUSE_SECONDS`, standing for the model's turn):
   back to back, a call's permit waits for the previous call's result to be recorded (the
   session's lane keeps them in order, `gateway/lane.py`); paced, it does not.
4b. 2 and 3 paced and taken in turns, one direct call then one through the gateway (the order
   swapped every other pair), so that both see the machine as it is at that moment.
4c. 4b with a read that takes 20 ms at the upstream (server-everything's long-running
   operation, one step): its permit is done before it answers.
4d. 3 and 4c again with an approval rule on the team (for a tool never called): nothing goes
   upstream before its permit, as for every write — the permit's time and the call's add up.
5. stop → the client's pending call answers — a reviewer's `POST .../cancel/` while
   `trigger-long-running-operation` runs, until the call in flight returns its tool error
   (cancelled upstream, drained); one new session per stop.

Part of `make bench` (`bench/run_all.py --only mcp` runs it alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, Row, free_port, latency_row, wait_for_port

EVERYTHING = ROOT / "tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
NODE = shutil.which("node") or "node"
# A read that takes its time at the upstream, as most real tools do (a file, an HTTP API):
# server-everything's long-running operation, one step of 20 ms. Its permit, asked beside it,
# is done before it answers.
SLOW_READ = ("trigger-long-running-operation", {"duration": 0.02, "steps": 1})
# The paced rows' pause between two calls: a model's turn is far longer, this is enough for the
# gateway's bookkeeping of one call (the result's record) to finish before the next.
PAUSE_SECONDS = 0.05


def _p50(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _echo(index: int | str) -> tuple[str, dict[str, Any]]:
    return "echo", {"message": f"m{index}"}


def _slow_read(index: int | str) -> tuple[str, dict[str, Any]]:
    return SLOW_READ


async def _timed_calls(
    session: Any,
    count: int,
    warmup: int = 20,
    cpu_pid: int | None = None,
    pause: float = 0.0,
    call: Any = _echo,
) -> tuple[list[float], float | None]:
    """The calls' wall times (ms), and the CPU time `cpu_pid` spent per call (ms) over them.

    `pause` (seconds) between calls stands for the model's turn between two tool calls; without
    it the calls are back to back, each one's bookkeeping competing with the next."""
    for _ in range(warmup):
        await session.call_tool(*call("warm"))
    cpu_before = _cpu_seconds(cpu_pid) if cpu_pid else 0.0
    samples = []
    for index in range(count):
        if pause:
            await asyncio.sleep(pause)
        started = time.perf_counter()
        await session.call_tool(*call(index))
        samples.append((time.perf_counter() - started) * 1000)
    cpu = (_cpu_seconds(cpu_pid) - cpu_before) * 1000 / count if cpu_pid else None
    return samples, cpu


async def _direct_stdio(count: int) -> list[float]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=NODE, args=[str(EVERYTHING), "stdio"])
    with open(os.devnull, "w") as quiet:
        async with stdio_client(params, errlog=quiet) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                samples, _ = await _timed_calls(session, count)
                return samples


def _http_session(url: str, token: str = "") -> Any:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    @contextlib.asynccontextmanager
    async def opened() -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session

    return opened()


async def _over_http(
    url: str,
    count: int,
    token: str = "",
    cpu_pid: int | None = None,
    pause: float = 0.0,
    call: Any = _echo,
) -> tuple[list[float], float | None]:
    async with _http_session(url, token) as session:
        return await _timed_calls(session, count, cpu_pid=cpu_pid, pause=pause, call=call)


async def _interleaved(
    direct_url: str, gateway_url: str, token: str, count: int, pause: float, call: Any = _echo
) -> tuple[list[float], list[float]]:
    """Direct and gateway calls taken in turns (the order swapped every other pair), `pause`
    before each: both see the same machine. Separate blocks of 1,000 calls each are minutes
    apart, and on this shared 2-core machine the CPU a call costs moved by half between blocks
    of the same code (docs/BENCHMARKS.md)."""
    async with _http_session(direct_url) as direct, _http_session(gateway_url, token) as gateway:
        for _ in range(20):
            await direct.call_tool(*call("warm"))
            await gateway.call_tool(*call("warm"))
        samples: dict[str, list[float]] = {"direct": [], "gateway": []}
        for index in range(count):
            order = [("direct", direct), ("gateway", gateway)]
            for name, session in order if index % 2 == 0 else order[::-1]:
                await asyncio.sleep(pause)
                started = time.perf_counter()
                await session.call_tool(*call(index))
                samples[name].append((time.perf_counter() - started) * 1000)
        return samples["direct"], samples["gateway"]


async def _stop_latency(base_url: str, token: str, reviewer_token: str, count: int) -> list[float]:
    from gateway.models import McpSession

    samples = []
    for _ in range(count):
        async with _http_session(f"{base_url}/mcp/everything/", token) as session:
            call = asyncio.create_task(
                session.call_tool("trigger-long-running-operation", {"duration": 60, "steps": 60})
            )
            await asyncio.sleep(0.3)  # the permit is asked and the call is running upstream
            run_id = await asyncio.to_thread(
                lambda: McpSession.objects.order_by("-id").values_list("run_id", flat=True)[0]
            )
            async with httpx.AsyncClient(base_url=base_url) as http:
                started = time.perf_counter()
                answer = await http.post(
                    f"/api/v1/runs/{run_id}/cancel/",
                    json={"reason": "user_stop", "note": "bench"},
                    headers={"Authorization": f"Bearer {reviewer_token}"},
                )
                result = await call
                samples.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 202 or not result.is_error:
                raise RuntimeError(f"the stop did not reach the call: {answer.text}")
    return samples


@contextlib.contextmanager
def _a_rule_on_the_team(team_id: int) -> Iterator[None]:
    """An approval rule for a tool nobody calls: the team then has a rule, so the gateway
    forwards nothing before its permit."""
    from runs.actors import Actor
    from runs.services import approval_rule_create, approval_rule_delete

    actor = Actor.system("bench")
    rule = approval_rule_create(
        team_id=team_id, actor=actor, name="bench: never matches", tool_glob="never-called-*"
    )
    try:
        yield
    finally:
        approval_rule_delete(rule_id=rule.pk, actor=actor)


def _py_spy(pid: int) -> subprocess.Popen[bytes] | None:
    """With BENCH_MCP_PYSPY=<file>, py-spy samples daphne's threads (CPU only) over the timed
    gateway calls and writes collapsed stacks there (`pip install py-spy` into .venv)."""
    out = os.environ.get("BENCH_MCP_PYSPY")
    if not out:
        return None
    spy = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/py-spy"),
            "record",
            "-p",
            str(pid),
            "-f",
            "raw",
            "-o",
            out,
            "-r",
            "500",
            "--threads",
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached before the first timed call
    return spy


def run(stack: Any) -> list[Row]:
    from gateway.models import McpUpstream
    from gateway.services import upstream_create
    from runs.actors import Actor
    from runs.models import Team

    if not EVERYTHING.exists():
        raise RuntimeError(f"{EVERYTHING} is missing: run `make mcp-servers`")
    count = stack.n(1000, 100)
    if not McpUpstream.objects.filter(team_id=stack.team_id, name="everything").exists():
        upstream_create(
            team=Team.objects.get(pk=stack.team_id),
            name="everything",
            transport="stdio",
            command=NODE,
            args=[str(EVERYTHING), "stdio"],
            actor=Actor.system("bench"),
        )
    port = free_port()
    node = subprocess.Popen(
        [NODE, str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port(port, timeout=30, process=node)
        direct_stdio = asyncio.run(_direct_stdio(count))
        direct_http, node_cpu = asyncio.run(
            _over_http(f"http://127.0.0.1:{port}/mcp", count, cpu_pid=node.pid)
        )
        load = os.getloadavg()[0]
        spy = _py_spy(stack.daphne.pid)
        gateway, daphne_cpu = asyncio.run(
            _over_http(
                f"{stack.base_url}/mcp/everything/",
                count,
                stack.agent_token,
                cpu_pid=stack.daphne.pid,
            )
        )
        if spy is not None:
            spy.send_signal(2)  # py-spy writes its profile on SIGINT
            spy.wait(timeout=60)
        paced_direct, _ = asyncio.run(
            _over_http(f"http://127.0.0.1:{port}/mcp", count, pause=PAUSE_SECONDS)
        )
        paced, _ = asyncio.run(
            _over_http(
                f"{stack.base_url}/mcp/everything/",
                count,
                stack.agent_token,
                pause=PAUSE_SECONDS,
            )
        )
        turns_direct, turns_gateway = asyncio.run(
            _interleaved(
                f"http://127.0.0.1:{port}/mcp",
                f"{stack.base_url}/mcp/everything/",
                stack.agent_token,
                count,
                PAUSE_SECONDS,
            )
        )
        slow_direct, slow_gateway = asyncio.run(
            _interleaved(
                f"http://127.0.0.1:{port}/mcp",
                f"{stack.base_url}/mcp/everything/",
                stack.agent_token,
                stack.n(300, 50),
                PAUSE_SECONDS,
                call=_slow_read,
            )
        )
        with _a_rule_on_the_team(stack.team_id):
            serial, _ = asyncio.run(
                _over_http(f"{stack.base_url}/mcp/everything/", count, stack.agent_token)
            )
            slow_serial, _ = asyncio.run(
                _over_http(
                    f"{stack.base_url}/mcp/everything/",
                    stack.n(300, 50),
                    stack.agent_token,
                    pause=PAUSE_SECONDS,
                    call=_slow_read,
                )
            )
        stops = asyncio.run(
            _stop_latency(stack.base_url, stack.agent_token, stack.reviewer_token, stack.n(20, 5))
        )
    finally:
        node.terminate()
        node.wait(10)
    p50 = _p50(gateway)
    over_http = p50 - _p50(direct_http)
    over_stdio = p50 - _p50(direct_stdio)
    over_paced = _p50(paced) - _p50(paced_direct)
    over_serial = _p50(serial) - _p50(direct_http)
    over_turns = _p50(turns_gateway) - _p50(turns_direct)
    over_slow = _p50(slow_gateway) - _p50(slow_direct)
    over_slow_serial = _p50(slow_serial) - _p50(slow_direct)
    section = "mcp gateway"
    note = (
        f"added p50: {over_http:.2f} ms over direct HTTP, {over_stdio:.2f} ms over direct stdio; "
        f"load {load:.1f}"
    )
    return [
        latency_row(section, "echo, direct (SDK client, stdio)", direct_stdio),
        latency_row(section, "echo, direct (SDK client, streamable HTTP)", direct_http),
        latency_row(section, "echo through the gateway (permit + result)", gateway, note=note),
        Row(
            section,
            "added per tools/call (p50, vs direct HTTP)",
            {"p50": round(over_http, 2)},
            "ms",
            "p50 ≤ 2 ms",
            over_http,
            over_http <= 2.0,
        ),
        latency_row(
            section, f"echo, direct HTTP, {PAUSE_SECONDS * 1000:g} ms between calls", paced_direct
        ),
        latency_row(
            section,
            f"echo through the gateway, {PAUSE_SECONDS * 1000:g} ms between calls",
            paced,
            note=f"added p50: {over_paced:.2f} ms over direct HTTP with the same pause",
        ),
        latency_row(
            section,
            f"echo, direct HTTP, in turns with the gateway, {PAUSE_SECONDS * 1000:g} ms before each",
            turns_direct,
        ),
        latency_row(
            section,
            f"echo through the gateway, in turns with direct, {PAUSE_SECONDS * 1000:g} ms before each",
            turns_gateway,
            note=f"added p50: {over_turns:.2f} ms over the direct calls taken in turns",
        ),
        Row(
            section,
            "added per tools/call (p50, in turns with direct HTTP, paced)",
            {"p50": round(over_turns, 2)},
            "ms",
            "p50 ≤ 2 ms",
            over_turns,
            over_turns <= 2.0,
        ),
        latency_row(
            section,
            "echo through the gateway, a team with an approval rule (permit, then the call)",
            serial,
            note=f"added p50: {over_serial:.2f} ms over direct HTTP (what a write pays)",
        ),
        latency_row(section, "a 20 ms read, direct HTTP, in turns with the gateway", slow_direct),
        latency_row(
            section,
            "a 20 ms read through the gateway, in turns with direct (beside its permit)",
            slow_gateway,
            note=f"added p50: {over_slow:.2f} ms over the direct calls taken in turns",
        ),
        latency_row(
            section,
            "a 20 ms read through the gateway, a team with an approval rule (permit first)",
            slow_serial,
            note=f"added p50: {over_slow_serial:.2f} ms over the direct calls above",
        ),
        latency_row(section, "stop → the pending call answers", stops),
        Row(
            section,
            "CPU per tools/call: daphne, through the gateway",
            {"value": round(daphne_cpu or 0.0, 2)},
            "ms",
            note="daphne's own user + system time over the timed calls, divided by their count "
            "(its stdio upstream is another process)",
        ),
        Row(
            section,
            "CPU per tools/call: server-everything, direct HTTP",
            {"value": round(node_cpu or 0.0, 2)},
            "ms",
        ),
    ]


if __name__ == "__main__":
    import sys

    os.execv(
        sys.executable,
        [sys.executable, str(ROOT / "bench/run_all.py"), "--only", "mcp", *sys.argv[1:]],
    )
