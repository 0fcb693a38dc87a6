"""OpenAI Agents SDK runs under a safestop lease (`pip install 'safestop-agent[openai-agents]'`).

    agent = Agent(name="support", tools=[lookup_order, refund], model=...)
    with client.lease(run_id, "worker-1") as run:
        agent = guard_agent(agent, writes={"refund"}, approvals={"refund"})
        result = run_agent_sync(run, agent, "Refund order 1042")
        run.complete({"answer": result.final_output})

What the adapter does (DESIGN §9, §10):

- **Function tools ask for permits.** `safestop_tool(tool, ...)` (or
  `guard_agent(agent, ...)` for all of an agent's function tools) returns a
  copy whose invocation asks a permit before the tool runs and reports its
  outcome after: `succeeded` with the output, `failed`, or `unknown` for a
  write that did not finish (a stop, a crash) — never `failed`. Each call is
  a step (`<tool>#<n>`). The permit's `tool_call_id` is the model's call id
  with the lease's epoch (`<call_id>.e<epoch>`).
- **Approvals.** A tool marked `needs_approval` (here, or the SDK's own flag,
  which the copy hands to safestop instead), or matched by a team rule (the
  permit answers 202), waits for a reviewer; the tool then runs with the
  final, possibly edited, arguments. A rejection (or expiry) is not an error:
  the reviewer's message goes back to the model as the tool's output
  (`rejection_output`), so it can change course. With
  `approval_flow="interrupt"` the wait is the SDK's own interruption
  instead: the run returns with `result.interruptions`, and `resume_agent`
  goes on from the saved `RunState` with the reviewer's decisions.
- **The whole agent graph.** `guard_agent` copies every agent reachable by
  handoffs and `as_tool`, and refuses tool names that match no tool.
- **A stop cancels the run.** `run_agent` / `run_agent_sync` cancel the SDK's
  run task the moment the run's token is set (push or heartbeat), and
  `run_agent_streamed` calls `RunResultStreaming.cancel()`; a tool in flight
  is reported (`unknown` for a write), and `SafestopHooks` refuse every new
  model call or tool after the stop. The caller sees `Cancelled`, which the
  lease block turns into `drained`.
- **Each model call is a step** (`model#<n>`) reported by `SafestopHooks`,
  which wrap the caller's own `RunHooks`.
- **Usage is reported by itself.** Each model response's `usage` becomes one
  `usage` event (`on_llm_end`; the step is the model call's): the top agent's
  through `SafestopHooks`, and those of agents run as tools (their own
  `Runner.run`) through the `AgentHooks` that `guard_agent` gives each copy.
  The model is the run config's, else the agent's (a name, or a `Model`'s
  `.model`); a response with a `response_id` is named by it, so a repeated
  report counts once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import threading
import types
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Literal, cast

from agents import Agent, AgentHooks, FunctionTool, Handoff, RunHooks, Runner
from agents.result import RunResult, RunResultStreaming
from agents.run_state import RunState
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext

from ..cancel import Cancelled
from ..errors import REFUSAL_CODES, ApprovalRejected, Refused
from ..wire import RecoveryPolicy, Risk, SideEffect
from ..worker import AgentRun, ToolCall
from . import is_offline

log = logging.getLogger("safestop_agent")

_ACTIVE: contextvars.ContextVar[AgentRun | None] = contextvars.ContextVar(
    "safestop_openai_agents_run", default=None
)

Summary = str | Callable[[Mapping[str, Any]], str] | None
ApprovalFlow = Literal["wait", "interrupt"]


def default_rejection_output(error: ApprovalRejected) -> str:
    """What the model reads when a reviewer did not approve the call."""
    reason = error.message or "no reason given"
    if error.status == "expired":
        return f"Not done: no reviewer approved this call in time ({reason})."
    return f"Not done: a reviewer rejected this call. Reviewer's message: {reason}"


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def next(self, name: str) -> int:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            return self._counts[name]


_STEPS = contextvars.ContextVar[_Counter | None]("safestop_openai_agents_steps", default=None)


def _counter() -> _Counter:
    counter = _STEPS.get()
    if counter is None:
        counter = _Counter()
        _STEPS.set(counter)
    return counter


def _run_in_context(context: Any) -> bool:
    candidate: Any = getattr(context, "context", None)
    return isinstance(candidate, AgentRun) or isinstance(
        getattr(candidate, "safestop_run", None), AgentRun
    )


def active_run(context: Any = None) -> AgentRun:
    """The leased run a tool or hook belongs to: the one `run_agent*` set, or the run context."""
    run = _ACTIVE.get()
    if run is None:
        candidate: Any = getattr(context, "context", None)
        nested: Any = getattr(candidate, "safestop_run", None)
        if isinstance(candidate, AgentRun):
            run = candidate
        elif isinstance(nested, AgentRun):
            run = nested
    if run is None:
        raise RuntimeError(
            "no safestop run: run the agent with run_agent / run_agent_sync / "
            "run_agent_streamed, or pass the AgentRun as the run context (or, in a test, "
            "inside `with safestop_agent.integrations.offline():` to run tools unguarded)"
        )
    return run


async def _event(run: AgentRun, type: str, **fields: Any) -> None:
    """Start a step (refused after a stop → `Cancelled`) or report a fact."""
    answer = await asyncio.to_thread(run.event, type, **fields)
    if type == "step.started":
        if answer.get("status") == "rejected" and answer.get("code") in REFUSAL_CODES:
            raise run._refused(
                Refused(409, str(answer.get("code")), "step.started rejected", answer)
            )


async def _fact(run: AgentRun, type: str, **fields: Any) -> None:
    try:
        await asyncio.to_thread(run.event, type, **fields)
    except Exception as error:  # a fact that cannot be sent must not end the run
        log.warning("safestop: %s not reported: %r", type, error)


def safestop_tool(
    tool: FunctionTool,
    *,
    side_effect: SideEffect = "none",
    needs_approval: bool | None = None,
    summary: Summary = None,
    risk: Risk | None = None,
    arguments_schema: Mapping[str, Any] | None = None,
    recovery_policy: RecoveryPolicy | None = None,
    idempotency_key: Callable[[Mapping[str, Any]], str] | None = None,
    rejection_output: Callable[[ApprovalRejected], Any] = default_rejection_output,
    approval_flow: ApprovalFlow = "wait",
) -> FunctionTool:
    """A copy of `tool` whose every call asks a safestop permit first (see the module docstring).

    `needs_approval=None` takes the tool's own SDK flag (a bool, or the SDK's
    async policy `(run_context, arguments, call_id) -> bool`). With
    `approval_flow="wait"` the copy's SDK flag is off and a call a reviewer
    must approve waits inside the tool. With `approval_flow="interrupt"` the
    permit is asked by the copy's SDK `needs_approval` policy instead: a call
    held for a reviewer becomes one of the SDK's own interruptions (the run
    returns with `result.interruptions`; save `result.to_state()`), and
    `resume_agent` answers them with the reviewer's decisions and goes on.
    """
    original_invoke = tool.on_invoke_tool
    # A tool made by `function_tool` turns a body's exception into a message for the model
    # before we could see it; call underneath that, so a stop or crash is reported as it is,
    # and give the model the same message afterwards.
    invoke_body = getattr(original_invoke, "_invoke_tool_impl", None) or original_invoke
    policy: Any = tool.needs_approval if needs_approval is None else needs_approval

    async def asks(ctx: ToolContext[Any], arguments: Mapping[str, Any]) -> bool:
        if callable(policy):
            decided = policy(ctx, dict(arguments), ctx.tool_call_id)
            return bool(await decided) if inspect.isawaitable(decided) else bool(decided)
        return bool(policy)

    async def sdk_policy(context: Any, arguments: Mapping[str, Any], call_id: str) -> bool:
        """The SDK asks whether the call needs approval: it does when the permit waits."""
        run = active_run(context)
        run.token.raise_if_cancelled()
        call = run.new_tool_call(
            tool.name,
            dict(arguments),
            side_effect,
            tool_call_id=f"{call_id}.e{run.epoch}"[-120:],
            idempotency_key=idempotency_key(arguments) if idempotency_key else None,
            recovery_policy=recovery_policy,
            needs_approval=await asks(context, arguments),
            summary=summary(arguments) if callable(summary) else summary,
            risk=risk,
            arguments_schema=arguments_schema,
        )
        try:
            granted = await asyncio.to_thread(run.ask_permit, call, wait=False)
        except ApprovalRejected:
            return False  # already decided no: the tool call answers the model with it
        return not granted

    async def on_invoke_tool(ctx: ToolContext[Any], raw_arguments: str) -> Any:
        if is_offline() and _ACTIVE.get() is None and not _run_in_context(ctx):
            return await original_invoke(ctx, raw_arguments)  # a test: unguarded on purpose
        run = active_run(ctx)
        run.token.raise_if_cancelled()
        arguments = json.loads(raw_arguments) if raw_arguments else {}
        call_id = f"{ctx.tool_call_id}.e{run.epoch}"[-120:]
        step_key = f"{tool.name}#{_counter().next(tool.name)}"
        await _event(
            run,
            "step.started",
            key=step_key,
            name=f"tool {tool.name}",
            kind="tool_write" if side_effect == "write" else "tool_read",
        )
        call = run.new_tool_call(
            tool.name,
            arguments,
            side_effect,
            tool_call_id=call_id,
            step_key=step_key,
            idempotency_key=idempotency_key(arguments) if idempotency_key else None,
            recovery_policy=recovery_policy,
            needs_approval=await asks(ctx, arguments),
            summary=summary(arguments) if callable(summary) else summary,
            risk=risk,
            arguments_schema=arguments_schema,
        )
        try:
            # Blocking (an approval may take minutes), so off the event loop; a stop wakes it.
            await asyncio.to_thread(run.ask_permit, call)
        except ApprovalRejected as rejected:
            await _fact(run, "step.completed", key=step_key, detail=f"approval {rejected.status}")
            return rejection_output(rejected)
        except BaseException as error:
            await _fact(run, "step.failed", key=step_key, error=str(error), cancelled=True)
            raise
        output = await _run_body(run, call, ctx, invoke_body, tool)
        await _fact(run, "step.completed", key=step_key)
        return output

    flag: Any = sdk_policy if approval_flow == "interrupt" else False
    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=flag)


async def _report(run: AgentRun, call: ToolCall, error: BaseException | None) -> None:
    """`run.report_outcome` off the event loop (it is a blocking HTTP call, retried).

    Shielded: when the stop cancels the run's task while the report is on its way, the
    report still goes out (the thread finishes it) and the cancellation goes on.
    """
    # Handed to a thread at once (a task could be cancelled before it started).
    report = asyncio.get_running_loop().run_in_executor(None, run.report_outcome, call, error)
    await asyncio.shield(report)


async def _run_body(
    run: AgentRun, call: ToolCall, ctx: ToolContext[Any], invoke_body: Any, tool: FunctionTool
) -> Any:
    try:
        output = await invoke_body(ctx, json.dumps(call.arguments))
    except Exception as error:
        # A stop inside the body, or a crash: `unknown` for a write, `failed` otherwise.
        await _report(run, call, error)
        if isinstance(error, Cancelled) or run.token.cancelled:
            raise
        return default_tool_error_function(ctx, error)
    except BaseException as error:  # the run task cancelled by the stop while the tool ran
        await _report(run, call, error)
        raise
    call.result = output
    await _report(run, call, None)
    return output


def guard_agent(
    agent: Agent[Any],
    *,
    writes: Iterable[str] = (),
    approvals: Iterable[str] = (),
    risk: Mapping[str, Risk] | None = None,
    summaries: Mapping[str, Summary] | None = None,
    recovery_policy: RecoveryPolicy | None = "manual_confirmation",
    rejection_output: Callable[[ApprovalRejected], Any] = default_rejection_output,
    approval_flow: ApprovalFlow = "wait",
) -> Agent[Any]:
    """A copy of `agent`, and of every agent it reaches, whose function tools go through
    `safestop_tool`.

    The whole agent graph is guarded: handoff targets (agents or `Handoff`s) and
    agents used as tools (`as_tool`), recursively, cycles included; the agent
    tool itself is a tool call too. `writes` names the tools with side effects
    (their unfinished calls are `unknown`, and get `recovery_policy`);
    `approvals` the ones a reviewer must approve (tools carrying the SDK's
    `needs_approval` wait too). A name in `writes`, `approvals`, `risk` or
    `summaries` that matches no function tool in the graph raises `ValueError`.
    The originals are left as they were. `approval_flow` is `safestop_tool`'s.
    """
    write_names, approval_names = set(writes), set(approvals)
    risks, summary_of = dict(risk or {}), dict(summaries or {})
    named = write_names | approval_names | set(risks) | set(summary_of)
    known = _tool_names(agent)
    if named - known:
        raise ValueError(
            f"guard_agent: no function tool named {sorted(named - known)} in the agent graph "
            f"of {agent.name!r}; its tools are {sorted(known)}"
        )

    def guard_tool(tool: FunctionTool) -> FunctionTool:
        is_write = tool.name in write_names
        return safestop_tool(
            tool,
            side_effect="write" if is_write else "none",
            needs_approval=True if tool.name in approval_names else None,
            summary=summary_of.get(tool.name),
            risk=risks.get(tool.name),
            recovery_policy=recovery_policy if is_write else None,
            rejection_output=rejection_output,
            approval_flow=approval_flow,
        )

    return _guard_graph(agent, guard_tool, {})


def _guard_graph(
    agent: Agent[Any], guard_tool: Callable[[FunctionTool], FunctionTool], done: dict[int, Any]
) -> Agent[Any]:
    if id(agent) in done:
        return cast(Agent[Any], done[id(agent)])
    guarded = agent.clone()
    done[id(agent)] = guarded  # before the recursion: a handoff back here finds the copy
    tools: list[Any] = []
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool):
            tools.append(tool)
            continue
        inner = _agent_of_tool(tool)
        if inner is not None:
            inner_guarded = _guard_graph(inner, guard_tool, done)
            tool = _rebound_tool(tool, inner, inner_guarded)
        tools.append(guard_tool(tool))
    handoffs: list[Any] = []
    for target in agent.handoffs:
        if isinstance(target, Agent):
            handoffs.append(_guard_graph(target, guard_tool, done))
        elif isinstance(target, Handoff):
            handoffs.append(_guarded_handoff(target, guard_tool, done))
        else:
            handoffs.append(target)
    guarded.tools = tools
    guarded.handoffs = handoffs
    if not isinstance(agent.hooks, _UsageAgentHooks):
        guarded.hooks = _UsageAgentHooks(agent.hooks)
    return guarded


def _tool_names(agent: Agent[Any], seen: set[int] | None = None) -> set[str]:
    """The names of the function tools of every agent `agent` reaches."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return set()
    seen.add(id(agent))
    names: set[str] = set()
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            names.add(tool.name)
            inner = _agent_of_tool(tool)
            if inner is not None:
                names |= _tool_names(inner, seen)
    for target in agent.handoffs:
        reached = target if isinstance(target, Agent) else _agent_of_handoff(target)
        if reached is not None:
            names |= _tool_names(reached, seen)
    return names


