"""The update op measured: tokens/s and MFU, on a GPU (1 rank, the 1.1B-class model) or on this
machine's CPU (1 rank against 2 ranks of FSDP2 over gloo: the scale-out proof).

    python benchmarks/trainer.py                     # a GPU if there is one, else the CPU
    python benchmarks/trainer.py --device cuda       # 1.1B-class llama, bf16, activation checkpointing, 1 rank
    python benchmarks/trainer.py --device cpu [--hidden 256] [--layers 4] [--steps 4] [--repeats 3] [--batch 32]
                                 [--prompt 32] [--response 96] [--precision fp32] [--json out.json]

Every configuration trains the same model (a random llama, seed 0; on cuda hidden 2048, 22 layers, 32
heads, 4 KV heads, intermediate 5632, vocab 32000, untied) on the same batches (--batch trajectories
of --prompt + --response tokens at most, groups of 4, +-1 advantages). tokens/s = the batch's prompt +
response tokens / the step's train seconds (after one warm-up step; the update op synchronises the
device before it stops its clock; the weights' publication is timed apart).

MFU = model FLOPs per second / the matmul rate this script measures at start on the same device
and dtype (`matmul_rate`: bf16 on cuda, the --precision's on cpu, with every core the run uses).
Model FLOPs (`train_flops`) = 3 x the forward's matmul FLOPs over the real (unpadded) tokens:
2 x (every linear layer's weights, the LM head included) per token, plus the attention scores
and their weighted sum, 4 x s^2 x heads x head_dim per layer and sequence of s tokens, halved as
causal. Activation checkpointing's recomputation and padding are not model FLOPs (they lower MFU).
On cpu, threads are split fairly: one rank uses every core, each of 2 ranks half of them. Per rank
it reports the parameter and AdamW-state bytes it holds (exact, from its shards: they must halve
with 2 ranks) and its peak RSS. Each configuration runs --repeats times, alternating, in fresh
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
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing

SIZES = {   # per device: the model, the batch, the precision and the rank counts compared
    "cuda": dict(hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000, batch=64, prompt=256,
                 response=768, micro_batch_tokens=32768, precision="bf16", activation_checkpointing=True, ranks=(1,),
                 repeats=1, steps=4),
    "cpu": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768, vocab=0, batch=32, prompt=32, response=96,
                micro_batch_tokens=2048, precision="fp32", activation_checkpointing=False, ranks=(1, 2), repeats=3,
                steps=4),
}
MATMUL = {"cuda": (8192, 20), "cpu": (1024, 8)}   # square size, repeats


def model_cfg(a) -> dict:
    return {"arch": "llama", "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads,
            "intermediate": a.intermediate, "vocab": a.vocab, "max_positions": max(1024, a.prompt + a.response),
            "tie_embeddings": a.device == "cpu"}


def train_flops(cfg: dict, seq_lens: list[int], causal: bool = True) -> float:
    """Model FLOPs of one training step over sequences of these lengths: forward + backward = 3 x
    the forward's matmuls. cfg: hidden, layers, heads, kv_heads, intermediate, vocab (the model's)."""
    h, layers, heads, kv = cfg["hidden"], cfg["layers"], cfg["heads"], cfg["kv_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    q, k = heads * head_dim, kv * head_dim
    weights = layers * (h * q + 2 * h * k + q * h + 3 * h * cfg["intermediate"]) + h * cfg["vocab"]
    scores = 4 * layers * q * sum(s * s for s in seq_lens) * (0.5 if causal else 1.0)
    return 3.0 * (2 * weights * sum(seq_lens) + scores)


def matmul_rate(device: str, dtype_name: str) -> float:
    """FLOP/s of a square matmul on `device` in `dtype_name`: the best of MATMUL's repeats after a warm-up."""
    import torch

    n, repeats = MATMUL["cuda" if device.startswith("cuda") else "cpu"]
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    for i in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        if i >= 2:
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def batches(a) -> list[list[dict]]:
    rng = random.Random(0)
    top = a.vocab or 60   # (vocab 0: the character tokenizer's, ids below 60 are in it)
    out = []
    for step in range(a.steps + 1):
        rows = []
        for i in range(a.batch):
            resp = [rng.randrange(4, top) for _ in range(rng.randrange(a.response // 2, a.response + 1))]
            rows.append({"uid": f"{step}-{i}", "group_id": step * a.batch + i // 4,
                         "prompt_ids": [rng.randrange(4, top) for _ in range(a.prompt)], "response_ids": resp,
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
                                                "precision": a.precision,
                                                "activation_checkpointing": a.activation_checkpointing})
    params["temperature"] = 1.0
    events: list[dict] = []
    run_dir = tempfile.mkdtemp(prefix=f"dora-bench-trainer-{env.world}-")
    ctx = OpContext(node="train", op="update", replica=env.rank, replicas=env.world, params=params, model=model_cfg(a),
                    device="cuda:0" if a.device == "cuda" else "cpu", run_dir=run_dir,
                    async_=AsyncSettings("sync", 0, a.batch, a.batch, 4),
                    rendezvous=env.rendezvous() if env.world > 1 else None, report=env.report(events))
    op = UpdateOp()
    op.setup(ctx)
    c = op.model.config
    dims = {"hidden": c.hidden_size, "layers": c.num_hidden_layers, "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads, "intermediate": c.intermediate_size, "vocab": c.vocab_size,
            "head_dim": getattr(c, "head_dim", None)}
    env.drive(op, lambda: [op.process(pa.RecordBatch.from_pylist(rows), "batch") for rows in data])
    held = op.sharded.local_bytes(op.optimizer)
    op.teardown()
    versions.cleanup(run_dir)
    steps = [e for e in events if e["kind"] == "train_step"]
    publish = [e["seconds"] for e in events if e["kind"] == "weights"]
    return {**held, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "dims": dims,
            "train_s": [e["seconds"] for e in steps][1:], "publish_s": publish[2:],
            "tokens": [e["metrics"]["tokens"] + a.batch * a.prompt for e in steps][1:],
            "peak_gib": max((e["metrics"].get("cuda_peak_reserved_gib", 0.0) for e in steps), default=0.0)}


def one_config(a, world: int, data, peak: float) -> dict:
    from dora.ops.sharding.local_ranks import run_local_ranks

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = run_local_ranks(rank_main, world, a, data, max(1, cores // world), timeout_s=3600)
    lead = ranks[0]
    tps = [t / s for t, s in zip(lead["tokens"], lead["train_s"])]
    lens = [[len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows] for rows in data[1:]]
    flops = [train_flops(lead["dims"], ls) / s for ls, s in zip(lens, lead["train_s"])]
    return {"ranks": world, "threads_per_rank": max(1, cores // world), "tokens_per_s": statistics.median(tps),
            "mfu": statistics.median(flops) / peak, "model_tflops": statistics.median(flops) / 1e12,
            "publish_s": statistics.median(lead["publish_s"]) if lead["publish_s"] else 0.0,
            "param_bytes": [r["param_bytes"] for r in ranks], "optimizer_bytes": [r["optimizer_bytes"] for r in ranks],
            "maxrss": [r["maxrss"] for r in ranks], "peak_gib": lead["peak_gib"], "dims": lead["dims"]}


def summarise(world: int, rs: list[dict]) -> dict:
    tps = [r["tokens_per_s"] for r in rs]
    return {"ranks": world, "threads_per_rank": rs[0]["threads_per_rank"], "tokens_per_s": statistics.median(tps),
            "tokens_per_s_range": [min(tps), max(tps)], "mfu": statistics.median(r["mfu"] for r in rs),
            "model_tflops": statistics.median(r["model_tflops"] for r in rs),
            "publish_s": statistics.median(r["publish_s"] for r in rs),
            "param_bytes_per_rank": max(b for r in rs for b in r["param_bytes"]),
            "optimizer_bytes_per_rank": max(b for r in rs for b in r["optimizer_bytes"]),
            "held_bytes_per_rank": max(p + o for r in rs for p, o in zip(r["param_bytes"], r["optimizer_bytes"])),
            "peak_rss_per_rank": max(m for r in rs for m in r["maxrss"]), "peak_gib": max(r["peak_gib"] for r in rs)}


def print_table(a, rows: list[dict], peak: float, dtype: str) -> None:
    mib = 1 << 20
    extra = ", activation checkpointing" if a.activation_checkpointing else ""
    print(f"\nupdate op on {a.device}, llama hidden {a.hidden} x {a.layers} layers ({a.heads} heads, {a.kv_heads} KV heads, "
          f"vocab {rows[0].get('vocab') or a.vocab or 'chars'}), batch {a.batch} x ({a.prompt} + <= {a.response}) tokens, "
          f"{a.precision}{extra}, {a.repeats} repeat(s) (median, range); measured {dtype} matmul peak "
          f"{peak / 1e12:.2f} TFLOP/s")
    print(f"{'ranks':>5} {'threads/rank':>12} {'tokens/s':>22} {'TFLOP/s':>8} {'MFU':>6} {'publish s':>10} "
          f"{'params MiB/rank':>16} {'AdamW MiB/rank':>15} {'peak RSS MiB/rank':>18} {'peak GPU GiB':>13}")
    for r in rows:
        lo, hi = r["tokens_per_s_range"]
        print(f"{r['ranks']:>5} {r['threads_per_rank']:>12} {r['tokens_per_s']:>8.0f} ({lo:>5.0f}-{hi:<5.0f}) "
              f"{r['model_tflops']:>8.3f} {r['mfu']:>6.1%} {r['publish_s']:>10.3f} {r['param_bytes_per_rank'] / mib:>16.2f} "
              f"{r['optimizer_bytes_per_rank'] / mib:>15.2f} {r['peak_rss_per_rank'] / mib:>18.0f} {r['peak_gib']:>13.1f}")
    if len(rows) > 1:
        ratio = rows[1]["held_bytes_per_rank"] / rows[0]["held_bytes_per_rank"]
        speed = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
        print(f"2 ranks / 1 rank: parameter + AdamW bytes per rank x{ratio:.3f} "
              f"({'halved' if ratio <= 0.51 else 'NOT halved'}), tokens/s x{speed:.2f}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if a GPU is visible")
    for name in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab", "steps", "repeats", "batch", "prompt",
                 "response", "micro-batch-tokens"):
        ap.add_argument(f"--{name}", type=int, default=None, help="default: per device (SIZES)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default=None)
    ap.add_argument("--activation-checkpointing", type=int, choices=(0, 1), default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    for k, v in SIZES[a.device].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.activation_checkpointing = bool(a.activation_checkpointing)
    return a


def main() -> None:
    a = parse_args()
    import torch
    if a.device == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    dtype = "bfloat16" if a.precision == "bf16" else "float32"
    peak = matmul_rate("cuda:0" if a.device == "cuda" else "cpu", dtype)
    print(f"{dtype} matmul on {a.device}: {peak / 1e12:.2f} TFLOP/s", flush=True)
    data = batches(a)
    runs: dict[int, list[dict]] = {w: [] for w in a.ranks}
    for rep in range(a.repeats):
        for world in a.ranks:
            r = one_config(a, world, data, peak)
            runs[world].append(r)
            print(f"repeat {rep + 1}/{a.repeats}, {world} rank(s): {r['tokens_per_s']:.0f} tokens/s, MFU {r['mfu']:.1%}",
                  flush=True)
    rows = [{**summarise(world, rs), "vocab": rs[0]["dims"]["vocab"]} for world, rs in runs.items()]
    print_table(a, rows, peak, dtype)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "matmul_peak_flops": peak, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
