"""What the demo's agents do: one function per scenario, each a list of planned steps with what
the agent does inside each (`Context.perform`: create the run with its plan, take the lease, run
the steps, complete). The simulator (`console.demo.simulator`) picks them and runs them.

Scenarios (`SCENARIOS`): model calls streamed through `collect_tool_calls`, read tools, write
tools that queue webhooks to the local receiver, a slow tool, a shell tool that ignores SIGTERM
(`run_process` escalates to SIGKILL), a worker that crashes mid-call (the server turns its call
`unknown`), a run that exhausts its budget, a run whose model calls reach its cost budget,
a steering message, and long runs to stop. Every model call reports its usage (`AGENT_MODELS`).

Approvals (DESIGN §10, `APPROVAL_SCENARIOS`): a refund (`payments.refund`), a production deploy
(`deploy.production`) and a customer email (an `email` outbox item to `*@customer.example`),
which the demo teams' rules (`console.demo.accounts`) hold for a reviewer. Each agent waits for
the decision the way a real one does: a stop still ends the wait at once; on approval the body
runs with the arguments as approved (perhaps edited); a rejection is logged and told to the
model, and the run carries on without the call.

Like the simulator, this imports nothing from Django: the agents know the server by URL and
token only.
"""

from __future__ import annotations

import json
import logging
import random
import shlex
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from console.demo.words import words
from safestop_agent import (
    AgentRun,
    ApprovalRejected,
    SafestopClient,
    StreamOutcome,
    collect_tool_calls,
    run_process,
)
from safestop_agent.wire import OutboxItemInfo
from safestop_agent.worker import StepKind

if TYPE_CHECKING:
    from console.demo.simulator import ActiveRun, Simulator

# The simulator's logger: a scenario's lines read as the simulator's.
log = logging.getLogger("safestop.simulator")

# The model (and provider) each demo agent calls, so the console shows costs priced from the
# price table, one model priced by the payments team's own price (`qwen-max`, which the table
# lacks; `console.demo.accounts`) and one nobody prices (`doubao-pro-32k`: unpriced, never $0).
AGENT_MODELS: dict[str, tuple[str, str | None]] = {
    "support-bot": ("gpt-4o", "openai"),
    "report-bot": ("claude-sonnet-4-5", "anthropic"),
    "incident-bot": ("gemini-2.0-flash", "google"),
    "payout-bot": ("qwen-max", None),
    "mail-bot": ("doubao-pro-32k", None),
    "summary-bot": ("gpt-4o", "openai"),
}
DEFAULT_MODEL: tuple[str, str | None] = ("gpt-4o-mini", "openai")


@dataclass(frozen=True)
class Step:
    """One planned step of a scenario: declared when the run is created, then reported around
    `body` (`run.step`). `when`, if given, decides at that point whether the step runs."""

    key: str
    name: str
    kind: StepKind
    body: Callable[[AgentRun], object] | None = None
    when: Callable[[], bool] | None = None


# What `Context.perform` walks: a step, or something the agent does between two steps.
Plan = Sequence[Step | Callable[[AgentRun], object]]


