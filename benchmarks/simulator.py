"""Simulator benchmarks: (1) the paper's setting side by side (Qwen2.5-32B, DAPO-Math lengths,
512 prompts x 16, K=3) at 64 and 128 GPUs, every mode with its ratio to sync and to the ideal
bound; (2) simulator speed at 4,096 GPUs, 8,192 trajectories/step, 50 steps (target < 60 s).

    python benchmarks/simulator.py [--steps 20] [--speed-steps 50] [--record docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.runtime.rollout import MODES  # noqa: E402
from dora.sim.simulator import SimConfig, ideal, simulate  # noqa: E402


def paper_setting(gpus: int, steps: int) -> list[str]:
    rows, sync_tps = [], None
    bound = ideal(SimConfig(gpus=gpus))
    for mode in MODES:
        t0 = time.perf_counter()
        r = simulate(SimConfig(mode=mode, gpus=gpus, steps=steps, seed=0))
        wall = time.perf_counter() - t0
        sync_tps = sync_tps or r["tokens_per_s"]
        rows.append(f"| {gpus} | {mode} | {r['step_time_s'] / 60:.2f} | {r['tokens_per_s']:,.0f} | "
                    f"{r['tokens_per_s'] / sync_tps:.2f}x | {r['tokens_per_s'] / bound['tokens_per_s']:.2f} | "
                    f"{r['rollout_only_fraction']:.1%} | {r['bubble_fraction']:.1%} | {r['overhead_fraction']:.2%} | "
                    f"{r['staleness_max']} | {r['c1_violations']}/{r['c2_violations']}/{r['c3_violations']} | "
                    f"{r['migrated_requests']:,} | {r['reprefill_tokens'] / r['steps'] / 1e6:.2f}M | "
                    f"{r['train_gpus']}+{r['rollout_instances']}x4 | {wall:.1f} |")
        print(rows[-1], flush=True)
    rows.append(f"| {gpus} | ideal | {bound['step_time_s'] / 60:.2f} | {bound['tokens_per_s']:,.0f} | "
                f"{bound['tokens_per_s'] / sync_tps:.2f}x | 1.00 | - | - | - | - | - | - | - | - | - |")
    print(rows[-1], flush=True)
    return rows


def speed(steps: int) -> list[str]:
    rows = []
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
    ap.add_argument("--speed-steps", type=int, default=50)
    ap.add_argument("--gpus", default="64,128", help="paper-setting cluster sizes ('' to skip)")
    ap.add_argument("--record", default=None, help="append the tables to this markdown file")
    a = ap.parse_args()
    head = ("| GPUs | mode | step (min) | tok/s | x sync | / ideal | rollout-only | bubble | overhead | stale max | "
            "C1/C2/C3 | migrated | re-prefill/step | train+rollout GPUs | wall s |\n|" + "---|" * 15)
    print(head)
    rows = []
    for g in filter(None, a.gpus.split(",")):
        rows += paper_setting(int(g), a.steps)
    shead = ("| mode | GPUs | rollout groups | traj/step | steps | trained | simulated | wall | < 60 s | load avg |\n|"
             + "---|" * 10)
    print(shead)
    srows = speed(a.speed_steps)
    if a.record:
        with open(a.record, "a") as f:
            f.write(f"\n## Simulator: rollout modes at the paper's setting, and simulator speed\n\n"
                    f"`python benchmarks/simulator.py --steps {a.steps} --speed-steps {a.speed_steps}` "
                    f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, shared).\n"
                    f"Qwen2.5-32B-like cost model (H800 figures), DAPO-Math lengths, 512 prompts x 16 = 8,192 "
                    f"trajectories/step, K=3, RBS = 1.5 x TBS, seed 0; steady state after {max(1, a.steps // 5)} warm-up steps.\n\n"
                    + head + "\n" + "\n".join(rows) + "\n\nSimulator speed (wall time of one `simulate()` call):\n\n"
                    + shead + "\n" + "\n".join(srows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
