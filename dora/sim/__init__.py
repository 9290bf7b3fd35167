"""Virtual clock, cost models, workloads: the same orchestrator on simulated engines.

`simulate(SimConfig(...))` runs one mode; `dora.sim.cli.simulate_main(argv)` is `dora simulate`.
"""
