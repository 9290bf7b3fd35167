"""The quickstart-shaped model's decode iteration time against batch size, in the torch engine on
CPU: what fast lanes trade on (a straggler alone on an instance runs faster only as far as an
iteration's cost grows with the batch; dora/rl/rollout/speed.py fits the same curve from what
instances report).

    python benchmarks/decode_batch.py [--batches 1,2,4,8,16,32] [--context 30] [--iters 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.generate import tiny_model  # noqa: E402
from dora.ops.engines.engine import SamplingRequest  # noqa: E402
from dora.ops.engines.torch_engine import TorchEngine  # noqa: E402

WARMUP = 20


def iteration_s(model, batch: int, context: int, iters: int) -> float:
    eng = TorchEngine(model, max_batch=batch, seed=0, eos_ids=[])
    for i in range(batch):
        eng.submit(SamplingRequest(f"r{i}", [5] * context, 0, max_tokens=WARMUP + iters + 1, temperature=1.0))
    for _ in range(WARMUP):
        eng.step()                         # the prefill, then decode at full batch
    t0 = time.perf_counter()
    for _ in range(iters):
        eng.step()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--context", type=int, default=30, help="prompt tokens per request")
    ap.add_argument("--iters", type=int, default=200, help="decode iterations timed per batch size")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = tiny_model()
    rows = [(b, iteration_s(model, b, a.context, a.iters)) for b in (int(x) for x in a.batches.split(","))]
    alone = rows[0][1]
    print("| batch | ms per iteration | ms per request-token | a request's speed-up alone (vs this batch) |")
    print("|---|---|---|---|")
    for b, s in rows:
        print(f"| {b} | {s * 1e3:.2f} | {s * 1e3 / b:.3f} | {s / alone:.2f}x |")


if __name__ == "__main__":
    main()
