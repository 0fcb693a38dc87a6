"""Channel-layer group names: the contract between the publisher (`console.realtime`) and the
consumers (`api/consumers.py` for agents, `console/consumers.py` for browsers).

They live in runs, the lowest layer, so both sides name a group the same way without the agent
consumer importing the console.

- `run_<id>`: viewers of one run (browser) — every change, with its sequence number;
- `team_<team_id>`: the runs page of a team — every change of any of its runs;
- `user_<user_id>`: every browser socket of one user — access changes;
- `agent_<id>`: the worker of one run — the stop signal and approval decisions;
- `token_<token_id>`: every agent socket opened with one token — its revocation.
"""

from __future__ import annotations


def run_group(run_id: str) -> str:
    return f"run_{run_id}"


def team_group(team_id: int | str) -> str:
    return f"team_{team_id}"


def user_group(user_id: int | str) -> str:
    return f"user_{user_id}"


def agent_group(run_id: str) -> str:
    return f"agent_{run_id}"


def token_group(token_id: int | str) -> str:
    return f"token_{token_id}"
