"""A small agent that a reviewer can stop or take over from the safestop console.

    SAFESTOP_URL=http://127.0.0.1:8000 SAFESTOP_TOKEN=<agent token> python examples/agent_example.py

Make a token with `python manage.py create_api_token --team acme --name example-agent
--role agent`. The run appears in the console; press Stop while it is working
and watch it drain: the shell tool's whole process tree is killed, the deploy
call is reported `unknown` if it was in flight, and no later step starts.
Pass a run id as the first argument to lease an existing run instead of creating one.
Set SAFESTOP_EXAMPLE_WEBHOOK to a URL on the server's SAFESTOP_WEBHOOK_ALLOWED_HOSTS to have
the server post "deployed" there at the end (docs/agents.md, "A first agent").
"""

from __future__ import annotations

import os
import socket
import sys

from safestop_agent import AgentRun, ApiError, SafestopClient, run_process

PLANNED_STEPS = [
    {"key": "inspect", "name": "Inspect the service", "kind": "tool_read"},
    {"key": "build", "name": "Build the release", "kind": "tool_read"},
    {"key": "deploy", "name": "Deploy to staging", "kind": "tool_write"},
    {"key": "notify", "name": "Tell the team", "kind": "external_action"},
]


def inspect_service(run: AgentRun) -> dict[str, str]:
    with run.step("inspect", "Inspect the service", kind="tool_read"):
        with run.tool_call("read_config", {"service": "billing"}) as call:
            call.result = {"service": "billing", "version": "1.4.2"}
    return call.result


def build_release(run: AgentRun) -> None:
    with run.step("build", "Build the release", kind="tool_read"):
        # A shell tool: a stop kills the shell *and* everything it started.
        with run.tool_call("shell", {"cmd": "build"}) as call:
            result = run_process(
                "echo building; sleep 8 & wait; echo built",
                shell=True,
                token=run.token,
                timeout=60,
                grace_seconds=2.0,
            )
            call.observe_process(result)
        run.token.raise_if_cancelled()
        run.checkpoint("checkpoint_02", {"built": True}, step_seq=2)


def deploy(run: AgentRun, version: str) -> None:
    with run.step("deploy", "Deploy to staging", kind="tool_write"):
        with run.tool_call(
            "deploy",
            {"service": "billing", "version": version},
            side_effect="write",
            idempotency_key=f"deploy-billing-{version}",
            recovery_policy="query_original",
        ) as call:
            call.set_operation_id(f"deploy-{version}")
            call.observe("deploy request submitted")
            run.token.wait(3)  # stands in for polling the deploy system
            run.token.raise_if_cancelled()  # stopped mid-deploy: reported `unknown`, not `failed`
            call.result = "deployed"


def notify(run: AgentRun) -> None:
    webhook = os.environ.get("SAFESTOP_EXAMPLE_WEBHOOK")
    if not webhook:
        # The server contacts only hosts on its SAFESTOP_WEBHOOK_ALLOWED_HOSTS: start it with
        # one allowed and name it here (docs/agents.md, "A first agent").
        print("no SAFESTOP_EXAMPLE_WEBHOOK: the team is not told (the outbox step is skipped)")
        return
    with run.step("notify", "Tell the team", kind="external_action"):
        # The server dispatches it; a stop freezes it if it was not sent yet.
        run.enqueue_outbox("webhook", webhook, {"text": "billing deployed to staging"})


def main() -> int:
    client = SafestopClient(os.environ["SAFESTOP_URL"], os.environ["SAFESTOP_TOKEN"])
    run_id = (
        sys.argv[1]
        if len(sys.argv) > 1
        else client.create_run("Deploy billing to staging", "example-agent", steps=PLANNED_STEPS)[
            "id"
        ]
    )
    print(f"run {run_id}: open it in the console and press Stop to try it")
    with client.lease(run_id, f"{socket.gethostname()}-{os.getpid()}", ttl_seconds=15) as run:
        config = inspect_service(run)
        build_release(run)
        deploy(run, config["version"])
        notify(run)
        run.complete({"deployed": config["version"]})
    if run.token.cancelled:
        print(f"stopped ({run.token.reason} by {run.token.requested_by}); drained and handed back")
        try:
            packet = client.stop_packet(run_id)
            print("stop packet:", packet.get("state"), packet.get("unconfirmed_side_effects"))
        except ApiError as error:  # the packet is built once the stop settles
            print("no stop packet yet:", error.code)
    else:
        print("completed")
    client.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