@dataclass
class Context:
    """What one scenario run needs: its clients, the receiver, pacing, and its run id."""

    sim: Simulator
    kind: str
    team: str
    worker_id: str
    run_id: str = ""
    agent: str = ""
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

    def t(self, template: str, **values: Any) -> str:
        """What the agent writes (a title, a step name, a summary) in the demo's language."""
        return words(self.sim.config.language, template, **values)

    def echo(self, template: str, **values: Any) -> str:
        """A shell `echo` of `template` in the demo's language (what the tool prints is the
        agent's output a reader sees on the run page)."""
        return "echo " + shlex.quote(self.t(template, **values))

    def hook(self, path: str) -> str:
        return self.sim.config.receiver_url.rstrip("/") + path

    def plan(
        self, title: str, agent: str, steps: Plan, budget: dict[str, Any] | None = None
    ) -> str:
        """Create the run with the steps of `steps` as its plan."""
        info = self.client.create_run(
            title,
            agent,
            steps=[
                {"key": step.key, "name": self.t(step.name), "kind": step.kind}
                for step in steps
                if isinstance(step, Step)
            ],
            budget=budget,
        )
        self.run_id = str(info["id"])
        self.agent = agent
        self.active = self.sim.register(self.run_id, self.kind, self.team)
        return self.run_id

    def lease(self) -> AgentRun:
        ttl = max(3.0, self.sim.config.lease_ttl * min(1.0, self.pace * 2))
        run = self.client.lease(self.run_id, self.worker_id, ttl_seconds=ttl, push=True)
        return run

    def leased(self) -> None:
        if self.active is not None:
            self.active.leased = True

    @contextmanager
    def working(self) -> Iterator[AgentRun]:
        """Hold the run's lease for the work (the reviewer bot may act on it from now on). A
        pushed stop ends the work: `AgentRun` drains and reports, and the block returns."""
        with self.lease() as run:
            self.leased()
            yield run

    def perform(
        self,
        title: str,
        agent: str,
        steps: Plan,
        *,
        result: Callable[[], Any],
        budget: dict[str, Any] | None = None,
    ) -> AgentRun:
        """The shape every planned scenario shares: create the run with its steps, take the
        lease, run each step's body inside `run.step` (and what comes between steps as it
        comes), then complete with `result()`. Returns the run, stopped or completed."""
        self.plan(title, agent, steps, budget)
        with self.working() as run:
            for entry in steps:
                if not isinstance(entry, Step):
                    entry(run)
                elif entry.when is None or entry.when():
                    with run.step(entry.key, self.t(entry.name), kind=entry.kind):
                        if entry.body is not None:
                            entry.body(run)
            run.complete(result())
        return run

    def outbox_write(
        self,
        run: AgentRun,
        tool: str,
        arguments: dict[str, Any],
        *,
        key: str,
        destination: str,
        payload: dict[str, Any],
        transport: str = "webhook",
        link: bool = True,
        **item: Any,
    ) -> OutboxItemInfo:
        """A write tool whose effect is one outbox item, both under one idempotency key (a
        retried call reuses it). `link` records the item as the call's operation, so the
        packet can say which item a call's outcome is."""
        with run.tool_call(
            tool,
            arguments,
            side_effect="write",
            idempotency_key=key,
            recovery_policy="reuse_idempotency_key",
        ) as call:
            queued = run.enqueue_outbox(
                transport, destination, payload, idempotency_key=key, **item
            )
            if link:
                call.set_operation_id(str(queued["id"]))
            call.result = queued
        return queued

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
        prompt_tokens: int | None = None,
    ) -> StreamOutcome:
        """A streamed model answer; a stop mid-stream discards any half-received tool call.
        The call's usage is reported either way (a stopped stream is billed too), under the
        model the run's agent uses (`AGENT_MODELS`)."""
        try:
            return self._stream(run, tool=tool, arguments=arguments, words=words)
        finally:
            self.report_usage(run, words, prompt_tokens)

    def report_usage(self, run: AgentRun, words: int, prompt_tokens: int | None) -> None:
        model, provider = AGENT_MODELS.get(self.agent, DEFAULT_MODEL)
        prompt = prompt_tokens if prompt_tokens is not None else self.rng.randint(800, 4000)
        try:
            run.report_usage(
                model=model,
                provider=provider,
                input_tokens=prompt,
                output_tokens=words * 3,
                cache_read_tokens=prompt // 4 if provider == "openai" else None,
            )
        except Exception:  # a lost usage report must not end the demo's run
            log.exception("simulator: %s: usage report failed", self.run_id)

    def _stream(
        self,
        run: AgentRun,
        *,
        tool: str | None,
        arguments: dict[str, Any] | None,
        words: int,
    ) -> StreamOutcome:
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

    def told_model(
        self, run: AgentRun, what: str, label: str, rejection: ApprovalRejected
    ) -> Outcome:
        """A rejected, expired or void approval: log it and tell the model, as a real agent
        would; the caller carries on without the call. `label` is `what` as the agent writes
        it (already in the demo's language)."""
        log.info(
            "simulator: %s: %s %s: %s",
            self.run_id,
            what,
            rejection.status,
            rejection.message or "(no message)",
        )
        status = self.t(APPROVAL_ENDINGS.get(rejection.status, rejection.status))
        title = self.t("{what}: approval {status}", what=label, status=status)
        if not run.token.cancelled:
            run.artifact(
                title,
                kind="text",
                content=self.t(
                    "Told the model: the reviewer said no ({status}): {message}",
                    status=status,
                    message=rejection.message or self.t("no message"),
                ),
            )
        said = self.t("{what} {status}", what=label, status=status)
        return Outcome(f"{what} {rejection.status}", said)

    def ended(self, run: AgentRun) -> str:
        """How the scenario ended, as a word for the log and the outcome counter."""
        if run.token.cancelled:
            return f"stopped ({run.token.reason})"
        return "completed" if run.completed else "ended"


