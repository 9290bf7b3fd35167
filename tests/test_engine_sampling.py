"""Batched sampling: per-row temperature / top-p / top-k draw from the right distribution."""

from __future__ import annotations

import torch

from dora.ops.engines.sampling import sample

torch.set_num_threads(1)


def _truncated_probs(logits: torch.Tensor, t: float, top_p: float, top_k: int) -> torch.Tensor:
    """Plain per-row reference: softmax(logits / t) restricted to the top-k / nucleus, renormalised."""
    probs = torch.softmax(logits / t, dim=-1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for rank, idx in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[idx] = True
        mass += probs[idx].item()
    p = torch.where(keep, probs, 0.0)
    return p / p.sum()


def test_empirical_distribution_per_row():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 10, generator=g) * 2
    temps = torch.tensor([1.0, 0.5, 2.0, 1.0])
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.6])
    top_k = torch.tensor([0, 0, 3, 4])
    n = 4000
    counts = torch.zeros(4, 10)
    gen = torch.Generator().manual_seed(1)
    for _ in range(n // 100):
        toks, lps = sample(logits.repeat(100, 1), temps.repeat(100), top_p.repeat(100), top_k.repeat(100), gen)
        toks = toks.view(100, 4)
        for r in range(4):
            counts[r] += torch.bincount(toks[:, r], minlength=10)
        # the reported logprob is the full-vocabulary log_softmax(logits / T), never renormalised
        full = torch.log_softmax(logits.repeat(100, 1) / temps.repeat(100)[:, None], dim=-1)
        assert torch.allclose(lps, full.gather(1, toks.view(-1, 1)).squeeze(1))
    for r in range(4):
        want = _truncated_probs(logits[r], temps[r].item(), top_p[r].item(), int(top_k[r]))
        got = counts[r] / n
        assert (got[want == 0] == 0).all(), f"row {r} sampled outside its top-k/top-p set"
        assert (got - want).abs().max().item() < 0.04, (r, got, want)


def test_greedy_rows_mixed_with_sampled_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        toks, lps = sample(logits, torch.tensor([0.0, 1.0]), torch.ones(2), torch.zeros(2, dtype=torch.long), gen)
        assert toks[0].item() == 1
        assert abs(lps[0].item() - torch.log_softmax(logits[0], -1)[1].item()) < 1e-6


def test_the_engine_path_draws_the_same_without_reading_the_device():
    """The engine passes a SamplePlan built from the requests (no host sync) and its parameters in one
    tensor: the same draws as the plain call."""
    from dora.ops.engines.sampling import SamplePlan, sampling_tensors
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(3))
    temps, top_ps, top_ks = [0.0, 1.0, 0.7, 1.2, 0.0, 1.0], [1.0, 0.9, 1.0, 0.5, 1.0, 1.0], [0, 0, 5, 0, 3, 0]
    plain = sample(logits, torch.tensor(temps), torch.tensor(top_ps), torch.tensor(top_ks),
                   torch.Generator().manual_seed(9))
    planned = sample(logits, *sampling_tensors(temps, top_ps, top_ks, torch.device("cpu")),
                     torch.Generator().manual_seed(9), SamplePlan.of(temps, top_ps, top_ks))
    assert torch.equal(plain[0], planned[0]) and torch.equal(plain[1], planned[1])
    assert SamplePlan.of(temps, top_ps, top_ks) == SamplePlan(all_greedy=False, any_greedy=True, truncate=True)
    assert SamplePlan.of([0.0], [1.0], [0]) == SamplePlan(all_greedy=True, any_greedy=True, truncate=False)
