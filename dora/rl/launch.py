"""`dora run P.yaml [k=v ...] [--backend local|ray] [--out DIR] [--seed N] [--dry-run] [--dashboard [PORT]]`.

Loads and validates the pipeline (exit 2 on bad input, every error at once), plans placement,
then runs it: RL graphs (dataset -> generate -> ... -> update) under the RLDriver, any other graph
as plain streaming dataflow. Writes DIR/metrics.jsonl, DIR/summary.json, DIR/trace.json and
checkpoints (DIR/checkpoints/step_N, loadable by transformers), DIR/state.json (the dashboard's
data, dora/observe/dashboard) and what `run.loggers` asks for (DIR/tb, DIR/wandb).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from dora.runtime.run_controller import START_TIMEOUT_S, STALL_TIMEOUT_S

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
        resume = _checkpoint_to_resume(args.resume)
        if resume is None:
            return 2
    elif args.pipeline is None:
        print("dora run: give a pipeline file (or --resume RUN_DIR)", file=sys.stderr)
        return 2
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
    if args.backend == "ray" and any(r.spare for r in plan.replicas):
        # Ray places each replica in its own placement group: a spare would get devices of its own,
        # not the trainer's, and lending them would measure nothing
        print(f"dora run: {args.pipeline}: async.elastic runs on the local backend only (its spares share the "
              "trainer's devices; Ray would give them their own)", file=sys.stderr)
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
    if resume is None and not args.overwrite and _holds_a_run(run_dir):
        print(f"dora run: {run_dir} holds an earlier run: continue it with --resume {run_dir}, or start afresh "
              "with --overwrite or another --out (nothing was touched)", file=sys.stderr)
        return 2
    os.makedirs(run_dir, exist_ok=True)
    return execute(graph, run_dir, backend=args.backend, seed=seed, quiet=args.quiet, deadline_s=args.deadline,
                   source=args.pipeline, hb_timeout=args.hb_timeout, resolved=resolved,
                   start_timeout_s=args.start_timeout, stall_timeout_s=args.stall_timeout, resume=resume,
                   dashboard_port=args.dashboard)


def _holds_a_run(run_dir: str) -> bool:
    metrics = os.path.join(run_dir, "metrics.jsonl")
    return (os.path.isfile(metrics) and os.path.getsize(metrics) > 0) or os.path.isdir(os.path.join(run_dir, "checkpoints"))


def _checkpoint_to_resume(run_dir: str):
    """(checkpoint folder, run state, pending trajectories) of the run's last complete checkpoint, or
    None after saying why not (exit 2)."""
    from dora.rl import checkpoint
    if not os.path.isfile(os.path.join(run_dir, "pipeline.yaml")):
        print(f"dora run: --resume {run_dir}: not a run directory (no pipeline.yaml)", file=sys.stderr)
        return None
    found = checkpoint.latest(run_dir)
    if found is None:
        print(f"dora run: --resume {run_dir}: no complete checkpoint in {run_dir}/checkpoints", file=sys.stderr)
        return None
    state, pending = checkpoint.read(found[1])
    return found[1], state, pending


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


def _keep_earlier_trace(run_dir: str) -> None:
    """A resumed run writes its own trace.json; the earlier segments' stay as trace-1.json, ..."""
    path = os.path.join(run_dir, "trace.json")
    if os.path.isfile(path):
        n = 1
        while os.path.exists(os.path.join(run_dir, f"trace-{n}.json")):
            n += 1
        os.replace(path, os.path.join(run_dir, f"trace-{n}.json"))


