"""`dora run P.yaml [k=v ...] [--backend local|ray] [--out DIR] [--seed N] [--dry-run] [--dashboard [PORT]]`.

Loads and validates the pipeline (exit 2 on bad input, every error at once), plans placement,
then runs it: RL graphs (dataset -> generate -> ... -> update) under the RLDriver, any other graph
as plain streaming dataflow. Writes DIR/metrics.jsonl, DIR/summary.json, DIR/trace.json and
checkpoints (DIR/checkpoints/step_N, loadable by transformers), DIR/state.json (the dashboard's
data, dora/runtime/dashboard) and what `run.loggers` asks for (DIR/tb, DIR/wandb).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

EXAMPLE = """example:
  dora run pipelines/quickstart.yaml --out runs/quickstart
  dora run pipelines/quickstart.yaml async.mode=dora async.max_staleness=2 --out runs/q-dora
  dora run pipelines/grpo.yaml --dry-run          # print the placement plan and exit
  dora run pipelines/quickstart.yaml async.mode=dora --dashboard      # live page on 127.0.0.1
"""


def _parser() -> argparse.ArgumentParser:
    from dora.runtime.dashboard import live
    p = argparse.ArgumentParser(prog="dora run", description="Run a pipeline.", epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", help="pipeline YAML file")
    p.add_argument("overrides", nargs="*", help="key=value overrides (omegaconf dotted paths)")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--out", default=None, help="run directory (default runs/<name>-<time>)")
    p.add_argument("--seed", type=int, default=None, help="run seed (default: run.seed in the YAML, else 0)")
    p.add_argument("--dry-run", action="store_true", help="print the placement plan and exit")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--deadline", type=float, default=3600.0, help="fail the run after this many seconds")
    live.add_flag(p)
    p.add_argument("--hb-timeout", type=float, default=30.0,
                   help="declare a worker dead after this many seconds without a heartbeat (generous: a 2-core "
                        "machine running torch in every worker can starve a heartbeat thread for seconds)")
    return p


def run_main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        # intermixed: overrides may come after options (`dora run p.yaml --out d k=v`)
        from dora.runtime.dashboard.live import bare_flag_first, check_port
        args = p.parse_intermixed_args(bare_flag_first(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if check_port(args.dashboard):
        print(f"dora run: {check_port(args.dashboard)}", file=sys.stderr)
        return 2
    graph = load_graph(args.pipeline, args.overrides)
    if graph is None:
        return 2
    if args.backend == "local":
        from dora.runtime.backends.local import resolve_transport
        try:
            resolve_transport()   # checks DORA_TRANSPORT before anything starts
        except ValueError as e:
            print(f"dora run: {e}", file=sys.stderr)
            return 2
    from dora.runtime.placement import format_plan, plan as make_plan
    try:
        plan = make_plan(graph)
    except ValueError as e:
        print(f"dora run: {args.pipeline}: cannot place the graph: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(format_plan(plan, args.backend))
        return 0
    seed = args.seed if args.seed is not None else int((graph.extra.get("run") or {}).get("seed", 0))
    run_dir = args.out or os.path.join("runs", f"{graph.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(run_dir, exist_ok=True)
    return execute(graph, run_dir, backend=args.backend, seed=seed, quiet=args.quiet, deadline_s=args.deadline,
                   source=args.pipeline, hb_timeout=args.hb_timeout, dashboard_port=args.dashboard)


def load_graph(path: str, overrides: list[str]):
    """The validated graph, or None after printing every diagnostic (file:line) to stderr."""
    from dora.graph.diagnostics import errors_of
    from dora.graph.validate import check_file
    graph, diags = check_file(path, overrides)
    for d in diags:
        print(d.format(), file=sys.stderr)
    errs = errors_of(diags)
    if graph is None or errs:
        print(f"{path}: {len(errs)} error(s); nothing was run", file=sys.stderr)
        return None
    return graph


def _inherit_temperature(graph, specs, params) -> None:
    """Trainer-side logprobs must use the temperature the behaviour policy sampled at, or every
    importance ratio is off: a null `temperature` on update/reference takes the generate node's."""
    gens = {params[n]["temperature"] for n in graph.nodes if specs[n].name == "generate"}
    for n in graph.nodes:
        if "temperature" in params[n] and params[n]["temperature"] is None and specs[n].name != "generate":
            t = gens.pop() if len(gens) == 1 else 1.0
            gens.add(t)
            # a temperature of 0 means greedy decoding, whose logprobs the engine reports at T = 1
            params[n]["temperature"] = t if t > 0 else 1.0
            graph.nodes[n].params["temperature"] = params[n]["temperature"]


def _fill_broadcast_world(graph, specs, params) -> None:
    """`weight_sync: broadcast` on the trainer pushes each version to every generate replica: with
    broadcast_to left at 0 the world is the generate node's replica count."""
    gens = [n for n in graph.nodes if specs[n].name == "generate"]
    for n in graph.nodes:
        p = params[n]
        if specs[n].name == "update" and p.get("weight_sync") == "broadcast" and not p.get("broadcast_to") and len(gens) == 1:
            p["broadcast_to"] = graph.nodes[gens[0]].replicas
            graph.nodes[n].params["broadcast_to"] = p["broadcast_to"]


