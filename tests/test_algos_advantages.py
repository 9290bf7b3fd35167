"""Advantage estimators vs plain-Python loop implementations and hand-computed cases."""

import math
import random

import pytest
import torch

from dora.algos import advantages


def _groups(rewards, gids):
    g = {}
    for r, k in zip(rewards, gids):
        g.setdefault(k, []).append(r)
    return g


def ref_outcome(name, rewards, gids, lengths, T):
    g = _groups(rewards, gids)
    out = []
    for r, k, L in zip(rewards, gids, lengths):
        xs = g[k]
        n = len(xs)
        mean = sum(xs) / n
        if name == "grpo":
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
            a = (r - mean) / (std + 1e-6)
        elif name in ("dr_grpo", "reinforce_pp_baseline"):
            a = r - mean
        elif name == "rloo":
            a = r - (sum(xs) - r) / (n - 1) if n > 1 else 0.0
        out.append([a if t < L else 0.0 for t in range(T)])
    if name == "reinforce_pp_baseline":
        toks = [out[i][t] for i, L in enumerate(lengths) for t in range(L)]
        m = sum(toks) / len(toks)
        var = sum((x - m) ** 2 for x in toks) / (len(toks) - 1)
        out = [[(x - m) / math.sqrt(var + 1e-8) if t < L else 0.0 for t, x in enumerate(row)]
               for row, L in zip(out, lengths)]
    return out


def ref_gae(rewards, values, lengths, gamma, lam):
    advs, rets = [], []
    for r, v, L in zip(rewards, values, lengths):
        T = len(v)
        rew = [0.0] * T
        if L:
            rew[L - 1] = r
        a = [0.0] * T
        last = 0.0
        for t in reversed(range(L)):
            nv = v[t + 1] if t + 1 < L else 0.0
            delta = rew[t] + gamma * nv - v[t]
            last = delta + gamma * lam * last
            a[t] = last
        advs.append(a)
        rets.append([a[t] + v[t] if t < L else 0.0 for t in range(T)])
    return advs, rets


def _batch(seed, B=12, T=7):
    rnd = random.Random(seed)
    gids = [rnd.randrange(4) for _ in range(B)]
    rewards = [rnd.choice([0.0, 1.0, 0.5, rnd.random()]) for _ in range(B)]
    lengths = [rnd.randrange(1, T + 1) for _ in range(B)]
    mask = torch.tensor([[1.0 if t < L else 0.0 for t in range(T)] for L in lengths])
    return gids, rewards, lengths, mask


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
@pytest.mark.parametrize("seed", range(5))
def test_outcome_estimators_match_loops(name, seed):
    gids, rewards, lengths, mask = _batch(seed)
    got = advantages.compute(name, rewards=torch.tensor(rewards), group_ids=torch.tensor(gids), mask=mask)
    want = torch.tensor(ref_outcome(name, rewards, gids, lengths, mask.shape[1]))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_grpo_hand_case():
    # group 0: rewards 1, 0 -> mean .5, unbiased std sqrt(.5) = .7071 -> +-.7071; group 7: one member -> 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    a = advantages.compute("grpo", rewards=torch.tensor([1.0, 0.0, 3.0]), group_ids=torch.tensor([0, 0, 7]), mask=mask)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(a, torch.tensor([[s, s, 0], [-s, 0, 0], [0, 0, 0]]))


def test_rloo_and_dr_grpo_hand_case():
    mask = torch.ones(3, 1)
    r, g = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([1, 1, 1])
    # rloo: 3 - mean(0, 0) = 3; 0 - mean(3, 0) = -1.5
    torch.testing.assert_close(advantages.compute("rloo", rewards=r, group_ids=g, mask=mask), torch.tensor([[3.0], [-1.5], [-1.5]]))
    torch.testing.assert_close(advantages.compute("dr_grpo", rewards=r, group_ids=g, mask=mask), torch.tensor([[2.0], [-1.0], [-1.0]]))


def test_token_rewards_add_to_outcome_reward():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    tr = torch.tensor([[-0.5, -0.5], [-0.25, 99.0]])  # 99 is off the mask: ignored
    a = advantages.compute("dr_grpo", rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), mask=mask, token_rewards=tr)
    # sequence rewards 0 and -0.25 -> mean -0.125
    torch.testing.assert_close(a, torch.tensor([[0.125, 0.125], [-0.125, 0.0]]))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0)])
def test_gae_matches_loop(seed, gamma, lam):
    gids, rewards, lengths, mask = _batch(seed)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(mask.shape, generator=g)
    adv, ret = advantages.gae_returns(rewards=torch.tensor(rewards), mask=mask, values=values, gamma=gamma, lam=lam)
    wa, wr = ref_gae(rewards, (values * mask).tolist(), lengths, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(wa), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, torch.tensor(wr), atol=1e-5, rtol=1e-5)
    raw = advantages.compute("gae", rewards=torch.tensor(rewards), group_ids=torch.tensor(gids), mask=mask,
                             values=values, gamma=gamma, lam=lam, whiten=False)
    torch.testing.assert_close(raw, adv)
    white = advantages.compute("gae", rewards=torch.tensor(rewards), group_ids=torch.tensor(gids), mask=mask,
                               values=values, gamma=gamma, lam=lam)
    toks = white[mask > 0]
    assert abs(float(toks.mean())) < 1e-5 and abs(float(toks.std()) - 1.0) < 1e-3
    assert float(white[mask == 0].abs().sum()) == 0.0


def test_gae_hand_case():
    # 3 tokens, reward 1 at the end, V = [.5, .5, .5], gamma = lam = 1:
    # deltas = [.5-.5, .5-.5, 1-.5] = [0, 0, .5] -> A = [.5, .5, .5], returns = [1, 1, 1]
    adv, ret = advantages.gae_returns(rewards=torch.tensor([1.0]), mask=torch.ones(1, 3), values=torch.full((1, 3), 0.5))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))


def test_unknown_names_and_params_are_clear_errors():
    kw = dict(rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="grpo.*rloo|valid names"):
        advantages.compute("grpoo", **kw)
    with pytest.raises(ValueError, match="gamma"):
        advantages.compute("grpo", gamma=0.9, **kw)
    with pytest.raises(ValueError, match="needs values"):
        advantages.compute("gae", **kw)
