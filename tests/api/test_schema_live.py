"""The schema tells the truth (clients are generated from it): schemathesis, with every check it has, in
positive and negative modes, against a live server (daphne, over HTTP), once with an agent
token and once with a reviewer token, finds no 5xx and no answer the schema does not describe —
no rejected schema-valid request, no accepted schema-violating one.

It runs the `schemathesis` CLI as a user would (`--checks all --mode all`), so the examples,
coverage and fuzzing phases and their checks are the library's own, not a subset picked here.
Path parameters are pointed at seeded runs, tool calls and an approval most of the time
(tests/api/schemathesis_hooks.py), so the calls get past the 404. Reproducible: the generation
is deterministic (`--generation-deterministic`, which also keeps no example database).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runs import services
from runs.actors import Actor
from runs.models import Team
from tests.support.api import stop
from tests.support.livestack import LiveStack, start_live_stack
from tests.support.scenarios import make_run, make_running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
MAX_EXAMPLES = 8
# No check of `--checks all` is excluded: the stateful ones (use_after_free,
# ensure_resource_availability) and ignored_auth run too, and pass.
FUZZ_SETTINGS = {
    # fuzzing is not abuse: thousands of calls a minute from one token and one address
    "SAFESTOP_RATE_LIMIT_PER_MINUTE": 0,
    # ignored_auth sends wrong tokens on purpose; throttling the address would turn every
    # later answer into a 429 and hide what the fuzz is looking for
    "SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE": 0,
    "SAFESTOP_WEBHOOK_ALLOWED_HOSTS": ["hooks.example"],
}


@pytest.fixture
def fuzz_server(transactional_db: None, django_db_blocker: Any) -> Iterator[LiveStack]:
    with start_live_stack(django_db_blocker, settings_overrides=FUZZ_SETTINGS) as stack:
        yield stack


def seed(team: Team) -> dict[str, list[Any]]:
    """Runs in the states the operations act on (running, stopped, pending, interrupted), a
    permitted tool call and a waiting approval: the ids the hook points path parameters at."""
    agent = Actor.system("fuzz-seed")
    running, lease = make_running(team, ttl=3600)
    permitted, _ = services.permit_request(
        run_id=running.pk, epoch=lease.epoch, tool_call_id="tc-search", tool="search", actor=agent
    )
    held, _ = services.permit_request(
        run_id=running.pk,
        epoch=lease.epoch,
        tool_call_id="tc-refund",
        tool="payments.refund",
        side_effect="write",
        needs_approval=True,
        actor=agent,
    )
    stopped = make_run(team)
    stop(stopped)
    pending = make_run(team)
    interrupted, left = make_running(team, ttl=3600)
    services.lease_release(
        run_id=interrupted.pk, lease_token=left.token, epoch=left.epoch, actor=agent
    )
    return {
        "run_id": [running.pk, stopped.pk, pending.pk, interrupted.pk],
        "tool_call_id": [permitted.tool_call_id, held.tool_call_id],
        "approval_id": [held.approval.public_id],
        "epoch": [1, 2],
    }


def schemathesis_run(
    url: str, raw_token: str, team_slug: str, ids: dict[str, list[Any]], report: Path
) -> str:
    """Run the CLI against `url`; return its output. Raises with the output if it failed."""
    command = [
        str(SCHEMATHESIS),
        "run",
        f"{url}/api/schema/?format=json",
        "--checks",
        "all",
        "--mode",
        "all",
        "--header",
        f"Authorization: Bearer {raw_token}",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers",
        "1",
        "--no-color",
        "--output-sanitize",
        "false",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    environment = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
        "SAFESTOP_FUZZ_IDS": json.dumps(ids),
        "SAFESTOP_FUZZ_TEAM": team_slug,
        "PYTHONPATH": str(ROOT),
    }
    finished = subprocess.run(
        command, cwd=report.parent, env=environment, capture_output=True, text=True, timeout=600
    )
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-30_000:]
    return output


@pytest.mark.parametrize("role", ["agent", "reviewer"])
def test_schemathesis_all_checks_against_a_live_server(
    role: str, fuzz_server: LiveStack, team: Team, agent_token: Any, reviewer_token: Any, tmp_path
):
    token = agent_token if role == "agent" else reviewer_token
    output = schemathesis_run(
        fuzz_server.url, token.raw, team.slug, seed(team), tmp_path / "junit.xml"
    )
    # It did test: every operation of the schema, none left out for want of a server.
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert selected and tested, output[-5000:]
    assert int(selected[1]) == int(selected[2]) == int(tested[1]) >= 27, output[-5000:]
