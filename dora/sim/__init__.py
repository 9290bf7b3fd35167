"""Virtual clock, cost models, workloads: the same orchestrator on simulated engines."""
