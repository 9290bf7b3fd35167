"""Virtual clock, cost models, workloads: the same orchestrator on simulated engines.

`simulate(SimConfig(...))` runs one mode; `dora.sim.simulate_cli.simulate_main(argv)` is `dora simulate`.
"""
