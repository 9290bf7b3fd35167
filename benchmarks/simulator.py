"""Simulator benchmarks: (1) the validation table: every cell of the DORA paper's table (Qwen2.5-32B,
DAPO-Math, 512 prompts x 16, K=3, 64 and 128 GPUs) beside ours, the error, and which cells were
fitted; then every mode with its ratio to sync and to the ideal bound; (2) simulator speed at
4,096 GPUs, 8,192 trajectories/step, 50 steps (target < 60 s).

    python benchmarks/simulator.py [--steps 20] [--seeds 0,1,2] [--speed-steps 50] [--jobs 2] [--record docs/benchmarks.md]

The paper's partial baseline is colocated with a training barrier (Kimi k1.5 style): its cells sit
beside our partial_colocated; partial (AReaL-style streaming) and partial_inflight (PipelineRL) are
predictions with no paper cell.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.rl.rollout import POLICIES  # noqa: E402

MODES = POLICIES.names()
from dora.sim.simulator import SimConfig, ideal, simulate  # noqa: E402

# The paper's table (DORA.md): (GPUs, mode) -> (rollout-only share, step minutes, tokens/s); None = not given.
# The paper's partial baseline is colocated, Kimi k1.5 style (a training barrier): our partial_colocated.
# Our partial (AReaL-style streaming) and partial_inflight (PipelineRL) have no cells in the paper.
PAPER = {
    (64, "sync"): (0.65, 22.91, 14143), (64, "one_step_off"): (0.33, 22.94, 14141),
    (64, "partial_colocated"): (0.46, 17.38, 19872), (64, "dora"): (0.12, 14.67, 23327),
    (128, "sync"): (0.73, 20.23, 16070), (128, "one_step_off"): (None, 14.0, 23200),
    (128, "partial_colocated"): (None, 13.95, 30800), (128, "dora"): (0.24, 10.46, 34135),
}
NOT_IN_PAPER = (None, None, None)
# What the calibration fitted (the dapo-math workload and the shared costs); the rest is predicted.
FITTED = {("sync", "rollout-only"), ("sync", "step min"), ("sync", "tokens/step")}


def _one(args: tuple[str, int, int, int]) -> tuple[dict, float]:
    mode, gpus, steps, seed = args
    t0 = time.perf_counter()
    return simulate(SimConfig(mode=mode, gpus=gpus, steps=steps, seed=seed)), time.perf_counter() - t0


def run_all(gpus_list: list[int], steps: int, seeds: list[int], jobs: int) -> dict:
    """Every mode at every size, each seed its own process (`jobs` at a time): (GPUs, mode) -> summary."""
    work = [(m, g, steps, s) for g in gpus_list for m in MODES for s in seeds]
    with multiprocessing.Pool(jobs) as pool:
        done = pool.map(_one, work, chunksize=1)
    out = {}
    for i, (g, m) in enumerate((g, m) for g in gpus_list for m in MODES):
        part = done[i * len(seeds):(i + 1) * len(seeds)]
        out[(g, m)] = summarise([r for r, _ in part], sum(w for _, w in part))
        print(f"{g} {m}: {out[(g, m)]['tokens_per_s']:,.0f} tok/s", file=sys.stderr, flush=True)
    return out


def summarise(rs: list[dict], wall: float) -> dict:
    out = {k: statistics.mean(r[k] for r in rs) for k in ("tokens_per_s", "step_time_s", "rollout_only_fraction",
                                                           "bubble_fraction", "overhead_fraction")}
    out["tps_all"] = [r["tokens_per_s"] for r in rs]
    out["tokens_per_step"] = statistics.mean(r["tokens_per_s"] * r["step_time_s"] for r in rs)
    out["violations"] = "/".join(str(sum(r[f"c{i}_violations"] for r in rs)) for i in (1, 2, 3))
    out["stale"] = max(r["staleness_max"] for r in rs)
    out["split"] = f"{rs[0]['train_gpus']}+{rs[0]['rollout_instances']}x4"
    out["wall"] = wall / len(rs)
    return out


def validation(results: dict, gpus_list: list[int]) -> list[str]:
    rows = ["| GPUs | mode | quantity | paper | ours | error | |", "|" + "---|" * 7]
    for g in gpus_list:
        for mode in MODES:
            r = results[(g, mode)]
            ro, step, tps = PAPER.get((g, mode), NOT_IN_PAPER)
            cells = [("rollout-only", ro, r["rollout_only_fraction"], "{:.0%}"),
                     ("step min", step, r["step_time_s"] / 60, "{:.2f}"),
                     ("tokens/s", tps, r["tokens_per_s"], "{:,.0f}"),
                     ("tokens/step", step * 60 * tps / 1e6 if step and tps else None, r["tokens_per_step"] / 1e6,
                      "{:.2f}M")]
            for q, paper, ours, fmt in cells:
                err = "-" if paper is None else f"{ours / paper - 1:+.1%}"
                kind = "fitted" if (mode, q) in FITTED else "predicted"
                rows.append(f"| {g} | {mode} | {q} | {'-' if paper is None else fmt.format(paper)} | "
                            f"{fmt.format(ours)} | {err} | {kind} |")
    return rows


def modes_table(results: dict, gpus_list: list[int], seeds: list[int]) -> list[str]:
    rows = ["| GPUs | mode | step (min) | tok/s (seed range) | x sync | / ideal | rollout-only | bubble | overhead | "
            "stale max | C1/C2/C3 | train+rollout GPUs | wall s |", "|" + "---|" * 13]
    for g in gpus_list:
        bound = ideal(SimConfig(gpus=g, seed=seeds[0]))
        sync = results[(g, "sync")]["tokens_per_s"]
        for mode in MODES:
            r = results[(g, mode)]
            lo, hi = min(r["tps_all"]), max(r["tps_all"])
            rows.append(f"| {g} | {mode} | {r['step_time_s'] / 60:.2f} | {r['tokens_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                        f"{r['tokens_per_s'] / sync:.2f}x | {r['tokens_per_s'] / bound['tokens_per_s']:.2f} | "
                        f"{r['rollout_only_fraction']:.1%} | {r['bubble_fraction']:.1%} | {r['overhead_fraction']:.2%} | "
                        f"{r['stale']} | {r['violations']} | {r['split']} | {r['wall']:.1f} |")
        rows.append(f"| {g} | ideal ({bound['bound']}) | {bound['step_time_s'] / 60:.2f} | {bound['tokens_per_s']:,.0f} | "
                    f"{bound['tokens_per_s'] / sync:.2f}x | 1.00 | capacity {bound['capacity_step_s'] / 60:.2f} min, "
                    f"latency floor {bound['latency_floor_step_s'] / 60:.2f} min | | | | | | |")
    return rows


def speed(steps: int) -> list[str]:
    rows = ["| mode | GPUs | rollout groups | traj/step | steps | trained | simulated | wall | < 60 s | load avg |",
            "|" + "---|" * 10]
    for mode in ("sync", "dora"):
        cfg = SimConfig(mode=mode, gpus=4096, steps=steps, train_batch=8192, group_size=16, seed=0,
                        train_gpus=0 if mode == "sync" else 1024)
        t0 = time.perf_counter()
        r = simulate(cfg)
        wall = time.perf_counter() - t0
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        rows.append(f"| {mode} | 4096 | {r['rollout_instances']} | 8192 | {steps} | {r['trajectories_trained']:,} | "
                    f"{r['total_time_s'] / 3600:.1f} h | {wall:.1f} s | {'yes' if wall < 60 else 'NO'} | {load:.1f} |")
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--speed-steps", type=int, default=50, help="0 to skip the speed run")
    ap.add_argument("--gpus", default="64,128", help="paper-setting cluster sizes")
    ap.add_argument("--record", default=None, help="append the tables to this markdown file")
    ap.add_argument("--jobs", type=int, default=2, help="simulations run at once (one process each)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    gpus_list = [int(g) for g in a.gpus.split(",") if g]
    results = run_all(gpus_list, a.steps, seeds, a.jobs)
    val, mt = validation(results, gpus_list), modes_table(results, gpus_list, seeds)
    print("\n".join(val) + "\n\n" + "\n".join(mt), flush=True)
    sp = speed(a.speed_steps) if a.speed_steps else []
    if a.record:
        with open(a.record, "a") as f:
            f.write(f"\n`python benchmarks/simulator.py --steps {a.steps} --seeds {a.seeds} --speed-steps {a.speed_steps}` "
                    f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, shared); "
                    f"means over seeds {a.seeds}, steady state after {max(1, a.steps // 5)} warm-up steps.\n\n"
                    + "\n".join(val) + "\n\n" + "\n".join(mt) + "\n"
                    + ("\nSimulator speed (wall time of one `simulate()` call):\n\n" + "\n".join(sp) + "\n" if sp else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
