"""The update op with 1 rank vs 2 ranks (FSDP2 over gloo) on this machine: the scale-out proof on CPU.

    python benchmarks/trainer.py [--hidden 256] [--layers 4] [--steps 4] [--repeats 3] [--batch 32]
                                 [--prompt 32] [--response 96] [--precision fp32] [--json out.json]

Both sides train the same model (a random llama of the given size, seed 0) on the same batches
(--batch trajectories of --prompt + --response tokens, groups of 4, +-1 advantages). Threads are
split fairly: one rank uses every core, each of 2 ranks half of them. Per rank it reports the
parameter and AdamW-state bytes it holds (exact, from its shards: they must halve with 2 ranks),
its peak RSS, and the step's tokens/s (prompt + response tokens of the batch / the step's train
seconds, after one warm-up step; the weights' publication is timed apart: with ranks it gathers
the full weights to rank 0). Each configuration runs --repeats times, alternating, in fresh
processes; the table shows the median and the range.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing


def model_cfg(a) -> dict:
    return {"arch": "llama", "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "kv_heads": a.heads // 2,
            "intermediate": 3 * a.hidden, "max_positions": 1024}


def batches(a) -> list[list[dict]]:
    rng = random.Random(0)
    out = []
    for step in range(a.steps + 1):
        rows = []
        for i in range(a.batch):
            resp = [rng.randrange(4, 60) for _ in range(rng.randrange(a.response // 2, a.response + 1))]
            rows.append({"uid": f"{step}-{i}", "group_id": step * a.batch + i // 4,
                         "prompt_ids": [rng.randrange(4, 60) for _ in range(a.prompt)], "response_ids": resp,
                         "behavior_logprobs": [-3.0] * len(resp), "advantages": [1.0 if i % 2 else -1.0] * len(resp),
                         "policy_version": step})
        out.append(rows)
    return out


def rank_main(env, a, data: list[list[dict]], threads: int) -> dict:
    import pyarrow as pa
    import torch

    from dora.graph.op_registry import resolve_op
    from dora.graph.opspec import fill_params
    from dora.graph.sections import AsyncSettings
    from dora.ops.base import OpContext
    from dora.ops.update import UpdateOp
    from dora.ops.weights import versions

    torch.set_num_threads(threads)
    params = fill_params(resolve_op("update"), {"lr": 1e-4, "steps": a.steps + 1, "micro_batch_tokens": a.micro_batch_tokens,
                                                "precision": a.precision})
    params["temperature"] = 1.0
    events: list[dict] = []
    run_dir = tempfile.mkdtemp(prefix=f"dora-bench-trainer-{env.world}-")
    ctx = OpContext(node="train", op="update", replica=env.rank, replicas=env.world, params=params, model=model_cfg(a),
                    run_dir=run_dir, async_=AsyncSettings("sync", 0, a.batch, a.batch, 4),
                    rendezvous=env.rendezvous() if env.world > 1 else None, report=env.report(events))
    op = UpdateOp()
    op.setup(ctx)
    env.drive(op, lambda: [op.process(pa.RecordBatch.from_pylist(rows), "batch") for rows in data])
    held = op.sharded.local_bytes(op.optimizer)
    op.teardown()
    versions.cleanup(run_dir)
    steps = [e for e in events if e["kind"] == "train_step"]
    publish = [e["seconds"] for e in events if e["kind"] == "weights"]
    return {**held, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "train_s": [e["seconds"] for e in steps][1:], "publish_s": publish[2:],
            "tokens": [e["metrics"]["tokens"] + a.batch * a.prompt for e in steps][1:]}


def one_config(a, world: int, data) -> dict:
    from dora.ops.sharding.local_ranks import run_local_ranks

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = run_local_ranks(rank_main, world, a, data, max(1, cores // world), timeout_s=3600)
    lead = ranks[0]
    tps = [t / s for t, s in zip(lead["tokens"], lead["train_s"])]
    return {"ranks": world, "threads_per_rank": max(1, cores // world), "tokens_per_s": statistics.median(tps),
            "publish_s": statistics.median(lead["publish_s"]) if lead["publish_s"] else 0.0,
            "param_bytes": [r["param_bytes"] for r in ranks], "optimizer_bytes": [r["optimizer_bytes"] for r in ranks],
            "maxrss": [r["maxrss"] for r in ranks]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4, help="measured steps (after one warm-up step)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=96)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    data = batches(a)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for rep in range(a.repeats):
        for world in (1, 2):
            r = one_config(a, world, data)
            runs[world].append(r)
            print(f"repeat {rep + 1}/{a.repeats}, {world} rank(s): {r['tokens_per_s']:.0f} tokens/s", flush=True)
    mib = 1 << 20
    rows = []
    for world, rs in runs.items():
        tps = [r["tokens_per_s"] for r in rs]
        held = max(p + o for r in rs for p, o in zip(r["param_bytes"], r["optimizer_bytes"]))
        rows.append({"ranks": world, "threads_per_rank": rs[0]["threads_per_rank"], "tokens_per_s": statistics.median(tps),
                     "tokens_per_s_range": [min(tps), max(tps)], "publish_s": statistics.median(r["publish_s"] for r in rs),
                     "param_bytes_per_rank": max(b for r in rs for b in r["param_bytes"]),
                     "optimizer_bytes_per_rank": max(b for r in rs for b in r["optimizer_bytes"]),
                     "held_bytes_per_rank": held, "peak_rss_per_rank": max(m for r in rs for m in r["maxrss"])})
    print(f"\nupdate op, model hidden {a.hidden} x {a.layers} layers, batch {a.batch} x ({a.prompt} + <= {a.response}) "
          f"tokens, {a.precision}, {a.repeats} repeats (median, range)")
    print(f"{'ranks':>5} {'threads/rank':>12} {'tokens/s':>22} {'publish s':>10} {'params MiB/rank':>16} "
          f"{'AdamW MiB/rank':>15} {'peak RSS MiB/rank':>18}")
    for r in rows:
        lo, hi = r["tokens_per_s_range"]
        print(f"{r['ranks']:>5} {r['threads_per_rank']:>12} {r['tokens_per_s']:>8.0f} ({lo:>5.0f}-{hi:<5.0f}) "
              f"{r['publish_s']:>10.3f} {r['param_bytes_per_rank'] / mib:>16.2f} {r['optimizer_bytes_per_rank'] / mib:>15.2f} "
              f"{r['peak_rss_per_rank'] / mib:>18.0f}")
    ratio = rows[1]["held_bytes_per_rank"] / rows[0]["held_bytes_per_rank"]
    speed = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(f"2 ranks / 1 rank: parameter + AdamW bytes per rank x{ratio:.3f} ({'halved' if ratio <= 0.51 else 'NOT halved'}), "
          f"tokens/s x{speed:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows, "held_ratio": ratio, "speed_ratio": speed}, f, indent=1)


if __name__ == "__main__":
    main()
