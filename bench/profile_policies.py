"""Where the policy checks of a permit and of an events batch spend their time (DESIGN §14):
cProfile of the checks `runs.hooks.policies()` runs inside `permit_request` and
`events_ingest`, on a team with 50 enabled policies (the shapes of `bench/bench_policies.py`,
none acting), in-process on PostgreSQL, and the CPU time of the evaluation alone
(`policies.engine.check`, no database).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/profile_policies.py
    #   PROFILE_POLICIES_CALLS=300 PROFILE_POLICIES_TOP=25

Runs on a test database of its own (SAFESTOP_TEST_DB_NAME, default
`test_safestop_profile_policies`). Prints the top functions by own time for each kind of check,
then the evaluation's CPU p50 and p99 with the 1-minute load average.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_policies import SHAPES  # noqa: E402

CALLS = int(os.environ.get("PROFILE_POLICIES_CALLS", 300))
TOP = int(os.environ.get("PROFILE_POLICIES_TOP", 25))


def _profile_checks() -> dict[str, cProfile.Profile]:
    """Register checks that profile themselves, one profile per kind."""
    from policies.evaluate import Checks
    from runs import hooks

    profiles = {"permit": cProfile.Profile(), "events": cProfile.Profile()}

    def profiled(kind: str, call: Callable[[], Any]) -> Any:
        profiles[kind].enable()
        try:
            return call()
        finally:
            profiles[kind].disable()

    class Profiled(Checks):
        def permit(self, run: Any, **kwargs: Any) -> Any:
            return profiled("permit", lambda: super(Profiled, self).permit(run, **kwargs))

        def events(self, run: Any, event_types: list[str], **kwargs: Any) -> None:
            profiled("events", lambda: super(Profiled, self).events(run, event_types, **kwargs))

    hooks.register_policies(Profiled())
    return profiles


def _evaluation_cpu(team: Any) -> str:
    """CPU of `check` alone over the team's compiled set, as a permit asks it."""
    from policies.engine import Moment, check, team_policies
    from policies.reads import policy_set_version

    policies = team_policies(team.pk, policy_set_version(team.pk)).all
    moment = Moment(
        "tool.permit",
        tool="search",
        arguments={"q": "x"},
        side_effect="write",
        destination_host="api.example.com",
        repeats=1,
        is_call=True,
    )
    values = {
        "run.tool_failures_in_a_row": 0,
        "run.cost_usd": 0.5,
        "run.elapsed_seconds": 12.0,
        "run.side_effects_last_minute": 3,
    }
    samples = []
    for _ in range(CALLS * 10):
        started = time.thread_time_ns()
        check(policies, agent=lambda: "bench-bot", moment=moment, run_value=values.__getitem__)
        samples.append((time.thread_time_ns() - started) / 1e6)
    samples.sort()
    return (
        f"check() over {len(policies.policies)} policies, CPU: p50 {samples[len(samples) // 2]:.3f} ms, "
        f"p99 {samples[int(len(samples) * 0.99)]:.3f} ms"
    )


def profile(team: Any) -> None:
    from bench.bench_policies import _batch, _permit_call, _runs
    from policies.services import policy_create
    from runs.actors import Actor

    admin = Actor.system("profile")
    for index in range(50):
        policy_create(
            team_id=team.pk,
            actor=admin,
            name=f"p{index}",
            expression=SHAPES[index % len(SHAPES)].format(n=1000 + index),
            action="stop",
            mode="enforce",
        )
    runs = _runs(team, CALLS)
    _permit_call(runs[0], "warm", 0)  # the first compile is not what a check costs
    _batch(runs[0], "warm", 0)
    profiles = _profile_checks()
    load = os.getloadavg()[0]
    for index, run in enumerate(runs):
        _permit_call(run, "p", index)
        _batch(run, "b", index)
    for kind, profiled in profiles.items():
        print(f"--- {CALLS} {kind} checks, 50 enabled policies: top {TOP} by own time")
        pstats.Stats(profiled).sort_stats("tottime").print_stats(TOP)
        pstats.Stats(profiled).sort_stats("cumulative").print_stats("policies/", TOP)
    print(_evaluation_cpu(team))
    print(f"load average {load:.2f} → {os.getloadavg()[0]:.2f}")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_profile_policies")
    os.environ.setdefault("SAFESTOP_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    import bench.bench_policies as bench
    from runs.actors import Actor
    from runs.tokens import team_ensure

    bench.AGENT_ACTOR = Actor("api_client", "1", "profile-agent")
    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        profile(team_ensure(slug="profile-policies", name="Profile policies"))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