def _agent_of_tool(tool: FunctionTool) -> Agent[Any] | None:
    """The agent an `as_tool` tool runs, or None for a plain function tool."""
    inner = getattr(tool, "_agent_instance", None)
    if isinstance(inner, Agent):
        return inner
    return None


def _agent_of_handoff(target: Any) -> Agent[Any] | None:
    if not isinstance(target, Handoff):
        return None
    ref = getattr(target, "_agent_ref", None)
    reached = ref() if callable(ref) else None
    if isinstance(reached, Agent):
        return reached
    found = _closure_values(target.on_invoke_handoff, Agent)
    return found[0] if len(found) == 1 else None


def _rebound_tool(tool: FunctionTool, inner: Agent[Any], guarded: Agent[Any]) -> FunctionTool:
    """A copy of the `as_tool` tool `tool` that runs `guarded` instead of `inner`.

    The SDK keeps the agent in the tool's closure; the copy's functions are the
    same code with that one value swapped (the original tool is unchanged).
    """
    invoke = _rebind(tool.on_invoke_tool, inner, guarded)
    if invoke is tool.on_invoke_tool:
        raise ValueError(
            f"guard_agent: cannot reach the agent {inner.name!r} behind the tool {tool.name!r} "
            "in this version of the SDK: guard that agent and call as_tool() on the copy"
        )
    copy = dataclasses.replace(tool, on_invoke_tool=invoke)
    for name, value in (("_is_agent_tool", True), ("_agent_instance", guarded)):
        object.__setattr__(copy, name, value)
    return copy


