"""Tools a model calls during a multi-turn rollout: declarations and their check (tool_registry),
the tools (python_tool in a sandbox, search_tool with BM25 over a shipped corpus), the call
parsers (tool_parsers) and the thread pool that runs calls off the engine loop (tool_runner).
Contract: docs/architecture.md, "Tools and multi-turn rollouts"."""
