"""Real runs of one pipeline in every async mode, side by side, on this machine.

    python benchmarks/modes.py --json out.json [--pipeline pipelines/quickstart.yaml]
                               [--modes sync,one_step_off,partial,dora] [--seeds 0,1] [--steps N] [k=v ...]

Every mode runs the same pipeline for the same steps and seeds. Per mode: tokens_per_s (mean
over seeds), ratio_to_sync, final_reward (mean of the last 3 steps), reward_last10 (mean of the last
10 steps; both also per seed), reward_by_step (mean over seeds), reward spread over seeds,
staleness and violations. Prints a table; writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def run_one(pipeline: str, mode: str, seed: int, steps: int | None, overrides: list[str], out_root: str) -> dict:
    from dora.runtime.launch import execute, load_graph
    ov = list(overrides) + [f"async.mode={mode}"]
    if steps:
        ov.append(f"nodes.train.params.steps={steps}")
    graph = load_graph(pipeline, ov)
    if graph is None:
        raise SystemExit(2)
    run_dir = os.path.join(out_root, f"{mode}-seed{seed}")
    os.makedirs(run_dir, exist_ok=True)
    code = execute(graph, run_dir, seed=seed, quiet=True)
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    if code != 0:
        raise RuntimeError(f"{mode} seed {seed} failed: {summary.get('error')}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default="pipelines/quickstart.yaml")
    p.add_argument("--modes", default="sync,one_step_off,partial,dora")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    seeds = [int(s) for s in a.seeds.split(",") if s]
    out_root = a.out or tempfile.mkdtemp(prefix="dora-modes-")
    rows = []
    for mode in modes:
        runs = []
        for seed in seeds:
            print(f"[modes] {mode} seed {seed} ...", file=sys.stderr, flush=True)
            runs.append(run_one(a.pipeline, mode, seed, a.steps, a.overrides, out_root))
        tps = [r["tokens"] / r["wall_s"] for r in runs]   # end to end: every token over the whole run
        finals = [r.get("reward_last3") for r in runs]
        # the mean of the last 10 steps: one 64-trajectory step's reward is noisy, 3 steps are not enough
        last10 = [statistics.fmean(r["reward_by_step"][-10:]) if r.get("reward_by_step") else 0.0 for r in runs]
        by_step = [statistics.fmean(x) for x in zip(*[r.get("reward_by_step", []) for r in runs])]
        rows.append({
            "mode": mode, "seeds": seeds, "tokens_per_s": statistics.fmean(tps),
            "final_reward": statistics.fmean(finals), "final_reward_spread": (max(finals) - min(finals)) if len(finals) > 1 else 0.0,
            "final_reward_by_seed": finals, "reward_last10": statistics.fmean(last10), "reward_last10_by_seed": last10,
            "reward_first3": statistics.fmean(r.get("reward_first3") for r in runs),
            "reward_by_step": by_step, "wall_s": statistics.fmean(r["wall_s"] for r in runs),
            "rollout_only_fraction": statistics.fmean(r.get("rollout_only_fraction") or 0.0 for r in runs),
            "staleness_max": max(r.get("staleness_max") or 0 for r in runs),
            "c1_violations": sum(r.get("c1_violations", 0) for r in runs),
            "c2_violations": sum(r.get("c2_violations", 0) for r in runs),
            "c3_violations": sum(r.get("c3_violations", 0) for r in runs),
            "migrated_requests": sum(r.get("migrated_requests") or 0 for r in runs),
        })
    base = next((r["tokens_per_s"] for r in rows if r["mode"] == "sync"), None)
    for r in rows:
        r["ratio_to_sync"] = r["tokens_per_s"] / base if base else None
    print(f"\n{'mode':<13} {'tok/s':>9} {'x sync':>7} {'reward first3':>13} {'final':>7} {'spread':>7} {'last10':>7} {'last10 by seed':>24} "
          f"{'roll-only':>9} {'stale':>5} {'C1/C2/C3':>9} {'migr':>5}")
    for r in rows:
        ratio = f"{r['ratio_to_sync']:.2f}" if r["ratio_to_sync"] else "-"
        print(f"{r['mode']:<13} {r['tokens_per_s']:>9.0f} {ratio:>7} {r['reward_first3']:>13.3f} {r['final_reward']:>7.3f} "
              f"{r['final_reward_spread']:>7.3f} {r['reward_last10']:>7.3f} {' / '.join(f'{x:.2f}' for x in r['reward_last10_by_seed']):>24} {r['rollout_only_fraction']:>9.2f} {r['staleness_max']:>5} "
              f"{str(r['c1_violations']) + '/' + str(r['c2_violations']) + '/' + str(r['c3_violations']):>9} "
              f"{r['migrated_requests']:>5}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
