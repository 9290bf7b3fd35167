"""Policy losses and KL estimators vs plain loop implementations and hand-computed cases."""

import math
import random

import pytest
import torch

from dora.algos import kl, losses


def ref_ppo_token(lp, old, a, lo, hi, dual):
    r = math.exp(lp - old)
    l1, l2 = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
    loss = max(l1, l2)
    if dual is not None and a < 0:
        loss = min(loss, -a * dual)
    return loss


def ref_agg(per_tok, lengths, agg):
    if agg == "token_mean":
        return sum(sum(row[:L]) for row, L in zip(per_tok, lengths)) / sum(lengths)
    seqs = [sum(row[:L]) / (L if agg == "seq_mean_token_mean" else 1) for row, L in zip(per_tok, lengths) if L]
    return sum(seqs) / len(seqs)


def _data(seed, B=5, T=6):
    rnd = random.Random(seed)
    lengths = [rnd.randrange(0 if b == 0 else 1, T + 1) for b in range(B)]
    lp = [[-rnd.random() * 3 for _ in range(T)] for _ in range(B)]
    old = [[x + rnd.uniform(-0.5, 0.5) for x in row] for row in lp]
    beh = [[x + rnd.uniform(-1.0, 1.0) for x in row] for row in old]
    adv = [[rnd.uniform(-2, 2) for _ in range(T)] for _ in range(B)]
    mask = [[1.0 if t < L else 0.0 for t in range(T)] for L in lengths]
    return lengths, lp, old, beh, adv, mask


T_ = lambda x: torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", losses.AGGS)
@pytest.mark.parametrize("hi,dual", [(None, None), (0.28, None), (None, 3.0)])
def test_ppo_clip_matches_loop(seed, agg, hi, dual):
    lengths, lp, old, beh, adv, mask = _data(seed)
    loss, m = losses.compute("ppo_clip", logprobs=T_(lp), old_logprobs=T_(old), advantages=T_(adv), mask=T_(mask),
                             agg=agg, clip_eps=0.2, clip_eps_high=hi, dual_clip=dual)
    h = 0.2 if hi is None else hi
    per = [[ref_ppo_token(lp[b][t], old[b][t], adv[b][t], 0.2, h, dual) for t in range(6)] for b in range(5)]
    assert float(loss) == pytest.approx(ref_agg(per, lengths, agg), rel=1e-9, abs=1e-12)
    assert m["loss"] == pytest.approx(float(loss))


@pytest.mark.parametrize("seed", range(4))
def test_token_weights_multiply_each_tokens_surrogate(seed):
    lengths, lp, old, beh, adv, mask = _data(seed)
    w = [[abs(x) for x in row] for row in beh]
    loss, _ = losses.compute("ppo_clip", logprobs=T_(lp), old_logprobs=T_(old), advantages=T_(adv), mask=T_(mask),
                             token_weights=T_(w))
    per = [[w[b][t] * ref_ppo_token(lp[b][t], old[b][t], adv[b][t], 0.2, 0.2, None) for t in range(6)] for b in range(5)]
    assert float(loss) == pytest.approx(ref_agg(per, lengths, "token_mean"), rel=1e-9)


def test_dapo_is_decoupled_ppo_clip_with_token_mean():
    lengths, lp, old, beh, adv, mask = _data(0)
    kw = dict(logprobs=T_(lp), old_logprobs=T_(old), advantages=T_(adv), mask=T_(mask))
    a, _ = losses.compute("dapo", **kw)
    b, _ = losses.compute("ppo_clip", clip_eps_high=0.28, **kw)
    assert float(a) == float(b)
    with pytest.raises(ValueError, match="token_mean"):
        losses.compute("dapo", agg="seq_mean_token_sum", **kw)


def test_gspo_matches_loop_value_and_gradient():
    lengths, lp, old, beh, adv_tok, mask = _data(1)
    adv = [[row[0]] * 6 for row in adv_tok]  # one advantage per sequence
    x = T_(lp).requires_grad_(True)
    loss, _ = losses.compute("gspo", logprobs=x, old_logprobs=T_(old), advantages=T_(adv), mask=T_(mask),
                             agg="seq_mean_token_mean", clip_eps=0.03, clip_eps_high=0.04)
    loss.backward()
    seqs, grads = [], []
    for b, L in enumerate(lengths):
        if not L:
            grads.append([0.0] * 6)
            continue
        s = math.exp(sum(lp[b][t] - old[b][t] for t in range(L)) / L)
        A = adv[b][0]
        l1, l2 = -A * s, -A * min(max(s, 0.97), 1.04)
        seqs.append(max(l1, l2))
        # d/dlogp_t of the sequence loss, averaged over sequences: -A * s / L when unclipped is active
        g = -A * s / L if l1 >= l2 else 0.0
        grads.append([g if t < L else 0.0 for t in range(6)])
    n = len(seqs)
    assert float(loss.detach()) == pytest.approx(sum(seqs) / n, rel=1e-9)
    torch.testing.assert_close(x.grad, T_(grads) / n)


