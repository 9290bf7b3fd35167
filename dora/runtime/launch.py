"""`dora run P.yaml [k=v ...] [--backend local|ray] [--out DIR] [--seed N] [--dry-run]`.

Loads and validates the pipeline (exit 2 on bad input, every error at once), plans placement,
then runs it: RL graphs (dataset -> generate -> ... -> update) under the RLDriver, any other graph
as plain streaming dataflow. Writes DIR/metrics.jsonl, DIR/summary.json, DIR/trace.json and
checkpoints (DIR/checkpoints/step_N, loadable by transformers).
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
"""


def _parser() -> argparse.ArgumentParser:
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
    p.add_argument("--hb-timeout", type=float, default=30.0,
                   help="declare a worker dead after this many seconds without a heartbeat (generous: a 2-core "
                        "machine running torch in every worker can starve a heartbeat thread for seconds)")
    return p


def run_main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        # intermixed: overrides may come after options (`dora run p.yaml --out d k=v`)
        args = p.parse_intermixed_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    graph = load_graph(args.pipeline, args.overrides)
    if graph is None:
        return 2
    from dora.graph.resolve import resolve
    resolved = resolve(graph)   # cannot fail: validation ran the same checks
    if args.backend == "local":
        from dora.runtime.backends.local import resolve_transport
        try:
            resolve_transport()   # checks DORA_TRANSPORT before anything starts
        except ValueError as e:
            print(f"dora run: {e}", file=sys.stderr)
            return 2
    from dora.runtime.placement import Inventory, format_plan, gpu_shortfall, plan as make_plan
    machine = Inventory.detect()
    try:
        plan = make_plan(graph)   # planning needs no device: the pools' own GPU count
    except ValueError as e:
        print(f"dora run: {args.pipeline}: cannot place the graph: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(format_plan(plan, args.backend, machine))
        return 0
    short = gpu_shortfall(graph, machine) if args.backend == "local" else None
    if short:
        print(f"dora run: {args.pipeline}: {short}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else resolved.run.seed
    run_dir = args.out or resolved.run.out or os.path.join("runs", f"{graph.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(run_dir, exist_ok=True)
    return execute(graph, run_dir, backend=args.backend, seed=seed, quiet=args.quiet, deadline_s=args.deadline,
                   source=args.pipeline, hb_timeout=args.hb_timeout, resolved=resolved)


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


def execute(graph, run_dir: str, backend: str = "local", seed: int = 0, quiet: bool = False,
            deadline_s: float = 3600.0, source: str | None = None, hb_timeout: float = 30.0, resolved=None) -> int:
    """Run a validated graph; returns the exit code. Shared by the CLI and benchmarks/modes.py."""
    from dora.graph.resolve import resolve
    from dora.graph.yaml_io import to_yaml
    from dora.runtime.run_controller import Controller
    from dora.runtime.errors import RunFailed
    from dora.runtime.metrics import MetricsLog, summarize, write_summary
    from dora.runtime.progress import RunProgress
    from dora.runtime.rl_driver import RLDriver, RLRoles

    resolved = resolved or resolve(graph)
    with open(os.path.join(run_dir, "pipeline.yaml"), "w", encoding="utf-8") as fh:
        fh.write(to_yaml(graph))   # exactly what ran, overrides applied
    roles = RLRoles.find(graph, resolved.op_of)
    metrics = MetricsLog(run_dir)
    total = resolved.params[roles.update]["steps"] if roles else 0
    progress = RunProgress(total, graph.name, quiet=quiet)
    driver = RLDriver(resolved, roles, metrics, progress) if roles else None
    ctrl = Controller(graph, backend=backend, driver=driver, run_dir=run_dir, seed=seed, deadline_s=deadline_s,
                      hb_timeout=hb_timeout, resolved=resolved)
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
    progress.summary_table(summary)
    if error:
        print(f"dora run: run failed: {error}", file=sys.stderr)
        return 1
    return 0
