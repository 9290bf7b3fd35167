"""Torch engine (continuous batching) vs transformers `generate` on the same tiny model.

    python benchmarks/generate.py [--batch 64] [--prompt-len 16] [--new-tokens 128] [--repeats 3] [--json out.json]

Both sides sample (temperature 1) exactly --new-tokens tokens per request from the same prompts
(EOS disabled so lengths match), fp32, one thread unless --threads. Prints tokens/s side by side.
A second row, "long-tailed", gives each request a different max_tokens (1/8 of the requests at
--new-tokens, the rest at 1/8 of it): HF must run the batch to the longest, we drop rows as they end.
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

from dora.ops.engines.engine import SamplingRequest
from dora.ops.engines.torch_engine import TorchEngine


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(cfg).float().eval()


def run_hf(model, prompts: torch.Tensor, max_new: int) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=0)
    dt = time.perf_counter() - t0
    assert out.shape[1] == prompts.shape[1] + max_new
    return dt


def run_ours(model, prompts: torch.Tensor, max_tokens: list[int]) -> tuple[float, int]:
    eng = TorchEngine(model, max_batch=len(prompts), seed=0, eos_ids=[])
    t0 = time.perf_counter()
    for i, p in enumerate(prompts.tolist()):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=max_tokens[i], temperature=1.0))
    n = 0
    while eng.has_work():
        n += sum(len(c.response_ids) for c in eng.step())
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 64, (a.batch, a.prompt_len), generator=g)
    short = max(1, a.new_tokens // 8)
    tail = [a.new_tokens if i % 8 == 0 else short for i in range(a.batch)]
    run_hf(model, prompts[:2], 4)          # warm-up both paths
    run_ours(model, prompts[:2], [4, 4])
    rows = []
    for name, lens in (("fixed length", [a.new_tokens] * a.batch), ("long-tailed", tail)):
        hf = min(run_hf(model, prompts, max(lens)) for _ in range(a.repeats))
        ours = min(run_ours(model, prompts, lens)[0] for _ in range(a.repeats))
        useful = sum(lens)       # tokens the requests asked for; HF computes batch*max for them
        rows.append({"workload": name, "batch": a.batch, "useful_tokens": useful,
                     "hf_s": hf, "ours_s": ours, "hf_tok_s": useful / hf, "ours_tok_s": useful / ours,
                     "ratio": hf / ours})
    print(f"{'workload':<14}{'batch':>6}{'tokens':>8}{'HF generate tok/s':>20}{'torch engine tok/s':>20}{'ratio':>8}")
    for r in rows:
        print(f"{r['workload']:<14}{r['batch']:>6}{r['useful_tokens']:>8}{r['hf_tok_s']:>20.0f}{r['ours_tok_s']:>20.0f}{r['ratio']:>8.2f}")
    if a.json:
        meta = {"torch": torch.__version__, "threads": a.threads, "prompt_len": a.prompt_len,
                "new_tokens": a.new_tokens, "repeats": a.repeats}
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
