"""Run a compiled LangGraph graph under a safestop lease (`pip install 'safestop-agent[langgraph]'`).

    graph = builder.compile(checkpointer=InMemorySaver())  # any LangGraph checkpointer
    with client.lease(run_id, "worker-1") as run:
        outcome = SafestopGraph(run, graph).invoke({"ticket": 42})
        run.complete(outcome.values)

What the adapter does (DESIGN §9, §10):

- **Each node is a step.** The graph runs with a breakpoint before every node
  (`interrupt_before="*"`), so between two nodes it is paused and checkpointed.
  At each pause the adapter checks the run's stop token, sends `step.started`
  for the nodes about to run (refused after a stop: they never run), resumes,
  and sends `step.completed` (or `step.failed`) once they are done. Step keys
  are `<node>#<langgraph step>`, the same in every process, so a resumed run
  reuses its steps.
- **Tool calls ask for permits.** Inside a node, `tool_call(...)` or a function
  decorated with `safestop_tool` asks a permit before the tool runs and reports
  its outcome after (a write that did not finish is `unknown`, never `failed`).
  A result is kept per call, so a node that LangGraph runs again after a resume
  does not repeat a tool that already ran.
- **A stop ends the graph at the next node or tool boundary**: a refused
  permit or step, or the token seen between nodes, raises `Cancelled`. The
  adapter reports the open steps `step.failed` (cancelled) and the thread's
  latest LangGraph checkpoint as `checkpoint.saved` (label
  `langgraph:<checkpoint_id>`), then lets `Cancelled` end the lease block
  (which reports `drained`). Resume in the console moves the run's
  `resume_from` there; the next `invoke()` on the same thread continues from
  it (or from an older `langgraph:` checkpoint a reviewer chose).
- **An approval wait is LangGraph's own `interrupt()`.** A call that must wait
  for a reviewer (a team rule, or `needs_approval=True`) interrupts its node:
  the graph is checkpointed and no node holds a thread. `invoke()` then waits
  for the decision on the run's push socket (or returns at once with
  `wait_for_approvals=False`: call `invoke()` again later, from any thread)
  and resumes the graph with `Command(resume=...)`. The node runs again from
  its start; the tool call asks the same permit again and gets the final
  (possibly edited) arguments, or raises `ApprovalRejected` with the
  reviewer's message.

Breakpoints a graph was compiled with are replaced by the adapter's; use
`interrupt()` for a graph's own human-in-the-loop (`invoke()` returns an
`interrupted` outcome with those interrupts, and `invoke(Command(resume=...))`
goes on). `invoke` is synchronous (`graph.stream`), so nodes are plain
functions; tool calls through the adapter are blocking HTTP calls.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from langgraph.config import get_config
from langgraph.types import Command, Interrupt, interrupt

from ..cancel import Cancelled, CancelToken
from ..errors import REFUSAL_CODES, ApiError, Refused
from ..wire import RecoveryPolicy, Risk, SideEffect
from ..worker import AgentRun, StepKind, describe_error

log = logging.getLogger("safestop_agent")

F = TypeVar("F", bound=Callable[..., Any])

CHECKPOINT_PREFIX = "langgraph:"
# Marks the interrupts this adapter raises, so they are told apart from a graph's own.
INTERRUPT_KIND = "safestop.approval"
# What a checkpoint event may carry of the graph's values (the checkpointer has them all).
VALUES_PREVIEW_BYTES = 16_000

_ACTIVE: contextvars.ContextVar[SafestopGraph | None] = contextvars.ContextVar(
    "safestop_langgraph_active", default=None
)
_NOTHING: Any = object()
_AUTO: Any = object()

OutcomeStatus = Literal["completed", "waiting_for_approval", "interrupted"]


@dataclass(frozen=True)
class GraphOutcome:
    """How `SafestopGraph.invoke()` ended, if not by raising.

    - `completed`: the graph ran to its end; `values` is its final state.
    - `waiting_for_approval` (only with `wait_for_approvals=False`): tool calls
      wait for a reviewer; `approvals` lists them. Call `invoke()` again.
    - `interrupted`: the graph's own `interrupt()` paused it; `interrupts` are
      LangGraph's. Go on with `invoke(Command(resume=...))`.
    """

    status: OutcomeStatus
    values: Any
    interrupts: tuple[Interrupt, ...] = ()
    approvals: tuple[Mapping[str, Any], ...] = ()
    thread_id: str = ""
    checkpoint_id: str | None = None


@dataclass
class _OpenStep:
    key: str
    node: str


@dataclass
class _Calls:
    """Per task: how many tool calls it made in this pass (ids are by position)."""

    counters: dict[str, int] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class SafestopGraph:
    """A compiled graph bound to one leased run (see the module docstring).

    `thread_id` defaults to `safestop-<run id>`: a run resumed by a reviewer
    (a new lease, perhaps in another process with a persistent checkpointer)
    finds its thread again. `step_kind` is a step kind for every node, or a
    mapping from node name to kind (others: `model_call`).
    """

    def __init__(
        self,
        run: AgentRun,
        graph: Any,
        *,
        thread_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        step_kind: StepKind | Mapping[str, StepKind] = "model_call",
        wait_for_approvals: bool = True,
    ) -> None:
        if getattr(graph, "checkpointer", None) is None:
            raise ValueError(
                "SafestopGraph needs a graph compiled with a checkpointer "
                "(builder.compile(checkpointer=InMemorySaver()) or a persistent one): "
                "a stop or an approval wait leaves the graph paused at a checkpoint"
            )
        self.run = run
        self.graph = graph
        self.thread_id = thread_id or f"safestop-{run.run_id}"
        self.wait_for_approvals = wait_for_approvals
        self._step_kind = step_kind
        base = dict(config or {})
        configurable = dict(base.get("configurable") or {})
        configurable["thread_id"] = self.thread_id
        configurable.pop("checkpoint_id", None)
        base["configurable"] = configurable
        self._config: dict[str, Any] = base
        self._open: dict[str, _OpenStep] = {}  # task id → the step it reported started
        self._calls = _Calls()
        self.last_checkpoint: str | None = None

    # -- running ---------------------------------------------------------------------

    def invoke(self, input: Any = None, *, resume_from: str | None = _AUTO) -> GraphOutcome:
        """Run (or go on with) the thread until it ends, waits or is interrupted.

        `input` starts a new pass when the thread has nothing pending (its first
        run, or after it completed); a thread that is paused (by a stop, an
        approval wait or a crash) goes on from its checkpoint and `input` is not
        applied again, unless it is a LangGraph `Command` (to answer the graph's
        own `interrupt()`). `resume_from` is a `langgraph:` checkpoint label to
        continue from; by default the run's `resume_from` (set by a reviewer's
        Resume, or by the checkpoint reported at the stop).

        Raises `Cancelled` when the run is stopped (after reporting the
        checkpoint), `ApprovalRejected` only if a node lets it propagate.
        """
        active = _ACTIVE.set(self)
        try:
            return self._invoke(input, resume_from)
        except Cancelled:
            self._stopped()
            raise
        finally:
            _ACTIVE.reset(active)

    def _invoke(self, input: Any, resume_from: str | None) -> GraphOutcome:
        config = self._start_config(resume_from)
        pending_input = input
        while True:
            state = self.graph.get_state(config)
            command: Any = None
            if isinstance(pending_input, Command):
                command, pending_input = pending_input, _NOTHING
            elif not state.next:
                if pending_input is _NOTHING or (pending_input is None and input is None):
                    return self._outcome("completed", state)
                # A new pass: LangGraph takes the input and pauses before the first node.
                command, pending_input = pending_input, _NOTHING
            else:
                pending_input = _NOTHING
                ours, theirs = _split_interrupts(state)
                if theirs:
                    return self._outcome("interrupted", state, interrupts=tuple(theirs))
                if ours:
                    if not self.wait_for_approvals and not self._all_decided(ours):
                        return self._outcome(
                            "waiting_for_approval",
                            state,
                            approvals=tuple(dict(item.value) for item in ours),
                        )
                    command = Command(resume={item.id: self._await(item) for item in ours})
                self.run.token.raise_if_cancelled()  # the node boundary: nothing new after a stop
                self._start_steps(state)
            self._stream(command, config)
            config = self._config  # a fork from an older checkpoint happens once
            self._settle_steps(self.graph.get_state(config), error=None)

    def _start_config(self, resume_from: str | None) -> dict[str, Any]:
        if resume_from is _AUTO:
            resume_from = self._run_resume_from()
        checkpoint_id = _checkpoint_id_of(resume_from)
        if checkpoint_id is None:
            return self._config
        latest = self.graph.get_state(self._config)
        if latest.config and latest.config["configurable"].get("checkpoint_id") == checkpoint_id:
            return self._config
        forked = dict(self._config)
        forked["configurable"] = {**self._config["configurable"], "checkpoint_id": checkpoint_id}
        try:
            found = self.graph.get_state(forked)
        except Exception:  # an id this checkpointer does not know
            found = None
        if found is None or (not found.values and not found.next):
            log.warning("safestop: checkpoint %s not in this checkpointer; going on", resume_from)
            return self._config
        return forked

    def _run_resume_from(self) -> str | None:
        try:
            label = self.run.client.get_run(self.run.run_id).get("resume_from")
        except ApiError as error:
            log.info("safestop: could not read resume_from of %s: %s", self.run.run_id, error)
            return None
        return str(label) if label else None

    def _stream(self, command: Any, config: Mapping[str, Any]) -> None:
        with self._calls.lock:
            self._calls.counters.clear()  # a node run again calls its tools in the same order
        try:
            for _chunk in self.graph.stream(
                command, config, interrupt_before="*", stream_mode="updates"
            ):
                pass
        except Cancelled:
            raise
        except Exception as error:
            self._settle_steps(self.graph.get_state(self._config), error=error)
            raise

    # -- steps -----------------------------------------------------------------------

    def _kind(self, node: str) -> StepKind:
        if isinstance(self._step_kind, Mapping):
            return self._step_kind.get(node, "model_call")
        return self._step_kind

    def _start_steps(self, state: Any) -> None:
        step = int((state.metadata or {}).get("step", -1)) + 1
        used = {open_step.key for open_step in self._open.values()}
        for task in state.tasks:
            if task.id in self._open:
                continue  # started before an approval wait: still the same step
            key = f"{task.name}#{step}"
            suffix = 2
            while key in used:  # the same node twice in one step (`Send`)
                key, suffix = f"{task.name}#{step}.{suffix}", suffix + 1
            used.add(key)
            self.run.token.raise_if_cancelled()
            answer = self.run.event(
                "step.started", key=key, name=task.name, kind=self._kind(task.name)
            )
            if answer.get("status") == "rejected" and answer.get("code") in REFUSAL_CODES:
                raise self.run._refused(
                    Refused(409, str(answer.get("code")), "step.started rejected", answer)
                )
            self._open[task.id] = _OpenStep(key, task.name)

    def _settle_steps(
        self, state: Any, *, error: BaseException | None, stopping: bool = False
    ) -> None:
        """Report the open steps whose tasks are done (or failed); keep those still pending.

        While `stopping`, a failed task is left open: the stop reports it cancelled.
        """
        pending = {task.id: task for task in state.tasks}
        for task_id, open_step in list(self._open.items()):
            task = pending.get(task_id)
            if task is not None and task.interrupts:
                continue  # waits for an approval (or the graph's own interrupt)
            if task is not None and getattr(task, "error", None) is not None:
                if not stopping:
                    self._step_failed(task_id, str(task.error))
            elif task is None or getattr(task, "result", None) is not None:
                # Gone from the pending tasks, or done with its writes saved beside a sibling
                # that is not: the node ran.
                del self._open[task_id]
                self._fact("step.completed", key=open_step.key)
            elif error is not None:
                self._step_failed(task_id, describe_error(error))

    def _step_failed(self, task_id: str, detail: str, *, cancelled: bool = False) -> None:
        open_step = self._open.pop(task_id)
        self._fact("step.failed", key=open_step.key, error=detail, cancelled=cancelled)

    def _fact(self, type: str, **fields: Any) -> None:
        try:
            self.run.event(type, **fields)
        except (ApiError, Cancelled) as error:
            log.warning("safestop: %s not reported: %s", type, error)

    def _stopped(self) -> None:
        """After a stop: close the open steps as cancelled and report the checkpoint."""
        reason = f"interrupted by stop ({self.run.token.reason})"
        try:
            self._settle_steps(self.graph.get_state(self._config), error=None, stopping=True)
        except Exception as error:
            log.warning("safestop: steps not settled at stop: %r", error)
        for task_id in list(self._open):
            self._step_failed(task_id, reason, cancelled=True)
        try:
            self.report_checkpoint()
        except Exception as error:  # the stop itself must go on: the drain follows
            log.warning("safestop: checkpoint not reported at stop: %r", error)

    def report_checkpoint(self) -> str | None:
        """Send the thread's latest checkpoint as `checkpoint.saved`; return its label."""
        state = self.graph.get_state(self._config)
        checkpoint_id = (state.config or {}).get("configurable", {}).get("checkpoint_id")
        if not checkpoint_id:
            return None
        label = f"{CHECKPOINT_PREFIX}{checkpoint_id}"
        self._fact(
            "checkpoint.saved",
            label=label,
            state={
                "framework": "langgraph",
                "thread_id": self.thread_id,
                "checkpoint_id": checkpoint_id,
                "next": list(state.next),
                "step": (state.metadata or {}).get("step"),
                "values": _preview(state.values),
            },
        )
        self.last_checkpoint = label
        return label

    # -- approvals -------------------------------------------------------------------

    def _await(self, item: Interrupt) -> dict[str, Any]:
        approval_id = str(item.value["approval_id"])
        decision = self.run.wait_for_approval(approval_id, poll_now=True)
        return {"approval_id": approval_id, "status": decision.status, "message": decision.message}

    def _all_decided(self, items: list[Interrupt]) -> bool:
        for item in items:
            approval_id = str(item.value["approval_id"])
            if self.run.approvals.get(approval_id) is None:
                try:
                    self.run.wait_for_approval(approval_id, timeout=0, poll_now=True)
                except TimeoutError:
                    return False
        return True

    # -- tool calls (called from inside nodes) ---------------------------------------

    def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        fn: Callable[..., Any],
        *,
        side_effect: SideEffect = "none",
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
        arguments_schema: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        recovery_policy: RecoveryPolicy | None = None,
    ) -> Any:
        task_id = _current_task_id()
        with self._calls.lock:
            index = self._calls.counters.get(task_id, 0)
            self._calls.counters[task_id] = index + 1
        # The same call in the same task at the same epoch has the same id: a node run
        # again after an approval asks the same permit, and finds a result already made.
        seed = f"{self.run.run_id}|{self.run.epoch}|{task_id}|{index}"
        tool_call_id = "lg_" + hashlib.sha256(seed.encode()).hexdigest()[:32]
        with self._calls.lock:
            if tool_call_id in self._calls.results:
                return self._calls.results[tool_call_id]
        open_step = self._open.get(task_id)
        call = self.run.new_tool_call(
            tool,
            dict(arguments),
            side_effect,
            tool_call_id=tool_call_id,
            step_key=open_step.key if open_step else None,
            idempotency_key=idempotency_key,
            recovery_policy=recovery_policy,
            needs_approval=needs_approval,
            summary=summary,
            risk=risk,
            arguments_schema=arguments_schema,
        )
        while not self.run.ask_permit(call, wait=False):
            approval = dict(call.approval or {})
            # Pauses the graph here (checkpointed, no thread held). When it is resumed the
            # node runs again from its start and this call asks again: the server answers the
            # permit with the final arguments, or the rejection (`ApprovalRejected`).
            interrupt(
                {
                    "kind": INTERRUPT_KIND,
                    "approval_id": approval.get("id"),
                    "tool_call_id": tool_call_id,
                    "tool": tool,
                    "arguments": dict(arguments),
                    "summary": summary,
                    "deadline": approval.get("deadline"),
                }
            )
        with self.run.guard(call) as permitted:
            final = permitted.arguments
            result = fn(**final) if isinstance(final, Mapping) else fn(final)
            permitted.result = result
        with self._calls.lock:
            self._calls.results[tool_call_id] = result
        return result

    # -- outcome ---------------------------------------------------------------------

    def _outcome(
        self,
        status: OutcomeStatus,
        state: Any,
        *,
        interrupts: tuple[Interrupt, ...] = (),
        approvals: tuple[Mapping[str, Any], ...] = (),
    ) -> GraphOutcome:
        return GraphOutcome(
            status=status,
            values=state.values,
            interrupts=interrupts,
            approvals=approvals,
            thread_id=self.thread_id,
            checkpoint_id=(state.config or {}).get("configurable", {}).get("checkpoint_id"),
        )


