"""KV parking across tool waits, side by side: the generate op of pipelines/agentic_calc.yaml
(SmolLM2-135M-Instruct, the python tool, up to 3 turns) on the same prompts with park_kv true and
false. Prints prefill tokens, prefix-cache hits, re-prefilled tokens and seconds per run, and the ratios.

    python3 benchmarks/agentic_parking.py --prompts 16
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa
import torch
import yaml

from dora.graph.columns import COLUMNS
from dora.graph.op_registry import resolve_op
from dora.graph.opspec import fill_params
from dora.graph.sections import AsyncSettings
from dora.ops.base import OpContext
from dora.ops.dataset import load_records, render
from dora.ops.generate import GenerateOp

PIPELINE = "pipelines/agentic_calc.yaml"


def run(params: dict, model: dict, prompt_ids: list[list[int]]) -> dict:
    op = GenerateOp()
    filled = fill_params(resolve_op("generate"), dict(params))
    op.setup(OpContext(node="rollout", op="generate", replica=0, replicas=1, params=filled, model=model,
                       async_=AsyncSettings(), seed=0, report=lambda ev: None))
    batch = pa.RecordBatch.from_pydict({"uid": [f"u{i}" for i in range(len(prompt_ids))], "prompt_ids": prompt_ids},
                                       schema=pa.schema({c: COLUMNS[c] for c in ("uid", "prompt_ids")}))
    t0 = time.perf_counter()
    op.process(batch, "prompts")
    rows = []
    while op.busy():
        rows += [r for b in op.poll() for r in b.to_pylist()]
    seconds = time.perf_counter() - t0
    st = op.engine.stats()
    op.teardown()
    return {"seconds": seconds, "prefill": st.prefill_tokens, "prefix_hits": st.prefix_hit_tokens,
            "reprefill": st.continuation_reprefill_tokens, "dropped": st.parked_dropped,
            "turns": sum(r["turns"] for r in rows), "tool_calls": sum(r["tool_calls"] for r in rows),
            "generated": sum(sum(r["response_mask"]) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=None, help="default: the pipeline's (0.7; greedy never "
                    "calls the tool). Both runs sample from the same seed; parking changes numerics slightly, so "
                    "the sampled trajectories may differ: compare turns too")
    a = ap.parse_args()
    torch.set_num_threads(2)
    cfg = yaml.safe_load(open(PIPELINE))
    gen, data = cfg["nodes"]["rollout"]["params"], cfg["nodes"]["prompts"]["params"]
    if a.temperature is not None:
        gen = {**gen, "temperature": a.temperature}
    from dora.ops.models import load_policy
    _, tok = load_policy(cfg["model"], "cpu", seed=0)
    records = load_records(data["source"], a.prompts, 0, data["task_params"])
    prompt_ids = [render(r, tok, None)["prompt_ids"] for r in records]
    out = {park: run({**gen, "park_kv": park}, cfg["model"], prompt_ids) for park in (False, True)}
    print(f"{PIPELINE} generate, {a.prompts} prompts (mean {sum(map(len, prompt_ids)) / len(prompt_ids):.0f} tokens), "
          f"temperature {gen['temperature']}")
    print("| park_kv | turns | tool calls | generated | prefill tokens | prefix hits | re-prefilled | dropped | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for park, r in out.items():
        print(f"| {str(park).lower()} | {r['turns']} | {r['tool_calls']} | {r['generated']} | {r['prefill']} | "
              f"{r['prefix_hits']} | {r['reprefill']} | {r['dropped']} | {r['seconds']:.1f} |")
    f, t = out[False], out[True]
    print(f"prefill tokens parked/unparked: {t['prefill'] / max(1, f['prefill']):.3f}; "
          f"seconds: {t['seconds'] / max(1e-9, f['seconds']):.2f}")


if __name__ == "__main__":
    main()
