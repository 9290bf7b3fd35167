"""`dora simulate`: run the rollout modes side by side on the cluster simulator.

    dora simulate --workload dapo-math --model qwen2.5-32b --gpus 64 \
        --modes sync,one_step_off,partial,dora --steps 20 --seed 0 --json out.json [--out DIR]
    dora simulate --trace RUN_DIR/length_trace.jsonl --sweep-k 1,2,3,5,10   # which K, on a run's lengths

Prints a table and (with --json) writes a JSON array: one object per mode, then the `ideal` row.
--out DIR writes a run folder per mode (DIR/<mode>: metrics.jsonl, summary.json, trace.json,
state.json) for `dora dashboard DIR/<mode>` and `dora plot DIR/*` (dora/sim/sim_run_files.py).
Exit codes: 0 ok, 1 simulation failed, 2 bad arguments or input files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from dora.observe.trace import TraceWriter
from dora.rl.rollout import POLICIES, RolloutConfig, RolloutConfigError

MODES = POLICIES.names()   # every rollout mode, in listing order

from .costmodel import MODELS, CostModel
from .simulator import (DEFAULT_FAST_LANES, DEFAULT_VERSIONS, SimConfig, SimulationError, ideal, placement,
                        simulate, versions_problem)
from .sweep_k import parse_ks, print_sweep, sweep
from .workloads import WORKLOADS, WorkloadError, get_workload

KEYS = ("mode", "step_time_s", "tokens_per_s", "rollout_only_fraction", "bubble_fraction", "staleness_max",
        "c1_violations", "c2_violations", "c3_violations", "overhead_fraction")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):              # argparse exits 2 itself; say it our way
        raise _BadArgs(message)


class _BadArgs(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dora simulate", description="Simulate rollout modes (sync, one_step_off, partial, dora, the "
                "published partial baselines) on a virtual cluster with the real orchestrator code.")
    p.add_argument("--workload", default="dapo-math", help=f"built-in workload: {', '.join(WORKLOADS)}")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="JSONL of {prompt_tokens, response_tokens} to resample instead of --workload")
    p.add_argument("--model", default="qwen2.5-32b", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-staleness", type=int, default=3, help="K for dora and partial")
    p.add_argument("--train-batch", type=int, default=None,
                   help="TBS, trajectories per training step (default 8192; with a run's length trace, its steps')")
    p.add_argument("--rollout-batch", type=int, default=0,
                   help="RBS, trajectories kept in flight (dora/partial; 0 = 1.5 x TBS)")
    p.add_argument("--group-size", type=int, default=None,
                   help="G, responses per prompt (default 16; with a run's length trace, its groups')")
    p.add_argument("--sweep-k", default=None, metavar="K,K,...",
                   help="for each K: dora and each partial baseline beside sync and the ideal; names the smallest "
                        "K reaching 90%% of the ideal (--modes is not used)")
    p.add_argument("--jobs", type=int, default=1, help="simulations run at once with --sweep-k (one process each)")
    p.add_argument("--train-gpus", type=int, default=0, help="trainer pool size for disaggregated modes (0 = balanced)")
    p.add_argument("--drop-groups", type=float, default=0.0, metavar="P",
                   help="fraction of finished groups a filter drops (DAPO dynamic sampling); replaced by new prompts")
    p.add_argument("--elastic", action="store_true",
                   help="trainer devices waiting for a batch serve rollout (every mode; colocated sync has none to lend)")
    p.add_argument("--versions-per-instance", type=int, default=DEFAULT_VERSIONS, metavar="M",
                   help="policy versions one rollout instance may hold at once (async.versions_per_instance, "
                        f"default {DEFAULT_VERSIONS}); dora mode packs old versions' stragglers beside the newest")
    p.add_argument("--fast-lanes", type=int, default=DEFAULT_FAST_LANES, metavar="N",
                   help="dora: at most N rollout instances serve as fast lanes for stragglers (async.fast_lanes; "
                        f"default {DEFAULT_FAST_LANES}: as many as measured, 0: none)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="held-out evaluation of version 0 and every N-th version (0: none), placed as a run places it")
    p.add_argument("--eval-prompts", type=int, default=0, metavar="P",
                   help="its requests per evaluation (one sample per prompt, lengths from the workload)")
    p.add_argument("--policy", action="append", default=[], metavar="NAME:WORKLOAD:TBS",
                   help="two or more: the policies share one rollout pool (dora/sim/two_policies.py); one row per "
                        "--splits entry, each policy trained --steps steps in --modes' first mode")
    p.add_argument("--splits", default="static,load", help="how the shared pool is split: static, load (or both)")
    p.add_argument("--json", default=None, metavar="FILE", help="write results as a JSON array")
    p.add_argument("--trace-out", default=None, metavar="FILE",
                   help="Chrome/Perfetto trace (one file per mode: FILE with .<mode> before the extension)")
    p.add_argument("--per-step", action="store_true", help="include per-step metrics in the JSON")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write a run folder per mode, DIR/<mode>, that `dora dashboard` and `dora plot` read")
    return p


def _configs(a: argparse.Namespace) -> list[SimConfig]:
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise _BadArgs(f"--modes: unknown mode(s) {', '.join(bad) or '(none given)'}; expected a subset of {','.join(MODES)}")
    if a.model not in MODELS:
        raise _BadArgs(f"--model: unknown model {a.model!r}; expected one of {', '.join(MODELS)}")
    tp = MODELS[a.model].tp
    if a.gpus < 2 * tp or a.gpus % tp:
        raise _BadArgs(f"--gpus {a.gpus}: must be a multiple of {tp} (the rollout TP size of {a.model}) and >= {2 * tp}")
    if a.steps < 1:
        raise _BadArgs(f"--steps must be >= 1, got {a.steps}")
    if a.train_gpus and not (0 < a.train_gpus <= a.gpus - tp):
        raise _BadArgs(f"--train-gpus {a.train_gpus}: must leave at least one rollout group of {tp} GPUs out of {a.gpus}")
    if not 0 <= a.drop_groups < 1:
        raise _BadArgs(f"--drop-groups {a.drop_groups}: must be in [0, 1)")
    if a.eval_every < 0 or a.eval_prompts < 0 or bool(a.eval_every) != bool(a.eval_prompts):
        raise _BadArgs("--eval-every N and --eval-prompts P go together, both >= 1")
    workload = get_workload(a.workload, a.trace)            # WorkloadError -> exit 2
    _sizes_from(a, workload)
    _check_versions(a, workload)
    out = []
    for m in modes:
        c = SimConfig(mode=m, model=a.model, gpus=a.gpus, steps=a.steps, seed=a.seed, train_batch=a.train_batch,
                      rollout_batch=a.rollout_batch, group_size=a.group_size, max_staleness=a.max_staleness,
                      workload=a.workload, trace_file=a.trace, train_gpus=a.train_gpus, drop_groups=a.drop_groups,
                      elastic=a.elastic, versions_per_instance=a.versions_per_instance, fast_lanes=a.fast_lanes,
                      eval_every=a.eval_every, eval_prompts=a.eval_prompts)
        RolloutConfig(mode=m, train_batch=c.train_batch, rollout_batch=c.rollout_batch, group_size=c.group_size,
                      max_staleness=c.max_staleness, fast_lanes=c.fast_lanes).resolved()   # RolloutConfigError -> exit 2
        _check_lanes(c)
        out.append(c)
    return out


def _sizes_from(a: argparse.Namespace, workload) -> None:
    """Train batch and group size: as given, else a length trace's (its smallest step, its groups), else
    the paper's; a length trace refuses a batch larger than its steps or another group size."""
    trace_g = getattr(workload, "group_size", None)
    if a.group_size is None:
        a.group_size = trace_g or 16
    if a.train_batch is None:
        a.train_batch = workload.per_step - workload.per_step % a.group_size if trace_g else 8192
    if trace_g:
        workload.check(a.train_batch, a.group_size)