def test_ppo_hand_case():
    # ratio e^0.5 = 1.6487 > 1.2 with A = 1: clipped -> loss -1.2; ratio 1 with A = -2 -> 2; mean = 0.4
    loss, m = losses.compute("ppo_clip", logprobs=torch.tensor([[0.5, 0.0]]), old_logprobs=torch.zeros(1, 2),
                             advantages=torch.tensor([[1.0, -2.0]]), mask=torch.ones(1, 2))
    assert float(loss) == pytest.approx(0.4)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_microbatch_losses_sum_to_full_batch_loss_and_gradient():
    lengths, lp, old, beh, adv, mask = _data(2)
    for agg in losses.AGGS:
        x = T_(lp).requires_grad_(True)
        full, _ = losses.compute("ppo_clip", logprobs=x, old_logprobs=T_(old), advantages=T_(adv), mask=T_(mask), agg=agg)
        full.backward()
        g_full = x.grad.clone()
        x.grad = None
        tt, ts = sum(lengths), sum(1 for L in lengths if L)
        parts = [slice(0, 2), slice(2, 5)]
        tot = 0.0
        for s in parts:
            part, _ = losses.compute("ppo_clip", logprobs=x[s], old_logprobs=T_(old)[s], advantages=T_(adv)[s],
                                     mask=T_(mask)[s], agg=agg, total_tokens=tt, total_seqs=ts)
            part.backward()
            tot += float(part.detach())
        assert tot == pytest.approx(float(full.detach()), rel=1e-9)
        torch.testing.assert_close(x.grad, g_full)


def test_kl_and_entropy_terms():
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask, ent = torch.ones(1, 2), torch.tensor([[2.0, 4.0]])
    base, _ = losses.compute("ppo_clip", logprobs=lp, old_logprobs=lp, advantages=torch.zeros(1, 2), mask=mask)
    with_terms, m = losses.compute("ppo_clip", logprobs=lp, old_logprobs=lp, advantages=torch.zeros(1, 2), mask=mask,
                                   ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1", entropy=ent, entropy_coef=0.01)
    # k1 = [.5, -1] -> mean -.25; entropy mean 3
    assert float(with_terms) == pytest.approx(float(base) + 0.1 * -0.25 - 0.01 * 3.0)
    assert m["kl"] == pytest.approx(-0.25) and m["entropy"] == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(3))
def test_kl_estimators_match_formulas(seed):
    rnd = random.Random(seed)
    lp = [[-rnd.random() * 4 for _ in range(5)] for _ in range(3)]
    ref = [[-rnd.random() * 4 for _ in range(5)] for _ in range(3)]
    want = {
        "k1": [[a - b for a, b in zip(r1, r2)] for r1, r2 in zip(lp, ref)],
        "k2": [[0.5 * (a - b) ** 2 for a, b in zip(r1, r2)] for r1, r2 in zip(lp, ref)],
        "k3": [[math.exp(b - a) - (b - a) - 1 for a, b in zip(r1, r2)] for r1, r2 in zip(lp, ref)],
    }
    for name, w in want.items():
        torch.testing.assert_close(kl.compute(name, logprobs=T_(lp), ref_logprobs=T_(ref)), T_(w))
    # hand case: logp = ref -> all zero; k3(logp=0, ref=-1) = e^-1 + 1 - 1 = 0.3679
    assert float(kl.compute("k3", logprobs=torch.tensor(0.0), ref_logprobs=torch.tensor(-1.0))) == pytest.approx(math.exp(-1))


def test_unknown_names_and_params():
    kw = dict(logprobs=torch.zeros(1, 2), old_logprobs=torch.zeros(1, 2), advantages=torch.zeros(1, 2), mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="dapo, gspo, ppo_clip"):
        losses.compute("ppo", **kw)
    with pytest.raises(ValueError, match="dual_clip"):
        losses.compute("gspo", dual_clip=3.0, **kw)
    with pytest.raises(ValueError, match="agg"):
        losses.compute("ppo_clip", agg="sum", **kw)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl.compute("k4", logprobs=torch.zeros(1), ref_logprobs=torch.zeros(1))