# How an approval that let nothing run ended (`ApprovalRejected.status`), as the agent writes it.
APPROVAL_ENDINGS = {"rejected": "rejected", "expired": "expired", "void": "void"}


@dataclass
class Outcome:
    """How an approval scenario ended: `word` for the simulator's log and counter (English,
    like every log line), `said` for the run's result, in the demo's language."""

    word: str = ""
    said: str = ""


# --------------------------------------------------------------------------------------------
# scenarios: each is its planned steps, in order, with what the agent does inside each


def research(ctx: Context) -> str:
    """Answer a support ticket: model calls, two read tools, a checkpoint, a webhook reply."""
    ticket = ctx.rng.randint(4000, 9999)
    planned: list[Any] = []  # the tool call the model asks for

    def plan(run: AgentRun) -> None:
        outcome = ctx.model_call(
            run,
            tool="search_kb",
            arguments={"query": ctx.t("ticket {ticket} refund status", ticket=ticket)},
        )
        planned.extend(outcome.calls[:1])

    def search_kb(run: AgentRun) -> None:
        for asked in planned:
            with run.tool_call(asked.name, asked.arguments, tool_call_id=asked.id) as call:
                ctx.pause(run, 0.5, 1.5)
                call.result = {"hits": [f"kb-{ctx.rng.randint(100, 999)}" for _ in range(3)]}
        run.artifact(
            ctx.t("search results"),
            kind="json",
            content=json.dumps({"ticket": ticket}),
            reusable=True,
        )

    def read_article(run: AgentRun) -> None:
        with run.tool_call("fetch_url", {"url": f"https://kb.example/articles/{ticket}"}) as call:
            ctx.pause(run, 0.5, 1.2)
            call.result = ctx.t("How refunds are processed (1,240 words)")
        run.checkpoint("checkpoint_03", {"ticket": ticket, "article": "refunds"}, step_seq=3)

    def draft(run: AgentRun) -> None:
        ctx.model_call(run, words=20)
        run.artifact(
            ctx.t("draft reply"),
            kind="text",
            content=ctx.t("Hello, about ticket #{ticket}: ...", ticket=ticket),
            reusable=True,
        )

    def post_reply(run: AgentRun) -> None:
        ctx.outbox_write(
            run,
            "post_reply",
            {"ticket": ticket},
            key=f"{ctx.run_id}-reply",
            destination=ctx.hook("/hooks/helpdesk"),
            payload={"ticket": ticket, "reply": ctx.t("draft reply")},
        )

    run = ctx.perform(
        ctx.t("Answer support ticket #{ticket}", ticket=ticket),
        "support-bot",
        [
            Step("plan", "Plan the answer", "model_call", plan),
            Step("search_kb", "Search the knowledge base", "tool_read", search_kb),
            Step("read_article", "Read the best article", "tool_read", read_article),
            Step("draft", "Draft the reply", "model_call", draft),
            Step("post_reply", "Post the reply to the helpdesk", "tool_write", post_reply),
        ],
        result=lambda: {"ticket": ticket, "answered": True},
    )
    return ctx.ended(run)


