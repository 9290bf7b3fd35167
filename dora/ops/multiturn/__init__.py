"""Multi-turn rollouts: the token-in/token-out trajectory (trajectory) and the loop that runs model
turns and tool calls on an engine (agent_loop). Contract: docs/architecture.md, "Tools and
multi-turn rollouts"."""
