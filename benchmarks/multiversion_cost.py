"""Multi-version instances (async.versions_per_instance, M) at the paper's setting: dora with
M = 1 and M = 2 beside sync and partial, per workload and cluster size, side by side in one run,
with issue 20's targets checked for M = 2 (dora >= partial, >= 0.9 of ideal with the latency
floor, rollout-only <= 10%, >= 1.65x / 2.12x sync at 64 / 128 GPUs, C1/C2/C3 = 0).

    python benchmarks/multiversion_cost.py [--workloads all] [--gpus 64,128] [--k 3] [--steps 20]
                                           [--seeds 0,1,2] [--modes sync,partial] [--json FILE]

tok/s are means over the seeds (each seed one simulate() run per mode); C1/C2/C3 are summed.
`--modes` picks the baselines run beside dora M = 1 and M = 2 (their costs do not depend on M).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.sim.costmodel import MODELS, CostModel  # noqa: E402
from dora.sim.simulator import SimConfig, ideal, simulate  # noqa: E402
from dora.sim.workloads import WORKLOADS  # noqa: E402

MODEL = "qwen2.5-32b"
PAPER_X_SYNC = {64: 1.65, 128: 2.12}


def runs(workload: str, gpus: int, k: int, steps: int, seeds: list[int], baselines: list[str]) -> dict:
    """Mean tok/s (and dora's rollout-only, C1-C3) per column over the seeds."""
    cols = {m: (m, 1) for m in baselines} | {"dora M=1": ("dora", 1), "dora M=2": ("dora", 2)}
    out: dict = {}
    for name, (mode, m) in cols.items():
        rs = [simulate(SimConfig(mode=mode, model=MODEL, gpus=gpus, steps=steps, seed=s, max_staleness=k,
                                 workload=workload, versions_per_instance=m)) for s in seeds]
        out[name] = {"tokens_per_s": statistics.mean(r["tokens_per_s"] for r in rs),
                     "rollout_only": statistics.mean(r["rollout_only_fraction"] for r in rs),
                     "c123": sum(r[f"c{i}_violations"] for r in rs for i in (1, 2, 3)),
                     "per_seed": [round(r["tokens_per_s"]) for r in rs]}
    out["ideal"] = statistics.mean(ideal(SimConfig(model=MODEL, gpus=gpus, max_staleness=k, workload=workload,
                                                   seed=s))["tokens_per_s"] for s in seeds)
    return out


def line(workload: str, gpus: int, k: int, r: dict) -> str:
    two, one, part, sync = r["dora M=2"], r["dora M=1"], r.get("partial"), r.get("sync")
    t2 = two["tokens_per_s"]
    checks = [("partial", part and t2 >= part["tokens_per_s"]), ("ideal", t2 >= 0.9 * r["ideal"]),
              ("ro", two["rollout_only"] <= 0.10), ("C", two["c123"] == 0)]
    if sync and gpus in PAPER_X_SYNC:
        checks.append(("x sync", t2 / sync["tokens_per_s"] >= PAPER_X_SYNC[gpus]))
    miss = [n for n, ok in checks if not ok]
    f = lambda x: f"{x:,.0f}"   # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"   # noqa: E731
    return " | ".join([
        workload, str(gpus), str(k), f(sync["tokens_per_s"]) if sync else "-", f(part["tokens_per_s"]) if part else "-",
        f(one["tokens_per_s"]), f(t2), ratio(t2, one["tokens_per_s"]),
        ratio(one["tokens_per_s"], part["tokens_per_s"]) if part else "-",
        ratio(t2, part["tokens_per_s"]) if part else "-", ratio(t2, sync["tokens_per_s"]) if sync else "-",
        f"{one['tokens_per_s'] / r['ideal']:.2f} / {t2 / r['ideal']:.2f}",
        f"{one['rollout_only']:.1%} / {two['rollout_only']:.1%}", str(two["c123"]),
        "ok" if not miss else "MISS " + ",".join(miss)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="all")
    p.add_argument("--gpus", default="64,128")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--modes", default="sync,partial", help="baselines beside dora M=1 and M=2")
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args()
    workloads = list(WORKLOADS) if a.workloads == "all" else a.workloads.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    baselines = [m for m in a.modes.split(",") if m]
    cost = CostModel(MODELS[MODEL])
    print(f"{MODEL}, K={a.k}, {a.steps} steps, seeds {a.seeds}. A second hosted version takes "
          f"{cost.weight_tokens():,} of an instance's {cost.kv_capacity_tokens:,} KV tokens and adds "
          f"{cost.t_weights * 1e3:.1f} ms to each decode step it runs in")
    print("| workload | GPUs | K | sync | partial | dora M=1 | dora M=2 | M=2 / M=1 | M=1 / partial | M=2 / partial | "
          "M=2 x sync | of ideal M=1 / M=2 | rollout-only M=1 / M=2 | M=2 C1+C2+C3 | targets (M=2) |\n|"
          + "---|" * 15, flush=True)
    rows = []
    for w in workloads:
        for g in (int(x) for x in a.gpus.split(",")):
            r = runs(w, g, a.k, a.steps, seeds, baselines)
            rows.append({"workload": w, "gpus": g, "k": a.k, **r})
            print("| " + line(w, g, a.k, r) + " |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
