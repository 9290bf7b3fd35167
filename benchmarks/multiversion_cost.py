"""What a second hosted version would cost dora, in the simulator's own cost model, before anything
is built to host it (async.versions_per_instance > 1 is refused; docs/benchmarks.md, "Multi-version
instances"). Per workload and cluster size, side by side in one run:

- partial and dora (M = 1) tokens/s, dora / partial, dora / ideal, dora rollout-only;
- the gain bound: dora with no rollout-only time at all, tok/s / (1 - rollout-only), against partial;
- the memory cost: dora with every instance's KV room cut by one more weight copy (the upper end:
  a real M = 2 would cut it only on instances hosting two versions);
- the weight-read cost: extra seconds per decode step for each extra hosted version.

    python benchmarks/multiversion_cost.py [--workloads all] [--gpus 64,128] [--k 3] [--steps 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.sim.costmodel import MODELS, CostModel  # noqa: E402
from dora.sim.simulator import SimConfig, ideal, simulate  # noqa: E402
from dora.sim.workloads import WORKLOADS  # noqa: E402

MODEL = "qwen2.5-32b"


def kv_tokens_with(versions: int) -> int:
    """KV room (tokens) of one instance holding `versions` weight copies, by the cost model's rule."""
    m = MODELS[MODEL]
    cost = CostModel(m)
    return int(max(0.0, 0.9 * m.tp * cost.hw.hbm_bytes - versions * m.weight_bytes) / m.kv_bytes_per_token)


def row(workload: str, gpus: int, k: int, steps: int, seed: int) -> dict:
    base = dict(model=MODEL, gpus=gpus, steps=steps, seed=seed, max_staleness=k, workload=workload)
    partial = simulate(SimConfig(mode="partial", **base))
    dora = simulate(SimConfig(mode="dora", **base))
    two = simulate(SimConfig(mode="dora", kv_tokens=kv_tokens_with(2), **base))
    best = ideal(SimConfig(mode="dora", **base))
    bound = dora["tokens_per_s"] / max(1e-9, 1 - dora["rollout_only_fraction"])
    return {"workload": workload, "gpus": gpus, "partial": partial["tokens_per_s"], "dora": dora["tokens_per_s"],
            "dora/partial": dora["tokens_per_s"] / partial["tokens_per_s"],
            "dora/ideal": dora["tokens_per_s"] / best["tokens_per_s"], "rollout_only": dora["rollout_only_fraction"],
            "bound/partial": bound / partial["tokens_per_s"],
            "kv2/dora": two["tokens_per_s"] / dora["tokens_per_s"], "c1c2c3": sum(
                dora[f"c{i}_violations"] for i in (1, 2, 3))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="all")
    p.add_argument("--gpus", default="64,128")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    workloads = list(WORKLOADS) if a.workloads == "all" else a.workloads.split(",")
    cost = CostModel(MODELS[MODEL])
    print(f"{MODEL}, K={a.k}, {a.steps} steps, seed {a.seed}. KV room per instance: {kv_tokens_with(1):,} tokens "
          f"with one version, {kv_tokens_with(2):,} with two; each extra version reads its weights in every "
          f"decode step: +{cost.t_weights * 1e3:.1f} ms (fixed part {cost.t_fixed * 1e3:.0f} ms)")
    cols = ["workload", "gpus", "partial", "dora", "dora/partial", "dora/ideal", "rollout_only", "bound/partial",
            "kv2/dora", "c1c2c3"]
    print(" | ".join(cols))
    for w in workloads:
        for g in (int(x) for x in a.gpus.split(",")):
            r = row(w, g, a.k, a.steps, a.seed)
            print(" | ".join(f"{r[c]:,.0f}" if c in ("partial", "dora") else f"{r[c]:.2f}" if isinstance(r[c], float)
                             else str(r[c]) for c in cols), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
