"""A LangGraph agent whose tools are the gateway's, through `langchain-mcp-adapters`.

Run by the `.venv-mcp-langchain` interpreter (`make mcp-clients`), not the repository's: every
release of `langchain-mcp-adapters` so far requires `mcp<2`, and the repository runs the 2.x
SDK. The wire protocol is the same, so this process talks to the live gateway over HTTP.

    python tests/mcp/langchain_client.py URL TOKEN SCRIPT_JSON

SCRIPT_JSON is the scripted model's turns: a list whose items are either a list of tool calls
(`{"name": ..., "args": {...}}`) or a final answer (a string). The process prints one JSON line:
the tool names it loaded, the tool messages the model read, and the final answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.prebuilt import create_react_agent


class ScriptedChat(BaseChatModel):
    """Answers from a script, one turn per call: no network, no real model."""

    turns: list[Any]
    seen: list[ToolMessage] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.extend(m for m in messages if isinstance(m, ToolMessage) and m not in self.seen)
        turn = self.turns.pop(0)
        if isinstance(turn, str):
            message = AIMessage(content=turn)
        else:
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": c["name"], "args": c["args"], "id": f"call_{len(self.turns)}_{i}"}
                    for i, c in enumerate(turn)
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


async def main(url: str, token: str, script: list[Any]) -> dict[str, Any]:
    client = MultiServerMCPClient(
        {
            "safestop": {
                "transport": "streamable_http",
                "url": url,
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
    )
    # One MCP session for the whole agent: one run. (`client.get_tools()` alone opens a new
    # session, so a new run, for every tool call.)
    async with client.session("safestop") as session:
        tools = await load_mcp_tools(session)
        model = ScriptedChat(turns=script, seen=[])
        agent = create_react_agent(model, tools)
        result = await agent.ainvoke({"messages": [("user", "go")]})
    return {
        "tools": sorted(tool.name for tool in tools),
        "tool_messages": [
            {"name": m.name, "status": m.status, "text": str(m.content)} for m in model.seen
        ],
        "final": str(result["messages"][-1].content),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
