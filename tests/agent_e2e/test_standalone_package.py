"""`safestop-agent` as its own distribution (agent/pyproject.toml), and the version check.

The package tests are the ones an agent developer lives: `python -m build agent` makes the
sdist and the wheel; each is installed into a fresh virtualenv that has no Django (only the
package and its two dependencies, from the index), and runs `examples/agent_example.py` with
that interpreter against a live server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

import safestop_agent
from runs.models import OutboxItem, Run, RunStatus
from safestop_agent import ClientTooOld, SafestopClient
from tests.support.livestack import start_live_stack

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent_example.py"


def _post_runs(client: Any, token: Any, **headers: str) -> Any:
    return client.post(
        "/api/v1/runs/",
        data=json.dumps({"title": "t", "agent": "a"}),
        content_type="application/json",
        **token.header,
        **headers,
    )


def test_the_server_answers_426_to_an_agent_older_than_its_minimum(client, agent_token, settings):
    settings.SAFESTOP_MIN_AGENT_VERSION = "0.3.0"
    too_old = _post_runs(client, agent_token, HTTP_SAFESTOP_AGENT_VERSION="0.2.9")
    assert too_old.status_code == 426
    body = too_old.json()
    assert (body["error"], body["minimum_version"], body["client_version"]) == (
        "client_too_old",
        "0.3.0",
        "0.2.9",
    )
    assert "needs 0.3.0 or newer" in body["detail"]
    by_user_agent = _post_runs(client, agent_token, HTTP_USER_AGENT="safestop-agent/0.1.4 httpx/0")
    assert by_user_agent.status_code == 426
    assert _post_runs(client, agent_token, HTTP_SAFESTOP_AGENT_VERSION="0.3.0").status_code == 201
    assert (
        _post_runs(client, agent_token, HTTP_SAFESTOP_AGENT_VERSION="1.0.0rc1").status_code == 201
    )
    # A request that names no agent version (curl, another client) is not checked.
    assert _post_runs(client, agent_token).status_code == 201
    assert Run.objects.count() == 3


def test_this_client_meets_the_default_minimum(client, agent_token):
    created = _post_runs(
        client, agent_token, HTTP_SAFESTOP_AGENT_VERSION=safestop_agent.__version__
    )
    assert created.status_code == 201


def test_the_real_client_is_told_it_is_too_old(agent_token, django_db_blocker):
    with start_live_stack(
        django_db_blocker, settings_overrides={"SAFESTOP_MIN_AGENT_VERSION": "99.0"}
    ) as live:
        with SafestopClient(live.url, agent_token.raw) as agent:
            with pytest.raises(ClientTooOld) as raised:
                agent.create_run("Too old", "old-bot")
    assert raised.value.minimum_version == "99.0"
    assert raised.value.client_version == safestop_agent.__version__
    assert not Run.objects.exists()


def _run(argv: list[str | Path], **options: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(arg) for arg in argv], capture_output=True, text=True, timeout=300, **options
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _build_both(tmp_path_factory.mktemp("package"))


def _build_both(tmp_path: Path) -> tuple[Path, Path]:
    """`python -m build agent` — the sdist, then the wheel built from that sdist — in a copy of
    the repository's two folders as a fresh clone has them (`agent/safestop_agent` is a link),
    so no build/ or egg-info is left in the repository."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    shutil.copytree(REPO / "agent", source / "agent", ignore=ignore, symlinks=True)
    shutil.copytree(REPO / "safestop_agent", source / "safestop_agent", ignore=ignore)
    assert (source / "agent" / "safestop_agent").is_symlink()
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, "agent"], cwd=source)
    (sdist,) = dist.glob("safestop_agent-*.tar.gz")
    (wheel,) = dist.glob("safestop_agent-*.whl")
    # No stray copy of the code in agent/: the only way to it there is still the link.
    stray = [
        path
        for path in (source / "agent").rglob("*.py")
        if not path.is_relative_to(source / "agent" / "safestop_agent")
    ]
    assert not stray, stray
    assert (source / "agent" / "safestop_agent").is_symlink()
    return sdist, wheel


def test_the_sdist_and_the_wheel_carry_the_whole_package(built):
    sdist, wheel = built
    assert sdist.name == f"safestop_agent-{safestop_agent.__version__}.tar.gz"
    assert wheel.name == f"safestop_agent-{safestop_agent.__version__}-py3-none-any.whl"
    modules = sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "safestop_agent").rglob("*.py")
        if "__pycache__" not in path.parts
    )
    with tarfile.open(sdist) as archive:
        members = {member.name: member for member in archive.getmembers()}
    root = sdist.name.removesuffix(".tar.gz")
    for module in [*modules, "safestop_agent/py.typed"]:
        member = members.get(f"{root}/{module}")
        assert member is not None and member.isfile(), f"{module} missing from the sdist"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {*modules, "safestop_agent/py.typed"} <= names


@pytest.mark.parametrize("kind", ["sdist", "wheel"])
def test_the_package_runs_the_example_in_a_venv_without_django(kind, built, stack, tmp_path):
    sdist, wheel = built
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    package = sdist if kind == "sdist" else wheel
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", package])

    installed = _run([python, "-m", "pip", "list", "--format=json"], cwd=tmp_path)
    names = {entry["name"].lower() for entry in json.loads(installed.stdout)}
    assert {"safestop-agent", "httpx", "websockets"} <= names
    assert not names & {"django", "celery", "psycopg", "channels", "djangorestframework"}
    where = _run(
        [python, "-c", "import safestop_agent; print(safestop_agent.__file__)"], cwd=tmp_path
    )
    assert where.stdout.strip().startswith(str(venv))  # the wheel's copy, not the repository's

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SAFESTOP_URL": stack.url,
        "SAFESTOP_TOKEN": stack.agent_raw,
        "SAFESTOP_EXAMPLE_WEBHOOK": stack.receiver.url("/hooks/example"),
    }
    done = _run([python, EXAMPLE], cwd=tmp_path, env=env)
    assert "completed" in done.stdout.splitlines()[-1], done.stdout
    run_id = done.stdout.split()[1].rstrip(":")
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED
    assert OutboxItem.objects.filter(run=run).count() == 1
