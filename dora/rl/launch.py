"""`dora run P.yaml [k=v ...] [--backend local|ray] [--out DIR] [--seed N] [--dry-run] [--dashboard [PORT]]`.

Loads and validates the pipeline (exit 2 on bad input, every error at once), plans placement,
then runs it: RL graphs (dataset -> generate -> ... -> update) under the RLDriver, any other graph
as plain streaming dataflow. Writes DIR/metrics.jsonl, DIR/summary.json, DIR/trace.json and
checkpoints (DIR/checkpoints/step_N, loadable by transformers), DIR/state.json (the dashboard's
data, dora/observe/dashboard) and what `run.loggers` asks for (DIR/tb, DIR/wandb).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import Any

from dora.graph.diagnostics import BadInput
from dora.graph.model import Graph
from dora.rl.execute import execute
from dora.runtime.run_controller import START_TIMEOUT_S, STALL_TIMEOUT_S

__all__ = ["Launch", "LaunchRefused", "checkpoint_to_resume", "execute", "load_graph", "prepare", "run_folder", "run_main"]

EXAMPLE = """example:
  dora run pipelines/quickstart.yaml --out runs/quickstart
  dora run pipelines/quickstart.yaml async.mode=dora async.max_staleness=2 --out runs/q-dora
  dora run pipelines/grpo.yaml --dry-run          # print the placement plan and exit
  dora run pipelines/quickstart.yaml async.mode=dora --dashboard      # live page on 127.0.0.1
"""


def _parser() -> argparse.ArgumentParser:
    from dora.observe.dashboard import live
    p = argparse.ArgumentParser(prog="dora run", description="Run a pipeline.", epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", nargs="?", help="pipeline YAML file (with --resume: the run's own pipeline.yaml)")
    p.add_argument("overrides", nargs="*", help="key=value overrides (omegaconf dotted paths)")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--out", default=None, help="run directory (default runs/<name>-<time>)")
    p.add_argument("--seed", type=_seed, default=None, help="run seed (default: run.seed in the YAML, else 0)")
    p.add_argument("--dry-run", action="store_true", help="print the placement plan and exit")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a run from its last complete checkpoint (metrics and ledgers are appended)")
    p.add_argument("--overwrite", action="store_true", help="start afresh in an --out that holds an earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--deadline", type=_seconds, default=None,
                   help="fail the run after this many seconds (default: no wall-clock limit; every wait still has its own bound)")
    p.add_argument("--start-timeout", type=_seconds, default=START_TIMEOUT_S,
                   help=f"fail if workers are not up within this many seconds (imports, model load; default {START_TIMEOUT_S:.0f})")
    p.add_argument("--stall-timeout", type=_seconds, default=STALL_TIMEOUT_S,
                   help="fail a replica that stays inside one op call this long with no sign of progress "
                        f"(default {STALL_TIMEOUT_S:.0f})")
    live.add_flag(p)
    p.add_argument("--hb-timeout", type=_seconds, default=30.0,
                   help="declare a worker dead after this many seconds without a heartbeat (generous: a 2-core "
                        "machine running torch in every worker can starve a heartbeat thread for seconds)")
    return p


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    """A CLI duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


class LaunchRefused(BadInput):
    """A run that cannot start as asked (exit 2, nothing touched); the message says why and what to do."""


@dataclasses.dataclass
class Launch:
    """A validated graph, ready to run: its settings, placement and run folder."""

    graph: Graph
    resolved: Any
    plan: Any
    machine: Any
    run_dir: str
    seed: int
    resume: Any = None


