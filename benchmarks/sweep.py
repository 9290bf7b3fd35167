"""Every shipped workload (and any --trace files) at several cluster sizes and staleness bounds:
sync, one_step_off, partial, dora and the ideal bound side by side, with the targets checked
(dora >= 0.9 of ideal, dora >= partial, dora rollout-only <= 10%, zero C1/C2/C3 violations).

    python benchmarks/sweep.py [--workloads all] [--gpus 64,128,512,1024] [--ks 1,2,3,4] [--steps 12]
                               [--seed 0] [--trace FILE ...] [--elastic] [--json sweep.json]

sync and one_step_off do not depend on K (the barrier fixes it at 0 and 1): they run once per
workload and cluster size and their row is repeated for each K.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.sim.simulator import SimConfig, ideal, simulate  # noqa: E402
from dora.sim.workloads import WORKLOADS  # noqa: E402

KEEP = ("mode", "step_time_s", "tokens_per_s", "rollout_only_fraction", "bubble_fraction", "overhead_fraction",
        "staleness_max", "c1_violations", "c2_violations", "c3_violations", "lost", "train_gpus", "rollout_instances",
        "migrated_requests", "reprefill_tokens")


def cell(workload: str, trace: str | None, gpus: int, k: int, mode: str, steps: int, seed: int, elastic: bool) -> dict:
    cfg = SimConfig(mode=mode, gpus=gpus, steps=steps, seed=seed, max_staleness=k, workload=workload,
                    trace_file=trace, **({"elastic": True} if elastic else {}))
    t0 = time.perf_counter()
    r = simulate(cfg)
    out = {key: r[key] for key in KEEP}
    out["wall_s"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="all", help="comma-separated names, or 'all'")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE", help="also run this JSONL trace")
    ap.add_argument("--gpus", default="64,128,512,1024")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--modes", default="sync,one_step_off,partial,dora")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--elastic", action="store_true", help="lend waiting trainer devices to rollout (every mode)")
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args()
    names = list(WORKLOADS) if a.workloads == "all" else [w for w in a.workloads.split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad:
        print(f"sweep: unknown workload(s) {', '.join(bad)}; expected {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    runs = [(w, None) for w in names] + [(f"trace:{os.path.basename(t)}", t) for t in a.trace]
    gpus = [int(g) for g in a.gpus.split(",")]
    ks = [int(k) for k in a.ks.split(",")]
    modes = a.modes.split(",")
    rows: list[dict] = []
    print("| workload | GPUs | K | sync | one_step_off | partial | dora | ideal (bound) | dora/ideal | dora/partial | "
          "dora rollout-only | dora C1/C2/C3 | targets |\n|" + "---|" * 13, flush=True)
    for wname, trace in runs:
        wl = wname if trace is None else "dapo-math"
        for g in gpus:
            fixed = {m: cell(wl, trace, g, 1, m, a.steps, a.seed, a.elastic) for m in modes if m in ("sync", "one_step_off")}
            for k in ks:
                res = dict(fixed)
                for m in modes:
                    if m not in fixed:
                        res[m] = cell(wl, trace, g, k, m, a.steps, a.seed, a.elastic)
                b = ideal(SimConfig(gpus=g, max_staleness=k, workload=wl, trace_file=trace, seed=a.seed))
                for m, r in res.items():
                    rows.append({"workload": wname, "gpus": g, "k": k, "elastic": a.elastic, **r,
                                 "ratio_to_ideal": r["tokens_per_s"] / b["tokens_per_s"]})
                rows.append({"workload": wname, "gpus": g, "k": k, "elastic": a.elastic, **b})
                d, p = res.get("dora"), res.get("partial")
                tps = {m: f"{res[m]['tokens_per_s']:,.0f}" if m in res else "-" for m in
                       ("sync", "one_step_off", "partial", "dora")}
                if d:
                    viol = f"{d['c1_violations']}/{d['c2_violations']}/{d['c3_violations']}"
                    di, dp = d["tokens_per_s"] / b["tokens_per_s"], d["tokens_per_s"] / p["tokens_per_s"] if p else float("nan")
                    miss = [name for name, ok in (("ideal", di >= 0.9), ("partial", not p or dp >= 1.0),
                                                  ("ro", d["rollout_only_fraction"] <= 0.10), ("C", viol == "0/0/0")) if not ok]
                    tail = (f"{di:.2f} | {dp:.2f} | {d['rollout_only_fraction']:.1%} | {viol} | "
                            f"{'ok' if not miss else 'MISS ' + ','.join(miss)} |")
                else:
                    tail = "- | - | - | - | - |"
                print(f"| {wname} | {g} | {k} | {tps['sync']} | {tps['one_step_off']} | {tps['partial']} | {tps['dora']} | "
                      f"{b['tokens_per_s']:,.0f} ({b['bound']}) | {tail}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
