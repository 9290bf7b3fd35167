"""The generic engine for graphs of operators: the wire format, channels, workers, placement,
backends and the run controller. It runs any graph; it knows nothing of RL (the RL layer,
dora/rl, drives it through the controller's driver protocol). See docs/architecture.md, "Runtime"."""
