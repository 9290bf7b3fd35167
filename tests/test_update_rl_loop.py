"""The chain advantage -> filter -> update learns: a tiny policy, sampled on-policy, raises its reward.

Reward = fraction of response tokens with an id below HALF (about half the vocabulary at start);
GRPO advantages from AdvantageOp, DAPO dynamic filtering, UpdateOp with ppo_clip. The sampler is a
plain loop over the trainer's own model (the generate op is another area's); behaviour logprobs
are those of the sampling distribution.
"""

import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from dora.ops.advantage import AdvantageOp
from op_context import op_context
from dora.ops.filter import FilterOp
from dora.ops.update import UpdateOp

torch.set_num_threads(1)
TINY = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}


pytestmark = pytest.mark.usefixtures("remove_shm_weights")
HALF = 50
G, PROMPTS, LEN = 8, 2, 6


@torch.no_grad()
def sample(model, prompt, n, length, gen):
    ids = torch.tensor([prompt] * n)
    logps = []
    for _ in range(length):
        logits = model(input_ids=ids).logits[:, -1].float()
        logp = torch.log_softmax(logits, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        logps.append(logp.gather(-1, tok))
        ids = torch.cat([ids, tok], 1)
    return ids[:, len(prompt):].tolist(), torch.cat(logps, 1).tolist()


def test_grpo_chain_raises_reward(tmp_path):
    events = []
    mk = lambda node, params, **a: op_context(node, params, model=TINY, run_dir=str(tmp_path),
                                              async_={"train_batch": G * PROMPTS, "group_size": G, **a}, report=events.append)
    adv, filt, upd = AdvantageOp(), FilterOp(), UpdateOp()
    adv.setup(mk("advantage", {"estimator": "grpo"}))
    filt.setup(mk("filter", {}))
    upd.setup(mk("update", {"lr": 2e-2, "steps": 12, "loss": "ppo_clip"}))
    gen = torch.Generator().manual_seed(0)
    rewards, gid = [], 0
    for it in range(40):
        if upd.done:
            break
        resp, beh, pids, gids = [], [], [], []
        for p in range(PROMPTS):
            prompt = [5 + p, 6, 7]
            r, lp = sample(upd.model, prompt, G, LEN, gen)
            resp += r; beh += lp; pids += [prompt] * G; gids += [gid] * G
            gid += 1
        rew = [sum(t < HALF for t in r) / LEN for r in resp]
        rewards.append(sum(rew) / len(rew))
        cols = {"uid": [f"{it}-{i}" for i in range(len(resp))], "group_id": gids, "prompt_ids": pids,
                "response_ids": resp, "behavior_logprobs": beh, "policy_version": [upd.version] * len(resp), "reward": rew}
        b = pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in cols.items()], names=list(cols))
        for kept in filt.process(b, "scored"):
            for scored in adv.process(kept, "scored"):
                upd.process(scored, "batch")
    steps = [e for e in events if e["kind"] == "train_step"]
    assert len(steps) == 12 and upd.done
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print("rewards", [round(r, 2) for r in rewards])
    assert last > first + 0.2, rewards
