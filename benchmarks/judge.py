"""Judge throughput: rows/s of one judge replica, and what a second replica buys.

    python benchmarks/judge.py [--rows 96] [--model tiny|smollm2] [--repeats 3] [--json out.json]

Each replica is a process of its own running the judge op (dora/ops/judge/judge_op.py) exactly as a
worker runs it: rows in through process(), verdicts out through poll(), the torch engine on CPU with
one thread per replica (what placement gives a replica of a cpu pool of count 2). The same rows are
judged by 1 replica, then split half and half across 2 running at once; wall time from the rows'
hand-over to the last verdict (model load excluded). Repeats alternate the two, so a busy machine
slows both alike; the ratio is the finding. Also printed: the rubric head's tokens and the share of
prompt tokens the prefix cache served (the head is prefilled once per batch, then shared).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing

TINY = {"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "tokenizer": "chars"}
RUBRIC = ("The task '{prompt}' asks for the character after * written as many times as the number before it.\n"
          "Expected: {answer}\nResponse: {response}\nRate the response from 0 (wrong) to 10 (exactly the expected "
          "text). Reply with the number only.")


def rows(n: int, seed: int = 0) -> list[dict]:
    import random

    from dora.ops.tasks.quickstart import TASK
    rng = random.Random(seed)
    out = []
    for i, r in enumerate(TASK.make(n, seed, max_count=48)):
        c, k = r["prompt"][-1], len(r["answer"])
        resp = c * max(1, k + rng.randint(-k, 6)) if rng.random() < 0.7 else "".join(rng.choice("abcdxyz#") for _ in range(rng.randint(1, 48)))
        out.append({"uid": f"{i}", "group_id": i, "question": r["prompt"], "prompt": r["prompt"], "answer": r["answer"],
                    "response_text": resp})
    return out


def replica(model: dict, batch_rows: list[dict], max_tokens: int, ready, go, out) -> None:
    import pyarrow as pa
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from op_context import op_context

    from dora.ops.judge.judge_op import JudgeOp
    op = JudgeOp()
    op.setup(op_context("judge", {"model": model, "rubric": RUBRIC, "max_tokens": max_tokens, "max_in_flight": 1 << 20},
                        async_={"group_size": 1}))
    batch = pa.RecordBatch.from_pylist(batch_rows)
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    op.process(batch, "trajectories")
    n = 0
    while op.busy():
        n += sum(b.num_rows for b in op.poll())
    out.put({"rows": n, "seconds": time.perf_counter() - t0, **op.stats()})
    op.teardown()


def judged(model: dict, all_rows: list[dict], replicas: int, max_tokens: int) -> dict:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    parts = [all_rows[r::replicas] for r in range(replicas)]
    procs, readies = [], []
    for part in parts:
        ready = ctx.Event()
        p = ctx.Process(target=replica, args=(model, part, max_tokens, ready, go, out))
        p.start()
        procs.append(p)
        readies.append(ready)
    for r in readies:
        r.wait(600)
    t0 = time.perf_counter()
    go.set()
    results = [out.get(timeout=1800) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    prompt = sum(r["prefill_tokens"] + r["prefix_hit_tokens"] for r in results)
    return {"replicas": replicas, "rows": sum(r["rows"] for r in results), "wall_s": wall,
            "rows_per_s": sum(r["rows"] for r in results) / wall,
            "rows_per_s_per_replica": [r["rows"] / r["seconds"] for r in results],
            "prefix_hit_share": sum(r["prefix_hit_tokens"] for r in results) / max(1, prompt),
            "rubric_head_tokens": results[0]["rubric_head_tokens"],
            "parse_errors": sum(r.get("parse_errors", 0) for r in results)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    model = TINY if a.model == "tiny" else {"name": "smollm2-135m-instruct"}
    data = rows(a.rows)
    runs = {1: [], 2: []}
    for _ in range(a.repeats):
        for n in (1, 2):
            runs[n].append(judged(model, data, n, a.max_tokens))
    print(f"judge throughput, model {a.model}, {a.rows} rows, max_tokens {a.max_tokens}, {os.cpu_count()} CPUs "
          f"(median of {a.repeats})")
    print(f"{'replicas':>8} {'rows/s':>8} {'rows/s per replica':>20} {'prefix-cache share':>19}")
    med = {}
    for n, rs in runs.items():
        med[n] = statistics.median(r["rows_per_s"] for r in rs)
        per = statistics.median(x for r in rs for x in r["rows_per_s_per_replica"])
        print(f"{n:>8} {med[n]:>8.2f} {per:>20.2f} {statistics.median(r['prefix_hit_share'] for r in rs):>19.2f}")
    print(f"a second replica: x{med[2] / med[1]:.2f} rows/s; rubric head {runs[1][0]['rubric_head_tokens']} tokens")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "rows": a.rows, "runs": runs, "speedup": med[2] / med[1]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
