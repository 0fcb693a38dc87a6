"""server-everything in its streamable-HTTP mode as an upstream: headers sent, URL allow-listed."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess

import pytest

from gateway.services import upstream_create
from runs.actors import Actor
from runs.models import ExecutionRecord
from tests.mcp.conftest import EVERYTHING, NODE, mcp_session
from tests.mcp.scenarios import INITIALIZE
from tests.support.livestack import start_live_stack
from tests.support.stack import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def everything_http():
    if not EVERYTHING.exists():
        pytest.fail("run `make mcp-servers`")
    port = free_port()
    process = subprocess.Popen(
        [NODE, str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: listening(port), 20, what="server-everything to listen")
        yield port
    finally:
        process.terminate()
        process.wait(10)


def test_http_upstream_through_the_gateway(
    transactional_db, django_db_blocker, everything_http, team, agent_token, settings
) -> None:
    allowed = [f"127.0.0.1:{everything_http}"]
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = allowed
    upstream_create(
        team=team,
        name="everything-http",
        transport="http",
        url=f"http://127.0.0.1:{everything_http}/mcp",
        headers={"X-Upstream-Key": "k-123"},
        actor=Actor.system("test"),
    )
    with start_live_stack(
        django_db_blocker, settings_overrides={"SAFESTOP_WEBHOOK_ALLOWED_HOSTS": allowed}
    ) as stack:

        async def scenario() -> str:
            async with mcp_session(f"{stack.url}/mcp/everything-http/", agent_token.raw) as session:
                await session.initialize()
                tools = await session.list_tools()
                assert "echo" in [tool.name for tool in tools.tools]
                result = await session.call_tool("echo", {"message": "over http"})
                return result.content[0].text

        assert asyncio.run(scenario()) == "Echo: over http"
    record = ExecutionRecord.objects.get(tool="echo")
    assert record.execution_state == "succeeded"


def test_http_upstream_off_the_allow_list_is_refused_at_connect(
    transactional_db, django_db_blocker, everything_http, team, agent_token, settings
) -> None:
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [f"127.0.0.1:{everything_http}"]
    upstream_create(
        team=team,
        name="everything-http",
        transport="http",
        url=f"http://127.0.0.1:{everything_http}/mcp",
        actor=Actor.system("test"),
    )
    # The operator narrowed the allow-list since: the gateway never contacts the host.
    with start_live_stack(
        django_db_blocker, settings_overrides={"SAFESTOP_WEBHOOK_ALLOWED_HOSTS": []}
    ) as stack:
        import httpx

        answer = httpx.post(
            f"{stack.url}/mcp/everything-http/",
            json=INITIALIZE,
            headers={"Authorization": f"Bearer {agent_token.raw}"},
            timeout=30,
        )
    assert answer.status_code == 403
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in answer.json()["error"]["message"]