def notify(ctx: Context) -> str:
    """Send invoice reminders: one write tool call and one webhook per customer."""
    batch = ctx.rng.randint(100, 999)
    customers = [f"cust_{ctx.rng.randint(1000, 9999)}" for _ in range(ctx.rng.randint(3, 5))]

    def select(run: AgentRun) -> None:
        with run.tool_call("sql_query", {"sql": "select id from invoices where overdue"}) as call:
            ctx.pause(run, 0.4, 1.0)
            call.result = customers

    def send(run: AgentRun) -> None:
        for customer in customers:
            # Now and then the receiver is slow, so an item is seen `dispatching`.
            path = "/slow/1.5/reminders" if ctx.rng.random() < 0.2 else "/hooks/reminders"
            ctx.outbox_write(
                run,
                "send_reminder",
                {"customer": customer},
                key=f"{ctx.run_id}-{customer}",
                destination=ctx.hook(path),
                payload={"customer": customer, "batch": batch},
            )
            ctx.pause(run, 0.3, 0.8)

    run = ctx.perform(
        ctx.t("Send invoice reminders (batch {batch})", batch=batch),
        "notifier-bot",
        [
            Step("select", "Select overdue customers", "tool_read", select),
            Step("send", "Send reminders", "external_action", send),
        ],
        result=lambda: {"batch": batch, "reminders": len(customers)},
    )
    return ctx.ended(run)


def slow_report(ctx: Context) -> str:
    """A slow warehouse query that reports progress: the run to stop mid-tool."""
    quarter = ctx.rng.choice(["Q1", "Q2", "Q3", "Q4"])

    def query(run: AgentRun) -> None:
        with run.tool_call("warehouse_query", {"quarter": quarter}) as call:
            chunks = ctx.rng.randint(5, 8)
            for done in range(1, chunks + 1):
                ctx.pause(run, 1.5, 2.5)
                call.observe(ctx.t("scanned {done}/{chunks} partitions", done=done, chunks=chunks))
            call.result = {"rows": 18_204}
        run.checkpoint("checkpoint_02", {"quarter": quarter, "rows": 18_204}, step_seq=2)

    def publish(run: AgentRun) -> None:
        ctx.outbox_write(
            run,
            "publish_report",
            {"quarter": quarter},
            key=f"{ctx.run_id}-publish",
            destination=ctx.hook("/hooks/reports"),
            payload={"quarter": quarter},
            link=False,
        )

    run = ctx.perform(
        ctx.t("Revenue report {quarter}", quarter=quarter),
        "report-bot",
        [
            Step(
                "plan",
                "Plan the report",
                "model_call",
                lambda run: ctx.model_call(
                    run, tool="warehouse_query", arguments={"quarter": quarter}
                ),
            ),
            Step("query", "Query the warehouse", "tool_read", query),
            Step("publish", "Publish the report", "tool_write", publish),
        ],
        result=lambda: {"quarter": quarter},
    )
    return ctx.ended(run)


