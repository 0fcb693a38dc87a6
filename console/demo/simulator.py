"""The demo simulator: realistic agent runs driven through `safestop_agent`, over real HTTP and
websockets, so the console is busy the moment it starts (`manage.py simulate`).

It is an agent runtime like any other: it knows the server only by URL and token, and imports
nothing from Django. Several worker threads each pick a scenario, run it to its end, and pick
the next, so new runs keep arriving. A reviewer bot stops or takes over some long runs now and
then (the rest wait for a human); every worker obeys the pushed stop, drains and reports.

Scenarios (see `SCENARIOS`): model calls streamed through `collect_tool_calls`, read tools,
write tools that queue webhooks to the local receiver, a slow tool, a shell tool that ignores
SIGTERM (`run_process` escalates to SIGKILL), a worker that crashes mid-call (the server turns
its call `unknown`), a run that exhausts its budget, a steering message, and long runs to stop.

Approvals (DESIGN §10, see `APPROVAL_SCENARIOS`): a refund (`payments.refund`), a production
deploy (`deploy.production`) and a customer email (an `email` outbox item to
`*@customer.example`), which the demo teams' rules (`console.demo.accounts`) hold for a
reviewer. Their own worker threads run them, so a few approvals always wait in the inbox while
the other scenarios go on. Each agent waits for the decision the way a real one does: a stop
still ends the wait at once; on approval the body runs with the arguments as approved (perhaps
edited); a rejection is logged and told to the model, and the run carries on without the call.
An approver bot decides what nobody has decided after `approval_grace` seconds (approve,
approve with edits or reject), leaving at most `approvals_left_for_humans` to wait for a
person or their deadline.

Robust by construction: a scenario that fails is logged and the worker moves on; `stop()`
(SIGTERM in the command) stops the simulator's live runs through the API, lets the workers
drain, and returns.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from safestop_agent import (
    AgentRun,
    ApiError,
    ApprovalRejected,
    SafestopClient,
    StreamOutcome,
    collect_tool_calls,
    run_process,
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
                    active.run_id, "dependency_failure", note="simulator shutting down"
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
                        target.run_id, "user_stop", note="reviewer bot: not needed any more"
                    )
                    action = "stopped"
                else:
                    reviewer.takeover(target.run_id, note="reviewer bot: a human will finish this")
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
            decision, message, arguments = bot_decision(self.rng, approval)
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
    rng: random.Random, approval: Mapping[str, Any]
) -> tuple[Literal["approve", "reject"], str, dict[str, Any] | None]:
    """What the approver bot says: mostly yes, sometimes with a smaller change, sometimes no."""
    roll = rng.random()
    arguments = approval.get("arguments")
    if roll < 0.2:
        return "reject", "approver bot: not today, ask the account owner first", None
    if roll < 0.45 and isinstance(arguments, dict):
        edited = dict(arguments)
        if isinstance(edited.get("amount_cents"), int) and edited["amount_cents"] > 1:
            edited["amount_cents"] = edited["amount_cents"] // 2
        elif isinstance(edited.get("canary_percent"), int):
            edited["canary_percent"] = 5
        elif isinstance(edited.get("subject"), str):
            edited["subject"] = "[reviewed] " + edited["subject"]
        else:
            return "approve", "approver bot: fine", None
        return "approve", "approver bot: approved with a smaller change", edited
    return "approve", "approver bot: looks right", None


@dataclass
class Context:
    """What one scenario run needs: its clients, the receiver, pacing, and its run id."""

    sim: Simulator
    kind: str
    team: str
    worker_id: str
    run_id: str = ""
    active: ActiveRun | None = None
    rng: random.Random = field(default_factory=random.Random)

    @property
    def client(self) -> SafestopClient:
        return self.sim.agents[self.team]

    @property
    def reviewer(self) -> SafestopClient:
        return self.sim.reviewers[self.team]

    @property
    def pace(self) -> float:
        return self.sim.config.pace

    def hook(self, path: str) -> str:
        return self.sim.config.receiver_url.rstrip("/") + path

    def create(
        self,
        title: str,
        agent: str,
        steps: list[tuple[str, str, str]],
        budget: dict[str, int] | None = None,
    ) -> str:
        info = self.client.create_run(
            title,
            agent,
            steps=[{"key": key, "name": name, "kind": kind} for key, name, kind in steps],
            budget=budget,
        )
        self.run_id = str(info["id"])
        self.active = self.sim.register(self.run_id, self.kind, self.team)
        return self.run_id

    def lease(self) -> AgentRun:
        ttl = max(3.0, self.sim.config.lease_ttl * min(1.0, self.pace * 2))
        run = self.client.lease(self.run_id, self.worker_id, ttl_seconds=ttl, push=True)
        return run

    def leased(self) -> None:
        if self.active is not None:
            self.active.leased = True

    def pause(self, run: AgentRun, low: float, high: float | None = None) -> None:
        """Simulated work that a stop interrupts at once."""
        seconds = self.rng.uniform(low, high) if high is not None else low
        if run.token.wait(seconds * self.pace):
            run.token.raise_if_cancelled()

    def model_call(
        self,
        run: AgentRun,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        words: int = 12,
    ) -> StreamOutcome:
        """A streamed model answer; a stop mid-stream discards any half-received tool call."""
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        delay = 0.06 * self.pace

        def stream() -> Iterator[dict[str, Any]]:
            for index in range(words):
                if run.token.wait(delay):
                    return
                yield {"choices": [{"delta": {"content": f"token{index} "}}]}
            if tool is not None:
                yield {
                    "choices": [
                        {
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": call_id,
                                        "type": "function",
                                        "function": {"name": tool, "arguments": ""},
                                    }
                                ]
                            }
                        }
                    ]
                }
                text = json.dumps(arguments or {})
                for start in range(0, len(text), 10):
                    if run.token.wait(delay / 2):
                        return
                    yield {
                        "choices": [
                            {
                                "delta": {
                                    "tool_calls": [
                                        {
                                            "index": 0,
                                            "function": {"arguments": text[start : start + 10]},
                                        }
                                    ]
                                }
                            }
                        ]
                    }
            yield {"choices": [{"delta": {}, "finish_reason": "tool_calls" if tool else "stop"}]}

        outcome = collect_tool_calls(stream(), token=run.token)
        run.token.raise_if_cancelled()
        return outcome

    def told_model(self, run: AgentRun, what: str, rejection: ApprovalRejected) -> str:
        """A rejected, expired or void approval: log it and tell the model, as a real agent
        would; the caller carries on without the call. Returns the outcome word."""
        log.info(
            "simulator: %s: %s %s: %s",
            self.run_id,
            what,
            rejection.status,
            rejection.message or "(no message)",
        )
        if not run.token.cancelled:
            run.artifact(
                f"{what}: approval {rejection.status}",
                kind="text",
                content=f"Told the model: the reviewer said no ({rejection.status}): "
                f"{rejection.message or 'no message'}",
            )
        return f"{what} {rejection.status}"

    def ended(self, run: AgentRun) -> str:
        """How the scenario ended, as a word for the log and the outcome counter."""
        if run.token.cancelled:
            return f"stopped ({run.token.reason})"
        return "completed" if run.completed else "ended"


# --------------------------------------------------------------------------------------------
# scenarios


def research(ctx: Context) -> str:
    """Answer a support ticket: model calls, two read tools, a checkpoint, a webhook reply."""
    ticket = ctx.rng.randint(4000, 9999)
    ctx.create(
        f"Answer support ticket #{ticket}",
        "support-bot",
        [
            ("plan", "Plan the answer", "model_call"),
            ("search_kb", "Search the knowledge base", "tool_read"),
            ("read_article", "Read the best article", "tool_read"),
            ("draft", "Draft the reply", "model_call"),
            ("post_reply", "Post the reply to the helpdesk", "tool_write"),
        ],
    )
    with ctx.lease() as run:
        ctx.leased()
        with run.step("plan", "Plan the answer", kind="model_call"):
            outcome = ctx.model_call(
                run, tool="search_kb", arguments={"query": f"ticket {ticket} refund status"}
            )
        calls = outcome.calls
        with run.step("search_kb", "Search the knowledge base", kind="tool_read"):
            for planned in calls[:1]:
                with run.tool_call(
                    planned.name, planned.arguments, tool_call_id=planned.id
                ) as call:
                    ctx.pause(run, 0.5, 1.5)
                    call.result = {"hits": [f"kb-{ctx.rng.randint(100, 999)}" for _ in range(3)]}
            run.artifact(
                "search results", kind="json", content=json.dumps({"ticket": ticket}), reusable=True
            )
        with run.step("read_article", "Read the best article", kind="tool_read"):
            with run.tool_call(
                "fetch_url", {"url": f"https://kb.example/articles/{ticket}"}
            ) as call:
                ctx.pause(run, 0.5, 1.2)
                call.result = "How refunds are processed (1,240 words)"
            run.checkpoint("checkpoint_03", {"ticket": ticket, "article": "refunds"}, step_seq=3)
        with run.step("draft", "Draft the reply", kind="model_call"):
            ctx.model_call(run, words=20)
            run.artifact(
                "draft reply",
                kind="text",
                content=f"Hello, about ticket #{ticket}: ...",
                reusable=True,
            )
        with run.step("post_reply", "Post the reply to the helpdesk", kind="tool_write"):
            key = f"{ctx.run_id}-reply"
            with run.tool_call(
                "post_reply",
                {"ticket": ticket},
                side_effect="write",
                idempotency_key=key,
                recovery_policy="reuse_idempotency_key",
            ) as call:
                item = run.enqueue_outbox(
                    "webhook",
                    ctx.hook("/hooks/helpdesk"),
                    {"ticket": ticket, "reply": "draft reply"},
                    idempotency_key=key,
                )
                call.set_operation_id(str(item["id"]))
                call.result = item
        run.complete({"ticket": ticket, "answered": True})
    return ctx.ended(run)


def notify(ctx: Context) -> str:
    """Send invoice reminders: one write tool call and one webhook per customer."""
    batch = ctx.rng.randint(100, 999)
    customers = [f"cust_{ctx.rng.randint(1000, 9999)}" for _ in range(ctx.rng.randint(3, 5))]
    ctx.create(
        f"Send invoice reminders (batch {batch})",
        "notifier-bot",
        [
            ("select", "Select overdue customers", "tool_read"),
            ("send", "Send reminders", "external_action"),
        ],
    )
    with ctx.lease() as run:
        ctx.leased()
        with run.step("select", "Select overdue customers", kind="tool_read"):
            with run.tool_call(
                "sql_query", {"sql": "select id from invoices where overdue"}
            ) as call:
                ctx.pause(run, 0.4, 1.0)
                call.result = customers
        with run.step("send", "Send reminders", kind="external_action"):
            for customer in customers:
                key = f"{ctx.run_id}-{customer}"
                # Now and then the receiver is slow, so an item is seen `dispatching`.
                path = "/slow/1.5/reminders" if ctx.rng.random() < 0.2 else "/hooks/reminders"
                with run.tool_call(
                    "send_reminder",
                    {"customer": customer},
                    side_effect="write",
                    idempotency_key=key,
                    recovery_policy="reuse_idempotency_key",
                ) as call:
                    item = run.enqueue_outbox(
                        "webhook",
                        ctx.hook(path),
                        {"customer": customer, "batch": batch},
                        idempotency_key=key,
                    )
                    call.set_operation_id(str(item["id"]))
                    call.result = item
                ctx.pause(run, 0.3, 0.8)
        run.complete({"batch": batch, "reminders": len(customers)})
    return ctx.ended(run)


def slow_report(ctx: Context) -> str:
    """A slow warehouse query that reports progress: the run to stop mid-tool."""
    quarter = ctx.rng.choice(["Q1", "Q2", "Q3", "Q4"])
    ctx.create(
        f"Revenue report {quarter}",
        "report-bot",
        [
            ("plan", "Plan the report", "model_call"),
            ("query", "Query the warehouse", "tool_read"),
            ("publish", "Publish the report", "tool_write"),
        ],
    )
    with ctx.lease() as run:
        ctx.leased()
        with run.step("plan", "Plan the report", kind="model_call"):
            ctx.model_call(run, tool="warehouse_query", arguments={"quarter": quarter})
        with run.step("query", "Query the warehouse", kind="tool_read"):
            with run.tool_call("warehouse_query", {"quarter": quarter}) as call:
                chunks = ctx.rng.randint(5, 8)
                for done in range(1, chunks + 1):
                    ctx.pause(run, 1.5, 2.5)
                    call.observe(f"scanned {done}/{chunks} partitions")
                call.result = {"rows": 18_204}
            run.checkpoint("checkpoint_02", {"quarter": quarter, "rows": 18_204}, step_seq=2)
        with run.step("publish", "Publish the report", kind="tool_write"):
            key = f"{ctx.run_id}-publish"
            with run.tool_call(
                "publish_report",
                {"quarter": quarter},
                side_effect="write",
                idempotency_key=key,
                recovery_policy="reuse_idempotency_key",
            ) as call:
                call.result = run.enqueue_outbox(
                    "webhook", ctx.hook("/hooks/reports"), {"quarter": quarter}, idempotency_key=key
                )
        run.complete({"quarter": quarter})
    return ctx.ended(run)


def deploy(ctx: Context) -> str:
    """Build, then a migration shell that ignores SIGTERM (a stop escalates to SIGKILL)."""
    version = f"1.{ctx.rng.randint(10, 60)}.{ctx.rng.randint(0, 9)}"
    ctx.create(
        f"Deploy billing-api {version}",
        "deploy-bot",
        [
            ("build", "Build the release", "tool_read"),
            ("migrate", "Apply database migrations", "tool_write"),
            ("announce", "Announce the deploy", "tool_write"),
        ],
    )
    with ctx.lease() as run:
        ctx.leased()
        with run.step("build", "Build the release", kind="tool_read"):
            with run.tool_call("shell", {"cmd": f"make release VERSION={version}"}) as call:
                call.observe_process(
                    run_process(
                        f"echo building {version}; sleep {1.5 * ctx.pace:.2f}; echo built",
                        shell=True,
                        token=run.token,
                        timeout=60,
                        grace_seconds=1.0,
                    )
                )
            run.token.raise_if_cancelled()
        with run.step("migrate", "Apply database migrations", kind="tool_write"):
            with run.tool_call(
                "shell",
                {"cmd": "manage.py migrate billing"},
                side_effect="write",
                operation_id=f"migrate-{version}",
                recovery_policy="query_original",
            ) as call:
                # `trap '' TERM` is inherited by `sleep`: the whole tool ignores SIGTERM.
                seconds = ctx.rng.uniform(5, 9) * ctx.pace
                call.observe_process(
                    run_process(
                        f"trap '' TERM; echo applying 0042_invoices; sleep {seconds:.2f}; echo migration applied",
                        shell=True,
                        token=run.token,
                        timeout=120,
                        grace_seconds=1.5,
                    )
                )
            run.token.raise_if_cancelled()
        with run.step("announce", "Announce the deploy", kind="tool_write"):
            key = f"{ctx.run_id}-announce"
            with run.tool_call(
                "post_chat",
                {"channel": "#deploys"},
                side_effect="write",
                idempotency_key=key,
                recovery_policy="reuse_idempotency_key",
            ) as call:
                call.result = run.enqueue_outbox(
                    "webhook",
                    ctx.hook("/hooks/chat"),
                    {"text": f"billing-api {version} deployed"},
                    idempotency_key=key,
                )
        run.complete({"version": version})
    return ctx.ended(run)


def crash(ctx: Context) -> str:
    """A worker that dies mid-call: permit granted, the write sent, no result ever reported.

    The server's lease reaper interrupts the run and marks the call `unknown`; the receiver
    knows the write was applied, so a reviewer can query it and resolve the unknown.
    """
    export = ctx.rng.randint(10, 99)
    ctx.create(
        f"Export ledger batch {export}",
        "export-bot",
        [
            ("export", "Export rows to the finance system", "tool_write"),
        ],
    )
    client = ctx.client
    ttl = max(2.0, 6.0 * ctx.pace)
    lease = client.acquire_lease(ctx.run_id, ctx.worker_id, ttl_seconds=ttl)
    ctx.leased()
    epoch = int(lease["epoch"])
    client.send_events(
        ctx.run_id,
        epoch=epoch,
        events=[
            {
                "event_id": f"evt_{uuid.uuid4().hex}",
                "type": "step.started",
                "key": "export",
                "name": "Export rows to the finance system",
                "kind": "tool_write",
            }
        ],
    )
    key = f"{ctx.run_id}-export"
    client.request_permit(
        ctx.run_id,
        epoch=epoch,
        tool_call_id=f"call_{uuid.uuid4().hex[:12]}",
        tool="finance_export",
        side_effect="write",
        arguments={"batch": export},
        idempotency_key=key,
        operation_id=f"export-{export}",
        recovery_policy="query_original",
        step_key="export",
    )
    with httpx.Client(timeout=5, trust_env=False) as http:
        http.post(
            ctx.hook("/hooks/finance"), json={"batch": export}, headers={"Idempotency-Key": key}
        )
    # The process "dies" here: no result, no heartbeat, no release. The lease runs out.
    if ctx.active is not None:
        ctx.active.leased = False
    return "crashed mid-call"


def budget(ctx: Context) -> str:
    """A crawler that keeps calling tools until its budget refuses the next permit."""
    by_calls = ctx.rng.random() < 0.6
    limits = {"max_tool_calls": 3} if by_calls else {"max_seconds": max(2, round(6 * ctx.pace))}
    ctx.create(
        "Crawl the partner catalog",
        "crawler-bot",
        [("crawl", "Crawl pages", "tool_read")],
        budget=limits,
    )
    with ctx.lease() as run:
        ctx.leased()
        with run.step("crawl", "Crawl pages", kind="tool_read"):
            for page in range(1, 50):
                with run.tool_call("fetch_page", {"page": page}) as call:
                    ctx.pause(run, 0.5, 1.0)
                    call.result = f"page {page}: 40 products"
        run.complete({"pages": 49})
    return ctx.ended(run)


def steering(ctx: Context) -> str:
    """A reviewer steers the run; the agent applies the message at its next step."""
    incident = ctx.rng.randint(1000, 9999)
    ctx.create(
        f"Summarise incident INC-{incident}",
        "incident-bot",
        [
            ("gather", "Gather the timeline", "tool_read"),
            ("summarise", "Write the summary", "model_call"),
        ],
    )
    with ctx.lease() as run:
        ctx.leased()
        message = ctx.reviewer.steer(ctx.run_id, "Focus on customer impact in the EU region first.")
        with run.step("gather", "Gather the timeline", kind="tool_read"):
            with run.tool_call("search_logs", {"incident": incident}) as call:
                ctx.pause(run, 0.8, 1.6)
                call.result = "42 log lines"
        run.token.raise_if_cancelled()
        run.steering_applied(message["id"])
        with run.step("summarise", "Write the summary", kind="model_call"):
            ctx.model_call(run, words=25)
            run.artifact(
                "incident summary",
                kind="text",
                content=f"INC-{incident}: EU customers first ...",
                reusable=True,
            )
        run.complete({"incident": incident})
    return ctx.ended(run)


def watch(ctx: Context) -> str:
    """A long on-call watcher: polls, sometimes pages someone; lives until stopped or done."""
    ctx.create("Watch the on-call queue", "oncall-bot", [("watch", "Watch the queue", "tool_read")])
    deadline = time.monotonic() + ctx.rng.uniform(45, 90) * ctx.pace
    polls = 0
    with ctx.lease() as run:
        ctx.leased()
        while time.monotonic() < deadline and not ctx.sim.stopping.is_set():
            polls += 1
            with run.step(f"poll_{polls:03d}", f"Poll the queue ({polls})", kind="tool_read"):
                with run.tool_call("queue_poll", {"queue": "oncall"}) as call:
                    ctx.pause(run, 0.8, 1.8)
                    call.result = {"open_alerts": ctx.rng.randint(0, 3)}
            if polls % 4 == 0:
                key = f"{ctx.run_id}-page-{polls}"
                with run.step(f"page_{polls:03d}", "Page the on-call engineer", kind="tool_write"):
                    with run.tool_call(
                        "page_oncall",
                        {"alert": polls},
                        side_effect="write",
                        idempotency_key=key,
                        recovery_policy="reuse_idempotency_key",
                    ) as call:
                        call.result = run.enqueue_outbox(
                            "webhook",
                            ctx.hook("/hooks/pager"),
                            {"alert": polls},
                            idempotency_key=key,
                        )
            ctx.pause(run, 0.5, 1.5)
        if not run.token.cancelled:
            run.complete({"polls": polls})
    return ctx.ended(run)


# --------------------------------------------------------------------------------------------
# approval scenarios (DESIGN §10): the demo teams' rules hold these calls for a reviewer

REFUND_SCHEMA_BASE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order": {"type": "integer"},
        "customer": {"type": "string"},
        "currency": {"enum": ["EUR"]},
    },
    "required": ["order", "customer", "amount_cents", "currency"],
    "additionalProperties": False,
}


def payout(ctx: Context) -> str:
    """Refund an order: `payments.refund` waits for a reviewer, who may lower the amount."""
    order = ctx.rng.randint(10_000, 99_999)
    customer = f"cust_{ctx.rng.randint(1000, 9999)}"
    amount = ctx.rng.choice([1_290, 4_500, 12_900, 89_000, 240_000])
    ctx.create(
        f"Refund order #{order}",
        "payout-bot",
        [
            ("check", "Check the order", "tool_read"),
            ("refund", "Refund the customer", "tool_write"),
            ("confirm", "Tell the customer", "model_call"),
        ],
    )
    outcome = ""
    with ctx.lease() as run:
        ctx.leased()
        with run.step("check", "Check the order", kind="tool_read"):
            with run.tool_call("orders.lookup", {"order": order}) as call:
                ctx.pause(run, 0.3, 0.8)
                call.result = {"order": order, "paid_cents": amount, "status": "returned"}
        with run.step("refund", "Refund the customer", kind="tool_write"):
            key = f"{ctx.run_id}-refund"
            schema = {
                **REFUND_SCHEMA_BASE,
                "properties": {
                    **REFUND_SCHEMA_BASE["properties"],
                    # a reviewer may lower the refund, never raise it
                    "amount_cents": {"type": "integer", "minimum": 1, "maximum": amount},
                },
            }
            try:
                with run.tool_call(
                    "payments.refund",
                    {
                        "order": order,
                        "customer": customer,
                        "amount_cents": amount,
                        "currency": "EUR",
                    },
                    side_effect="write",
                    idempotency_key=key,
                    recovery_policy="reuse_idempotency_key",
                    # the agent's own policy: big refunds always wait, rule or not
                    needs_approval=amount >= 50_000,
                    summary=f"Refund €{amount / 100:,.2f} to {customer} for returned order #{order}",
                    risk="high",
                    arguments_schema=schema,
                ) as call:
                    # the body runs with the arguments as approved, perhaps edited
                    item = run.enqueue_outbox(
                        "webhook", ctx.hook("/hooks/payments"), call.arguments, idempotency_key=key
                    )
                    call.set_operation_id(str(item["id"]))
                    call.result = item
                    outcome = f"refunded {call.arguments['amount_cents']} cents"
            except ApprovalRejected as rejection:
                outcome = ctx.told_model(run, "refund", rejection)
        with run.step("confirm", "Tell the customer", kind="model_call"):
            ctx.model_call(run, words=10)
        run.complete({"order": order, "outcome": outcome})
    return outcome if run.completed else ctx.ended(run)


def release(ctx: Context) -> str:
    """Release to production: `deploy.production` waits; the reviewer may shrink the canary."""
    service = ctx.rng.choice(["checkout-web", "search-api", "billing-api"])
    version = f"2.{ctx.rng.randint(0, 40)}.{ctx.rng.randint(0, 9)}"
    ctx.create(
        f"Release {service} {version} to production",
        "release-bot",
        [
            ("checks", "Run the release checks", "tool_read"),
            ("deploy", "Deploy to production", "tool_write"),
            ("verify", "Watch the canary", "tool_read"),
        ],
    )
    outcome = ""
    with ctx.lease() as run:
        ctx.leased()
        with run.step("checks", "Run the release checks", kind="tool_read"):
            with run.tool_call("ci.status", {"service": service, "version": version}) as call:
                ctx.pause(run, 0.4, 1.0)
                call.result = {"checks": "green", "tests": 1_284}
        with run.step("deploy", "Deploy to production", kind="tool_write"):
            try:
                with run.tool_call(
                    "deploy.production",
                    {"service": service, "version": version, "canary_percent": 10},
                    side_effect="write",
                    operation_id=f"deploy-{service}-{version}-{ctx.run_id}",
                    recovery_policy="query_original",
                    summary=f"Roll {service} {version} out to production (10% canary first)",
                    risk="high",
                    arguments_schema={
                        "type": "object",
                        "properties": {
                            "service": {"const": service},
                            "version": {"const": version},
                            "canary_percent": {"type": "integer", "minimum": 1, "maximum": 100},
                        },
                        "required": ["service", "version", "canary_percent"],
                    },
                ) as call:
                    percent = call.arguments["canary_percent"]
                    call.observe_process(
                        run_process(
                            f"echo rolling out {service} {version} to {percent}%; "
                            f"sleep {0.8 * ctx.pace:.2f}; echo rolled out",
                            shell=True,
                            token=run.token,
                            timeout=60,
                            grace_seconds=1.0,
                        )
                    )
                    outcome = f"deployed at {percent}%"
                run.token.raise_if_cancelled()
            except ApprovalRejected as rejection:
                outcome = ctx.told_model(run, "deploy", rejection)
        if outcome.startswith("deployed"):
            with run.step("verify", "Watch the canary", kind="tool_read"):
                with run.tool_call("metrics.query", {"service": service, "slo": "p99"}) as call:
                    ctx.pause(run, 0.5, 1.0)
                    call.result = {"error_rate": 0.001}
        run.complete({"service": service, "version": version, "outcome": outcome})
    return outcome if run.completed else ctx.ended(run)


def customer_email(ctx: Context) -> str:
    """Email a customer: the `email` outbox item waits for a reviewer before it is sent."""
    invoice = ctx.rng.randint(1000, 9999)
    name = ctx.rng.choice(["jane.doe", "ops", "billing", "m.rossi"])
    address = f"{name}@customer.example"
    ctx.create(
        f"Email {address} about invoice {invoice}",
        "mail-bot",
        [
            ("draft", "Draft the email", "model_call"),
            ("send", "Send the email", "external_action"),
        ],
    )
    outcome = ""
    with ctx.lease() as run:
        ctx.leased()
        with run.step("draft", "Draft the email", kind="model_call"):
            ctx.model_call(run, words=16)
        with run.step("send", "Send the email", kind="external_action"):
            key = f"{ctx.run_id}-email"
            subject = f"Your invoice {invoice} is overdue"
            with run.tool_call(
                "email.send",
                {"to": address, "subject": subject},
                side_effect="write",
                idempotency_key=key,
                recovery_policy="reuse_idempotency_key",
            ) as call:
                item = run.enqueue_outbox(
                    "email",
                    address,
                    {"subject": subject, "body": f"Hello,\n\ninvoice {invoice} is 14 days late."},
                    idempotency_key=key,
                    summary=f"Remind {address} that invoice {invoice} is overdue",
                    risk="medium",
                )
                call.set_operation_id(str(item["id"]))
                call.result = item
            approval = item.get("approval")
            if item.get("status") == "awaiting_approval" and isinstance(approval, Mapping):
                # The item is the server's to send once approved; the agent waits to know.
                decision = run.wait_for_approval(str(approval["id"]))
                if decision.approved:
                    outcome = "email approved"
                else:
                    rejection = ApprovalRejected(decision.message, decision.status, approval)
                    outcome = ctx.told_model(run, "email", rejection)
            else:
                outcome = "email queued"
        run.complete({"invoice": invoice, "outcome": outcome})
    return outcome if run.completed else ctx.ended(run)


@dataclass(frozen=True)
class Scenario:
    fn: Callable[[Context], str]
    team: str
    weight: float


SCENARIOS: dict[str, Scenario] = {
    "research": Scenario(research, "payments", 3),
    "notify": Scenario(notify, "payments", 2),
    "slow_report": Scenario(slow_report, "platform", 2),
    "deploy": Scenario(deploy, "platform", 2),
    "crash": Scenario(crash, "payments", 1),
    "budget": Scenario(budget, "platform", 1),
    "steering": Scenario(steering, "platform", 1),
    "watch": Scenario(watch, "payments", 2),
}

# Run by their own worker threads (`approval_workers`), so waiting approvals never starve the
# scenarios above.
APPROVAL_SCENARIOS: dict[str, Scenario] = {
    "payout": Scenario(payout, "payments", 2),
    "release": Scenario(release, "platform", 2),
    "customer_email": Scenario(customer_email, "payments", 1),
}