def run_main(argv: list[str] | None = None) -> int:
    p = _parser()
    try:
        # intermixed: overrides may come after options (`dora run p.yaml --out d k=v`)
        from dora.observe.dashboard.live import bare_flag_first, check_port
        args = p.parse_intermixed_args(bare_flag_first(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if check_port(args.dashboard):
        print(f"dora run: {check_port(args.dashboard)}", file=sys.stderr)
        return 2
    resume = None
    if args.resume:
        # the run's own pipeline; a positional argument is then an override like the rest
        args.overrides = ([args.pipeline] if args.pipeline else []) + args.overrides
        args.pipeline, args.out = os.path.join(args.resume, "pipeline.yaml"), args.resume
    elif args.pipeline is None:
        print("dora run: give a pipeline file (or --resume RUN_DIR)", file=sys.stderr)
        return 2
    try:
        if args.resume:
            run_folder(args.resume)
        graph = load_graph(args.pipeline, args.overrides)
        if graph is None:
            return 2
        if args.resume:   # (each policy's own checkpoints in a run of several)
            resume = checkpoint_to_resume(args.resume, graph)
        launch = prepare(graph, backend=args.backend, out=args.out, seed=args.seed, resume=resume,
                         overwrite=args.overwrite, source=args.pipeline, dry_run=args.dry_run)
    except LaunchRefused as e:
        print(f"dora run: {e}", file=sys.stderr)
        return 2
    if launch is None:   # --dry-run: the plan was printed
        return 0
    return execute(graph, launch.run_dir, backend=args.backend, seed=launch.seed, quiet=args.quiet,
                   deadline_s=args.deadline, source=args.pipeline, hb_timeout=args.hb_timeout, resolved=launch.resolved,
                   start_timeout_s=args.start_timeout, stall_timeout_s=args.stall_timeout, resume=resume,
                   dashboard_port=args.dashboard)


def prepare(graph: Graph, *, backend: str = "local", out: str | None = None, seed: int | None = None, resume=None,
            overwrite: bool = False, source: str | None = None, dry_run: bool = False) -> Launch | None:
    """Everything `dora run` decides before starting a validated graph: its settings, the transport,
    the placement (printed and None with dry_run), the devices this machine has, the run folder (made;
    one holding an earlier run is refused unless overwrite or resume). LaunchRefused says why not."""
    from dora.graph.resolve import resolve
    from dora.rl.elastic_lending import elastic_spares
    from dora.runtime.placement import Inventory, format_plan, gpu_shortfall, plan as make_plan

    where = source or graph.source_file or graph.name
    resolved = resolve(graph)   # cannot fail: validation ran the same checks
    if backend == "local":
        from dora.runtime.backends.local import resolve_transport
        try:
            resolve_transport()   # checks DORA_TRANSPORT before anything starts
        except ValueError as e:
            raise LaunchRefused(str(e)) from None
    machine = Inventory.detect()
    try:
        plan = make_plan(graph, spares=elastic_spares(graph))   # planning needs no device: the pools' own GPU count
    except ValueError as e:
        raise LaunchRefused(f"{where}: cannot place the graph: {e}") from None
    if backend == "ray" and any(r.spare for r in plan.replicas):
        # Ray places each replica in its own placement group: a spare would get devices of its own,
        # not the trainer's, and lending them would measure nothing
        raise LaunchRefused(f"{where}: async.elastic runs on the local backend only (its spares share the "
                            "trainer's devices; Ray would give them their own)")
    if backend == "ray" and plan.shared:
        # a Ray placement group per replica: replicas declared to share a device would get one each
        raise LaunchRefused(f"{where}: devices shared by memory shares run on the local backend only (Ray "
                            "would give each replica devices of its own)")
    if dry_run:
        print(format_plan(plan, backend, machine))
        return None
    short = gpu_shortfall(graph, machine) if backend == "local" else None
    if short:
        raise LaunchRefused(f"{where}: {short}")
    seed = seed if seed is not None else resolved.run.seed
    run_dir = out or resolved.run.out or os.path.join("runs", f"{graph.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if resume is None and not overwrite and _holds_a_run(run_dir):
        raise LaunchRefused(f"{run_dir} holds an earlier run: continue it with --resume {run_dir} (dora.run(..., "
                            "resume=True)), or start afresh with --overwrite or another --out (nothing was touched)")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise LaunchRefused(f"cannot make the run folder {run_dir}: {e.strerror or e}") from None
    return Launch(graph, resolved, plan, machine, run_dir, seed, resume)


def _holds_a_run(run_dir: str) -> bool:
    metrics = os.path.join(run_dir, "metrics.jsonl")
    return ((os.path.isfile(metrics) and os.path.getsize(metrics) > 0) or os.path.isdir(os.path.join(run_dir, "checkpoints"))
            or os.path.isdir(os.path.join(run_dir, "policies")))


def run_folder(run_dir: str) -> str:
    """The pipeline.yaml of the run in run_dir, which --resume continues; LaunchRefused if it is not a run."""
    path = os.path.join(run_dir, "pipeline.yaml")
    if not os.path.isfile(path):
        raise LaunchRefused(f"--resume {run_dir}: not a run directory (no pipeline.yaml)")
    return path


def checkpoint_to_resume(run_dir: str, graph: Graph | None = None):
    """The run's newest checkpoint that verifies against its manifest (newer ones that do not are
    named and skipped); LaunchRefused when there is none. `graph`: the run's own; in a run of several
    policies each policy resumes from its own: {policy: Resume, or None for a policy with none (it
    starts afresh)}."""
    run_folder(run_dir)
    from dora.graph.policy_roles import policy_dir
    from dora.graph.resolve import resolve
    policies = list(resolve(graph).policies) if graph is not None else []
    if policies:
        found = {u: _trusted(policy_dir(run_dir, u), f"{run_dir} ({u})") for u in policies}
        if all(r is None for r in found.values()):
            raise LaunchRefused(f"--resume {run_dir}: no policy has a complete checkpoint "
                                f"(in {run_dir}/policies/<update>/checkpoints)")
        return found
    found = _trusted(run_dir, run_dir)
    if found is None:
        raise LaunchRefused(f"--resume {run_dir}: no complete checkpoint in {run_dir}/checkpoints")
    return found


def _trusted(folder: str, what: str):
    """checkpoint.Resume of the newest trusted checkpoint in folder/checkpoints (None: none)."""
    from dora.rl import checkpoint
    found, skipped = checkpoint.trusted(folder)
    for path, why in skipped:   # (moved to rolled_back/ once the run starts: dora/rl/lineage.py)
        print(f"dora run: --resume {what}: skipping checkpoint {path}: {why}", file=sys.stderr)
    if found is None:
        return None
    if skipped:
        print(f"dora run: --resume {what}: continuing from {found[1]}", file=sys.stderr)
    from dora.ops.weights.pretrained import holds_optimizer
    if not holds_optimizer(found[1]):
        print(f"dora run: --resume {what}: {found[1]} holds no optimizer state (run.save_optimizer): the trainer "
              "continues from its weights with AdamW's moments afresh", file=sys.stderr)
    state, pending = checkpoint.read(found[1])
    return checkpoint.Resume(found[1], state, pending, [path for path, _ in skipped])


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