def deploy(ctx: Context) -> str:
    """Build, then a migration shell that ignores SIGTERM (a stop escalates to SIGKILL)."""
    version = f"1.{ctx.rng.randint(10, 60)}.{ctx.rng.randint(0, 9)}"

    def build(run: AgentRun) -> None:
        with run.tool_call("shell", {"cmd": f"make release VERSION={version}"}) as call:
            call.observe_process(
                run_process(
                    f"{ctx.echo('building {version}', version=version)}; "
                    f"sleep {1.5 * ctx.pace:.2f}; {ctx.echo('built')}",
                    shell=True,
                    token=run.token,
                    timeout=60,
                    grace_seconds=1.0,
                )
            )
        run.token.raise_if_cancelled()

    def migrate(run: AgentRun) -> None:
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
                    f"trap '' TERM; {ctx.echo('applying 0042_invoices')}; "
                    f"sleep {seconds:.2f}; {ctx.echo('migration applied')}",
                    shell=True,
                    token=run.token,
                    timeout=120,
                    grace_seconds=1.5,
                )
            )
        run.token.raise_if_cancelled()

    def announce(run: AgentRun) -> None:
        ctx.outbox_write(
            run,
            "post_chat",
            {"channel": "#deploys"},
            key=f"{ctx.run_id}-announce",
            destination=ctx.hook("/hooks/chat"),
            payload={"text": ctx.t("billing-api {version} deployed", version=version)},
            link=False,
        )

    run = ctx.perform(
        ctx.t("Deploy billing-api {version}", version=version),
        "deploy-bot",
        [
            Step("build", "Build the release", "tool_read", build),
            Step("migrate", "Apply database migrations", "tool_write", migrate),
            Step("announce", "Announce the deploy", "tool_write", announce),
        ],
        result=lambda: {"version": version},
    )
    return ctx.ended(run)


