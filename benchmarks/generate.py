"""The torch engine (paged) vs the eager baseline engine vs transformers `generate`, same tiny model, CPU.

    python benchmarks/generate.py [--batch 64] [--prompt-len 16] [--new-tokens 128] [--repeats 3]
                                  [--threads 1] [--json out.json]

Every side samples (temperature 1) from the same prompts, fp32, EOS disabled so lengths match.
Rows: "fixed length" (every request --new-tokens tokens), "long-tailed" (1/8 of the requests at
--new-tokens, the rest at 1/8 of it: HF must run the batch to the longest, the engines drop rows
as they end) and "groups of 8" (the long-tailed lengths, requests in groups of 8 sharing a
--group-prompt-len prompt: the paged engine prefills each prompt once). Prints tokens/s (useful
tokens: those the requests asked for) side by side and the paged engine's ratio to each.
The eager engine is benchmarks/baselines/eager_engine.py, the torch engine before the paged one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.baselines.eager_engine import EagerEngine
from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.torch_engine import TorchEngine


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(cfg).float().eval()


def run_hf(model, prompts: list[list[int]], lens: list[int]) -> float:
    ids = torch.tensor(prompts)        # (every prompt of a row has the same length)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=max(lens), min_new_tokens=max(lens), pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + max(lens)
    return time.perf_counter() - t0


def run_engine(make, model, prompts: list[list[int]], lens: list[int]) -> float:
    eng = make(model)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=lens[i], temperature=1.0))
    n = 0
    while eng.has_work():
        n += sum(len(c.response_ids) for c in eng.step())
    assert n == sum(lens), (n, sum(lens))
    return time.perf_counter() - t0


def workloads(a) -> list[tuple[str, list[list[int]], list[int]]]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 64, (a.batch, a.prompt_len), generator=g).tolist()
    short = max(1, a.new_tokens // 8)
    tail = [a.new_tokens if i % 8 == 0 else short for i in range(a.batch)]
    shared = torch.randint(1, 64, (a.batch // 8, a.group_prompt_len), generator=g).tolist()
    grouped = [shared[i // 8] for i in range(a.batch // 8 * 8)]
    return [("fixed length", prompts, [a.new_tokens] * a.batch), ("long-tailed", prompts, tail),
            ("groups of 8", grouped, tail[:len(grouped)])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--group-prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    if a.batch < 8 or a.new_tokens < 8:
        ap.error("--batch and --new-tokens must be >= 8 (the long tail is 1 request in 8 at 8x the others' length)")
    torch.set_num_threads(a.threads)
    model = tiny_model()
    sides = {"hf": lambda p, lens: run_hf(model, p, lens),
             "eager": lambda p, lens: run_engine(lambda m: EagerEngine(m, max_batch=len(p), seed=0, eos_ids=[]), model, p, lens),
             "paged": lambda p, lens: run_engine(lambda m: TorchEngine(m, max_batch=len(p), seed=0, eos_ids=[]), model, p, lens)}
    for run in sides.values():          # warm-up every path
        run([[1, 2, 3]] * 2, [4, 4])
    rows = []
    for name, prompts, lens in workloads(a):
        best = {side: float("inf") for side in sides}
        for _ in range(a.repeats):      # alternate the sides, keep each one's best
            for side, run in sides.items():
                best[side] = min(best[side], run(prompts, lens))
        useful = sum(lens)
        rows.append({"workload": name, "batch": len(prompts), "useful_tokens": useful,
                     **{f"{s}_s": t for s, t in best.items()}, **{f"{s}_tok_s": useful / t for s, t in best.items()},
                     "paged_vs_eager": best["eager"] / best["paged"], "paged_vs_hf": best["hf"] / best["paged"]})
    print(f"{'workload':<14}{'batch':>6}{'tokens':>8}{'HF tok/s':>11}{'eager tok/s':>13}{'paged tok/s':>13}"
          f"{'paged/eager':>13}{'paged/HF':>10}")
    for r in rows:
        print(f"{r['workload']:<14}{r['batch']:>6}{r['useful_tokens']:>8}{r['hf_tok_s']:>11.0f}{r['eager_tok_s']:>13.0f}"
              f"{r['paged_tok_s']:>13.0f}{r['paged_vs_eager']:>13.2f}{r['paged_vs_hf']:>10.2f}")
    if a.json:
        meta = {"torch": torch.__version__, "threads": a.threads, "prompt_len": a.prompt_len,
                "group_prompt_len": a.group_prompt_len, "new_tokens": a.new_tokens, "repeats": a.repeats}
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
