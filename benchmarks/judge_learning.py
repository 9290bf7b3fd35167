"""A judged run where the reward visibly rises: the quickstart policy trained on a judge's verdicts only.

    python benchmarks/judge_learning.py train --out bench/judge-model [--steps 700] [--seed 0]
    python benchmarks/judge_learning.py run --judge bench/judge-model --out bench/judge-runs [--seeds 0 1] [--steps 30]

A 135M SmolLM2 cannot tell a good quickstart answer from a bad one (docs/benchmarks.md, issue 33: its
0-10 ratings correlate -0.23 with the task's score), so the judge here is a tiny char model of the
quickstart's size taught to judge: `train` fits it, by supervised next-token loss on the verdict
digit only, to answer the rubric "{prompt}|{response}=" with round(9 x the task's score) on random
responses (the right symbol at lengths around n, other symbols, noise). Its held-out agreement
with the task's scorer is printed. It is a generative judge like any other: the judge op fills the
rubric, the torch engine generates one token greedily, the number parser reads it in [0, 9].
`run` trains the quickstart policy (GRPO, dora mode) with reward = 1.0 x the judge; the task's own
score rides along as a source of weight 0 (reward/task), so the table shows whether what the judge
rewards is what the task wants. Prints reward (= reward/judge) and reward/task, first 3 vs last 3
steps, per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)   # run from a checkout without installing

JUDGE = {"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
         "max_positions": 256, "init_std": 0.05, "tokenizer": "chars"}
RUBRIC = "{prompt}|{response}="
MAX_COUNT = 48


def example(rng: random.Random) -> tuple[str, str, int]:
    """(prompt, response, verdict digit) for a quickstart prompt and a random response: empty, the right
    symbol near the right length, another symbol, noise over every character a tiny policy can write
    (what an untrained one does), and runs of the symbol mixed with noise. (Empty responses and noise
    over every character were each missing from an earlier version, and each time the policy found
    exactly that hole: docs/benchmarks.md.)"""
    import string

    from dora.ops.tasks.quickstart import TASK
    r = TASK.make(1, rng.randrange(1 << 30), max_count=MAX_COUNT)[0]
    n, c = len(r["answer"]), r["prompt"][-1]
    chars = string.printable
    kind = rng.random()
    if kind < 0.05:    # nothing at all (an untrained judge rated empty responses highly: the policy found it)
        resp = ""
    elif kind < 0.4:   # the right symbol, about the right length
        resp = c * max(1, int(n * rng.uniform(0.2, 2.0) + rng.randint(-2, 2)))
    elif kind < 0.55:  # another symbol
        resp = rng.choice("abcdxyz8%_") * rng.randint(1, MAX_COUNT)
    elif kind < 0.8:   # noise, with some of the symbol
        share = rng.random()
        resp = "".join(c if rng.random() < share else rng.choice(chars) for _ in range(rng.randint(1, MAX_COUNT)))
    else:              # a run of the symbol, then noise
        resp = c * rng.randint(1, n + 2) + "".join(rng.choice(chars) for _ in range(rng.randint(1, MAX_COUNT)))
    resp = resp[:MAX_COUNT]
    return r["prompt"], resp, round(9 * TASK.score(resp, r["answer"]))


def train(out: str, steps: int, seed: int, batch: int = 64) -> dict:
    import torch

    from dora.ops.models import load_policy
    torch.set_num_threads(1)   # (a tiny model: more threads only wait on each other, the more so on a busy machine)
    torch.manual_seed(seed)
    model, tok = load_policy(JUDGE, "cpu", seed=seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)

    def tensors(examples):
        seqs = [tok.encode(RUBRIC.format(prompt=p, response=r), add_special_tokens=True) + [tok.token_id(str(d)),
                tok.eos_token_id] for p, r, d in examples]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tok.pad_token_id)
        labels = torch.full((len(seqs), width), -100)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
            labels[i, len(s) - 2:len(s)] = torch.tensor(s[-2:])   # the verdict digit and EOS only
        return ids, labels

    for step in range(steps):
        ids, labels = tensors([example(rng) for _ in range(batch)])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 200 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    model.eval()
    held = [example(random.Random(10_000 + i)) for i in range(400)]
    with torch.no_grad():
        preds = []
        for p, r, _ in held:
            ids = torch.tensor([tok.encode(RUBRIC.format(prompt=p, response=r), add_special_tokens=True)])
            preds.append(int(model(input_ids=ids).logits[0, -1].argmax()))
    digits = [int(tok.decode([t])) if tok.decode([t]).isdigit() else -1 for t in preds]
    truth = [d for _, _, d in held]
    agree = {"held_out": len(held), "exact": sum(a == b for a, b in zip(digits, truth)) / len(held),
             "within_1": sum(abs(a - b) <= 1 for a, b in zip(digits, truth)) / len(held),
             "correlation": statistics.correlation([float(d) for d in digits], [float(t) for t in truth])}
    model.save_pretrained(out)
    tok.save_pretrained(out)
    with open(os.path.join(out, "agreement.json"), "w") as f:
        json.dump(agree, f)
    print(f"judge saved to {out}: held-out agreement {agree}")
    return agree


def run(judge: str, out: str, seeds: list[int], steps: int) -> None:
    overrides = [f"nodes.judge.params.model={{path: {os.path.abspath(judge)}}}", f"nodes.judge.params.rubric='{RUBRIC}'",
                 "nodes.judge.params.chat=false", "nodes.judge.params.range=[0, 9]", "nodes.judge.params.max_tokens=1",
                 "nodes.reward.params.sources=[{name: judge, column: reward/judge, weight: 1.0}, "
                 "{name: task, fn: synthetic, weight: 0.0}]", f"nodes.train.params.steps={steps}"]
    table = []
    for seed in seeds:
        d = os.path.join(out, f"seed{seed}")
        cmd = [sys.executable, "-m", "dora.cli", "run", os.path.join(ROOT, "pipelines", "judge.yaml"), *overrides,
               f"run.seed={seed}", f"nodes.prompts.params.seed={seed}", "--out", d, "--overwrite", "--quiet"]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        lines = [json.loads(x) for x in open(os.path.join(d, "metrics.jsonl"))]
        first, last = lines[:3], lines[-3:]
        mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)
        table.append((seed, mean(first, "reward/judge"), mean(last, "reward/judge"), mean(first, "reward/task"),
                      mean(last, "reward/task"), sum(r["judge_parse_errors"] for r in lines),
                      sum(r["step_time_s"] for r in lines) / len(lines)))
    print(f"{'seed':>4} {'judge first3':>12} {'judge last3':>11} {'task first3':>11} {'task last3':>10} "
          f"{'parse errors':>12} {'step s':>7}")
    for row in table:
        print(f"{row[0]:>4} {row[1]:>12.3f} {row[2]:>11.3f} {row[3]:>11.3f} {row[4]:>10.3f} {row[5]:>12} {row[6]:>7.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=700)
    t.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--judge", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--steps", type=int, default=30)
    a = ap.parse_args(argv)
    if a.cmd == "train":
        train(a.out, a.steps, a.seed)
    else:
        run(a.judge, a.out, a.seeds, a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