def crash(ctx: Context) -> str:
    """A worker that dies mid-call: permit granted, the write sent, no result ever reported.

    The server's lease reaper interrupts the run and marks the call `unknown`; the receiver
    knows the write was applied, so a reviewer can query it and resolve the unknown.
    """
    export = ctx.rng.randint(10, 99)
    ctx.plan(
        ctx.t("Export ledger batch {export}", export=export),
        "export-bot",
        [Step("export", "Export rows to the finance system", "tool_write")],
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
                "name": ctx.t("Export rows to the finance system"),
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

    def crawl(run: AgentRun) -> None:
        for page in range(1, 50):
            with run.tool_call("fetch_page", {"page": page}) as call:
                ctx.pause(run, 0.5, 1.0)
                call.result = ctx.t("page {page}: 40 products", page=page)

    run = ctx.perform(
        ctx.t("Crawl the partner catalog"),
        "crawler-bot",
        [Step("crawl", "Crawl pages", "tool_read", crawl)],
        budget=limits,
        result=lambda: {"pages": 49},
    )
    return ctx.ended(run)


def spend(ctx: Context) -> str:
    """Summarise long contracts with a big model until the run's cost budget stops it: each
    call reads a whole contract (about $0.05 at gpt-4o's table price), and the call whose
    usage reaches $0.12 stops the run (`budget_exhausted`) in the batch that reports it."""

    def summarise(run: AgentRun) -> None:
        for contract in range(1, 50):
            ctx.model_call(run, words=30, prompt_tokens=16_000 + ctx.rng.randint(0, 2_000))
            run.artifact(
                ctx.t("summary of contract {contract}", contract=contract),
                kind="text",
                content="...",
            )
            ctx.pause(run, 0.3, 0.6)

    run = ctx.perform(
        ctx.t("Summarise the quarter's supplier contracts"),
        "summary-bot",
        [Step("summarise", "Summarise each contract", "model_call", summarise)],
        budget={"max_cost_usd": 0.12},
        result=lambda: {"contracts": 49},
    )
    return ctx.ended(run)


# What the looping agent researches (each has its words in `console.demo.words`).
LOOP_TOPICS = ("refund policy", "shipping times", "warranty terms")


def looping(ctx: Context) -> str:
    """A research agent stuck in a loop: it asks the same search with the same arguments until
    the team's loop policy (`demo-loop`, DESIGN §14) stops it at the repeating permit."""
    topic = ctx.t(ctx.rng.choice(LOOP_TOPICS))

    def search(run: AgentRun) -> None:
        for _ in range(30):
            with run.tool_call("search_web", {"query": topic, "page": 1}) as call:
                ctx.pause(run, 0.3, 0.6)
                call.result = ctx.t("no new results")

    run = ctx.perform(
        ctx.t("Research {topic}", topic=topic),
        "looping-researcher",
        [Step("search", "Search until satisfied", "tool_read", search)],
        result=lambda: {"topic": topic},
    )
    return ctx.ended(run)


class _LedgerTimeout(Exception):
    """The demo's flaky downstream: every call times out."""


def flaky(ctx: Context) -> str:
    """A sync agent whose tool keeps failing: the team's failure-streak policy
    (`demo-failure-streak`) stops it at the third failed result in a row."""
    batch = ctx.rng.randint(100, 999)

    def sync(run: AgentRun) -> None:
        for attempt in range(1, 20):
            try:
                with run.tool_call("ledger.sync", {"batch": batch, "attempt": attempt}):
                    ctx.pause(run, 0.3, 0.6)
                    raise _LedgerTimeout(
                        ctx.t("ledger API timed out (attempt {attempt})", attempt=attempt)
                    )
            except _LedgerTimeout as error:
                log.info("flaky %s: %s", ctx.run_id, error)

    run = ctx.perform(
        ctx.t("Sync ledger batch {batch}", batch=batch),
        "ledger-sync-bot",
        [Step("sync", "Sync the batch", "tool_write", sync)],
        result=lambda: {"batch": batch},
    )
    return ctx.ended(run)


def steering(ctx: Context) -> str:
    """A reviewer steers the run; the agent applies the message at its next step."""
    incident = ctx.rng.randint(1000, 9999)
    message: dict[str, Any] = {}

    def reviewer_steers(_run: AgentRun) -> None:
        message.update(
            ctx.reviewer.steer(
                ctx.run_id, ctx.t("Focus on customer impact in the EU region first.")
            )
        )

    def gather(run: AgentRun) -> None:
        with run.tool_call("search_logs", {"incident": incident}) as call:
            ctx.pause(run, 0.8, 1.6)
            call.result = ctx.t("42 log lines")

    def apply_steering(run: AgentRun) -> None:
        run.token.raise_if_cancelled()
        run.steering_applied(message["id"])

    def summarise(run: AgentRun) -> None:
        ctx.model_call(run, words=25)
        run.artifact(
            ctx.t("incident summary"),
            kind="text",
            content=ctx.t("INC-{incident}: EU customers first ...", incident=incident),
            reusable=True,
        )

    run = ctx.perform(
        ctx.t("Summarise incident INC-{incident}", incident=incident),
        "incident-bot",
        [
            reviewer_steers,
            Step("gather", "Gather the timeline", "tool_read", gather),
            apply_steering,
            Step("summarise", "Write the summary", "model_call", summarise),
        ],
        result=lambda: {"incident": incident},
    )
    return ctx.ended(run)


def watch(ctx: Context) -> str:
    """A long on-call watcher: polls, sometimes pages someone; lives until stopped or done.

    Its steps are not known in advance (a poll each, a page now and then), so it plans one and
    reports the rest as it goes."""
    ctx.plan(
        ctx.t("Watch the on-call queue"),
        "oncall-bot",
        [Step("watch", "Watch the queue", "tool_read")],
    )
    deadline = time.monotonic() + ctx.rng.uniform(45, 90) * ctx.pace
    polls = 0
    with ctx.working() as run:
        while time.monotonic() < deadline and not ctx.sim.stopping.is_set():
            polls += 1
            with run.step(
                f"poll_{polls:03d}",
                ctx.t("Poll the queue ({polls})", polls=polls),
                kind="tool_read",
            ):
                with run.tool_call("queue_poll", {"queue": "oncall"}) as call:
                    ctx.pause(run, 0.8, 1.8)
                    call.result = {"open_alerts": ctx.rng.randint(0, 3)}
            if polls % 4 == 0:
                with run.step(
                    f"page_{polls:03d}", ctx.t("Page the on-call engineer"), kind="tool_write"
                ):
                    ctx.outbox_write(
                        run,
                        "page_oncall",
                        {"alert": polls},
                        key=f"{ctx.run_id}-page-{polls}",
                        destination=ctx.hook("/hooks/pager"),
                        payload={"alert": polls},
                        link=False,
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
    outcome = Outcome()

    def check(run: AgentRun) -> None:
        with run.tool_call("orders.lookup", {"order": order}) as call:
            ctx.pause(run, 0.3, 0.8)
            call.result = {"order": order, "paid_cents": amount, "status": "returned"}

    def refund(run: AgentRun) -> None:
        nonlocal outcome
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
                {"order": order, "customer": customer, "amount_cents": amount, "currency": "EUR"},
                side_effect="write",
                idempotency_key=key,
                recovery_policy="reuse_idempotency_key",
                # the agent's own policy: big refunds always wait, rule or not
                needs_approval=amount >= 50_000,
                summary=ctx.t(
                    "Refund €{amount} to {customer} for returned order #{order}",
                    amount=f"{amount / 100:,.2f}",
                    customer=customer,
                    order=order,
                ),
                risk="high",
                arguments_schema=schema,
            ) as call:
                # the body runs with the arguments as approved, perhaps edited
                item = run.enqueue_outbox(
                    "webhook", ctx.hook("/hooks/payments"), call.arguments, idempotency_key=key
                )
                call.set_operation_id(str(item["id"]))
                call.result = item
                cents = call.arguments["amount_cents"]
                outcome = Outcome(
                    f"refunded {cents} cents", ctx.t("refunded {cents} cents", cents=cents)
                )
        except ApprovalRejected as rejection:
            outcome = ctx.told_model(run, "refund", ctx.t("refund"), rejection)

    run = ctx.perform(
        ctx.t("Refund order #{order}", order=order),
        "payout-bot",
        [
            Step("check", "Check the order", "tool_read", check),
            Step("refund", "Refund the customer", "tool_write", refund),
            Step(
                "confirm",
                "Tell the customer",
                "model_call",
                lambda run: ctx.model_call(run, words=10),
            ),
        ],
        result=lambda: {"order": order, "outcome": outcome.said},
    )
    return outcome.word if run.completed else ctx.ended(run)


def release(ctx: Context) -> str:
    """Release to production: `deploy.production` waits; the reviewer may shrink the canary."""
    service = ctx.rng.choice(["checkout-web", "search-api", "billing-api"])
    version = f"2.{ctx.rng.randint(0, 40)}.{ctx.rng.randint(0, 9)}"
    outcome = Outcome()

    def checks(run: AgentRun) -> None:
        with run.tool_call("ci.status", {"service": service, "version": version}) as call:
            ctx.pause(run, 0.4, 1.0)
            call.result = {"checks": "green", "tests": 1_284}

    def deploy_production(run: AgentRun) -> None:
        nonlocal outcome
        try:
            with run.tool_call(
                "deploy.production",
                {"service": service, "version": version, "canary_percent": 10},
                side_effect="write",
                operation_id=f"deploy-{service}-{version}-{ctx.run_id}",
                recovery_policy="query_original",
                summary=ctx.t(
                    "Roll {service} {version} out to production (10% canary first)",
                    service=service,
                    version=version,
                ),
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
                        f"{ctx.echo('rolling out {service} {version} to {percent}%', service=service, version=version, percent=percent)}; "
                        f"sleep {0.8 * ctx.pace:.2f}; {ctx.echo('rolled out')}",
                        shell=True,
                        token=run.token,
                        timeout=60,
                        grace_seconds=1.0,
                    )
                )
                outcome = Outcome(
                    f"deployed at {percent}%", ctx.t("deployed at {percent}%", percent=percent)
                )
            run.token.raise_if_cancelled()
        except ApprovalRejected as rejection:
            outcome = ctx.told_model(run, "deploy", ctx.t("deploy"), rejection)

    def verify(run: AgentRun) -> None:
        with run.tool_call("metrics.query", {"service": service, "slo": "p99"}) as call:
            ctx.pause(run, 0.5, 1.0)
            call.result = {"error_rate": 0.001}

    run = ctx.perform(
        ctx.t("Release {service} {version} to production", service=service, version=version),
        "release-bot",
        [
            Step("checks", "Run the release checks", "tool_read", checks),
            Step("deploy", "Deploy to production", "tool_write", deploy_production),
            # only what was deployed is watched
            Step(
                "verify",
                "Watch the canary",
                "tool_read",
                verify,
                when=lambda: outcome.word.startswith("deployed"),
            ),
        ],
        result=lambda: {"service": service, "version": version, "outcome": outcome.said},
    )
    return outcome.word if run.completed else ctx.ended(run)


