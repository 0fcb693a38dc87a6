"""The package names its version on every request, and a `426 client_too_old` is `ClientTooOld`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import httpx
import pytest

import safestop_agent
from safestop_agent import ApiError, ClientTooOld, SafestopClient
from safestop_agent._version import VERSION_HEADER
from safestop_agent.signals import PushListener

AGENT_PYPROJECT = Path(__file__).resolve().parents[2] / "agent" / "pyproject.toml"


def test_every_request_names_the_client_version() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "run_1"})

    with SafestopClient("http://x", "t", transport=httpx.MockTransport(handle)) as client:
        client.get_run("run_1")
    assert seen[0].headers[VERSION_HEADER] == safestop_agent.__version__
    assert seen[0].headers["User-Agent"].startswith(f"safestop-agent/{safestop_agent.__version__}")


def test_the_push_socket_names_it_too() -> None:
    listener = PushListener(url="ws://x", bearer_token="t", on_signal=lambda signal: None)
    assert listener._headers[VERSION_HEADER] == safestop_agent.__version__


def test_client_too_old_carries_the_minimum() -> None:
    body = {
        "error": "client_too_old",
        "detail": "safestop-agent 0.2.0 is too old for this server, which needs 0.3.0 or newer",
        "client_version": "0.2.0",
        "minimum_version": "0.3.0",
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(426, json=body))
    with SafestopClient("http://x", "t", transport=transport) as client:
        with pytest.raises(ClientTooOld) as raised:
            client.create_run("t", "a")
    error = raised.value
    assert isinstance(error, ApiError) and error.status_code == 426
    assert (error.minimum_version, error.client_version) == ("0.3.0", "0.2.0")
    assert "needs 0.3.0 or newer" in str(error)


def test_the_distribution_takes_its_version_from_the_package_and_needs_no_server() -> None:
    project = tomllib.loads(AGENT_PYPROJECT.read_text())
    assert project["project"]["name"] == "safestop-agent"
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "safestop_agent._version.__version__"
    }
    needs = {dep.split(">")[0].split("[")[0] for dep in project["project"]["dependencies"]}
    assert needs == {"httpx", "websockets"}
    assert set(project["project"]["optional-dependencies"]) == {"langgraph", "openai-agents"}
