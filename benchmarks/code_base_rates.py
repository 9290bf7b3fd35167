"""What SmolLM2 (or any `model:`) already passes of synthetic:code_functions, template by template,
before any training: the measurement pipelines/code_exec.yaml's choice of templates rests on.

For each template: `prompts` prompts (its constants drawn with --seed), `samples` sampled responses
each (the pipeline's temperature and max_tokens) and one greedy response, all scored by the code_exec
reward in the sandbox. A template whose samples all pass or all fail gives GRPO no signal (every
sample of a group has the same reward, so every advantage is 0); the column "mixed groups" counts the
prompts whose samples differ. Failing responses are sorted by why: no code block, the wrong function
name, cut by max_tokens, or wrong (ran, failed cases).

    python benchmarks/code_base_rates.py --prompts 3 --samples 8 --max-tokens 64
    python benchmarks/code_base_rates.py --model '{"path": "RUN/checkpoints/step_20"}' --templates reverse count
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from dora.ops.models import load_policy  # noqa: E402
from dora.ops.prompt_rows import render  # noqa: E402
from dora.ops.tasks.code_functions import row, select  # noqa: E402
from dora.ops.tools.code_exec import CodeExecScorer, extract_program  # noqa: E402


def generate(model, tok, prompts: list[list[int]], n: int, temperature: float, max_tokens: int):
    """n responses per prompt: (text, cut by max_tokens) pairs, prompt-major."""
    seqs = [p for p in prompts for _ in range(n)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    kw = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                             pad_token_id=tok.pad_token_id or 0, eos_token_id=tok.eos_token_id, **kw)
    res = []
    for row in out[:, width:].tolist():
        cut = tok.eos_token_id not in row
        res.append((tok.decode([t for t in row if t != tok.eos_token_id and t != tok.pad_token_id],
                               skip_special_tokens=True), cut))
    return res


def why(text: str, cut: bool, fn: str, reward: float) -> str:
    if reward >= 1.0:
        return "pass"
    if "```" not in text:
        return "no_block"
    if f"def {fn}(" not in extract_program(text):
        return "wrong_name"
    if cut:
        return "cut"
    return "wrong"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default='{"name": "smollm2-135m-instruct"}')
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--show", type=int, default=1, help="failing responses printed per template")
    p.add_argument("--templates", nargs="+", help="only these templates (default: every one)")
    p.add_argument("--json", help="write the per-template table here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tok = load_policy(json.loads(args.model))
    score = CodeExecScorer({"warm": 2})
    rng = random.Random(args.seed)
    table = []
    t0 = time.perf_counter()
    for template in select(args.templates):
        rows = [row(template, rng, 4) for _ in range(args.prompts)]
        prompts = [render(r, tok, None)["prompt_ids"] for r in rows]
        t_gen = time.perf_counter()
        sampled = generate(model, tok, prompts, args.samples, args.temperature, args.max_tokens)
        greedy = generate(model, tok, prompts, 1, 0.0, args.max_tokens)
        t_gen = time.perf_counter() - t_gen
        t_score = time.perf_counter()
        kinds: dict[str, int] = {}
        s_rewards, mixed, shown = [], 0, 0
        for i, r in enumerate(rows):
            fn = json.loads(r["answer"])["fn"]
            group = []
            for text, cut in sampled[i * args.samples:(i + 1) * args.samples]:
                rew = score(text, r["answer"], {})
                group.append(rew)
                k = why(text, cut, fn, rew)
                kinds[k] = kinds.get(k, 0) + 1
                if k != "pass" and shown < args.show:
                    shown += 1
                    print(f"--- {template.name} ({k}, reward {rew:.2f}):\n{text}\n", flush=True)
            s_rewards += group
            mixed += len(set(group)) > 1
        g_rewards = [score(text, r["answer"], {}) for (text, _), r in zip(greedy, rows)]
        rec = {"template": template.name, "sampled": sum(s_rewards) / len(s_rewards),
               "sampled_all_pass": sum(x >= 1 for x in s_rewards) / len(s_rewards),
               "greedy": sum(g_rewards) / len(g_rewards), "mixed_groups": mixed, "prompts": len(rows), **kinds,
               "generate_s": round(t_gen, 1), "score_s": round(time.perf_counter() - t_score, 1)}
        table.append(rec)
        print(json.dumps(rec), flush=True)
    score.close()
    print(f"\nmodel={args.model} temperature={args.temperature} max_tokens={args.max_tokens} "
          f"prompts={args.prompts} samples={args.samples} seed={args.seed} ({time.perf_counter() - t0:.0f} s)")
    cols = ["pass", "wrong", "cut", "wrong_name", "no_block"]
    print("| template | sampled pass rate | sampled all-pass | greedy pass rate | mixed groups | "
          + " | ".join(cols) + " |")
    print("|---|---|---|---|---|" + "---|" * len(cols))
    for r in table:
        print(f"| {r['template']} | {r['sampled']:.2f} | {r['sampled_all_pass']:.2f} | {r['greedy']:.2f} | "
              f"{r['mixed_groups']}/{r['prompts']} | " + " | ".join(str(r.get(c, 0)) for c in cols) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
