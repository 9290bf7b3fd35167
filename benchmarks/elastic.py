"""Elastic trainer devices in the real runtime, side by side: the quickstart with async.elastic off
and on, in each mode asked for, on this machine.

    python benchmarks/elastic.py [--modes sync,dora] [--steps 10] [--seeds 0] [--json out.json] [-- OVERRIDE ...]

Every run is a real `dora run` (a subprocess). Printed per mode: train tokens/s (summary.json:
tokens over the steps' wall time) off and on and their ratio, and what elastic did: lends, the
seconds the trainer waited for its devices to come back (hand-back), the time the spare served,
trajectories it finished, requests and KV bytes moved at reclaims. On a CPU machine the spare
shares the trainer's cores with everything else (the quickstart's pools are core counts, not
partitions), so a gain is not to be expected here: the table shows what lending costs.
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


def run(out: str, mode: str, elastic: bool, steps: int, seed: int, extra: list[str]) -> dict:
    return dora_run(out, "quickstart.yaml", [f"async.mode={mode}", f"async.elastic={'true' if elastic else 'false'}",
                                             f"nodes.train.params.steps={steps}", f"run.seed={seed}", *extra],
                    f"{mode} elastic={elastic} seed {seed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="sync,dora")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*", help="pipeline overrides for every run (key=value)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dora-bench-elastic-") as tmp:
        for mode in a.modes.split(","):
            for seed in [int(x) for x in a.seeds.split(",")]:
                pair = {}
                for elastic in (False, True):
                    s = run(os.path.join(tmp, f"{mode}-{seed}-{int(elastic)}"), mode, elastic, a.steps, seed, a.overrides)
                    pair[elastic] = s
                    print(f"{mode} seed {seed} elastic={elastic}: {s['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
                el = pair[True]["elastic"]
                rows.append({"mode": mode, "seed": seed, "off_tok_s": pair[False]["tokens_per_s"],
                             "on_tok_s": pair[True]["tokens_per_s"],
                             "ratio": pair[True]["tokens_per_s"] / pair[False]["tokens_per_s"],
                             "off_wall_s": pair[False]["wall_s"], "on_wall_s": pair[True]["wall_s"], **el})
    print("| mode | seed | tok/s off | tok/s on | on/off | lends | hand-back s (total) | lend s (total) | "
          "spare served s | spare trajectories | requests moved | KV MB moved |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seed']} | {r['off_tok_s']:.0f} | {r['on_tok_s']:.0f} | {r['ratio']:.2f} | {r['lends']} | "
              f"{r['handback_s']:.2f} | {r['lend_s']:.2f} | {r['lent_s']:.1f} | {r['trajectories_finished']} | "
              f"{r['requests_moved']} | {r['kv_bytes_moved'] / 1e6:.2f} |")
    for mode in a.modes.split(","):
        ratios = [r["ratio"] for r in rows if r["mode"] == mode]
        if len(ratios) > 1:
            print(f"{mode}: on/off mean {statistics.fmean(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