def execute(graph, run_dir: str, backend: str = "local", seed: int = 0, quiet: bool = False,
            deadline_s: float = 3600.0, source: str | None = None, hb_timeout: float = 30.0,
            dashboard_port: int | None = None, live_state: bool = True) -> int:
    """Run a validated graph; returns the exit code. Shared by the CLI and benchmarks/modes.py.
    live_state keeps RUN_DIR/state.json current (False: no live counters at all, for the
    dashboard's overhead benchmark); dashboard_port also serves it (0: any free port)."""
    from dora.graph.opspec import fill_params, resolve_op
    from dora.graph.yaml_io import to_yaml
    from dora.runtime.run_controller import Controller
    from dora.runtime.errors import RunFailed
    from dora.runtime.dashboard.live import LIVE_S, LiveDashboard
    from dora.runtime.metric_sinks import open_for_run
    from dora.runtime.metrics import MetricsLog, summarize, write_summary
    from dora.runtime.progress import RunProgress
    from dora.runtime.rl_driver import RLDriver, RLRoles

    specs = {n: resolve_op(node.op) for n, node in graph.nodes.items()}
    params = {n: fill_params(specs[n], node.params) for n, node in graph.nodes.items()}
    _inherit_temperature(graph, specs, params)
    _fill_broadcast_world(graph, specs, params)
    with open(os.path.join(run_dir, "pipeline.yaml"), "w", encoding="utf-8") as fh:
        fh.write(to_yaml(graph))   # exactly what ran, overrides applied
    roles = RLRoles.find(graph, lambda n: specs[n].name)
    a = graph.async_
    sinks = open_for_run(graph, run_dir, {"pipeline": source, "mode": a.mode, "max_staleness": a.max_staleness,
                                          "train_batch": a.train_batch, "rollout_batch": a.rollout_batch, "seed": seed})
    if sinks is None:
        return 1
    metrics = MetricsLog(run_dir, sinks)
    total = int(params[roles.update].get("steps", 1)) if roles else 0
    progress = RunProgress(total, graph.name, quiet=quiet)
    driver = RLDriver(graph, roles, params, metrics, progress) if roles else None
    group_sizes = {p["group_size"] for n, p in params.items() if specs[n].name == "dataset"}
    async_extra = {"group_size": group_sizes.pop()} if len(group_sizes) == 1 else {}
    dash = None
    if live_state or dashboard_port is not None:
        try:
            dash = LiveDashboard(graph, run_dir, driver=driver, metrics=metrics, total_steps=total or None, port=dashboard_port)
        except OSError as e:
            print(f"dora run: --dashboard: cannot listen on 127.0.0.1:{dashboard_port}: {e.strerror or e}", file=sys.stderr)
            metrics.close()
            return 2
    ctrl = Controller(graph, backend=backend, driver=driver, run_dir=run_dir, seed=seed, deadline_s=deadline_s,
                      hb_timeout=hb_timeout, async_extra=async_extra, live_s=LIVE_S if dash else 0.0,
                      monitor=dash.state if dash else None)
    if driver is not None:
        driver.attach(ctrl)
    from dora.ops.weights import versions as weights
    weights.cleanup(run_dir)   # versions left by an earlier run in this folder would be mistaken for ours
    t0 = time.monotonic()
    ok, error = False, None
    try:
        result = ctrl.run()
        ok = result.ok
    except RunFailed as e:
        error = str(e)   # names the node and replica, with the worker's traceback
    except KeyboardInterrupt:
        error = "interrupted"
    finally:
        progress.close()
        metrics.close()
        weights.cleanup(run_dir)   # the /dev/shm copies; checkpoints stay in run_dir
    wall = time.monotonic() - t0
    summary: dict[str, Any] = summarize(metrics.records, name=graph.name, mode=graph.async_.mode, backend=backend,
                                        seed=seed, wall_s=wall, run_dir=run_dir, ok=ok, error=error, source=source)
    if driver is not None:
        summary["accounting"] = driver.finish()
        summary["stop_reason"] = driver.stop_reason
        for key in ("c1_violations", "c2_violations", "c3_violations"):
            summary[key] = max(summary.get(key, 0), summary["accounting"].get(key, 0))
        summary["weight_loads"] = driver.weight_loads
        driver.trace.write(os.path.join(run_dir, "trace.json"))
    else:
        with open(os.path.join(run_dir, "trace.json"), "w") as fh:
            json.dump({"traceEvents": []}, fh)
    write_summary(run_dir, summary)
    if dash is not None:
        dash.close(ctrl, ok, error)
    progress.summary_table(summary)
    if error:
        print(f"dora run: run failed: {error}", file=sys.stderr)
        return 1
    return 0
