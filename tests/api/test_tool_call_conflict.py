"""A `tool_call_id` names one call (DESIGN §5): the same id with the same tool and arguments is a
retry (200, the same permit); with another tool or other arguments it is 409
`tool_call_conflict`, grants nothing, and names what the id was first asked for.

On PostgreSQL here (the API, an approval's edit, two threads racing two different asks for one
id); the same rules on SQLite, the embedded default, in a migrated SQLite file in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runs import services
from runs.actors import Actor
from runs.errors import ToolCallConflict
from runs.models import ExecutionRecord, LedgerEntry
from tests.support.api import url
from tests.support.scenarios import make_running
from tests.support.stack import racer

ROOT = Path(__file__).resolve().parents[2]
AGENT = Actor.system("agent")


def ask(tool_call_id: str, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "epoch": 1,
        "tool_call_id": tool_call_id,
        "tool": tool,
        "side_effect": "write",
        "arguments": arguments,
        **extra,
    }


@pytest.mark.django_db
def test_the_same_id_for_another_tool_is_409_and_names_the_first_call(api, team, agent_token):
    run, _ = make_running(team)
    first = api.post(url(run, "permits/"), ask("X1", "send_email", {"to": "a"}), agent_token)
    entries = LedgerEntry.objects.filter(run=run).count()
    other = api.post(url(run, "permits/"), ask("X1", "lookup", {"q": "x"}), agent_token)
    assert first.status_code == 201
    assert other.status_code == 409
    body = other.json()
    assert body["error"] == "tool_call_conflict"
    assert (body["tool_call_id"], body["first_tool"], body["first_arguments"]) == (
        "X1",
        "send_email",
        {"to": "a"},
    )
    assert (body["status"], body["stop_epoch"]) == ("running", 1)
    assert "permit_id" not in body
    assert "send_email" in body["detail"] and "lookup" in body["detail"]
    # Nothing granted, nothing written: the one record is still the first call's.
    record = ExecutionRecord.objects.get(run=run)
    assert (record.tool, record.arguments) == ("send_email", {"to": "a"})
    assert LedgerEntry.objects.filter(run=run).count() == entries


@pytest.mark.django_db
def test_the_same_id_and_tool_with_other_arguments_is_409(api, team, agent_token):
    run, _ = make_running(team)
    api.post(url(run, "permits/"), ask("X1", "send_email", {"to": "a"}), agent_token)
    other = api.post(url(run, "permits/"), ask("X1", "send_email", {"to": "b"}), agent_token)
    assert other.status_code == 409
    assert other.json()["error"] == "tool_call_conflict"
    assert other.json()["first_arguments"] == {"to": "a"}
    assert ExecutionRecord.objects.get(run=run).arguments == {"to": "a"}


@pytest.mark.django_db
def test_the_same_id_tool_and_arguments_is_a_retry_with_the_same_permit(api, team, agent_token):
    run, _ = make_running(team)
    arguments = {"to": "a", "cc": ["b", "c"], "n": 1}
    first = api.post(url(run, "permits/"), ask("X1", "send_email", arguments), agent_token)
    # The same JSON value with its keys in another order is the same arguments.
    again = api.post(
        url(run, "permits/"),
        ask("X1", "send_email", dict(reversed(list(arguments.items())))),
        agent_token,
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["permit_id"] == first.json()["permit_id"]


@pytest.mark.django_db
def test_after_an_edited_approval_the_original_ask_is_a_retry_and_another_is_a_conflict(
    api, team, agent_token, reviewer_actor
):
    run, _ = make_running(team)
    held = api.post(
        url(run, "permits/"),
        ask("X1", "send_email", {"to": "a"}, needs_approval=True),
        agent_token,
    )
    assert held.status_code == 202
    approval_id = services.parse_approval_id(held.json()["approval"]["id"])
    services.approval_decide(
        approval_id=approval_id, decision="approve", actor=reviewer_actor, arguments={"to": "b"}
    )
    # The worker asks again with what it first asked: it gets the permit and the edit.
    again = api.post(
        url(run, "permits/"),
        ask("X1", "send_email", {"to": "a"}, needs_approval=True),
        agent_token,
    )
    assert again.status_code == 201
    assert again.json()["arguments"] == {"to": "b"}
    # Another tool under the approved id gets neither the permit nor the reviewer's edit.
    other = api.post(url(run, "permits/"), ask("X1", "lookup", {"q": "x"}), agent_token)
    assert other.status_code == 409
    body = other.json()
    assert (body["error"], body["first_tool"], body["first_arguments"]) == (
        "tool_call_conflict",
        "send_email",
        {"to": "a"},
    )
    assert "permit_id" not in body and "arguments" not in body


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(5))
def test_two_different_asks_racing_for_one_id_one_wins_the_other_conflicts(team, attempt):
    run, lease = make_running(team)
    asks = {"email": ("send_email", {"to": "a"}), "lookup": ("lookup", {"q": "x"})}
    barrier = threading.Barrier(len(asks))
    results: dict[str, Any] = {}
    threads = [
        racer(
            barrier,
            lambda tool=tool, arguments=arguments: services.permit_request(
                run_id=run.pk,
                epoch=lease.epoch,
                tool_call_id="X1",
                tool=tool,
                side_effect="write",
                arguments=arguments,
                actor=AGENT,
            ),
            results,
            name,
        )
        for name, (tool, arguments) in asks.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    granted = [name for name, result in results.items() if isinstance(result, tuple)]
    refused = [name for name, result in results.items() if isinstance(result, ToolCallConflict)]
    assert len(granted) == 1 and len(refused) == 1, results
    winner_tool, winner_arguments = asks[granted[0]]
    record = ExecutionRecord.objects.get(run=run)
    assert (record.tool, record.arguments) == (winner_tool, winner_arguments)
    conflict = results[refused[0]]
    assert (conflict.extra["first_tool"], conflict.extra["first_arguments"]) == (
        winner_tool,
        winner_arguments,
    )


SQLITE_SCRIPT = """
import json, threading
import django
django.setup()
from django.db import connection
from runs import services
from runs.actors import Actor
from runs.errors import ToolCallConflict
from runs.models import ExecutionRecord
from runs.tokens import team_ensure