def run_graph(run: AgentRun, graph: Any, input: Any = None, **options: Any) -> GraphOutcome:
    """`SafestopGraph(run, graph, **options).invoke(input)`."""
    return SafestopGraph(run, graph, **options).invoke(input)


def active_graph() -> SafestopGraph:
    """The `SafestopGraph` running the current node; RuntimeError outside one."""
    graph = _ACTIVE.get()
    if graph is None:
        raise RuntimeError(
            "no safestop graph is running: call tools through safestop inside a node of a graph "
            "run by SafestopGraph(run, graph).invoke(...)"
        )
    return graph


def current_token() -> CancelToken:
    """The running run's stop token, for node code that waits or loops: check it often."""
    return active_graph().run.token


def tool_call(
    tool: str,
    arguments: Mapping[str, Any],
    fn: Callable[..., Any],
    *,
    side_effect: SideEffect = "none",
    needs_approval: bool = False,
    summary: str | None = None,
    risk: Risk | None = None,
    arguments_schema: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    recovery_policy: RecoveryPolicy | None = None,
) -> Any:
    """Inside a node: ask a permit (and an approval), run `fn(**arguments)`, report the outcome.

    `fn` gets the final arguments (a reviewer may have edited them). Raises
    `Cancelled` after a stop (the tool never starts), `ApprovalRejected` when
    a reviewer said no (`.message` is theirs: hand it to the model).
    """
    return active_graph().call_tool(
        tool,
        arguments,
        fn,
        side_effect=side_effect,
        needs_approval=needs_approval,
        summary=summary,
        risk=risk,
        arguments_schema=arguments_schema,
        idempotency_key=idempotency_key,
        recovery_policy=recovery_policy,
    )


