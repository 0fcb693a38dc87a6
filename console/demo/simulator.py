"""The demo simulator: realistic agent runs driven through `safestop_agent`, over real HTTP and
websockets, so the console is busy the moment it starts (`manage.py simulate`).

It is an agent runtime like any other: it knows the server only by URL and token, and imports
nothing from Django. Several worker threads each pick a scenario, run it to its end, and pick
the next, so new runs keep arriving. A reviewer bot stops or takes over some long runs now and
then (the rest wait for a human); every worker obeys the pushed stop, drains and reports.

The scenarios are `console.demo.scenarios` (`SCENARIOS`, and `APPROVAL_SCENARIOS`, which the
demo teams' rules hold for a reviewer). Approval scenarios run on their own worker threads, so a
few approvals always wait in the inbox while the other scenarios go on. An approver bot decides
what nobody has decided after `approval_grace` seconds (approve, approve with edits or reject),
leaving at most `approvals_left_for_humans` to wait for a person or their deadline.

Robust by construction: a scenario that fails is logged and the worker moves on; `stop()`
(SIGTERM in the command) stops the simulator's live runs through the API, lets the workers
drain, and returns.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from console.demo.scenarios import APPROVAL_SCENARIOS, SCENARIOS, Context, Scenario
from console.demo.words import words
from safestop_agent import (
    ApiError,
    SafestopClient,
)

log = logging.getLogger("safestop.simulator")

# Scenario kinds that stay running long enough for a reviewer (bot or human) to press Stop.
# (Not the approval scenarios: their waiting approvals are left for a person to decide, or to
# stop, which voids the approval.)
REVIEWABLE = frozenset({"watch", "slow_report", "deploy"})


@dataclass(frozen=True)
class TeamCredentials:
    team: str
    agent_token: str
    reviewer_token: str


@dataclass
class SimulatorConfig:
    url: str
    teams: list[TeamCredentials]
    receiver_url: str
    concurrency: int = 6
    # Multiplies every simulated duration: 1.0 looks like real work, tests use ~0.2.
    pace: float = 1.0
    # Mean seconds between reviewer-bot actions; 0 turns the bot off.
    reviewer_interval: float = 8.0
    # Share of long runs the bot may stop or take over; the rest are left for humans.
    bot_share: float = 0.6
    seed: int | None = None
    lease_ttl: float = 15.0
    # Worker threads that only run approval scenarios (payments, deploys, customer email).
    approval_workers: int = 3
    # Seconds a waiting approval is left to people before the approver bot decides it;
    # 0 or less: the bot never decides (a test decides through the services).
    approval_grace: float = 45.0
    # Waiting approvals the bot leaves to a person (or their deadline) past the grace, at most.
    approvals_left_for_humans: int = 1
    # The language the agents write their titles, step names, summaries and results in, and
    # the bots their notes (`console.demo.words`): `en` or `zh-hans`.
    language: str = "en"


@dataclass
class ActiveRun:
    run_id: str
    kind: str
    team: str
    started: float
    bot_may_act: bool
    leased: bool = False
    acted: bool = False


class Simulator:
    def __init__(self, config: SimulatorConfig) -> None:
        if not config.teams:
            raise ValueError("the simulator needs at least one team's tokens")
        self.config = config
        self.rng = random.Random(config.seed)
        self.stopping = threading.Event()
        self.agents = {t.team: SafestopClient(config.url, t.agent_token) for t in config.teams}
        self.reviewers = {
            t.team: SafestopClient(config.url, t.reviewer_token) for t in config.teams
        }
        self.outcomes: Counter[str] = Counter()
        self.run_ids: list[str] = []
        self.errors = 0
        self._active: dict[str, ActiveRun] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # The first pass walks every scenario once, so each kind is on screen within seconds.
        self._first_pass = iter(list(SCENARIOS))
        self._first_approval_pass = iter(list(APPROVAL_SCENARIOS))
        self._worker_ids = itertools.count(1)
        # The approver bot: when it first saw each waiting approval, and those it leaves alone.
        self._approvals_seen: dict[str, tuple[str, float]] = {}
        self._approvals_left: set[str] = set()
        self.approval_decisions: Counter[str] = Counter()

    def t(self, template: str, **values: Any) -> str:
        """A note the simulator's bots write, in the demo's language."""
        return words(self.config.language, template, **values)

    # -- lifecycle ---------------------------------------------------------------------------

    def wait_until_ready(self, timeout: float = 60.0) -> bool:
        """Poll the API until it answers (the server may still be migrating or starting)."""
        client = next(iter(self.agents.values()))
        deadline = time.monotonic() + timeout
        while not self.stopping.is_set():
            try:
                client.list_runs()
                return True
            except (httpx.TransportError, ApiError) as error:
                if time.monotonic() >= deadline:
                    log.error(
                        "simulator: %s did not answer within %.0fs (%r)",
                        self.config.url,
                        timeout,
                        error,
                    )
                    return False
            self.stopping.wait(0.25)
        return False

    def start(self) -> Simulator:
        for index in range(self.config.concurrency):
            self._spawn(self._worker_loop, f"sim-worker-{index + 1}", index)
        for index in range(self.config.approval_workers):
            self._spawn(
                self._worker_loop, f"sim-approval-worker-{index + 1}", index, APPROVAL_SCENARIOS
            )
        if self.config.reviewer_interval > 0:
            self._spawn(self._reviewer_loop, "sim-reviewer")
        if self.config.approval_workers > 0 and self.config.approval_grace > 0:
            self._spawn(self._approver_loop, "sim-approver")
        return self

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def request_stop(self) -> None:
        """Signal-safe: only sets a flag. `stop()` does the rest."""
        self.stopping.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the simulator's live runs through the API, let the workers drain, then return."""
        self.stopping.set()
        with self._lock:
            live = [active for active in self._active.values() if active.leased]
        server_gone = False
        for active in live:
            if server_gone:
                break
            try:
                # An agent token may stop its own run for `dependency_failure`: the runtime is
                # going away. The worker hears the push, drains and reports like any stop.
                self.agents[active.team].cancel(
                    active.run_id, "dependency_failure", note=self.t("simulator shutting down")
                )
            except httpx.TransportError:
                # The server stopped first (`serve` shutting down): nobody to drain to. Its
                # lease reaper will mark these runs interrupted when it is back.
                server_gone = True
                log.info("simulator: server gone; %d run(s) left to its lease reaper", len(live))
            except ApiError as error:
                log.info("simulator: could not stop %s on shutdown: %s", active.run_id, error)
        deadline = time.monotonic() + (min(timeout, 2.0) if server_gone else timeout)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for client in [*self.agents.values(), *self.reviewers.values()]:
            client.disconnect()

    def run_for(self, duration: float | None) -> None:
        """Block until `duration` seconds passed (None: until `request_stop`)."""
        self.stopping.wait(duration)

    # -- bookkeeping -------------------------------------------------------------------------

    def register(self, run_id: str, kind: str, team: str) -> ActiveRun:
        active = ActiveRun(
            run_id,
            kind,
            team,
            time.monotonic(),
            bot_may_act=kind in REVIEWABLE and self.rng.random() < self.config.bot_share,
        )
        with self._lock:
            self._active[run_id] = active
            self.run_ids.append(run_id)
        return active

    def unregister(self, run_id: str) -> None:
        with self._lock:
            self._active.pop(run_id, None)

    def _next_kind(self, scenarios: dict[str, Scenario]) -> str:
        first_pass = self._first_pass if scenarios is SCENARIOS else self._first_approval_pass
        with self._lock:
            kind = next(first_pass, None)
        if kind is not None:
            return kind
        kinds = list(scenarios)
        return self.rng.choices(kinds, weights=[scenarios[k].weight for k in kinds])[0]

    # -- the threads -------------------------------------------------------------------------

    def _worker_loop(self, index: int, scenarios: dict[str, Scenario] | None = None) -> None:
        scenarios = SCENARIOS if scenarios is None else scenarios
        if self.stopping.wait(index * 0.15):
            return
        while not self.stopping.is_set():
            kind = self._next_kind(scenarios)
            scenario = scenarios[kind]
            team = scenario.team if scenario.team in self.agents else next(iter(self.agents))
            ctx = Context(self, kind, team, f"sim-{kind}-{next(self._worker_ids)}")
            try:
                outcome = scenario.fn(ctx)
            except Exception as error:  # one broken scenario never stops the demo
                if self.stopping.is_set():
                    outcome = "cut short by shutdown"  # the server may already be gone
                else:
                    outcome = "error"
                    self.errors += 1
                    log.warning(
                        "simulator: %s on %s failed: %r", kind, ctx.run_id or "(no run)", error
                    )
                    self.stopping.wait(1.0)
            finally:
                if ctx.run_id:
                    self.unregister(ctx.run_id)
            with self._lock:
                self.outcomes[f"{kind}:{outcome}"] += 1
            log.info("simulator: %-12s %-18s %s", kind, ctx.run_id or "-", outcome)
            self.stopping.wait(self.rng.uniform(0.2, 1.2) * self.config.pace)

    def _reviewer_loop(self) -> None:
        interval = self.config.reviewer_interval
        while not self.stopping.wait(interval * self.rng.uniform(0.6, 1.4)):
            now = time.monotonic()
            with self._lock:
                candidates = [
                    a
                    for a in self._active.values()
                    if a.bot_may_act
                    and a.leased
                    and not a.acted
                    and now - a.started > 2.5 * self.config.pace
                ]
            if not candidates:
                continue
            target = self.rng.choice(candidates)
            target.acted = True
            reviewer = self.reviewers[target.team]
            try:
                if self.rng.random() < 0.55:
                    reviewer.cancel(
                        target.run_id, "user_stop", note=self.t("reviewer bot: not needed any more")
                    )
                    action = "stopped"
                else:
                    reviewer.takeover(
                        target.run_id, note=self.t("reviewer bot: a human will finish this")
                    )
                    action = "took over"
                log.info("simulator: reviewer bot %s %s (%s)", action, target.run_id, target.kind)
            except (ApiError, httpx.TransportError) as error:
                log.info("simulator: reviewer bot could not act on %s: %s", target.run_id, error)

    def _approver_loop(self) -> None:
        """Decide the simulator's approvals that nobody decided within `approval_grace`."""
        while not self.stopping.wait(1.0):
            for team, reviewer in self.reviewers.items():
                try:
                    waiting = reviewer.list_approvals(status="waiting")
                except (ApiError, httpx.TransportError) as error:
                    log.info("simulator: approver bot could not list %s approvals: %s", team, error)
                    continue
                with self._lock:
                    ours = set(self.run_ids)
                self._approvals_due(team, [a for a in waiting if a.get("run_id") in ours])

    def _approvals_due(self, team: str, waiting: list[Any]) -> None:
        now = time.monotonic()
        ids = {str(approval["id"]) for approval in waiting}
        # forget what was decided meanwhile (by a person, the deadline or a stop)
        for gone in [k for k, (t, _) in self._approvals_seen.items() if t == team and k not in ids]:
            del self._approvals_seen[gone]
            self._approvals_left.discard(gone)
        for approval_id in ids - set(self._approvals_seen):
            self._approvals_seen[approval_id] = (team, now)
            if len(self._approvals_left) < self.config.approvals_left_for_humans and (
                self.rng.random() < 0.25
            ):
                self._approvals_left.add(approval_id)
        for approval in waiting:
            approval_id = str(approval["id"])
            if approval_id in self._approvals_left:
                continue
            if now - self._approvals_seen[approval_id][1] < self.config.approval_grace:
                continue
            if "arguments" not in approval:
                # a list summarises the arguments; an edit needs them whole
                try:
                    approval = self.reviewers[team].get_approval(approval_id)
                except (ApiError, httpx.TransportError):
                    continue
            decision, message, arguments = bot_decision(
                self.rng, approval, language=self.config.language
            )
            try:
                self.reviewers[team].decide_approval(
                    approval_id, decision, message=message, arguments=arguments
                )
            except (ApiError, httpx.TransportError) as error:
                # already decided by a person, void by a stop, or the server is going away
                log.info("simulator: approver bot could not decide %s: %s", approval_id, error)
                continue
            outcome = "approved with edits" if arguments is not None else f"{decision}d"
            with self._lock:
                self.approval_decisions[outcome] += 1
            log.info(
                "simulator: approver bot %s %s (%s)", outcome, approval_id, approval.get("tool")
            )


def bot_decision(
    rng: random.Random, approval: Mapping[str, Any], *, language: str = "en"
) -> tuple[Literal["approve", "reject"], str, dict[str, Any] | None]:
    """What the approver bot says (in the demo's `language`): mostly yes, sometimes with a
    smaller change, sometimes no."""
    roll = rng.random()
    arguments = approval.get("arguments")
    if roll < 0.2:
        return (
            "reject",
            words(language, "approver bot: not today, ask the account owner first"),
            None,
        )
    if roll < 0.45 and isinstance(arguments, dict):
        edited = dict(arguments)
        if isinstance(edited.get("amount_cents"), int) and edited["amount_cents"] > 1:
            edited["amount_cents"] = edited["amount_cents"] // 2
        elif isinstance(edited.get("canary_percent"), int):
            edited["canary_percent"] = 5
        elif isinstance(edited.get("subject"), str):
            edited["subject"] = words(language, "[reviewed] {subject}", subject=edited["subject"])
        else:
            return "approve", words(language, "approver bot: fine"), None
        return "approve", words(language, "approver bot: approved with a smaller change"), edited
    return "approve", words(language, "approver bot: looks right"), None
