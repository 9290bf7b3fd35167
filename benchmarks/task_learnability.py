"""Does a synthetic task learn under GRPO with a tiny random model, and are its lengths long-tailed?

A minimal self-contained GRPO loop (independent of dora's runtime, so it measures the task,
not the plumbing): sample G responses per prompt with the model's forward and a KV cache,
score them with the task, group-normalised advantages, token-mean policy-gradient loss
(on-policy, so PPO's ratio is 1), AdamW. Prints one line per step and a summary table:
reward first-3 vs last-3 steps, max/median response length per step, seconds per step.

    python benchmarks/task_learnability.py --seeds 0 1 2 --steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from dora.ops.models import load_policy  # noqa: E402
from dora.ops.tasks import get_task  # noqa: E402


def left_pad(seqs: list[list[int]], pad: int):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids, mask


@torch.no_grad()
def sample(model, prompts, max_tokens, temperature, eos, pad, gen):
    ids, mask = left_pad(prompts, pad)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    past, logits, cur = out.past_key_values, out.logits[:, -1], pos[:, -1]
    B = len(prompts)
    done = torch.zeros(B, dtype=torch.bool)
    resp: list[list[int]] = [[] for _ in range(B)]
    for _ in range(max_tokens):
        tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen).squeeze(1)
        for i in torch.nonzero(~done).flatten().tolist():
            resp[i].append(int(tok[i]))
        done |= tok == eos
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], 1)
        cur = cur + 1
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=cur[:, None],
                    past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    return resp


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    adv = torch.zeros_like(rewards)
    for g in groups.unique():
        m = groups == g
        r = rewards[m]
        adv[m] = (r - r.mean()) / (r.std(unbiased=True) + 1e-6) if m.sum() > 1 else 0.0
    return adv


def policy_gradient_step(model, opt, prompts, responses, adv, pad, temperature, agg="token_mean", grad_clip=1.0):
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp_mask = torch.zeros(len(seqs), width)
    for i, (p, r) in enumerate(zip(prompts, responses)):  # right padding for training
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
        resp_mask[i, len(p): len(p) + len(r)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1] / temperature
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = resp_mask[:, 1:]
    per_token = -(logp * adv[:, None] * mask)
    if agg == "token_mean":      # every token of the batch weighs the same (long responses dominate)
        loss = per_token.sum() / mask.sum()
    else:                        # seq_mean_token_mean: every response weighs the same
        loss = (per_token.sum(1) / mask.sum(1).clamp(min=1)).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


def run(args, seed: int) -> dict:
    torch.manual_seed(seed)
    model_cfg = json.loads(args.model)
    model, tok = load_policy(model_cfg, seed=seed)
    model.train()
    task = get_task(args.task)
    rows = task.make(args.size, seed, **json.loads(args.task_params))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rows), generator=gen).tolist()
    steps = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        chosen = [rows[order[(step * args.prompts + k) % len(rows)]] for k in range(args.prompts)]
        prompts = [tok.encode(r["prompt"]) for r in chosen for _ in range(args.group)]
        answers = [r["answer"] for r in chosen for _ in range(args.group)]
        groups = torch.tensor([k for k in range(args.prompts) for _ in range(args.group)])
        model.eval()
        responses = sample(model, prompts, args.max_tokens, args.temperature, tok.eos_token_id, tok.pad_token_id, gen)
        model.train()
        rewards = torch.tensor([task.score(tok.decode(r), a) for r, a in zip(responses, answers)])
        adv = grpo_advantages(rewards, groups)
        policy_gradient_step(model, opt, prompts, responses, adv, tok.pad_token_id, args.temperature, args.agg)
        lens = [len(r) for r in responses]
        med = statistics.median(lens)
        rec = {"step": step, "reward": float(rewards.mean()), "len_median": med, "len_max": max(lens),
               "ratio": max(lens) / med, "s": time.perf_counter() - t0}
        steps.append(rec)
        if args.verbose:
            print(f"seed {seed} step {step:2d} reward {rec['reward']:.3f} len med {med:5.1f} max {max(lens):4d} "
                  f"ratio {rec['ratio']:5.1f} {rec['s']:.2f}s", flush=True)
    first = statistics.mean(s["reward"] for s in steps[:3])
    last = statistics.mean(s["reward"] for s in steps[-3:])
    ratios = [s["ratio"] for s in steps]
    return {"seed": seed, "first3": first, "last3": last, "gain": last - first,
            "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
            "steps_ratio_ge_10": sum(r >= 10 for r in ratios), "steps": len(steps),
            "s_per_step": statistics.mean(s["s"] for s in steps), "total_s": sum(s["s"] for s in steps)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="quickstart")
    p.add_argument("--task-params", default="{}")
    p.add_argument("--model", default='{"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, '
                                      '"intermediate": 128, "init_std": 0.02}')
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--agg", default="token_mean", choices=("token_mean", "seq_mean_token_mean"))
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = [run(args, s) for s in args.seeds]
    print(f"\ntask={args.task} params={args.task_params} model={args.model}")
    print(f"lr={args.lr} temperature={args.temperature} max_tokens={args.max_tokens} "
          f"prompts={args.prompts} group={args.group} steps={args.steps} agg={args.agg} threads={args.threads}")
    print("| seed | reward first-3 | reward last-3 | gain | max/median min | max/median median | steps >= 10 | s/step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['first3']:.3f} | {r['last3']:.3f} | {r['gain']:+.3f} | {r['ratio_min']:.1f} | "
              f"{r['ratio_median']:.1f} | {r['steps_ratio_ge_10']}/{r['steps']} | {r['s_per_step']:.2f} |")
    return results


if __name__ == "__main__":
    main()
