"""Adapters for agent frameworks, each an optional extra of `safestop-agent`.

- `safestop_agent.integrations.langgraph` (`safestop-agent[langgraph]`): a compiled
  LangGraph graph under a safestop lease.
- `safestop_agent.integrations.openai_agents` (`safestop-agent[openai-agents]`): OpenAI
  Agents SDK function tools and run hooks.

Each module imports its framework at the top, so importing it without the extra
installed fails at once with the package name to install; `safestop_agent` itself
never imports them.
"""