def _guarded_handoff(
    target: Handoff[Any, Any],
    guard_tool: Callable[[FunctionTool], FunctionTool],
    done: dict[int, Any],
) -> Handoff[Any, Any]:
    reached = _agent_of_handoff(target)
    original = target.on_invoke_handoff

    async def on_invoke_handoff(context: Any, input_json: str) -> Any:
        # The agent the handoff returns, guarded (found at call time when not before).
        agent = await original(context, input_json)
        return _guard_graph(agent, guard_tool, done) if isinstance(agent, Agent) else agent

    if reached is not None:
        _guard_graph(reached, guard_tool, done)
    copy = dataclasses.replace(target, on_invoke_handoff=on_invoke_handoff)
    if reached is not None and hasattr(target, "_agent_ref"):
        object.__setattr__(copy, "_agent_ref", weakref.ref(done[id(reached)]))
    return copy


def _closure_values(fn: Any, kind: type, depth: int = 4) -> list[Any]:
    """Values of type `kind` held in `fn`'s closure (and its inner functions')."""
    found: list[Any] = []
    if depth == 0 or not isinstance(fn, types.FunctionType):
        return found
    inner = [*(fn.__closure__ or ()), *(types.CellType(v) for v in vars(fn).values())]
    for cell in inner:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, kind) and all(value is not seen for seen in found):
            found.append(value)
        elif isinstance(value, types.FunctionType):
            found.extend(v for v in _closure_values(value, kind, depth - 1) if v not in found)
    return found


