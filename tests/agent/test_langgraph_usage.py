"""LangGraph: every chat model call in a node reports its `usage_metadata` with no code in the
node (sync, async, streamed), named by the node's step, counted once per call.

The models are LangChain's own scripted chat model (`GenericFakeChatModel`): no network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from agent_fakes import FakeApi
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from safestop_agent import AgentRun, SafestopClient
from safestop_agent.integrations.langgraph import SafestopGraph, UsageCallback

pytestmark = pytest.mark.timeout(60)


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def answer(text: str, *, model: str, tokens_in: int, tokens_out: int, cached: int = 0) -> AIMessage:
    return AIMessage(
        content=text,
        response_metadata={"model_name": model},
        usage_metadata={
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
            "input_token_details": {"cache_read": cached} if cached else {},
        },
    )


class OpenAILike(GenericFakeChatModel):
    """Scripted, and says it is OpenAI's, as `ChatOpenAI` does (`ls_provider`)."""

    def _get_ls_params(self, stop: Any = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "openai"
        params["ls_model_name"] = "gpt-4o"
        return params


class StreamedWithUsage(GenericFakeChatModel):
    """Streams its answer in two chunks, the last one carrying the usage, as providers do."""

    def _stream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:  # noqa: E501
        yield ChatGenerationChunk(message=AIMessageChunk(content="part one, "))
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content="part two",
                response_metadata={"model_name": "claude-sonnet-4-5"},
                usage_metadata={"input_tokens": 40, "output_tokens": 7, "total_tokens": 47},
            )
        )


def two_model_nodes(first: Any, second: Any, *, stream_second: bool = False) -> Any:
    def plan(state: MessagesState) -> dict[str, Any]:
        return {"messages": [first.invoke(state["messages"])]}

    def write(state: MessagesState) -> dict[str, Any]:
        if stream_second:
            chunks = list(second.stream(state["messages"]))
            text = "".join(str(chunk.content) for chunk in chunks)
            return {"messages": [AIMessage(content=text)]}
        return {"messages": [second.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("plan", plan)
    builder.add_node("write", write)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "write")
    builder.add_edge("write", END)
    return builder.compile(checkpointer=InMemorySaver())


def fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("event_id", "type")}


def test_each_model_call_in_a_node_reports_its_usage_with_the_nodes_step(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    planner = OpenAILike(
        messages=iter(
            [answer("plan", model="gpt-4o-2024-08-06", tokens_in=1200, tokens_out=30, cached=1000)]
        )
    )
    writer = GenericFakeChatModel(
        messages=iter([answer("draft", model="my-own-model", tokens_in=50, tokens_out=9)])
    )
    with leased(client) as run:
        outcome = SafestopGraph(run, two_model_nodes(planner, writer)).invoke(
            {"messages": [HumanMessage("hi")]}
        )
    assert outcome.status == "completed"
    first, second = fake_api.events_of_type("usage")
    assert fields(first) == {
        "model": "gpt-4o-2024-08-06",  # the response's own name wins over the configured one
        "provider": "openai",
        "input_tokens": 1200,
        "output_tokens": 30,
        "cache_read_tokens": 1000,
        "step_key": "plan#1",
    }
    # A provider the price table does not know by LangChain's name is left out.
    assert fields(second) == {
        "model": "my-own-model",
        "input_tokens": 50,
        "output_tokens": 9,
        "step_key": "write#2",
    }
    assert first["event_id"] != second["event_id"]
    assert all(e["event_id"].startswith("evt_usage_") for e in (first, second))


def test_async_nodes_and_streamed_calls_report_usage_too(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    planner = GenericFakeChatModel(
        messages=iter([answer("plan", model="gpt-4o-mini", tokens_in=10, tokens_out=2)])
    )
    writer = StreamedWithUsage(messages=iter([AIMessage("unused")]))

    async def plan(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await planner.ainvoke(state["messages"])]}

    async def write(state: MessagesState) -> dict[str, Any]:
        chunks = [chunk async for chunk in writer.astream(state["messages"])]
        return {"messages": [AIMessage("".join(str(c.content) for c in chunks))]}

    builder = StateGraph(MessagesState)
    builder.add_node("plan", plan)
    builder.add_node("write", write)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "write")
    builder.add_edge("write", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    with leased(client) as run:
        outcome = asyncio.run(SafestopGraph(run, graph).ainvoke({"messages": [HumanMessage("hi")]}))
    assert outcome.values["messages"][-1].content == "part one, part two"
    reported = [fields(e) for e in fake_api.events_of_type("usage")]
    assert reported == [
        {"model": "gpt-4o-mini", "input_tokens": 10, "output_tokens": 2, "step_key": "plan#1"},
        {
            "model": "claude-sonnet-4-5",
            "input_tokens": 40,
            "output_tokens": 7,
            "step_key": "write#2",
        },
    ]


def test_a_call_without_usage_reports_nothing_and_report_usage_false_turns_it_off(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    silent = GenericFakeChatModel(messages=iter([AIMessage("no usage said")]))
    counted = GenericFakeChatModel(
        messages=iter([answer("x", model="gpt-4o", tokens_in=5, tokens_out=1)])
    )
    with leased(client) as run:
        SafestopGraph(run, two_model_nodes(silent, counted), report_usage=False).invoke(
            {"messages": [HumanMessage("hi")]}
        )
    assert fake_api.events_of_type("usage") == []
    silent = GenericFakeChatModel(messages=iter([AIMessage("no usage said")]))
    counted = GenericFakeChatModel(
        messages=iter([answer("x", model="gpt-4o", tokens_in=5, tokens_out=1)])
    )
    with leased(client) as run:
        SafestopGraph(run, two_model_nodes(silent, counted), thread_id="t2").invoke(
            {"messages": [HumanMessage("hi")]}
        )
    assert [e["model"] for e in fake_api.events_of_type("usage")] == ["gpt-4o"]


def test_the_callback_outside_a_graph_and_a_repeated_report_keeps_its_event_id(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    model = GenericFakeChatModel(
        messages=iter([answer("x", model="gpt-4o", tokens_in=5, tokens_out=1)])
    )
    with leased(client) as run:
        callback = UsageCallback(run)
        with run.step("draft", "Draft", kind="model_call"):
            message = model.invoke("hi", config={"callbacks": [callback]})
            (sent,) = fake_api.events_of_type("usage")
            # The same answer handed to the handler again (a retried callback): the same event.
            call_id = UUID(hex=sent["event_id"].removeprefix("evt_usage_").rsplit("_", 1)[0])
            callback.on_chat_model_start({}, [], run_id=call_id)
            callback.on_llm_end(
                LLMResult(generations=[[ChatGeneration(message=message)]]), run_id=call_id
            )
    first, again = fake_api.events_of_type("usage")
    assert first["event_id"] == again["event_id"], "the server answers the repeat `duplicate`"
    assert first["step_key"] == "draft", "outside a graph: the step open in this thread"
