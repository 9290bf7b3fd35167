"""The RL layer: it drives the generic runtime (dora/runtime) to train a policy. The RL driver and
its helpers, the rollout orchestration (dora/rl/rollout: one control code for every async mode,
which the simulator drives too), elastic lending, the run state and its checkpoints, and
`dora run` itself (launch.py). See docs/architecture.md, "RL layer"."""