def _is_sdk_helper(value: Any) -> bool:
    """An instance of one of the SDK's own helper classes (an invoker), not a tool or agent."""
    return (
        not isinstance(value, type | types.FunctionType | Agent | FunctionTool | Handoff)
        and type(value).__module__.split(".", 1)[0] == "agents"
        and hasattr(value, "__dict__")
    )


def _rebind(fn: Any, old: Any, new: Any, depth: int = 4) -> Any:
    """A copy of function `fn` where closure cells (and inner functions') holding `old` hold `new`.

    The SDK's own invoker objects (which hold the function in an attribute) are
    copied the same way; tools, agents and handoffs are never walked into.
    """
    if depth == 0:
        return fn
    if _is_sdk_helper(fn):
        attributes = {name: _rebind(value, old, new, depth - 1) for name, value in vars(fn).items()}
        if all(attributes[name] is value for name, value in vars(fn).items()):
            return fn
        duplicate = copy.copy(fn)
        vars(duplicate).update(attributes)
        return duplicate
    if not isinstance(fn, types.FunctionType):
        return fn
    changed = False
    cells: list[Any] = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            cells.append(cell)
            continue
        swapped = new if value is old else _rebind(value, old, new, depth - 1)
        changed = changed or swapped is not value
        cells.append(types.CellType(swapped) if swapped is not value else cell)
    attributes = {name: _rebind(value, old, new, depth - 1) for name, value in vars(fn).items()}
    changed = changed or any(attributes[name] is not value for name, value in vars(fn).items())
    if not changed:
        return fn
    rebound = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells) or None
    )
    rebound.__kwdefaults__ = fn.__kwdefaults__
    rebound.__qualname__ = fn.__qualname__
    rebound.__doc__ = fn.__doc__
    rebound.__dict__.update(attributes)
    return rebound


