"""Issue 35: dora on long tails (64K-128K responses) against sync and each partial baseline, as a
fraction of the ideal, before (another source tree, e.g. main) and after (this tree), in the
simulator (deterministic per seed); then each lever's share at one K, and the dapo-math guard.

    python benchmarks/long_tails.py --before /tmp/main-src [--workloads longtail-64k,longtail-128k]
        [--gpus 64,128] [--ks 2,3,4] [--seeds 0] [--steps 12] [--jobs 2] [--json out.json]

--before DIR: a checkout of the tree to compare with (`git archive main | tar -x -C DIR`); its
modes that this tree has are run there too (main has sync, partial and dora, not
partial_colocated / partial_inflight). Each cell is one `simulate` in a child process whose
PYTHONPATH is its tree; fractions are of that tree's own ideal (`ideal()`, which includes the
latency floor). Nothing here is tuned to a workload: every cell runs the shipped defaults.

Levers (this tree, at --lever-k): dora as shipped, without fast lanes (fast_lanes 0), without
length-aware dispatch (rollout.length_aware false), with neither, and with preempted KV offloaded
to host memory (SimConfig.kv_offload) instead of recomputed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFTER_MODES = ("sync", "partial", "partial_colocated", "partial_inflight", "dora")
BEFORE_MODES = ("sync", "partial", "dora")
LEVERS = {"as shipped": {}, "no fast lanes": {"fast_lanes": 0},
          "no length-aware": {"rollout": {"length_aware": False}},
          "neither": {"fast_lanes": 0, "rollout": {"length_aware": False}},
          "+ KV offload": {"kv_offload": True}}
KEEP = ("tokens_per_s", "rollout_only_fraction", "c1_violations", "c2_violations", "c3_violations", "lost",
        "fast_lane_requests", "siblings_started_newest", "preemptions")


def child(spec: dict) -> None:
    """In the child (PYTHONPATH = its tree): one simulation and its ideal, as JSON on stdout."""
    from dora.sim.simulator import SimConfig, ideal, simulate
    cfg = SimConfig(mode=spec["mode"], gpus=spec["gpus"], steps=spec["steps"], seed=spec["seed"],
                    max_staleness=spec["k"], workload=spec["workload"], **spec.get("extra", {}))
    r = simulate(cfg)
    b = ideal(SimConfig(gpus=spec["gpus"], seed=spec["seed"], max_staleness=spec["k"], workload=spec["workload"]))
    out = {key: r.get(key) for key in KEEP}
    out["ideal_tokens_per_s"] = b["tokens_per_s"]
    out["of_ideal"] = r["tokens_per_s"] / b["tokens_per_s"]
    print(json.dumps(out))


def cell(root: str, spec: dict) -> dict:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--cell", json.dumps(spec)], cwd=root,
                       env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"cell {spec} in {root} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return {**spec, "tree": root, **json.loads(p.stdout.strip().splitlines()[-1])}


def run_cells(jobs: int, cells: list[tuple[str, dict]]) -> list[dict]:
    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(lambda c: cell(*c), cells))


def frac(rows: list[dict], **match) -> tuple[float, list[dict]]:
    hit = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return (statistics.fmean(r["of_ideal"] for r in hit) if hit else float("nan")), hit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--before", default=None, metavar="DIR", help="source tree to compare with (e.g. main's)")
    ap.add_argument("--workloads", default="longtail-64k,longtail-128k")
    ap.add_argument("--gpus", default="64,128")
    ap.add_argument("--ks", default="2,3,4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lever-k", type=int, default=3)
    ap.add_argument("--guard", default="dapo-math", help="workload that must not lose against --before (K = --lever-k)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.cell:
        child(json.loads(a.cell))
        return 0
    wls, gpus = a.workloads.split(","), [int(g) for g in a.gpus.split(",")]
    ks, seeds = [int(k) for k in a.ks.split(",")], [int(s) for s in a.seeds.split(",")]
    base = {"steps": a.steps}
    trees = [("after", HERE, AFTER_MODES)] + ([("before", os.path.abspath(a.before), BEFORE_MODES)] if a.before else [])
    cells = []
    for label, root, modes in trees:
        for w in wls + [a.guard]:
            for g in gpus:
                for k in (ks if w != a.guard else [a.lever_k]):
                    for m in (modes if w != a.guard else ("dora",)):
                        if m == "sync" and k != ks[0]:
                            continue                      # sync does not depend on K
                        for s in seeds:
                            cells.append((root, {"label": label, "workload": w, "gpus": g, "k": k, "mode": m, "seed": s, **base}))
    for w in wls:
        for g in gpus:
            for name, extra in LEVERS.items():
                if name != "as shipped":
                    for s in seeds:
                        cells.append((HERE, {"label": "lever", "lever": name, "workload": w, "gpus": g, "k": a.lever_k,
                                             "mode": "dora", "seed": s, "extra": extra, **base}))
    rows = run_cells(a.jobs, cells)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)

    print(f"dora and the baselines as a fraction of the ideal (mean of seeds {a.seeds}, {a.steps} steps; "
          "'main' = the --before tree)\n")
    cols = [("sync", "after", "sync"), ("partial", "after", "partial"), ("partial_colocated", "after", "partial_colocated"),
            ("partial_inflight", "after", "partial_inflight"), ("dora (main)", "before", "dora"), ("dora", "after", "dora")]
    print("| workload | GPUs | K | " + " | ".join(c[0] for c in cols) + " | dora rollout-only | dora C1/C2/C3 | ideal tok/s |")
    print("|" + "---|" * (len(cols) + 6))
    for w in wls:
        for g in gpus:
            for k in ks:
                vals = []
                for _, label, m in cols:
                    f, _ = frac(rows, label=label, workload=w, gpus=g, k=(ks[0] if m == "sync" else k), mode=m)
                    vals.append("-" if f != f else f"{f:.2f}")
                _, d = frac(rows, label="after", workload=w, gpus=g, k=k, mode="dora")
                ro = statistics.fmean(r["rollout_only_fraction"] for r in d)
                viol = "/".join(str(sum(r[f"c{i}_violations"] for r in d)) for i in (1, 2, 3))
                print(f"| {w} | {g} | {k} | " + " | ".join(vals) + f" | {ro:.1%} | {viol} | {d[0]['ideal_tokens_per_s']:,.0f} |")

    print(f"\nEach lever on its own, dora at K = {a.lever_k} (fraction of the ideal; requests into lanes / siblings "
          "started on the newest / preemptions)\n")
    print("| workload | GPUs | " + " | ".join(LEVERS) + " |")
    print("|" + "---|" * (len(LEVERS) + 2))
    for w in wls:
        for g in gpus:
            out = []
            for name in LEVERS:
                match = ({"label": "after", "mode": "dora", "k": a.lever_k} if name == "as shipped"
                         else {"label": "lever", "lever": name})
                f, hit = frac(rows, workload=w, gpus=g, **match)
                n = hit[0]
                out.append(f"{f:.3f} ({n['fast_lane_requests']} / {n['siblings_started_newest']} / {n['preemptions']})")
            print(f"| {w} | {g} | " + " | ".join(out) + " |")

    if a.before:
        print(f"\n{a.guard}, dora at K = {a.lever_k}: tokens/s after / before (must not lose more than 1%)\n")
        print("| GPUs | before tok/s | after tok/s | after / before |\n|---|---|---|---|")
        for g in gpus:
            t = {lab: statistics.fmean(r["tokens_per_s"] for r in rows if r["label"] == lab and r["workload"] == a.guard
                                       and r["gpus"] == g) for lab in ("before", "after")}
            print(f"| {g} | {t['before']:,.0f} | {t['after']:,.0f} | {t['after'] / t['before']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
