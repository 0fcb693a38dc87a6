"""Run a compiled LangGraph graph under a safestop lease (`pip install 'safestop-agent[langgraph]'`).

    tools = SafestopToolNode([lookup, send_email], writes={"send_email"}, approvals={"send_email"})
    graph = builder.compile(checkpointer=InMemorySaver())  # any LangGraph checkpointer
    with client.lease(run_id, "worker-1") as run:
        outcome = SafestopGraph(run, graph).invoke({"messages": [...]})
        run.complete(outcome.values)

What the adapter does (DESIGN §9, §10):

- **Each node is a step.** The graph runs with a breakpoint before every node
  (`interrupt_before="*"`), so between two nodes it is paused and checkpointed.
  At each pause the adapter checks the run's stop token, sends `step.started`
  for the nodes about to run (refused after a stop: they never run), resumes,
  and sends `step.completed` (or `step.failed`) once they are done. Step keys
  are `<node>#<langgraph step>`, the same in every process, so a resumed run
  reuses its steps.
- **Tool calls ask for permits.** `SafestopToolNode` (LangGraph's prebuilt
  `ToolNode` with a safestop wrapper around each call), or inside any node
  `tool_call(...)` / a function decorated with `safestop_tool`: a permit is
  asked before the tool runs and its outcome reported after (a write that did
  not finish is `unknown`, never `failed`). A call is named by the model's own
  call id (`ToolCall.id`, the `tool_call_id` of its `ToolMessage`) with the
  lease's epoch; only a call with no id (a plain function called in a node) is
  named by its tool, its arguments and how many identical calls the node made
  before it. A result is kept per call, so a node that
  LangGraph runs again after a resume does not repeat a tool that already ran.
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
  reviewer's message. A decision that is a `void` caused by a stop never
  resumes the graph: it ends as stopped, and the node does not run again.
- **Usage is reported by itself.** Every chat model call made inside the
  graph (`model.invoke`, `ainvoke`, `stream`, in any node) is seen by a
  LangChain callback handler (`UsageCallback`) the adapter adds to the
  graph's config; the call's `usage_metadata` becomes one `usage` event
  (model from the response, step = the node's step), named after LangChain's
  run id so a repeated report counts once. `report_usage=False` turns it off.
- **Sync and async.** `invoke` / `stream` drive `graph.stream`, `ainvoke` /
  `astream` drive `graph.astream` (async nodes, async tools, async
  checkpointers). `stream` / `astream` hand the graph's chunks (in the
  `stream_mode` asked for) to the caller as they come; the outcome is then
  `adapter.outcome`.

Breakpoints a graph was compiled with are replaced by the adapter's; use
`interrupt()` for a graph's own human-in-the-loop (`invoke()` returns an
`interrupted` outcome with those interrupts, and `invoke(Command(resume=...))`
goes on).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langgraph.config import get_config
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Interrupt, interrupt

from ..cancel import Cancelled, CancelToken
from ..errors import REFUSAL_CODES, ApiError, ApprovalRejected, Refused
from ..wire import RecoveryPolicy, Risk, SideEffect
from ..worker import AgentRun, StepKind, ToolCall, describe_error
from . import is_offline

log = logging.getLogger("safestop_agent")

F = TypeVar("F", bound=Callable[..., Any])

CHECKPOINT_PREFIX = "langgraph:"
# Marks the interrupts this adapter raises, so they are told apart from a graph's own.
INTERRUPT_KIND = "safestop.approval"
# What a checkpoint event may carry of the graph's values (the checkpointer has them all).
VALUES_PREVIEW_BYTES = 16_000
# The server's limit on a tool_call_id; a longer framework id is hashed to fit.
TOOL_CALL_ID_MAX = 120

_ACTIVE: contextvars.ContextVar[SafestopGraph | None] = contextvars.ContextVar(
    "safestop_langgraph_active", default=None
)
# Set while `SafestopToolNode` runs a call it already guards: a `safestop_tool` function
# inside it runs as it is, so one call never asks two permits.
_GUARDED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "safestop_langgraph_guarded", default=False
)
_NOTHING: Any = object()
_AUTO: Any = object()

OutcomeStatus = Literal["completed", "waiting_for_approval", "interrupted"]
Summary = str | Callable[[Mapping[str, Any]], str] | None


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
    """Calls without a framework id, per task (named by position); results by call id."""

    counters: dict[str, int] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Async calls that were permitted and still run, by call id (see `acall_tool`).
    running: dict[str, asyncio.Future[Any]] = field(default_factory=dict)


@dataclass
class _Pass:
    """What to do next with the thread: stream `command`, or stop with `outcome`."""

    command: Any = None
    outcome: GraphOutcome | None = None
    waits: list[Interrupt] = field(default_factory=list)
    paused: bool = False  # between two nodes: the nodes about to run are new steps


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
        report_usage: bool = True,
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
        if report_usage:
            base["callbacks"] = _with_handler(base.get("callbacks"), UsageCallback(run, self))
        self._config: dict[str, Any] = base
        self._open: dict[str, _OpenStep] = {}  # task id → the step it reported started
        self._calls = _Calls()
        self.last_checkpoint: str | None = None
        self.outcome: GraphOutcome | None = None

    def step_key_of(self, metadata: Mapping[str, Any]) -> str | None:
        """The step of the node a callback's `metadata` comes from (None outside a node)."""
        namespace = str(metadata.get("langgraph_checkpoint_ns") or "")
        top = namespace.split("|", 1)[0]
        task_id = top.split(":", 1)[1] if ":" in top else top
        open_step = self._open.get(task_id)
        return open_step.key if open_step is not None else None

    # -- running (sync) ----------------------------------------------------------------

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
        for _chunk in self.stream(input, resume_from=resume_from):
            pass
        assert self.outcome is not None
        return self.outcome

    def stream(
        self,
        input: Any = None,
        *,
        resume_from: str | None = _AUTO,
        stream_mode: Any = "updates",
        subgraphs: bool = False,
    ) -> Iterator[Any]:
        """`invoke()` that yields the graph's chunks (`graph.stream(..., stream_mode=...)`).

        The adapter's own pauses (its breakpoints, its approval interrupts) are
        not passed on. When the iteration ends, `self.outcome` says how.
        """
        active = _ACTIVE.set(self)
        try:
            config = self._start_config(resume_from, self.graph.get_state(self._config))
            pending = input
            while True:
                step = self._plan(self.graph.get_state(config), input, pending)
                pending = _NOTHING
                if step.outcome is not None:
                    self.outcome = step.outcome
                    return
                if step.waits:
                    step.command = Command(resume={w.id: self._await(w) for w in step.waits})
                self.run.token.raise_if_cancelled()  # the node boundary: nothing after a stop
                if step.paused:
                    self._start_steps(self.graph.get_state(config))
                self._reset_positions()
                try:
                    for chunk in self.graph.stream(
                        step.command,
                        config,
                        interrupt_before="*",
                        stream_mode=stream_mode,
                        subgraphs=subgraphs,
                    ):
                        if not _is_adapter_chunk(chunk):
                            yield chunk
                except Cancelled:
                    raise
                except Exception as error:
                    self._settle_steps(self.graph.get_state(self._config), error=error)
                    raise
                config = self._config  # a fork from an older checkpoint happens once
                self._settle_steps(self.graph.get_state(config), error=None)
        except Cancelled:
            self._stopped(self.graph.get_state(self._config))
            raise
        finally:
            _reset(_ACTIVE, active)

    # -- running (async) ---------------------------------------------------------------

    async def ainvoke(self, input: Any = None, *, resume_from: str | None = _AUTO) -> GraphOutcome:
        """`invoke()` for async graphs (async nodes and tools, async checkpointers)."""
        async for _chunk in self.astream(input, resume_from=resume_from):
            pass
        assert self.outcome is not None
        return self.outcome

    async def astream(
        self,
        input: Any = None,
        *,
        resume_from: str | None = _AUTO,
        stream_mode: Any = "updates",
        subgraphs: bool = False,
    ) -> AsyncIterator[Any]:
        """`stream()` on `graph.astream`: the adapter's HTTP calls run off the event loop."""
        active = _ACTIVE.set(self)
        try:
            config = await asyncio.to_thread(
                self._start_config, resume_from, await self.graph.aget_state(self._config)
            )
            pending = input
            while True:
                step = self._plan(await self.graph.aget_state(config), input, pending)
                pending = _NOTHING
                if step.outcome is not None:
                    self.outcome = step.outcome
                    return
                if step.waits:
                    decided = {w.id: await asyncio.to_thread(self._await, w) for w in step.waits}
                    step.command = Command(resume=decided)
                self.run.token.raise_if_cancelled()
                if step.paused:
                    state = await self.graph.aget_state(config)
                    await asyncio.to_thread(self._start_steps, state)
                self._reset_positions()
                try:
                    async for chunk in self.graph.astream(
                        step.command,
                        config,
                        interrupt_before="*",
                        stream_mode=stream_mode,
                        subgraphs=subgraphs,
                    ):
                        if not _is_adapter_chunk(chunk):
                            yield chunk
                except Cancelled:
                    raise
                except Exception as error:
                    state = await self.graph.aget_state(self._config)
                    await asyncio.to_thread(self._settle_steps, state, error=error)
                    raise
                config = self._config
                state = await self.graph.aget_state(config)
                await asyncio.to_thread(self._settle_steps, state, error=None)
        except (Cancelled, asyncio.CancelledError) as error:
            if isinstance(error, Cancelled) or self.run.token.cancelled:
                state = await self.graph.aget_state(self._config)
                await asyncio.to_thread(self._stopped, state)
            raise
        finally:
            _reset(_ACTIVE, active)

    # -- one pass ----------------------------------------------------------------------

    def _plan(self, state: Any, input: Any, pending: Any) -> _Pass:
        """From the thread's state: the command to stream next, approvals to wait for, or the end."""
        if isinstance(pending, Command):
            return _Pass(command=pending)
        if not state.next:
            if pending is _NOTHING or (pending is None and input is None):
                return _Pass(outcome=self._outcome("completed", state))
            return _Pass(command=pending)  # a new pass: LangGraph pauses before the first node
        ours, theirs = _split_interrupts(state)
        if theirs:
            return _Pass(outcome=self._outcome("interrupted", state, interrupts=tuple(theirs)))
        if ours and not self.wait_for_approvals and not self._all_decided(ours):
            approvals = tuple(dict(item.value) for item in ours)
            return _Pass(outcome=self._outcome("waiting_for_approval", state, approvals=approvals))
        return _Pass(command=None, waits=ours, paused=True)

    def _start_config(self, resume_from: str | None, latest: Any) -> dict[str, Any]:
        if resume_from is _AUTO:
            resume_from = self._run_resume_from()
        checkpoint_id = _checkpoint_id_of(resume_from)
        if checkpoint_id is None:
            return self._config
        if latest.config and latest.config["configurable"].get("checkpoint_id") == checkpoint_id:
            return self._config
        forked = dict(self._config)
        forked["configurable"] = {**self._config["configurable"], "checkpoint_id": checkpoint_id}
        try:
            found = self.graph.checkpointer.get_tuple(forked)
        except NotImplementedError:  # an async-only checkpointer: take the label on trust
            return forked
        except Exception:  # an id this checkpointer does not know
            found = None
        if found is None:
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

    def _reset_positions(self) -> None:
        with self._calls.lock:
            self._calls.counters.clear()  # a node run again calls its tools in the same order

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

    def _stopped(self, state: Any) -> None:
        """After a stop: close the open steps as cancelled and report the checkpoint."""
        reason = f"interrupted by stop ({self.run.token.reason})"
        try:
            self._settle_steps(state, error=None, stopping=True)
        except Exception as error:
            log.warning("safestop: steps not settled at stop: %r", error)
        for task_id in list(self._open):
            self._step_failed(task_id, reason, cancelled=True)
        try:
            self.report_checkpoint(state)
        except Exception as error:  # the stop itself must go on: the drain follows
            log.warning("safestop: checkpoint not reported at stop: %r", error)

    def report_checkpoint(self, state: Any = None) -> str | None:
        """Send the thread's latest checkpoint as `checkpoint.saved`; return its label."""
        if state is None:
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
        if decision.status == "void":
            # A stop voids the waiting approvals, and the void may be heard before the stop:
            # resuming now would run the node again after the stop.
            self.run.raise_if_void_stopped()
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

    def _identity(self, tool_call_id: str | None, tool: str, arguments: Mapping[str, Any]) -> str:
        """The permit's `tool_call_id`: the framework's call id at this epoch, else a position.

        The framework's id names the call whatever order parallel calls run in.
        A call without one is named by what it asks (tool and arguments) and how
        many same asks the task made before it: calls that run in parallel in
        one node can then never trade ids (only identical asks share a counter,
        and trading those changes nothing).
        """
        if tool_call_id:
            named = f"{tool_call_id}.e{self.run.epoch}"
            if len(named) <= TOOL_CALL_ID_MAX:
                return named
            return "lg_" + hashlib.sha256(named.encode()).hexdigest()[:40]
        task_id = _current_task_id()
        what = json.dumps([tool, arguments], sort_keys=True, default=str)
        ask = f"{task_id}|{hashlib.sha256(what.encode()).hexdigest()}"
        with self._calls.lock:
            index = self._calls.counters.get(ask, 0)
            self._calls.counters[ask] = index + 1
        # The same ask in the same task at the same epoch has the same id: a node run
        # again after an approval asks the same permit, and finds a result already made.
        seed = f"{self.run.run_id}|{self.run.epoch}|{ask}|{index}"
        return "lg_" + hashlib.sha256(seed.encode()).hexdigest()[:32]

    def _new_call(self, tool: str, arguments: Mapping[str, Any], call_id: str, **options: Any):  # type: ignore[no-untyped-def]
        open_step = self._open.get(_current_task_id())
        return self.run.new_tool_call(
            tool,
            dict(arguments),
            options.pop("side_effect", "none"),
            tool_call_id=call_id,
            step_key=open_step.key if open_step else None,
            **options,
        )

    def _pause_for(self, call: ToolCall, arguments: Mapping[str, Any]) -> None:
        approval = dict(call.approval or {})
        # Pauses the graph here (checkpointed, no thread held). When it is resumed the
        # node runs again from its start and this call asks again: the server answers the
        # permit with the final arguments, or the rejection (`ApprovalRejected`).
        interrupt(
            {
                "kind": INTERRUPT_KIND,
                "approval_id": approval.get("id"),
                "tool_call_id": call.tool_call_id,
                "tool": call.tool,
                "arguments": dict(arguments),
                "summary": call.summary,
                "deadline": approval.get("deadline"),
            }
        )

    def _cached(self, call_id: str) -> Any:
        with self._calls.lock:
            return self._calls.results.get(call_id, _NOTHING)

    def _keep(self, call_id: str, result: Any) -> None:
        with self._calls.lock:
            self._calls.results[call_id] = result

    def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        fn: Callable[..., Any],
        *,
        tool_call_id: str | None = None,
        failed: Callable[[Any], str | None] | None = None,
        **options: Any,
    ) -> Any:
        """Ask the permit (an approval wait is an `interrupt()`), run `fn`, report the outcome.

        `failed(result)` names a result that is really a failure (a tool error the
        framework turned into a message): the outcome is then `failed` (`unknown`
        for a write), with that text as the observation.
        """
        call_id = self._identity(tool_call_id, tool, arguments)
        done = self._cached(call_id)
        if done is not _NOTHING:
            return done
        call = self._new_call(tool, arguments, call_id, **options)
        while not self.run.ask_permit(call, wait=False):
            self._pause_for(call, arguments)
        with self.run.guard(call) as permitted:
            result = _apply(fn, permitted.arguments)
            _record(permitted, result, failed)
        self._keep(call_id, result)
        return result

    async def acall_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        fn: Callable[..., Awaitable[Any]],
        *,
        tool_call_id: str | None = None,
        failed: Callable[[Any], str | None] | None = None,
        **options: Any,
    ) -> Any:
        """`call_tool` for an async tool: the HTTP calls run off the event loop.

        A permitted call runs in a task of its own, shielded: when a sibling call
        of the same node interrupts for an approval, LangGraph abandons the node's
        other calls, and the node run again after the decision must find this one
        (running or done), never start it a second time.
        """
        call_id = self._identity(tool_call_id, tool, arguments)
        done = self._cached(call_id)
        if done is not _NOTHING:
            return done
        loop = asyncio.get_running_loop()
        with self._calls.lock:
            running = self._calls.running.get(call_id)
        if running is not None and running.get_loop() is loop:
            return await asyncio.shield(running)
        call = self._new_call(tool, arguments, call_id, **options)
        while not await asyncio.to_thread(self.run.ask_permit, call, wait=False):
            self._pause_for(call, arguments)
        task = asyncio.ensure_future(self._arun(call, fn, failed))
        with self._calls.lock:
            self._calls.running[call_id] = task
        return await asyncio.shield(task)

    async def _arun(self, call: ToolCall, fn: Callable[..., Awaitable[Any]], failed: Any) -> Any:
        try:
            result = await _apply(fn, call.arguments)
        except BaseException as error:  # a stop, a crash: reported as it is
            self._forget_running(call.tool_call_id)
            await asyncio.to_thread(self.run.report_outcome, call, error)
            raise
        _record(call, result, failed)
        self._keep(call.tool_call_id, result)  # kept before it stops counting as running
        self._forget_running(call.tool_call_id)
        await asyncio.to_thread(self.run.report_outcome, call, None)
        return result

    def _forget_running(self, call_id: str) -> None:
        with self._calls.lock:
            self._calls.running.pop(call_id, None)

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
            "run by SafestopGraph(run, graph).invoke(...) (or .ainvoke / .stream / .astream), "
            "or inside `with safestop_agent.integrations.offline():` to run them unguarded "
            "in a test"
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
    tool_call_id: str | None = None,
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
    a reviewer said no (`.message` is theirs: hand it to the model). Pass the
    model's call id as `tool_call_id` when there is one; without it the call
    is named by its position in the node.
    """
    if _GUARDED.get() or (_ACTIVE.get() is None and is_offline()):
        return _apply(fn, arguments)
    return active_graph().call_tool(
        tool,
        arguments,
        fn,
        tool_call_id=tool_call_id,
        side_effect=side_effect,
        needs_approval=needs_approval,
        summary=summary,
        risk=risk,
        arguments_schema=arguments_schema,
        idempotency_key=idempotency_key,
        recovery_policy=recovery_policy,
    )


async def atool_call(
    tool: str,
    arguments: Mapping[str, Any],
    fn: Callable[..., Awaitable[Any]],
    *,
    tool_call_id: str | None = None,
    side_effect: SideEffect = "none",
    needs_approval: bool = False,
    summary: str | None = None,
    risk: Risk | None = None,
    arguments_schema: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    recovery_policy: RecoveryPolicy | None = None,
) -> Any:
    """`tool_call` for an async `fn`, inside an async node."""
    if _GUARDED.get() or (_ACTIVE.get() is None and is_offline()):
        return await _apply(fn, arguments)
    return await active_graph().acall_tool(
        tool,
        arguments,
        fn,
        tool_call_id=tool_call_id,
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
    summary: Summary = None,
    risk: Risk | None = None,
    arguments_schema: Mapping[str, Any] | None = None,
    recovery_policy: RecoveryPolicy | None = None,
    idempotency_key: Callable[[Mapping[str, Any]], str] | None = None,
) -> Any:
    """Decorate a tool function so that calling it inside a node goes through `tool_call`.

        @safestop_tool(side_effect="write", needs_approval=True, risk="high",
                       summary=lambda args: f"Refund {args['amount']} EUR")
        def refund(order: str, amount: int) -> str: ...

    Arguments are bound by the function's signature, so positional calls work
    too; an `async def` becomes an async tool (`atool_call`). For the tools of
    a model, give the plain tools to `SafestopToolNode` instead: it names each
    call by the model's call id.
    """

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        tool_name = name or function.__name__

        def options(arguments: Mapping[str, Any]) -> dict[str, Any]:
            return {
                "side_effect": side_effect,
                "needs_approval": needs_approval,
                "summary": summary(arguments) if callable(summary) else summary,
                "risk": risk,
                "arguments_schema": arguments_schema,
                "idempotency_key": idempotency_key(arguments) if idempotency_key else None,
                "recovery_policy": recovery_policy,
            }

        def bind(args: Any, kwargs: Any) -> dict[str, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments)

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                arguments = bind(args, kwargs)
                return await atool_call(tool_name, arguments, function, **options(arguments))

            return cast(F, async_wrapper)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            arguments = bind(args, kwargs)
            return tool_call(tool_name, arguments, function, **options(arguments))

        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


# -- ToolNode ------------------------------------------------------------------------------


def default_rejection_output(error: ApprovalRejected) -> str:
    """What the model reads when a reviewer did not approve the call."""
    reason = error.message or "no reason given"
    if error.status == "expired":
        return f"Not done: no reviewer approved this call in time ({reason})."
    return f"Not done: a reviewer rejected this call. Reviewer's message: {reason}"


class SafestopToolNode(ToolNode):  # type: ignore[misc]
    """LangGraph's prebuilt `ToolNode` whose every call asks a safestop permit first.

        tools = SafestopToolNode([lookup, send_email], writes={"send_email"},
                                 approvals={"send_email"}, risk={"send_email": "high"})

    Give it the plain tools (`@tool` functions, `BaseTool`s or callables, as
    `ToolNode` takes them). Each call is named by the model's call id, so
    parallel calls never trade permits or arguments, whatever order they run
    in. `writes` names the tools with side effects (an unfinished call is
    `unknown`; they get `recovery_policy`), `approvals` those a reviewer must
    approve (a team rule may add others). A rejection goes back to the model
    as the call's `ToolMessage` (`rejection_output`), not as an error; a stop
    ends the node with `Cancelled` (never a tool error message for the model).
    Names in `writes`, `approvals`, `risk` or `summaries` that match no tool
    raise `ValueError`. Other keyword arguments go to `ToolNode`.
    """

    def __init__(
        self,
        tools: Iterable[Any],
        *,
        writes: Iterable[str] = (),
        approvals: Iterable[str] = (),
        risk: Mapping[str, Risk] | None = None,
        summaries: Mapping[str, Summary] | None = None,
        recovery_policy: RecoveryPolicy | None = "manual_confirmation",
        rejection_output: Callable[[ApprovalRejected], str] = default_rejection_output,
        handle_tool_errors: Any = _AUTO,
        wrap_tool_call: Callable[..., Any] | None = None,
        awrap_tool_call: Callable[..., Any] | None = None,
        **tool_node_options: Any,
    ) -> None:
        super().__init__(
            list(tools),
            handle_tool_errors=_stop_aware(
                _TOOL_NODE_DEFAULT_ERRORS if handle_tool_errors is _AUTO else handle_tool_errors
            ),
            wrap_tool_call=self._guard,
            awrap_tool_call=self._aguard,
            **tool_node_options,
        )
        self.writes, self.approvals = set(writes), set(approvals)
        self.risk, self.summaries = dict(risk or {}), dict(summaries or {})
        known = set(self.tools_by_name)
        named = self.writes | self.approvals | set(self.risk) | set(self.summaries)
        if named - known:
            raise ValueError(
                f"SafestopToolNode: no tool named {sorted(named - known)}; "
                f"its tools are {sorted(known)}"
            )
        self.recovery_policy = recovery_policy
        self.rejection_output = rejection_output
        self._inner, self._ainner = wrap_tool_call, awrap_tool_call

    def _options(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        summary = self.summaries.get(name)
        is_write = name in self.writes
        return {
            "side_effect": "write" if is_write else "none",
            "needs_approval": name in self.approvals,
            "summary": summary(arguments) if callable(summary) else summary,
            "risk": self.risk.get(name),
            "recovery_policy": self.recovery_policy if is_write else None,
        }

    def _rejected(self, request: Any, error: ApprovalRejected) -> ToolMessage:
        call = request.tool_call
        return ToolMessage(
            content=self.rejection_output(error),
            name=call["name"],
            tool_call_id=call["id"],
            status="error",
        )

    def _guard(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        inner = self._inner
        run_it = execute if inner is None else (lambda req: inner(req, execute))
        graph = _ACTIVE.get()
        if graph is None:
            if not is_offline():
                active_graph()  # raises: a guarded tool never runs unguarded by accident
            return run_it(request)
        call = request.tool_call
        arguments = dict(call.get("args") or {})

        def body(**final: Any) -> Any:
            guarded = _GUARDED.set(True)
            try:
                return run_it(_with_arguments(request, final))
            finally:
                _GUARDED.reset(guarded)

        try:
            return graph.call_tool(
                call["name"],
                arguments,
                body,
                tool_call_id=call.get("id"),
                failed=_error_of_message,
                **self._options(call["name"], arguments),
            )
        except ApprovalRejected as error:
            return self._rejected(request, error)

    async def _aguard(self, request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        inner = self._ainner
        run_it = execute if inner is None else (lambda req: inner(req, execute))
        graph = _ACTIVE.get()
        if graph is None:
            if not is_offline():
                active_graph()  # raises: a guarded tool never runs unguarded by accident
            return await run_it(request)
        call = request.tool_call
        arguments = dict(call.get("args") or {})

        async def body(**final: Any) -> Any:
            guarded = _GUARDED.set(True)
            try:
                return await run_it(_with_arguments(request, final))
            finally:
                _GUARDED.reset(guarded)

        try:
            return await graph.acall_tool(
                call["name"],
                arguments,
                body,
                tool_call_id=call.get("id"),
                failed=_error_of_message,
                **self._options(call["name"], arguments),
            )
        except ApprovalRejected as error:
            return self._rejected(request, error)


# What `ToolNode` does with a tool's exception when not told otherwise.
_TOOL_NODE_DEFAULT_ERRORS = (
    inspect.signature(ToolNode.__init__).parameters["handle_tool_errors"].default
)


def _stop_aware(flag: Any) -> Callable[[Exception], str]:
    """`ToolNode`'s `handle_tool_errors`, except that a stop is never a message for the model.

    `ToolNode` turns a tool's exception into an error `ToolMessage` and goes
    on; `Cancelled` must end the node instead, so the graph stops there and
    the node runs again on resume.
    """
    from langgraph.prebuilt.tool_node import _handle_tool_error, _infer_handled_types

    if isinstance(flag, type) and issubclass(flag, Exception):
        handled: tuple[type[Exception], ...] = (flag,)
    elif isinstance(flag, tuple):
        handled = flag
    elif callable(flag):
        handled = _infer_handled_types(flag)
    else:
        handled = (Exception,)

    def handle(e: Exception) -> str:
        if isinstance(e, Cancelled) or not flag or not isinstance(e, handled):
            raise e
        return str(_handle_tool_error(e, flag=True if isinstance(flag, type | tuple) else flag))

    return handle


def _with_arguments(request: Any, arguments: Mapping[str, Any]) -> Any:
    """The request with the final (possibly reviewer-edited) arguments."""
    call = request.tool_call
    if dict(call.get("args") or {}) == dict(arguments):
        return request
    return request.override(tool_call={**call, "args": dict(arguments)})


def _error_of_message(result: Any) -> str | None:
    if isinstance(result, ToolMessage) and result.status == "error":
        return str(result.content)
    return None


def _apply(fn: Callable[..., Any], arguments: Any) -> Any:
    return fn(**arguments) if isinstance(arguments, Mapping) else fn(arguments)


def _record(call: ToolCall, result: Any, failed: Callable[[Any], str | None] | None) -> None:
    problem = failed(result) if failed is not None else None
    if problem is None:
        call.result = result
        return
    call.observe(problem)
    call.set_execution_state("unknown" if call.side_effect == "write" else "failed")


# LangChain's provider names (`ls_provider`) that the price table knows by another name
# (OpenTelemetry's `gen_ai.system`); a provider not listed is left out and the model's name
# alone prices the call, as an unknown provider would leave it unpriced.
_PROVIDERS = {
    "openai": "openai",
    "azure": "azure",
    "anthropic": "anthropic",
    "google_genai": "google",
    "google_vertexai": "google",
    "google_anthropic_vertex": "google",
    "amazon_bedrock": "aws",
    "bedrock": "aws",
    "bedrock_converse": "aws",
    "groq": "groq",
    "mistral": "mistral",
    "mistralai": "mistral",
    "deepseek": "deepseek",
    "cohere": "cohere",
    "together": "together",
    "fireworks": "fireworks",
    "xai": "x-ai",
    "perplexity": "perplexity",
}


class UsageCallback(BaseCallbackHandler):
    """A LangChain callback handler that reports each chat model call's tokens to the run.

    `SafestopGraph` adds one to the graph's config, so every chat model a node calls
    (sync or async, invoked or streamed) reports its `usage_metadata` as one `usage`
    event with no code in the node. Outside a graph, pass it yourself:
    `model.invoke(messages, config={"callbacks": [UsageCallback(run)]})`.

    A call without `usage_metadata` (a provider that did not say) reports nothing. The
    event's id is derived from LangChain's run id for the call, so a report sent twice
    counts once. A report that fails is logged, never raised into the model call.
    """

    # Called in an executor thread for async models: the report is a blocking HTTP call.
    run_inline = False
    raise_error = False

    def __init__(self, run: AgentRun, graph: SafestopGraph | None = None) -> None:
        self.run = run
        self.graph = graph
        self._calls: dict[UUID, tuple[str | None, str | None, str | None]] = {}
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        metadata: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        metadata = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = metadata.get("ls_model_name") or params.get("model") or params.get("model_name")
        provider = _PROVIDERS.get(str(metadata.get("ls_provider") or "").lower())
        step = self.graph.step_key_of(metadata) if self.graph is not None else None
        with self._lock:
            self._calls[run_id] = (str(model) if model else None, provider, step)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            model, provider, step = self._calls.pop(run_id, (None, None, None))
        generations = [g for batch in (response.generations or []) for g in batch]
        for index, generation in enumerate(generations):
            message = getattr(generation, "message", None)
            usage = getattr(message, "usage_metadata", None)
            if not usage:
                continue
            said = getattr(message, "response_metadata", None) or {}
            # The response names the model that answered (often a dated version): it wins.
            name = said.get("model_name") or said.get("model") or said.get("model_id") or model
            details = usage.get("input_token_details") or {}
            try:
                self.run.report_usage(
                    model=str(name or "unknown"),
                    provider=provider,
                    input_tokens=int(usage.get("input_tokens") or 0),
                    output_tokens=int(usage.get("output_tokens") or 0),
                    cache_read_tokens=details.get("cache_read") or None,
                    cache_write_tokens=details.get("cache_creation") or None,
                    step_key=step,
                    event_id=f"evt_usage_{run_id.hex}_{index}",
                )
            except Exception as error:  # the model call itself must go on
                log.warning("safestop: usage of a %s call not reported: %r", name, error)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._calls.pop(run_id, None)


def _with_handler(callbacks: Any, handler: BaseCallbackHandler) -> Any:
    """The config's `callbacks` (a list, a manager, or none) with `handler` added."""
    if callbacks is None:
        return [handler]
    if isinstance(callbacks, list | tuple):
        return [*callbacks, handler]
    manager = callbacks.copy()
    manager.add_handler(handler, inherit=True)
    return manager


def _is_adapter_chunk(chunk: Any) -> bool:
    """A chunk that only says the graph paused at the adapter's breakpoint or approval wait."""
    data = chunk[-1] if isinstance(chunk, tuple) else chunk
    if not isinstance(data, Mapping) or set(data) != {"__interrupt__"}:
        return False
    return all(
        isinstance(item.value, Mapping) and item.value.get("kind") == INTERRUPT_KIND
        for item in data["__interrupt__"]
    )


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


def _reset(var: contextvars.ContextVar[Any], token: contextvars.Token[Any]) -> None:
    try:
        var.reset(token)
    except ValueError:  # a generator closed from another context: nothing to restore there
        pass


__all__ = [
    "CHECKPOINT_PREFIX",
    "GraphOutcome",
    "SafestopGraph",
    "SafestopToolNode",
    "UsageCallback",
    "active_graph",
    "atool_call",
    "current_token",
    "default_rejection_output",
    "run_graph",
    "safestop_tool",
    "tool_call",
]
