"""`safestop_agent` against a live server over real HTTP and websockets.

The worker side is the real package (client, lease, push listener, heartbeat, tool calls,
process runner); the server side is daphne serving the whole application on the test database.
"""

from __future__ import annotations

import os
import statistics
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from runs.models import (
    ExecutionRecord,
    ExecutionState,
    RejectedWrite,
    Run,
    RunStatus,
    SideEffectState,
    StopRequest,
)
from safestop_agent import AgentRun, Cancelled, run_process
from tests.support.stack import (
    WorkerThread,
    alive,
    leased,
    planned,
    read_pids,
    wait_status,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _stamp_when_cancelled(run: AgentRun) -> tuple[threading.Event, list[float]]:
    """Wake the moment the run's token is set and note the time (perf_counter)."""
    done, at = threading.Event(), []

    def watch() -> None:
        if run.token.wait(10):
            at.append(time.perf_counter())
            done.set()

    threading.Thread(target=watch, daemon=True).start()
    return done, at


def test_stop_reaches_a_connected_worker_by_push(stack):
    """The heartbeat is 20 s apart here, so only the push can deliver the stop this fast."""
    client, reviewer = stack.agent(), stack.reviewer()
    delays, server_side = [], []
    for attempt in range(5):
        run_id = client.create_run(f"Push {attempt}", "e2e-bot")["id"]
        with client.lease(run_id, f"worker-{attempt}", ttl_seconds=60) as run:
            assert run._listener is not None and run._listener.connected.wait(10)
            time.sleep(0.05)  # the server has joined the socket to the run's group
            received, at = _stamp_when_cancelled(run)
            sent = time.perf_counter()
            reviewer.cancel(run_id, "user_stop", note="push latency")
            assert received.wait(5), "the stop never reached the worker"
            delays.append(at[0] - sent)
            assert (run.token.reason, run.token.stop_epoch, run.token.requested_by) == (
                "user_stop",
                2,
                "reviewer-bot",
            )
        stop = StopRequest.objects.get(run_id=run_id)
        assert stop.signal_delivered_at is not None and stop.acknowledged_at is not None
        server_side.append((stop.signal_delivered_at - stop.requested_at).total_seconds())
        wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    print(
        f"\nstop → worker by push: median {statistics.median(delays) * 1000:.1f} ms, "
        f"max {max(delays) * 1000:.1f} ms over {len(delays)} stops (the cancel POST included); "
        f"stop recorded → frame sent: median {statistics.median(server_side) * 1000:.1f} ms"
    )
    assert max(delays) < 1.0


def test_permit_refused_after_a_stop_raises_cancelled_and_the_tool_never_runs(stack):
    """No push and a slow heartbeat: the worker has not heard of the stop; the permit says no."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Deploy", "e2e-bot", steps=planned(("deploy", "tool_write")))["id"]
    ran: list[str] = []
    with client.lease(run_id, "worker-deaf", ttl_seconds=60, push=False) as run:
        reviewer.cancel(run_id, "user_stop", note="not today")
        assert not run.token.cancelled
        with pytest.raises(Cancelled) as cancelled:
            with run.tool_call(
                "deploy", {"version": "2.0"}, side_effect="write", tool_call_id="call_deploy"
            ):
                ran.append("deploy")
        assert cancelled.value.reason == "stale_epoch" and cancelled.value.stop_epoch == 2
        assert run.token.cancelled
    assert ran == []
    assert not ExecutionRecord.objects.filter(run_id=run_id).exists()
    assert (
        RejectedWrite.objects.filter(run_id=run_id, kind="permit", code="stale_epoch").count() == 1
    )
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)  # the worker drained on its way out


def test_crash_inside_tool_call_leaves_unknown_on_the_server(stack):
    client = stack.agent()
    run_id = client.create_run("Transfer", "e2e-bot", steps=planned(("transfer", "tool_write")))[
        "id"
    ]
    runs: list[AgentRun] = []

    def work() -> None:
        with leased(client, run_id, into=runs) as run:
            with run.step("transfer", "Transfer funds", kind="tool_write"):
                with run.tool_call(
                    "read_balance", {"account": "A"}, tool_call_id="call_read"
                ) as call:
                    call.result = 1200
                with run.tool_call(
                    "transfer",
                    {"amount": 300},
                    side_effect="write",
                    tool_call_id="call_write",
                    operation_id="tr_300",
                    recovery_policy="query_original",
                ):
                    raise ConnectionResetError("bank connection reset mid-request")

    worker = WorkerThread(work)
    worker.start()
    with pytest.raises(ConnectionResetError):
        worker.outcome()

    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_write")
    assert (record.execution_state, record.side_effect_state) == (
        ExecutionState.UNKNOWN,
        SideEffectState.PENDING_VERIFICATION,
    )
    assert "ConnectionResetError: bank connection reset mid-request" in record.last_observation
    assert record.operation_id == "tr_300"
    assert (
        ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_read").execution_state
        == ExecutionState.SUCCEEDED
    )
    # the worker gave its lease back without finishing: interrupted, never "failed" or "completed"
    run = wait_status(run_id, RunStatus.INTERRUPTED)
    assert run.interruption["reason"] == "worker_released"


def test_process_runner_kills_child_setsid_grandchild_and_term_ignoring_child_on_stop(
    stack, tmp_path
):
    client = stack.agent()
    run_id = client.create_run("Build and test", "e2e-bot", steps=planned(("ci", "tool_read")))[
        "id"
    ]
    pids = {name: tmp_path / name for name in ("shell", "child", "escaped", "stubborn")}
    escape = tmp_path / "escape.py"
    escape.write_text(
        textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            open({str(pids["escaped"])!r}, "w").write(str(os.getpid()))
            time.sleep(600)
        os._exit(0)
    """)
    )
    command = "\n".join(
        [
            f"echo $$ > {pids['shell']}",
            f"sleep 600 & echo $! > {pids['child']}",
            f"{sys.executable} {escape}",
            f"sh -c 'trap \"\" TERM; echo $$ > {pids['stubborn']}; sleep 600' &",
            "wait",
        ]
    )
    results = []

    def work() -> None:
        with leased(client, run_id) as run:
            with run.step("ci", "Run the test suite", kind="tool_read"):
                with run.tool_call(
                    "shell", {"cmd": "make test"}, tool_call_id="call_shell"
                ) as call:
                    result = run_process(
                        command, shell=True, token=run.token, grace_seconds=1.0, timeout=60
                    )
                    results.append(result)
                    call.observe_process(result)
                run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    tree = {name: read_pids(str(path), 1)[0] for name, path in pids.items()}
    assert all(alive(pid) for pid in tree.values())
    stop_sent = time.monotonic()
    stack.reviewer().cancel(run_id, "user_stop", note="cancel the build")
    worker.outcome(20)
    took = time.monotonic() - stop_sent

    result = results[0]
    dead = wait_until(
        lambda: not any(alive(pid) for pid in tree.values()) or None,
        timeout=5,
        what="the whole tree to be gone",
    )
    assert dead is True
    assert (
        result.cancelled and result.killed and result.escalated_to_kill
    )  # the stubborn child forced SIGKILL
    assert set(result.reaped_descendants) >= {tree["child"], tree["escaped"], tree["stubborn"]}
    assert result.leftover_pids == () and result.boundary_note is None
    assert took < 6
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_shell")
    assert (
        record.execution_state == ExecutionState.FAILED
        and "SIGKILL after grace" in record.last_observation
    )


def test_process_runner_returns_while_a_descendant_holds_stdout_and_reports_truncation(
    stack, tmp_path
):
    client = stack.agent()
    run_id = client.create_run("Tail logs", "e2e-bot")["id"]
    holder_file = tmp_path / "holder"
    command = (
        f"echo first lines; (echo $$ > /dev/null; sleep 600) & echo $! > {holder_file}; exit 0"
    )
    with leased(client, run_id) as run:
        with run.tool_call("shell", {"cmd": "tail"}, tool_call_id="call_tail") as call:
            started = time.monotonic()
            result = run_process(
                command, shell=True, token=run.token, drain_timeout=0.3, kill_descendants=False
            )
            call.observe_process(result)
        holder = int(Path(holder_file).read_text())
        try:
            assert time.monotonic() - started < 3
            assert (
                result.output_truncated
                and result.output_abandoned
                and holder in result.leftover_pids
            )
        finally:
            os.kill(holder, 9)
        run.complete({"tail": "done"})
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_tail")
    assert record.output_truncated and "first lines" in record.last_observation
    assert Run.objects.get(pk=run_id).status == RunStatus.COMPLETED