def _model_name(agent: Any, run_config: Any = None) -> str:
    """The model a response came from: the run config's, else the agent's, else the default."""
    for candidate in (getattr(run_config, "model", None), getattr(agent, "model", None)):
        if isinstance(candidate, str) and candidate:
            return candidate
        named = getattr(candidate, "model", None)  # OpenAIResponsesModel, LitellmModel, ...
        if isinstance(named, str) and named:
            return named
        if candidate is not None:
            return type(candidate).__name__  # a model we cannot name: unpriced, still counted
    try:
        from agents.models import get_default_model
    except ImportError:  # an SDK without a named default
        return "unknown"
    return str(get_default_model())


def _claim(response: Any) -> bool:
    """True the first time a response's usage is to be reported (run and agent hooks both see it).

    Called before any await, so of two hooks handling the same response only one reports it.
    """
    if getattr(response, "_safestop_usage_reported", False):
        return False
    try:
        object.__setattr__(response, "_safestop_usage_reported", True)
    except (AttributeError, TypeError):  # a response that takes no attribute: report it anyway
        pass
    return True


async def _report_usage(
    run: AgentRun, agent: Any, response: Any, *, step_key: str | None, run_config: Any = None
) -> None:
    """One `usage` event for a model response (nothing for a response that used no tokens)."""
    usage = getattr(response, "usage", None)
    input_tokens = int(getattr(usage, "input_tokens", 0) or 0)
    output_tokens = int(getattr(usage, "output_tokens", 0) or 0)
    if usage is None or input_tokens + output_tokens == 0:
        return
    details = getattr(usage, "input_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    written = int(getattr(details, "cache_write_tokens", 0) or 0)  # in later SDKs only
    response_id = getattr(response, "response_id", None) or getattr(response, "request_id", None)
    event_id = None
    if response_id:
        digest = hashlib.sha256(f"{run.run_id}|{response_id}".encode()).hexdigest()[:32]
        event_id = f"evt_usage_{digest}"
    try:
        await asyncio.to_thread(
            run.report_usage,
            model=_model_name(agent, run_config),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cached or None,
            cache_write_tokens=written or None,
            step_key=step_key,
            event_id=event_id,
        )
    except Exception as error:  # a fact that cannot be sent must not end the run
        log.warning("safestop: usage of a model call not reported: %r", error)


class _UsageAgentHooks(AgentHooks[Any]):
    """The agent hooks `guard_agent` gives each copy: usage of the agent's model calls when it
    runs under another `Runner.run` (as a tool), where `SafestopHooks` are not the run's hooks.
    Every callback also goes to the agent's own hooks."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        await asyncio.sleep(0)  # the run's own hooks, started first, claim a response first
        if _claim(response):
            try:
                run = active_run(context)
            except RuntimeError:
                run = None
            if run is not None:
                await _report_usage(run, agent, response, step_key=None)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)


def _delegate(name: str) -> Any:
    async def delegated(self: _UsageAgentHooks, *args: Any, **kwargs: Any) -> None:
        if self.inner is not None:
            await getattr(self.inner, name)(*args, **kwargs)

    delegated.__name__ = name
    return delegated


for _name in ("on_start", "on_end", "on_handoff", "on_tool_start", "on_tool_end", "on_llm_start"):
    setattr(_UsageAgentHooks, _name, _delegate(_name))


class SafestopHooks(RunHooks[Any]):
    """Run hooks: no model call or tool starts after a stop; each model call is a step.

    Wraps `inner` (the caller's own hooks), which still sees every callback.
    """

    def __init__(
        self, run: AgentRun, inner: RunHooks[Any] | None = None, *, run_config: Any = None
    ) -> None:
        self.run = run
        self.inner = inner
        self.run_config = run_config
        self._open: dict[int, str] = {}
        self._counter = _Counter()

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: Any, input_items: Any
    ) -> None:
        self.run.token.raise_if_cancelled()
        key = f"model#{self._counter.next('model')}"
        await _event(self.run, "step.started", key=key, name=f"{agent.name}: model call")
        self._open[id(agent)] = key
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        key = self._open.pop(id(agent), None)
        if _claim(response):
            await _report_usage(self.run, agent, response, step_key=key, run_config=self.run_config)
        if key is not None:
            await _fact(self.run, "step.completed", key=key)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.run.token.raise_if_cancelled()
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self.run.token.raise_if_cancelled()
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        self.run.token.raise_if_cancelled()
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def close_open_steps(self) -> None:
        """After a stop: the model calls cut short are failed steps."""
        for key in list(self._open.values()):
            await _fact(
                self.run, "step.failed", key=key, error="interrupted by stop", cancelled=True
            )
        self._open.clear()


def _cancelled(run: AgentRun) -> Cancelled:
    return Cancelled(
        run.token.reason, stop_epoch=run.token.stop_epoch, requested_by=run.token.requested_by
    )


async def run_agent(
    run: AgentRun,
    agent: Agent[Any],
    input: Any,
    *,
    hooks: RunHooks[Any] | None = None,
    **kwargs: Any,
) -> RunResult:
    """`Runner.run(agent, input, ...)` that a stop cancels (raises `Cancelled`)."""
    run.token.raise_if_cancelled()
    safestop_hooks = SafestopHooks(run, hooks, run_config=kwargs.get("run_config"))
    active, steps = _ACTIVE.set(run), _STEPS.set(_Counter())
    try:
        task = asyncio.ensure_future(Runner.run(agent, input, hooks=safestop_hooks, **kwargs))
    finally:
        _ACTIVE.reset(active)
        _STEPS.reset(steps)
    loop = asyncio.get_running_loop()
    forget = run.token.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))
    try:
        return await task
    except BaseException as error:
        if run.token.cancelled:
            await safestop_hooks.close_open_steps()
            raise _cancelled(run) from error
        raise
    finally:
        forget()


async def resume_agent(
    run: AgentRun,
    agent: Agent[Any],
    state: RunState[Any] | str | Mapping[str, Any],
    *,
    hooks: RunHooks[Any] | None = None,
    **kwargs: Any,
) -> RunResult:
    """Go on with a run that stopped at the SDK's approval interruptions (`approval_flow="interrupt"`).

    `state` is `result.to_state()`, or what its `to_string()` / `to_json()`
    saved. Each interruption is answered with the reviewer's decision in
    safestop (waiting for it, off the event loop, if it is still open):
    approved → `state.approve(item)` and the tool runs with the final
    arguments; rejected or expired → `state.reject(item)`. A void caused by a
    stop raises `Cancelled`. Then the run goes on as `run_agent` does.
    """
    if isinstance(state, str):
        state = await RunState.from_string(agent, state)
    elif not isinstance(state, RunState):
        state = await RunState.from_json(agent, dict(state))
    for item in state.get_interruptions():
        if await asyncio.to_thread(_reviewer_approved, run, item):
            state.approve(item)
        else:
            state.reject(item)
    return await run_agent(run, agent, state, hooks=hooks, **kwargs)


def _interrupted_call(run: AgentRun, item: Any) -> ToolCall:
    """The call an SDK interruption stands for, named as its permit was asked."""
    raw = item.raw_item
    field = raw.get if isinstance(raw, Mapping) else (lambda key: getattr(raw, key, None))
    arguments = field("arguments") or "{}"
    return run.new_tool_call(
        str(item.tool_name or field("name")),
        json.loads(arguments) if isinstance(arguments, str) else dict(arguments),
        tool_call_id=f"{field('call_id')}.e{run.epoch}"[-120:],
    )


def _reviewer_approved(run: AgentRun, item: Any) -> bool:
    """Ask the interrupted call's permit again until the reviewer has decided; True if approved."""
    call = _interrupted_call(run, item)
    try:
        while not run.ask_permit(call, wait=False):
            decision = run.wait_for_approval(str((call.approval or {})["id"]), poll_now=True)
            if decision.status == "void":
                run.raise_if_void_stopped()
    except ApprovalRejected:
        return False
    return True


SUSPENDED_FORMAT = "safestop.openai-agents.suspended/1"


@dataclasses.dataclass(frozen=True)
class SuspendedRun:
    """A run suspended at the SDK's approval interruptions, holding no lease and no process.

    `state` is the SDK's saved `RunState` (`to_string()`), `approvals` the safestop
    approvals the reviewers decide. Keep `to_string()` wherever the process that goes on
    will find it (a file, a database row, a queue message), then
    `resume_when_decided(client, agent, saved, worker_id=...)`.
    """

    run_id: str
    epoch: int
    approvals: tuple[str, ...]
    state: str

    def to_string(self) -> str:
        return json.dumps(
            {
                "format": SUSPENDED_FORMAT,
                "run_id": self.run_id,
                "epoch": self.epoch,
                "approvals": list(self.approvals),
                "state": self.state,
            }
        )

    @classmethod
    def from_string(cls, text: str) -> SuspendedRun:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != SUSPENDED_FORMAT:
            raise ValueError(
                f"not a suspended run saved by suspend_for_approvals ({SUSPENDED_FORMAT})"
            )
        return cls(
            run_id=str(data["run_id"]),
            epoch=int(data["epoch"]),
            approvals=tuple(str(a) for a in data["approvals"]),
            state=str(data["state"]),
        )


def _waiting_approvals(run: AgentRun, interruptions: list[Any]) -> list[str]:
    """The approvals of `interruptions` that still wait for a reviewer (asked again, not waited)."""
    waiting: list[str] = []
    for item in interruptions:
        call = _interrupted_call(run, item)
        try:
            if not run.ask_permit(call, wait=False):
                waiting.append(str((call.approval or {})["id"]))
        except ApprovalRejected:
            pass  # decided already: nothing to wait for
    return waiting


async def suspend_for_approvals(
    run: AgentRun,
    agent: Agent[Any],
    result: RunResult,
    *,
    reason: str = "waiting_for_approval",
    **kwargs: Any,
) -> SuspendedRun | RunResult:
    """Let the run wait for its reviewers without holding a process (`approval_flow="interrupt"`).

    With interruptions in `result` that still wait for a reviewer, the lease is released
    with `suspend` (the run is `suspended`; its approvals stay open for the reviewers) and a
    `SuspendedRun` is returned: save its `to_string()` and let the process end. Decisions
    that are already in are applied at once, in this process, with `resume_agent`, as is
    the whole wait if a decision lands while the lease is being given back; so a
    `RunResult` comes back when the run got past its interruptions here (call
    `run.complete(...)`). `kwargs` go to `resume_agent`.
    """
    while result.interruptions:
        waiting = await asyncio.to_thread(_waiting_approvals, run, list(result.interruptions))
        state = result.to_state()
        if waiting:
            try:
                await asyncio.to_thread(run.release, suspend=True, reason=reason)
            except Refused as refused:
                if refused.code != "illegal_transition":
                    raise
                # A decision landed in between (its call is permitted now): go on here.
                log.info("safestop: not suspended (%s); resuming in this process", refused)
            else:
                assert run.epoch is not None
                return SuspendedRun(run.run_id, run.epoch, tuple(waiting), state.to_string())
        result = await resume_agent(run, agent, state, **kwargs)
    return result


async def _wait_for_decisions(
    client: Any, suspended: SuspendedRun, *, poll_interval: float, timeout: float | None
) -> None:
    """Poll the approvals (no lease held) until none waits; `Cancelled` if the run was stopped."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        run_info = await asyncio.to_thread(client.get_run, suspended.run_id)
        status = str(run_info.get("status") or "")
        if status != "suspended":
            raise Cancelled(
                str(run_info.get("stop_reason") or status),
                stop_epoch=run_info.get("stop_epoch"),
            )
        waiting = [
            approval_id
            for approval_id in suspended.approvals
            if (await asyncio.to_thread(client.get_approval, approval_id)).get("status")
            == "waiting"
        ]
        if not waiting:
            return
        if timeout is not None and loop.time() - started >= timeout:
            raise TimeoutError(f"approvals {waiting} still waiting after {timeout}s")
        await asyncio.sleep(poll_interval)


@contextlib.asynccontextmanager
async def resume_when_decided(
    client: Any,
    agent: Agent[Any],
    saved: SuspendedRun | str,
    *,
    worker_id: str,
    poll_interval: float = 2.0,
    timeout: float | None = None,
    lease_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[AgentRun, SuspendedRun | RunResult]]:
    """Go on with a `SuspendedRun` once its reviewers have decided, in any process.

        async with resume_when_decided(client, agent, saved, worker_id="w2") as (run, outcome):
            if isinstance(outcome, SuspendedRun):
                store(outcome.to_string())  # it waits for reviewers again
            else:
                run.complete({"answer": outcome.final_output})

    Waits holding nothing (the approvals are polled every `poll_interval` seconds), then
    leases the run (same epoch: the decisions belong to it), answers each interruption
    with its reviewer's decision (`resume_agent`: an approved call runs once, with the
    final arguments) and goes on; new interruptions suspend the run again
    (`suspend_for_approvals`). The lease is finished when the block ends. A stop of the
    suspended run raises `Cancelled` (nothing to drain: no worker held it). `kwargs` go to
    `resume_agent`; `lease_options` to `client.lease`.
    """
    suspended = SuspendedRun.from_string(saved) if isinstance(saved, str) else saved
    await _wait_for_decisions(client, suspended, poll_interval=poll_interval, timeout=timeout)
    run = client.lease(suspended.run_id, worker_id, **dict(lease_options or {}))
    await asyncio.to_thread(run.acquire)
    try:
        result = await resume_agent(run, agent, suspended.state, **kwargs)
        outcome = await suspend_for_approvals(run, agent, result, **kwargs)
        yield run, outcome
    finally:
        await asyncio.to_thread(run.finish)


def run_agent_sync(run: AgentRun, agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
    """`run_agent` for synchronous code (its own event loop)."""
    return asyncio.run(run_agent(run, agent, input, **kwargs))


def run_agent_streamed(
    run: AgentRun,
    agent: Agent[Any],
    input: Any,
    *,
    hooks: RunHooks[Any] | None = None,
    **kwargs: Any,
) -> RunResultStreaming:
    """`Runner.run_streamed(...)` whose run a stop cancels (`result.cancel()`).

    Call it inside a running event loop, and read the events with
    `stream_events(run, result)`, which raises `Cancelled` when a stop ended it.
    """
    run.token.raise_if_cancelled()
    loop = asyncio.get_running_loop()
    active, steps = _ACTIVE.set(run), _STEPS.set(_Counter())
    try:
        result = Runner.run_streamed(
            agent,
            input,
            hooks=SafestopHooks(run, hooks, run_config=kwargs.get("run_config")),
            **kwargs,
        )
    finally:
        _ACTIVE.reset(active)
        _STEPS.reset(steps)
    forget = run.token.on_cancel(lambda: loop.call_soon_threadsafe(result.cancel))
    result._safestop_forget = forget  # type: ignore[attr-defined]
    return result


async def stream_events(run: AgentRun, result: RunResultStreaming) -> AsyncIterator[Any]:
    """`result.stream_events()`, then `Cancelled` if a stop cut the run short."""
    try:
        async for event in result.stream_events():
            yield event
    except BaseException as error:
        if run.token.cancelled:
            raise _cancelled(run) from error
        raise
    finally:
        forget = getattr(result, "_safestop_forget", None)
        if forget is not None:
            forget()
    if run.token.cancelled:
        raise _cancelled(run)


__all__ = [
    "SUSPENDED_FORMAT",
    "SafestopHooks",
    "SuspendedRun",
    "active_run",
    "default_rejection_output",
    "guard_agent",
    "run_agent",
    "run_agent_streamed",
    "resume_agent",
    "run_agent_sync",
    "safestop_tool",
    "resume_when_decided",
    "stream_events",
    "suspend_for_approvals",
]