agent = Actor.system("agent")
team = team_ensure(slug="lite")
out = {}


def ask(run, lease, tool, arguments, call_id="X1"):
    return services.permit_request(
        run_id=run.pk, epoch=lease.epoch, tool_call_id=call_id, tool=tool,
        side_effect="write", arguments=arguments, actor=agent,
    )


def outcome(fn):
    try:
        record, created = fn()
        return {"granted": record.tool, "created": created, "id": record.pk}
    except ToolCallConflict as error:
        return {"conflict": error.extra["first_tool"], "first": error.extra["first_arguments"]}


run = services.run_create(team=team, title="t", agent="a", actor=agent)
lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=60, actor=agent)
out["first"] = outcome(lambda: ask(run, lease, "send_email", {"to": "a"}))
out["retry"] = outcome(lambda: ask(run, lease, "send_email", {"to": "a"}))
out["other_tool"] = outcome(lambda: ask(run, lease, "lookup", {"q": "x"}))
out["other_arguments"] = outcome(lambda: ask(run, lease, "send_email", {"to": "b"}))

races = []
for attempt in range(5):
    run = services.run_create(team=team, title="t", agent="a", actor=agent)
    lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=60, actor=agent)
    barrier = threading.Barrier(2)
    answers = {}

    def racer(name, tool, arguments):
        try:
            barrier.wait(10)
            answers[name] = outcome(lambda: ask(run, lease, tool, arguments))
        finally:
            connection.close()

    threads = [
        threading.Thread(target=racer, args=("email", "send_email", {"to": "a"})),
        threading.Thread(target=racer, args=("lookup", "lookup", {"q": "x"})),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    answers["records"] = list(ExecutionRecord.objects.filter(run=run).values_list("tool", flat=True))
    races.append(answers)
out["races"] = races
print(json.dumps(out))
"""


@pytest.mark.slow  # a SQLite database migrated in a subprocess
def test_on_sqlite_a_reused_id_conflicts_and_a_race_has_one_winner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        SAFESTOP_SQLITE_PATH=str(tmp_path / "conflict.sqlite3"),
        DJANGO_SETTINGS_MODULE="console.settings",
    )
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    result = subprocess.run(
        [sys.executable, "-c", SQLITE_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["first"]["granted"] == "send_email" and out["first"]["created"] is True
    assert out["retry"] == {**out["first"], "created": False}
    assert out["other_tool"] == {"conflict": "send_email", "first": {"to": "a"}}
    assert out["other_arguments"] == {"conflict": "send_email", "first": {"to": "a"}}
    for race in out["races"]:
        granted = [name for name in ("email", "lookup") if "granted" in race[name]]
        refused = [name for name in ("email", "lookup") if "conflict" in race[name]]
        assert len(granted) == 1 and len(refused) == 1, race
        winner = race[granted[0]]["granted"]
        assert race["records"] == [winner]
        assert race[refused[0]]["conflict"] == winner