class StopSignals:
    """SIGTERM / SIGINT during a run: the first asks the controller to stop cleanly (the driver stops
    dispatch and checkpoints, then summary, trace and clean-up as usual); a second one stops at once
    (KeyboardInterrupt: workers are killed, clean-up still runs). Only the main thread can install
    handlers; elsewhere (a run driven from a thread) this does nothing."""

    def __init__(self, ctrl, progress):
        self.ctrl, self.progress = ctrl, progress
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            raise KeyboardInterrupt(f"second signal ({name}): stopping at once")
        self.received = signum
        self.ctrl.stop_requested = name
        self.progress.status(f"{name}: stopping (checkpoint, summary, clean-up); send it again to stop at once")

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number: 143 for SIGTERM, 130 for SIGINT (shell convention)."""
        return 128 + int(self.received or signal.SIGTERM)


def execute(graph, run_dir: str, backend: str = "local", seed: int = 0, quiet: bool = False,
            deadline_s: float | None = None, source: str | None = None, hb_timeout: float = 30.0, resolved=None,
            start_timeout_s: float = START_TIMEOUT_S, stall_timeout_s: float = STALL_TIMEOUT_S, resume=None,
            dashboard_port: int | None = None, live_state: bool = True) -> int:
    """Run a validated graph; returns the exit code (0 finished, 1 failed, 143 / 130 preempted by
    SIGTERM / SIGINT). Shared by the CLI and benchmarks/modes.py. Whatever happens, summary.json and
    trace.json are written and the run's shared memory is removed. live_state keeps RUN_DIR/state.json
    current (False: no live counters at all, for the dashboard's overhead benchmark); dashboard_port
    also serves it (0: any free port)."""
    from dora.graph.resolve import resolve
    from dora.graph.yaml_io import to_yaml
    from dora.runtime.errors import RunFailed
    from dora.observe.dashboard.live import LIVE_S, LiveDashboard
    from dora.observe.metric_sinks import open_for_run
    from dora.observe.metrics import MetricsLog, summarize, write_summary
    from dora.observe.progress import RunProgress
    from dora.rl import run_state
    from dora.rl.driver import RLDriver, RLRoles
    from dora.runtime.run_controller import Controller

    resolved = resolved or resolve(graph)
    from dora.ops.weights import versions as weights
    from dora.runtime import run_files
    swept = run_files.sweep_stale()
    if swept and not quiet:
        print(f"dora run: removed what {len(swept)} dead run(s) left: {', '.join(swept)}", file=sys.stderr)
    shm = weights.shm_dir(run_dir)
    if os.access(os.path.dirname(shm), os.W_OK):
        try:   # before anything in run_dir is written: a live run's files stay untouched
            run_files.claim(shm, run_dir)   # exclusive, 0700
        except run_files.RunFilesError as e:
            print(f"dora run: {e}", file=sys.stderr)
            return 2
    if resume is None:
        with open(os.path.join(run_dir, "pipeline.yaml"), "w", encoding="utf-8") as fh:
            fh.write(to_yaml(graph))   # exactly what ran, overrides applied
    roles = RLRoles.find(graph, resolved.op_of)
    if resume is not None and roles is None:
        print("dora run: --resume continues RL runs only (this graph has no dataset -> generate -> update)", file=sys.stderr)
        return 2
    a = resolved.async_
    sinks = open_for_run(graph, run_dir, {"pipeline": source, "mode": a.mode, "max_staleness": a.max_staleness,
                                          "train_batch": a.train_batch, "rollout_batch": a.rollout_batch, "seed": seed})
    if sinks is None:
        return 1
    metrics = MetricsLog(run_dir, sinks, append=resume is not None)
    total = resolved.params[roles.update]["steps"] if roles else 0
    progress = RunProgress(total, graph.name, quiet=quiet)
    driver = RLDriver(resolved, roles, metrics, progress) if roles else None
    restores = None
    if resume is not None:
        folder, state, pending = resume
        driver.restore(state, pending)
        restores = run_state.replica_restores(state, roles, graph, folder)
        _keep_earlier_trace(run_dir)
    dash = None
    if live_state or dashboard_port is not None:
        try:
            dash = LiveDashboard(graph, run_dir, driver=driver, metrics=metrics, total_steps=total or None, port=dashboard_port)
        except OSError as e:
            print(f"dora run: --dashboard: cannot listen on 127.0.0.1:{dashboard_port}: {e.strerror or e}", file=sys.stderr)
            metrics.close()
            return 2
    ctrl = Controller(graph, backend=backend, driver=driver, run_dir=run_dir, seed=seed, deadline_s=deadline_s,
                      hb_timeout=hb_timeout, start_timeout_s=start_timeout_s, stall_timeout_s=stall_timeout_s,
                      resolved=resolved, restores=restores, max_restarts=resolved.run.max_restarts,
                      live_s=LIVE_S if dash else 0.0, monitor=dash.state if dash else None)
    if driver is not None:
        driver.attach(ctrl)
    t0 = time.monotonic()
    ended, error = "failed", None
    signals = StopSignals(ctrl, progress)
    try:
        with signals:
            ctrl.run()
        ended = "preempted" if ctrl.stop_requested else "finished"
    except RunFailed as e:
        error = str(e)   # names the node and replica, with the worker's traceback
    except KeyboardInterrupt as e:
        ended, error = "preempted", str(e) or "interrupted"
    except Exception as e:   # a driver or control error: a named failure, not a bare traceback
        error = f"the run's control code failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        progress.close()
        metrics.close()
        weights.cleanup(run_dir)   # the /dev/shm copies; checkpoints stay in run_dir
    wall = time.monotonic() - t0
    summary: dict[str, Any] = summarize(metrics.records, name=graph.name, mode=graph.async_.mode, backend=backend,
                                        seed=seed, wall_s=wall, run_dir=run_dir, ok=ended == "finished", error=error,
                                        source=source, ended=ended, wire_rejected=ctrl.rejected())
    if ended == "preempted":
        summary["stop_reason"] = ctrl.stop_requested or "interrupted"
    if resume is not None:
        summary["resumed_from_step"] = int(resume[1]["step"])
    summary["respawn_log"] = ctrl.respawn_log   # {replica, why, seconds until it took work again}
    try:
        if driver is not None:
            summary["accounting"] = driver.finish()
            summary["stop_reason"] = summary.get("stop_reason") or driver.stop_reason
            for key in ("c1_violations", "c2_violations", "c3_violations"):
                summary[key] = max(summary.get(key, 0), summary["accounting"].get(key, 0))
            summary["weight_loads"] = driver.weight_loads
            if driver.elastic is not None:   # lends, hand-back seconds, requests and KV bytes moved
                summary["elastic"] = driver.elastic.summary()
            summary["checkpoints"] = driver.checkpoint_log
            driver.trace.write(os.path.join(run_dir, "trace.json"))
        else:
            with open(os.path.join(run_dir, "trace.json"), "w") as fh:
                json.dump({"traceEvents": []}, fh)
    finally:
        write_summary(run_dir, summary)
        if dash is not None:
            dash.close(ctrl, ended == "finished", error)
    progress.summary_table(summary)
    if ended == "preempted":
        print(f"dora run: preempted ({summary['stop_reason']}); summary in {run_dir}", file=sys.stderr)
        return signals.exit_code
    if error:
        print(f"dora run: run failed: {error}", file=sys.stderr)
        return 1
    return 0
