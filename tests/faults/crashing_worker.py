"""A worker process that dies in the middle of a tool call (fault tests only).

    python -m tests.faults.crashing_worker URL TOKEN RUN_ID HOOK_URL IDEMPOTENCY_KEY

It leases the run, asks the permit for a write, performs the write against the receiver (the
remote applies it), prints "applied", and is SIGKILLed before it can report the result: the
seed's "Agent 在保存结果前崩溃". Only `safestop_agent` and httpx: no Django in this process.
"""

from __future__ import annotations

import os
import signal
import sys

import httpx

from safestop_agent import SafestopClient


def main(url: str, token: str, run_id: str, hook: str, key: str) -> None:
    client = SafestopClient(url, token)
    with client.lease(run_id, "worker-that-crashes", ttl_seconds=2) as run:
        with run.step("export", "Export the batch to finance", kind="tool_write"):
            with run.tool_call(
                "finance_export",
                {"batch": 7},
                side_effect="write",
                tool_call_id="call_export",
                idempotency_key=key,
                operation_id="export-7",
                recovery_policy="query_original",
            ):
                with httpx.Client(trust_env=False, timeout=5) as http:
                    http.post(
                        hook, json={"batch": 7}, headers={"Idempotency-Key": key}
                    ).raise_for_status()
                print("applied", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # dies before the result is saved


if __name__ == "__main__":
    main(*sys.argv[1:6])
