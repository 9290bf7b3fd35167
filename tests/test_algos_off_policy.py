"""Off-policy corrections vs plain loop implementations and hand-computed cases."""

import math
import random

import pytest
import torch

from dora.algos import off_policy

T_ = lambda x: torch.tensor(x, dtype=torch.float64)


def _data(seed, B=6, T=7, spread=1.5):
    rnd = random.Random(seed)
    lengths = [rnd.randrange(0 if b == 0 else 1, T + 1) for b in range(B)]
    prox = [[-rnd.random() * 3 for _ in range(T)] for _ in range(B)]
    beh = [[x + rnd.uniform(-spread, spread) for x in row] for row in prox]
    mask = [[1.0 if t < L else 0.0 for t in range(T)] for L in lengths]
    return lengths, prox, beh, mask


def _run(name, seed, **params):
    lengths, prox, beh, mask = _data(seed)
    c = off_policy.compute(name, prox_logprobs=T_(prox), behavior_logprobs=T_(beh), mask=T_(mask), **params)
    ratios = [[math.exp(p - b) for p, b in zip(rp, rb)] for rp, rb in zip(prox, beh)]
    return c, ratios, lengths


def _tokens(lengths):
    return [(b, t) for b, L in enumerate(lengths) for t in range(L)]


def _ref_ess(ratios, lengths):
    rho = [math.prod(ratios[b][:L]) for b, L in enumerate(lengths) if L]
    return sum(rho) ** 2 / (len(rho) * sum(x * x for x in rho))


@pytest.mark.parametrize("seed", range(4))
def test_tis_truncates_the_ratio(seed):
    c, r, lengths = _run("tis", seed, cap=1.5)
    for b, t in _tokens(lengths):
        assert float(c.weight[b, t]) == pytest.approx(min(r[b][t], 1.5), rel=1e-12)
    assert float(c.weight.sum()) == pytest.approx(sum(min(r[b][t], 1.5) for b, t in _tokens(lengths)))  # 0 on padding
    assert c.lr_scale == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_icepop_masks_outside_the_band(seed):
    c, r, lengths = _run("icepop", seed, low=0.5, high=2.0)
    dropped = 0
    for b, t in _tokens(lengths):
        want = r[b][t] if 0.5 <= r[b][t] <= 2.0 else 0.0
        dropped += want == 0.0
        assert float(c.weight[b, t]) == pytest.approx(want, rel=1e-12)
    assert c.metrics["is_dropped_frac"] == pytest.approx(dropped / sum(lengths))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("m2_max", [0.04, 0.3, 100.0])
def test_m2po_drops_the_largest_squared_log_ratios_until_the_bound_holds(seed, m2_max):
    c, r, lengths = _run("m2po", seed, m2_max=m2_max)
    toks = sorted(_tokens(lengths), key=lambda bt: -math.log(r[bt[0]][bt[1]]) ** 2)
    sq = [math.log(r[b][t]) ** 2 for b, t in toks]
    k = next((k for k in range(len(sq)) if sum(sq[k:]) / (len(sq) - k) <= m2_max), len(sq))
    kept = set(toks[k:])
    for b, t in toks:
        assert float(c.weight[b, t]) == pytest.approx(r[b][t] if (b, t) in kept else 0.0, rel=1e-12)
    if kept:
        assert sum(math.log(r[b][t]) ** 2 for b, t in kept) / len(kept) <= m2_max + 1e-12
    if m2_max == 100.0:
        assert k == 0   # a batch inside the bound is untouched


def test_m2po_keeps_nothing_when_no_subset_meets_the_bound():
    c = off_policy.compute("m2po", prox_logprobs=T_([[0.0, 0.0]]), behavior_logprobs=T_([[-1.0, 1.0]]),
                           mask=T_([[1.0, 1.0]]), m2_max=0.5)
    assert c.weight.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("power", [0.5, 1.0])
def test_ess_lr_scales_the_step_by_the_sequence_ess(seed, power):
    c, r, lengths = _run("ess_lr", seed, cap=2.0, power=power)
    for b, t in _tokens(lengths):
        assert float(c.weight[b, t]) == pytest.approx(min(r[b][t], 2.0), rel=1e-12)
    ess = _ref_ess(r, lengths)
    assert c.metrics["is_seq_ess"] == pytest.approx(ess, rel=1e-9)
    assert c.lr_scale == pytest.approx(ess ** power, rel=1e-9)
    assert 0 < c.lr_scale <= 1


def test_sequence_ess_bounds():
    mask = T_([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    assert off_policy.sequence_ess(T_([[0.3, -0.3], [0.0, 5.0], [9.0, 9.0]]), mask) == pytest.approx(1.0)  # all rho = 1
    one_dominates = off_policy.sequence_ess(T_([[15.0, 15.0], [0.0, 0.0], [0.0, 0.0]]), mask)
    assert one_dominates == pytest.approx(0.5, rel=1e-6)   # 1/N over the N = 2 non-empty sequences


@pytest.mark.parametrize("seed", range(4))
def test_decoupled_drops_above_the_cap(seed):
    c, r, lengths = _run("decoupled", seed, cap=2.0)
    for b, t in _tokens(lengths):
        assert float(c.weight[b, t]) == pytest.approx(r[b][t] if r[b][t] <= 2.0 else 0.0, rel=1e-12)


@pytest.mark.parametrize("name", off_policy.OFF_POLICY.names())
def test_on_policy_data_are_left_alone(name):
    lengths, prox, _, mask = _data(0)
    c = off_policy.compute(name, prox_logprobs=T_(prox), behavior_logprobs=T_(prox), mask=T_(mask))
    assert torch.equal(c.weight, T_(mask)) and c.lr_scale == 1.0
    assert c.metrics["is_seq_ess"] == pytest.approx(1.0) and c.metrics["is_dropped_frac"] == 0.0


def test_none_ignores_the_behaviour_policy():
    c, _, lengths = _run("none", 0)
    assert float(c.weight.sum()) == sum(lengths)


def test_weights_carry_no_gradient():
    prox = torch.zeros(2, 3, requires_grad=True)
    for name in off_policy.OFF_POLICY.names():
        c = off_policy.compute(name, prox_logprobs=prox, behavior_logprobs=torch.full((2, 3), -0.1), mask=torch.ones(2, 3))
        assert not c.weight.requires_grad, name


def test_bad_names_params_and_values_are_clear_errors():
    one = dict(prox_logprobs=torch.zeros(1, 1), behavior_logprobs=torch.zeros(1, 1), mask=torch.ones(1, 1))
    with pytest.raises(ValueError, match="valid names: decoupled, ess_lr, icepop, m2po, none, tis"):
        off_policy.compute("is", **one)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['cap'\]"):
        off_policy.compute("m2po", cap=2.0, **one)
    for name, params in (("tis", {"cap": 0}), ("icepop", {"low": 2.0, "high": 1.0}), ("m2po", {"m2_max": -1}),
                         ("ess_lr", {"power": -1}), ("decoupled", {"cap": float("inf")})):
        with pytest.raises(ValueError):
            off_policy.compute(name, **one, **params)
    with pytest.raises(ValueError, match="same shape"):
        off_policy.compute("tis", prox_logprobs=torch.zeros(1, 2), behavior_logprobs=torch.zeros(1, 1), mask=torch.ones(1, 2))