def safestop_tool(
    fn: F | None = None,
    *,
    name: str | None = None,
    side_effect: SideEffect = "none",
    needs_approval: bool = False,
    summary: str | Callable[[Mapping[str, Any]], str] | None = None,
    risk: Risk | None = None,
    arguments_schema: Mapping[str, Any] | None = None,
    recovery_policy: RecoveryPolicy | None = None,
    idempotency_key: Callable[[Mapping[str, Any]], str] | None = None,
) -> Any:
    """Decorate a tool function so that calling it inside a node goes through `tool_call`.

        @safestop_tool(side_effect="write", needs_approval=True, risk="high",
                       summary=lambda args: f"Refund {args['amount']} EUR")
        def refund(order: str, amount: int) -> str: ...

    Arguments are bound by the function's signature, so positional calls work too.
    """

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        tool_name = name or function.__name__

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            return tool_call(
                tool_name,
                arguments,
                function,
                side_effect=side_effect,
                needs_approval=needs_approval,
                summary=summary(arguments) if callable(summary) else summary,
                risk=risk,
                arguments_schema=arguments_schema,
                idempotency_key=idempotency_key(arguments) if idempotency_key else None,
                recovery_policy=recovery_policy,
            )

        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


def _split_interrupts(state: Any) -> tuple[list[Interrupt], list[Interrupt]]:
    ours: list[Interrupt] = []
    theirs: list[Interrupt] = []
    for task in state.tasks:
        for item in task.interrupts:
            value = item.value
            is_ours = isinstance(value, Mapping) and value.get("kind") == INTERRUPT_KIND
            (ours if is_ours else theirs).append(item)
    return ours, theirs


def _current_task_id() -> str:
    config = get_config()
    namespace = str(
        (config.get("metadata") or {}).get("langgraph_checkpoint_ns")
        or (config.get("configurable") or {}).get("checkpoint_ns")
        or ""
    )
    # "node:<task id>", or "node:<task id>|child:<task id>" inside a subgraph: the top task.
    top = namespace.split("|", 1)[0]
    return top.split(":", 1)[1] if ":" in top else top


def _checkpoint_id_of(label: str | None) -> str | None:
    if label and label.startswith(CHECKPOINT_PREFIX):
        return label[len(CHECKPOINT_PREFIX) :] or None
    return None


def _preview(values: Any) -> Any:
    try:
        text = json.dumps(values, default=str)
    except (TypeError, ValueError):
        return {"repr": repr(values)[:VALUES_PREVIEW_BYTES]}
    if len(text) > VALUES_PREVIEW_BYTES:
        return {"truncated": text[:VALUES_PREVIEW_BYTES]}
    return json.loads(text)


__all__ = [
    "CHECKPOINT_PREFIX",
    "GraphOutcome",
    "SafestopGraph",
    "active_graph",
    "current_token",
    "run_graph",
    "safestop_tool",
    "tool_call",
]
