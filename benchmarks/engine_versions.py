"""What a second hosted version costs the torch engine's decode step (CPU): the same batch of B
running requests, all on one version (max_versions 1) or split half and half over two hosted
versions (max_versions 2: each step runs one forward per version), side by side in one run.
Also the load of version 1 while version 0's requests decode, and the weight bytes each holds.

    python benchmarks/engine_versions.py [--batches 8,32] [--steps 30] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from dora.ops.engines.engine import SamplingRequest  # noqa: E402
from dora.ops.engines.torch_engine import TorchEngine  # noqa: E402

PROMPT = 64


def model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      intermediate_size=1376, vocab_size=4096, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).float().eval()


def _submit(eng: TorchEngine, n: int, version: int, tag: str) -> None:
    for i in range(n):
        prompt = [(7 * i + j) % 4000 + 10 for j in range(PROMPT)]
        eng.submit(SamplingRequest(f"{tag}{i}", prompt, version, max_tokens=10_000, temperature=1.0))


def _until_running(eng: TorchEngine, n: int) -> None:
    while len(eng.sched.running) < n:
        eng.step()


def _timed(eng: TorchEngine, steps: int) -> tuple[float, float]:
    """(wall, CPU) ms per step: CPU time is the steadier one on a machine others share."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        eng.step()
    return (time.perf_counter() - t0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3


def one_version(models, batch: int, steps: int) -> dict:
    eng = TorchEngine(models[0], max_batch=batch, seed=0, eos_ids=[], max_versions=1)
    _submit(eng, batch, 0, "a")
    _until_running(eng, batch)
    wall, cpu = _timed(eng, steps)
    return {"ms": wall, "cpu_ms": cpu, "weight_bytes": eng.weight_bytes()}


def two_versions(models, batch: int, steps: int) -> dict:
    eng = TorchEngine(models[0], max_batch=batch, seed=0, eos_ids=[], max_versions=2)
    _submit(eng, batch // 2, 0, "a")
    _until_running(eng, batch // 2)
    t0 = time.perf_counter()
    eng.load_weights(1, models[1].state_dict())        # while version 0 decodes
    load_s = time.perf_counter() - t0
    _submit(eng, batch - batch // 2, 1, "b")
    _until_running(eng, batch)
    assert eng.hosted_versions() == [0, 1]
    wall, cpu = _timed(eng, steps)
    return {"ms": wall, "cpu_ms": cpu, "weight_bytes": eng.weight_bytes(), "load_s": load_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="8,32")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    models = {0: model(0), 1: model(1)}
    print(f"torch {torch.__version__}, {a.threads} threads, llama hidden 512 x 4 layers, vocab 4096, "
          f"prompt {PROMPT}, {a.steps} decode steps, median of {a.rounds} alternating rounds")
    print("| batch | 1 version ms/step (CPU) | 2 versions ms/step (CPU) | 2 / 1 wall (CPU) | weights MB (1 / 2) "
          "| load of v1 while v0 decodes (s) |")
    print("|---|---|---|---|---|---|")
    for batch in (int(b) for b in a.batches.split(",")):
        ones, twos = [], []
        for _ in range(a.rounds):   # alternate, so drift on a shared machine hits both alike
            ones.append(one_version(models, batch, a.steps))
            twos.append(two_versions(models, batch, a.steps))
        one_ms, two_ms = (statistics.median(r["ms"] for r in rs) for rs in (ones, twos))
        one_cpu, two_cpu = (statistics.median(r["cpu_ms"] for r in rs) for rs in (ones, twos))
        print(f"| {batch} | {one_ms:.1f} ({one_cpu:.1f}) | {two_ms:.1f} ({two_cpu:.1f}) | "
              f"{two_ms / one_ms:.2f} ({two_cpu / one_cpu:.2f}) | "
              f"{ones[0]['weight_bytes'] / 1e6:.1f} / {twos[0]['weight_bytes'] / 1e6:.1f} | "
              f"{statistics.median(r['load_s'] for r in twos):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
