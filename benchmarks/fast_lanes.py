"""Fast lanes in the real runtime: the quickstart with a long tail, dora with async.fast_lanes on
(-1: as many as measured) and off (0), side by side, seed by seed, on this machine.

    python benchmarks/fast_lanes.py [--steps 12] [--seeds 0,1,2] [--json out.json] [-- OVERRIDE ...]

The long tail: max_tokens 480 (the model's 512 positions less the prompt), 4 generate replicas,
and a learning rate of 1e-4, so the policy stays near its random start, whose response lengths run
from a few tokens to the cap (median ~60-120, max/median 4-8) for the whole run instead of
collapsing as the task is learnt. K = 1 and one version per replica (async.versions_per_instance 1:
an old version's stragglers keep whole replicas, which fast lanes then spread out).
Every run is a real `dora run` (a subprocess); the two settings of a seed run one after the other,
in alternating order. Printed per seed: train tokens/s (summary.json: tokens over the steps' wall
time) with lanes and without, their ratio, the requests moved into lanes, and the trainer's
rollout-only share. The machine is shared with other work: wall-clock numbers are noisy, compare
the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_runs import dora_run  # noqa: E402

LONG_TAIL = ["async.mode=dora", "async.max_staleness=1", "async.versions_per_instance=1", "pools.rollout.count=4",
             "nodes.rollout.replicas=4", "nodes.rollout.params.max_tokens=480", "nodes.train.params.lr=1.0e-4"]


def run(out: str, lanes: int, steps: int, seed: int, extra: list[str]) -> dict:
    return dora_run(out, "quickstart.yaml", [*LONG_TAIL, f"async.fast_lanes={lanes}", f"nodes.train.params.steps={steps}",
                                             f"run.seed={seed}", *extra], f"fast_lanes={lanes} seed {seed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*", help="pipeline overrides for every run (key=value)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dora-bench-lanes-") as tmp:
        for i, seed in enumerate(int(x) for x in a.seeds.split(",")):
            pair = {}
            for lanes in ((-1, 0) if i % 2 == 0 else (0, -1)):
                pair[lanes] = run(os.path.join(tmp, f"{seed}-{lanes}"), lanes, a.steps, seed, a.overrides)
                print(f"seed {seed} fast_lanes={lanes}: {pair[lanes]['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
            on, off = pair[-1], pair[0]
            rows.append({"seed": seed, "on_tok_s": on["tokens_per_s"], "off_tok_s": off["tokens_per_s"],
                         "ratio": on["tokens_per_s"] / off["tokens_per_s"], "lane_requests": on["fast_lane_requests"],
                         "off_lane_requests": off["fast_lane_requests"], "on_rollout_only": on["rollout_only_fraction"],
                         "off_rollout_only": off["rollout_only_fraction"], "on_wall_s": on["wall_s"], "off_wall_s": off["wall_s"]})
    print("| seed | tok/s with lanes | tok/s without | with / without | requests into lanes | rollout-only with / without |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['on_tok_s']:,.0f} | {r['off_tok_s']:,.0f} | {r['ratio']:.2f} | {r['lane_requests']} | "
              f"{r['on_rollout_only']:.1%} / {r['off_rollout_only']:.1%} |")
    ratios = [r["ratio"] for r in rows]
    print(f"with / without: mean {statistics.fmean(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
