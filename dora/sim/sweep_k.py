"""`dora simulate --sweep-k 1,2,3,5,10`: which staleness bound K a workload needs.

For each K: dora, and each partial baseline at the same staleness cap (partial, partial_colocated,
partial_inflight), beside sync (K = 0, once) and the ideal at that K (dora/sim/simulator.py
`ideal`: the larger of the capacity bound and the latency floor, which shrinks as K grows). It
prints dora's tokens/s, its share of the ideal and its rollout-only share per K, the baselines'
tokens/s, and names the smallest K at which dora reaches GOAL of the ideal. With `--trace
RUN_DIR/length_trace.jsonl` the lengths are a run's own (dora/sim/step_trace.py), so a user picks K
from the run they have.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from typing import Any

from .simulator import SimConfig, ideal, simulate

GOAL = 0.9                                   # share of the ideal the sweep names the smallest K for
BASELINES = ("partial", "partial_colocated", "partial_inflight")


def parse_ks(text: str) -> list[int]:
    """'1,2,3,5,10' -> [1, 2, 3, 5, 10]; ValueError naming the bad entry (K must be an integer >= 1)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            k = int(part)
        except ValueError:
            raise ValueError(f"--sweep-k: {part!r} is not an integer (K is a whole number of versions)") from None
        if k < 1:
            raise ValueError(f"--sweep-k: K must be >= 1 (dora and the partial modes overlap rollout with training), got {k}")
        out.append(k)
    if not out:
        raise ValueError("--sweep-k: give at least one K, e.g. 1,2,3,5,10")
    return sorted(set(out))


def _run(cfg: SimConfig) -> dict[str, Any]:
    r = simulate(cfg)
    r.pop("per_step", None)
    return r


def sweep(base: SimConfig, ks: list[int], jobs: int = 1) -> list[dict[str, Any]]:
    """One row per K: dora's and the baselines' results, sync's and the ideal at that K."""
    configs = [dataclasses.replace(base, mode="sync")]
    configs += [dataclasses.replace(base, mode=m, max_staleness=k) for k in ks for m in ("dora", *BASELINES)]
    if jobs > 1:
        with multiprocessing.Pool(jobs) as pool:
            results = pool.map(_run, configs, chunksize=1)
    else:
        results = [_run(c) for c in configs]
    sync, rest = results[0], results[1:]
    rows = []
    for i, k in enumerate(ks):
        part = rest[i * (1 + len(BASELINES)):(i + 1) * (1 + len(BASELINES))]
        best = ideal(dataclasses.replace(base, max_staleness=k))
        rows.append({"k": k, "ideal": best, "sync": sync, "dora": part[0], **dict(zip(BASELINES, part[1:])),
                     "dora_of_ideal": part[0]["tokens_per_s"] / best["tokens_per_s"]})
    return rows


def smallest_k(rows: list[dict[str, Any]], goal: float = GOAL) -> int | None:
    return next((r["k"] for r in rows if r["dora_of_ideal"] >= goal), None)


def print_sweep(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title)
    for h in ("K", "dora tok/s", "of ideal", "rollout-only", "C1/C2/C3", "sync", *BASELINES, "ideal tok/s (bound)"):
        t.add_column(h, justify="right")
    for r in rows:
        d = r["dora"]
        t.add_row(str(r["k"]), f"{d['tokens_per_s']:,.0f}", f"{r['dora_of_ideal']:.2f}", f"{d['rollout_only_fraction']:.1%}",
                  f"{d['c1_violations']}/{d['c2_violations']}/{d['c3_violations']}", f"{r['sync']['tokens_per_s']:,.0f}",
                  *(f"{r[m]['tokens_per_s']:,.0f}" for m in BASELINES),
                  f"{r['ideal']['tokens_per_s']:,.0f} ({r['ideal']['bound']})")
    con = Console(width=180)
    con.print(t)
    k = smallest_k(rows)
    best = max(rows, key=lambda r: r["dora_of_ideal"])
    con.print(f"smallest K reaching {GOAL:.0%} of the ideal: {k}" if k is not None else
              f"no K given reaches {GOAL:.0%} of the ideal (best: K = {best['k']}, {best['dora_of_ideal']:.2f})")