def _check_versions(a: argparse.Namespace, workload) -> None:
    """--versions-per-instance: >= 1, and the weights of that many versions must leave room in one
    instance for one request of the workload's maximum length (the longest of a step's draws)."""
    problem = versions_problem(CostModel(MODELS[a.model]), workload, a.versions_per_instance)
    if problem:
        raise _BadArgs(f"--versions-per-instance {a.versions_per_instance}: {problem}")


def _check_lanes(c: SimConfig) -> None:
    """--fast-lanes must leave the newest version at least one of the mode's rollout instances."""
    if c.fast_lanes > 0:
        instances = placement(c, CostModel(MODELS[c.model]), get_workload(c.workload, c.trace_file))[0]
        if c.fast_lanes >= instances:
            raise _BadArgs(f"--fast-lanes {c.fast_lanes} leaves no rollout instance for the newest version: "
                           f"{c.mode} runs {instances} instance(s) on {c.gpus} GPUs")


def _trace_path(base: str, mode: str, many: bool) -> str:
    if not many:
        return base
    stem, dot, ext = base.rpartition(".")
    return f"{stem}.{mode}.{ext}" if dot else f"{base}.{mode}"


def _print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title)
    cols = [("mode", "mode"), ("step_time_s", "step s"), ("tokens_per_s", "tok/s"), ("ratio_to_sync", "x sync"),
            ("ratio_to_ideal", "/ ideal"), ("rollout_only_fraction", "rollout-only"), ("bubble_fraction", "bubble"),
            ("overhead_fraction", "overhead"), ("staleness_max", "stale max"), ("c1_violations", "C1"),
            ("c2_violations", "C2"), ("c3_violations", "C3"), ("migrated_requests", "migrated"),
            ("fast_lane_requests", "to lanes"),
            ("reprefill_tokens", "re-prefill tok")]
    for _, h in cols:
        t.add_column(h, justify="left" if h == "mode" else "right")
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k, "")
            if isinstance(v, float):
                v = f"{v:.1%}" if k.endswith("fraction") else (f"{v:.2f}" if k.startswith("ratio") else f"{v:,.0f}")
            elif isinstance(v, int):
                v = f"{v:,}"
            cells.append(str(v))
        t.add_row(*cells)
    Console(width=None if sys.stdout.isatty() else 180).print(t)   # pipes: don't squash columns


