"""Issue 35: dora on long tails (64K-128K responses) against sync and each partial baseline, as a
fraction of the ideal, before (another source tree, e.g. main) and after (this tree), in the
simulator (deterministic per seed); then each lever's share at one K, and the dapo-math guard.

    python benchmarks/long_tails.py --before /tmp/main-src [--workloads longtail-64k,longtail-128k]
        [--gpus 64,128] [--ks 2,3,4] [--seeds 0] [--steps 12] [--jobs 2] [--json out.json]
    python benchmarks/long_tails.py --load out.json      # the tables again, from a run's rows

With several seeds each cell prints the mean and, in brackets, the lowest and highest seed.

--before DIR: a checkout of the tree to compare with (`git archive main | tar -x -C DIR`); its
modes that this tree has are run there too (main has sync, partial and dora, not
partial_colocated / partial_inflight). Each cell is one `simulate` in a child process whose
PYTHONPATH is its tree; fractions are of that tree's own ideal (`ideal()`, which includes the
latency floor). Nothing here is tuned to a workload: every cell runs the shipped defaults.

Levers (this tree, at --lever-k): dora as shipped, without fast lanes (fast_lanes 0), and with
preempted KV offloaded to host memory (SimConfig.kv_offload) instead of recomputed.
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
LEVERS = {"as shipped": {}, "no fast lanes": {"fast_lanes": 0}, "+ KV offload": {"kv_offload": True}}
KEEP = ("tokens_per_s", "rollout_only_fraction", "c1_violations", "c2_violations", "c3_violations", "lost",
        "fast_lane_requests", "preemptions")


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


def spread(values: list[float], fmt: str) -> str:
    """The mean, and with several seeds the lowest and highest in brackets."""
    if not values:
        return "-"
    mean = fmt.format(statistics.fmean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def build_cells(a: argparse.Namespace) -> list[tuple[str, dict]]:
    """Every (tree, spec) the arguments ask for: modes x K per workload and size, the guard, the levers."""
    wls, gpus = a.workloads.split(","), [int(g) for g in a.gpus.split(",")]
    ks, seeds = [int(k) for k in a.ks.split(",")], [int(s) for s in a.seeds.split(",")]
    base = {"steps": a.steps}
    trees = [("after", HERE, AFTER_MODES)] + ([("before", os.path.abspath(a.before), BEFORE_MODES)] if a.before else [])
    cells = []
    for label, root, modes in trees:
        for w in wls + ([a.guard] if a.guard and a.lever_k > 0 else []):
            for g in gpus:
                for k in (ks if w != a.guard else [a.lever_k]):
                    for m in (modes if w != a.guard else ("dora",)):
                        if m == "sync" and k != ks[0]:
                            continue                      # sync does not depend on K
                        for s in seeds:
                            cells.append((root, {"label": label, "workload": w, "gpus": g, "k": k, "mode": m, "seed": s, **base}))
    for w in (wls if a.lever_k > 0 else []):
        for g in gpus:
            for name, extra in LEVERS.items():
                if name != "as shipped":
                    for s in seeds:
                        cells.append((HERE, {"label": "lever", "lever": name, "workload": w, "gpus": g, "k": a.lever_k,
                                             "mode": "dora", "seed": s, "extra": extra, **base}))
    return cells


def fraction_table(rows: list[dict], wls: list[str], gpus: list[int], ks: list[int]) -> None:
    cols = [("sync", "after", "sync"), ("partial", "after", "partial"), ("partial_colocated", "after", "partial_colocated"),
            ("partial_inflight", "after", "partial_inflight"), ("dora (main)", "before", "dora"), ("dora", "after", "dora")]
    print("| workload | GPUs | K | " + " | ".join(c[0] for c in cols) + " | dora rollout-only | dora C1/C2/C3 | ideal tok/s |")
    print("|" + "---|" * (len(cols) + 6))
    for w in wls:
        for g in gpus:
            for k in ks:
                _, d = frac(rows, label="after", workload=w, gpus=g, k=k, mode="dora")
                ideal_at_k = {r["seed"]: r["ideal_tokens_per_s"] for r in d}
                vals = []
                for _, label, m in cols:
                    _, hit = frac(rows, label=label, workload=w, gpus=g, k=(ks[0] if m == "sync" else k), mode=m)
                    # sync ran once, at the first K; its share is of this row's ideal (the latency floor depends on K)
                    vals.append(spread([r["tokens_per_s"] / ideal_at_k[r["seed"]] if m == "sync" else r["of_ideal"]
                                        for r in hit], "{:.2f}"))
                ro = spread([100 * r["rollout_only_fraction"] for r in d], "{:.1f}") + "%"
                viol = "/".join(str(sum(r[f"c{i}_violations"] for r in d)) for i in (1, 2, 3))
                print(f"| {w} | {g} | {k} | " + " | ".join(vals) + f" | {ro} | {viol} | {spread([r['ideal_tokens_per_s'] for r in d], '{:,.0f}')} |")


def violations_table(rows: list[dict], wls: list[str], gpus: list[int], ks: list[int]) -> None:
    """C1/C2/C3 counts of every mode (summed over seeds): the partial baselines break C1 by design."""
    print("| workload | GPUs | K | " + " | ".join(AFTER_MODES) + " |")
    print("|" + "---|" * (len(AFTER_MODES) + 3))
    for w in wls:
        for g in gpus:
            for k in ks:
                out = []
                for m in AFTER_MODES:
                    _, hit = frac(rows, label="after", workload=w, gpus=g, k=(ks[0] if m == "sync" else k), mode=m)
                    out.append("/".join(str(sum(r[f"c{i}_violations"] for r in hit)) for i in (1, 2, 3)) if hit else "-")
                print(f"| {w} | {g} | {k} | " + " | ".join(out) + " |")


def lever_table(rows: list[dict], wls: list[str], gpus: list[int], lever_k: int) -> None:
    print("| workload | GPUs | " + " | ".join(LEVERS) + " |")
    print("|" + "---|" * (len(LEVERS) + 2))
    for w in wls:
        for g in gpus:
            out = []
            for name in LEVERS:
                match = ({"label": "after", "mode": "dora", "k": lever_k} if name == "as shipped"
                         else {"label": "lever", "lever": name})
                _, hit = frac(rows, workload=w, gpus=g, **match)
                lanes = statistics.fmean(r["fast_lane_requests"] for r in hit)
                pre = statistics.fmean(r["preemptions"] for r in hit)
                out.append(f"{spread([r['of_ideal'] for r in hit], '{:.3f}')} ({lanes:.0f} / {pre:.0f})")
            print(f"| {w} | {g} | " + " | ".join(out) + " |")


def guard_table(rows: list[dict], guard: str, gpus: list[int]) -> None:
    print("| GPUs | seed | before tok/s | after tok/s | after / before |\n|---|---|---|---|---|")
    for g in gpus:
        t = {(r["label"], r["seed"]): r["tokens_per_s"] for r in rows
             if r["workload"] == guard and r["gpus"] == g and r["label"] in ("before", "after")}
        seeds = sorted({s for _, s in t})
        for s in seeds:
            print(f"| {g} | {s} | {t['before', s]:,.0f} | {t['after', s]:,.0f} | {t['after', s] / t['before', s]:.3f} |")
        if len(seeds) > 1:
            b, f = (statistics.fmean(t[lab, s] for s in seeds) for lab in ("before", "after"))
            print(f"| {g} | mean | {b:,.0f} | {f:,.0f} | {f / b:.3f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--before", default=None, metavar="DIR", help="source tree to compare with (e.g. main's)")
    ap.add_argument("--workloads", default="longtail-64k,longtail-128k")
    ap.add_argument("--gpus", default="64,128")
    ap.add_argument("--ks", default="2,3,4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lever-k", type=int, default=3, help="K of the lever and guard cells (0: none)")
    ap.add_argument("--guard", default="dapo-math",
                    help="workload that must not lose against --before (K = --lever-k; '': no guard cells)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="write every cell's row here")
    ap.add_argument("--load", default=None, metavar="JSON", help="print the tables from a --json file; run nothing")
    a = ap.parse_args()
    if a.cell:
        child(json.loads(a.cell))
        return 0
    if a.load:
        with open(a.load) as fh:
            rows = json.load(fh)
    else:
        rows = run_cells(a.jobs, build_cells(a))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    wls, gpus, ks = a.workloads.split(","), [int(g) for g in a.gpus.split(",")], [int(k) for k in a.ks.split(",")]
    seeds = sorted({r["seed"] for r in rows})
    print(f"dora and the baselines as a fraction of the ideal (mean of seeds {seeds}, lowest-highest in brackets; "
          f"{rows[0]['steps']} steps; 'main' = the --before tree)\n")
    fraction_table(rows, wls, gpus, ks)
    print("\nC1/C2/C3 violations of every mode (summed over the seeds)\n")
    violations_table(rows, wls, gpus, ks)
    if any(r["label"] == "lever" for r in rows):
        print(f"\nEach lever on its own, dora at K = {a.lever_k} (fraction of the ideal; mean requests into lanes / "
              "preemptions)\n")
        lever_table(rows, wls, gpus, a.lever_k)
    if any(r["label"] == "before" and r["workload"] == a.guard for r in rows):
        print(f"\n{a.guard}, dora at K = {a.lever_k}: tokens/s after / before (must not lose more than 1%)\n")
        guard_table(rows, a.guard, gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