def customer_email(ctx: Context) -> str:
    """Email a customer: the `email` outbox item waits for a reviewer before it is sent."""
    invoice = ctx.rng.randint(1000, 9999)
    name = ctx.rng.choice(["jane.doe", "ops", "billing", "m.rossi"])
    address = f"{name}@customer.example"
    outcome = Outcome()

    def send(run: AgentRun) -> None:
        nonlocal outcome
        subject = ctx.t("Your invoice {invoice} is overdue", invoice=invoice)
        item = ctx.outbox_write(
            run,
            "email.send",
            {"to": address, "subject": subject},
            key=f"{ctx.run_id}-email",
            transport="email",
            destination=address,
            payload={
                "subject": subject,
                "body": ctx.t("Hello,\n\ninvoice {invoice} is 14 days late.", invoice=invoice),
            },
            summary=ctx.t(
                "Remind {address} that invoice {invoice} is overdue",
                address=address,
                invoice=invoice,
            ),
            risk="medium",
        )
        approval = item.get("approval")
        if item.get("status") == "awaiting_approval" and isinstance(approval, Mapping):
            # The item is the server's to send once approved; the agent waits to know.
            decision = run.wait_for_approval(str(approval["id"]))
            if decision.approved:
                outcome = Outcome("email approved", ctx.t("email approved"))
            else:
                rejection = ApprovalRejected(decision.message, decision.status, approval)
                outcome = ctx.told_model(run, "email", ctx.t("email"), rejection)
        else:
            outcome = Outcome("email queued", ctx.t("email queued"))

    run = ctx.perform(
        ctx.t("Email {address} about invoice {invoice}", address=address, invoice=invoice),
        "mail-bot",
        [
            Step(
                "draft", "Draft the email", "model_call", lambda run: ctx.model_call(run, words=16)
            ),
            Step("send", "Send the email", "external_action", send),
        ],
        result=lambda: {"invoice": invoice, "outcome": outcome.said},
    )
    return outcome.word if run.completed else ctx.ended(run)


@dataclass(frozen=True)
class Scenario:
    fn: Callable[[Context], str]
    team: str
    weight: float


SCENARIOS: dict[str, Scenario] = {
    "research": Scenario(research, "payments", 3),
    # Early in the first pass: a cost budget stop is on screen within a minute of `make run`.
    "spend": Scenario(spend, "platform", 1),
    "notify": Scenario(notify, "payments", 2),
    "slow_report": Scenario(slow_report, "platform", 2),
    "deploy": Scenario(deploy, "platform", 2),
    "crash": Scenario(crash, "payments", 1),
    "budget": Scenario(budget, "platform", 1),
    "steering": Scenario(steering, "platform", 1),
    "watch": Scenario(watch, "payments", 2),
    # Tripped by the demo teams' policies (console.demo.accounts.DEMO_POLICIES).
    "looping": Scenario(looping, "platform", 1),
    "flaky": Scenario(flaky, "payments", 1),
}

# Run by their own worker threads (`approval_workers`), so waiting approvals never starve the
# scenarios above.
APPROVAL_SCENARIOS: dict[str, Scenario] = {
    "payout": Scenario(payout, "payments", 2),
    "release": Scenario(release, "platform", 2),
    "customer_email": Scenario(customer_email, "payments", 1),
}