def simulate_main(argv: list[str] | None = None) -> int:
    try:
        a = build_parser().parse_args(argv)
        ks = parse_ks(a.sweep_k) if a.sweep_k is not None else None
        if ks:
            a.modes = "dora"
        configs = _configs(a)
    except _BadArgs as e:
        print(f"dora simulate: error: {e}", file=sys.stderr)
        return 2
    except (RolloutConfigError, WorkloadError, ValueError) as e:
        print(f"dora simulate: error: {e}", file=sys.stderr)
        return 2
    if a.policy:
        return policies_main(a, configs[0])
    if ks:
        return _sweep_main(a, configs[0], ks)
    rows: list[dict[str, Any]] = []
    for c in configs:
        trace = TraceWriter(enabled=bool(a.trace_out or a.out))
        parts: list = []
        try:
            r = simulate(c, trace, observer=lambda *p: parts.extend(p))
        except SimulationError as e:
            print(f"dora simulate: {c.mode} failed: {e}", file=sys.stderr)
            return 1
        try:
            if a.out:
                from .sim_run_files import write_sim_run
                write_sim_run(os.path.join(a.out, c.mode), c, r, trace, *parts)
            if a.trace_out:
                path = _trace_path(a.trace_out, c.mode, len(configs) > 1)
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                trace.write(path)
        except OSError as e:
            print(f"dora simulate: error: cannot write {e.filename}: {e.strerror}", file=sys.stderr)
            return 2
        if not a.per_step:
            r.pop("per_step", None)
        rows.append(r)
    best = ideal(configs[0])
    sync = next((r for r in rows if r["mode"] == "sync"), None)
    for r in rows:
        r["ratio_to_ideal"] = r["tokens_per_s"] / best["tokens_per_s"]
        if sync:
            r["ratio_to_sync"] = r["tokens_per_s"] / sync["tokens_per_s"]
    best["ratio_to_ideal"] = 1.0
    if sync:
        best["ratio_to_sync"] = best["tokens_per_s"] / sync["tokens_per_s"]
    for k in KEYS:
        best.setdefault(k, 0)
    rows.append(best)
    _print_table(rows, f"{configs[0].model}, {a.gpus} GPUs, {a.train_batch} trajectories/step (G={a.group_size}), "
                       f"K={a.max_staleness}, {a.steps} steps, {configs[0].workload if not a.trace else a.trace}")
    return _write_json(a.json, rows)


def _write_json(path: str | None, rows: list[dict[str, Any]]) -> int:
    """--json FILE: the rows as a JSON array; 0, or 2 when it cannot be written."""
    if path:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)
        except OSError as e:
            print(f"dora simulate: error: cannot write {path}: {e.strerror}", file=sys.stderr)
            return 2
    return 0


def _sweep_main(a: argparse.Namespace, base: SimConfig, ks: list[int]) -> int:
    try:
        rows = sweep(base, ks, max(1, a.jobs))
    except SimulationError as e:
        print(f"dora simulate: the K sweep failed: {e}", file=sys.stderr)
        return 1
    print_sweep(rows, f"{base.model}, {a.gpus} GPUs, {a.train_batch} trajectories/step (G={a.group_size}), "
                      f"{a.steps} steps, {a.trace or a.workload}: dora per K against sync and the partial baselines")
    return _write_json(a.json, rows)


def policies_main(a: argparse.Namespace, cfg: SimConfig) -> int:
    """Several policies on one shared pool, one row per split (dora/sim/two_policies.py)."""
    from .policy_split import SPLITS
    from .two_policies import SimPolicy, simulate_policies
    try:
        policies = [SimPolicy.parse(x) for x in a.policy]
        for p in policies:
            get_workload(p.workload, None)
        splits = [x.strip() for x in a.splits.split(",") if x.strip()]
        if not splits or set(splits) - set(SPLITS):
            raise ValueError(f"--splits {a.splits!r}: expected a subset of {','.join(SPLITS)}")
        rows = [simulate_policies(cfg, policies, s) for s in splits]
    except (ValueError, WorkloadError) as e:
        print(f"dora simulate: error: {e}", file=sys.stderr)
        return 2
    except SimulationError as e:
        print(f"dora simulate: failed: {e}", file=sys.stderr)
        return 1
    for r in rows:
        per = "  ".join(f"{u}: step {q['step_time_s']:.0f} s, {q['tokens_per_s']:,.0f} tok/s, done at {q['finished_s']:.0f} s, "
                        f"{q['instances_held']:.1f} instances, C1-C3 {q['c1_violations']}/{q['c2_violations']}/"
                        f"{q['c3_violations']}" for u, q in r["policies"].items())
        print(f"{r['split']:>6}: all done at {r['makespan_s']:,.0f} s, {r['instances_moved']} instances moved  |  {per}")
    return _write_json(a.json, rows)


if __name__ == "__main__":
    sys.exit(simulate_main())
