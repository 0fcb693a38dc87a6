"""The MCP gateway (DESIGN §15): an agent's MCP client talks to `/mcp/<name>/`, and every tool
call passes through a run's permit, approval rules and stop."""
