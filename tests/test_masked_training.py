"""Training on multi-turn rows: tool-observation tokens (response_mask 0) are in no loss term
(policy loss, KL, entropy), get no advantage, are in no whitening statistic, and gae steps over them;
an all-ones response_mask changes nothing."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from dora.algos import advantages, losses
from dora.graph.columns import COLUMNS
from dora.ops.advantage import AdvantageOp
from op_context import op_context
from test_update_op import make_op, rows

torch.set_num_threads(1)
pytestmark = pytest.mark.usefixtures("remove_shm_weights")

# row 0: 2 model tokens, 2 observation tokens, 2 model tokens; row 1: 3 model tokens, padding
MASK = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.float32)


def loss_and_grad(name: str, agg: str, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    logp = t["logp"].clone().requires_grad_(True)
    loss, _ = losses.compute(name, logprobs=logp, old_logprobs=t["old"], advantages=t["adv"], mask=MASK, agg=agg,
                             ref_logprobs=t["ref"], kl_coef=0.1, entropy=t["ent"], entropy_coef=0.01,
                             clip_eps=0.2)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("name,agg", [("ppo_clip", a) for a in losses.AGGS] + [("dapo", "token_mean"), ("gspo", "token_mean")])
def test_masked_tokens_change_no_loss_term(name, agg):
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(MASK.shape, generator=g) * 0.3 - (1.0 if k in ("logp", "old", "ref") else 0.0)
         for k in ("logp", "old", "adv", "ref", "ent")}
    loss, grad = loss_and_grad(name, agg, t)
    off = MASK == 0
    garbage = {k: torch.where(off, torch.randn(MASK.shape, generator=g) * 5, v) for k, v in t.items()}
    loss2, grad2 = loss_and_grad(name, agg, garbage)
    assert torch.allclose(loss, loss2, atol=1e-6) and torch.allclose(grad, grad2, atol=1e-6)
    assert (grad[off] == 0).all() and (grad[~off] != 0).any()


def test_gae_steps_over_observations():
    """GAE on a response with an observation inside equals GAE on the same response with the
    observation cut out (the model's tokens back to back)."""
    g = torch.Generator().manual_seed(1)
    values, rewards = torch.randn(MASK.shape, generator=g), torch.tensor([1.0, -0.5])
    kw = dict(rewards=rewards, gamma=0.9, lam=0.8)
    adv, ret = advantages.gae_returns(mask=MASK, values=values, **kw)
    keep = [0, 1, 4, 5]
    compact_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    compact_values = torch.stack([values[0, keep], torch.cat([values[1, :3], torch.zeros(1)])])
    adv_c, ret_c = advantages.gae_returns(mask=compact_mask, values=compact_values, **kw)
    assert torch.allclose(adv[0, keep], adv_c[0]) and torch.allclose(ret[0, keep], ret_c[0])
    assert torch.allclose(adv[1, :3], adv_c[1, :3])
    assert (adv[MASK == 0] == 0).all() and (ret[MASK == 0] == 0).all()


def _scored(resps: list[list[int]], masks: list[list[int]] | None) -> pa.RecordBatch:
    data = {"uid": [f"u{i}" for i in range(len(resps))], "group_id": [0] * len(resps), "reward": [1.0, 0.0, 0.5],
            "response_ids": resps}
    if masks is not None:
        data["response_mask"] = masks
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in data.items()], names=list(data))


def test_advantage_op_scores_model_tokens_only():
    """Whitened advantages (reinforce_pp_baseline) with observations in the rows equal those of the
    rows without them; observation tokens get 0."""
    masks = [[1, 0, 0, 1], [1, 1, 0, 1, 1], [1]]
    resps = [[5, 6, 7, 8], [5, 6, 7, 8, 9], [5]]
    compact = [[t for t, m in zip(r, mk) if m] for r, mk in zip(resps, masks)]
    out = []
    for batch in (_scored(resps, masks), _scored(compact, None)):
        op = AdvantageOp()
        op.setup(op_context("advantage", {"estimator": "reinforce_pp_baseline"}, async_={"group_size": 3}))
        out.append(op.process(batch, "scored")[0].column("advantages").to_pylist())
    with_obs, without = out
    for a, mk, b in zip(with_obs, masks, without):
        assert [x for x, m in zip(a, mk) if m] == pytest.approx(b, abs=1e-6)
        assert all(x == 0 for x, m in zip(a, mk) if not m)


def _multiturn(op, resps, advs, masks, garbage: bool = False) -> pa.RecordBatch:
    b = rows(op, [0, 0, 1, 1], resps, advs)
    cols = {n: b.column(n).to_pylist() for n in b.schema.names}
    if garbage:   # what the engine wrote on observation tokens must not matter
        cols["behavior_logprobs"] = [[lp if m else -30.0 for lp, m in zip(r, mk)] for r, mk in zip(cols["behavior_logprobs"], masks)]
        cols["advantages"] = [[a if m else 99.0 for a, m in zip(r, mk)] for r, mk in zip(cols["advantages"], masks)]
    cols.update(response_mask=masks, turns=[2, 1, 2, 1], tool_calls=[1, 0, 1, 0], tool_errors=[1, 0, 0, 0],
                tool_wait_s=[0.25, 0.0, 0.5, 0.0])
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in cols.items()], names=list(cols))


def _params(op) -> list[torch.Tensor]:
    return [p.detach().clone() for p in op.model.parameters()]


def test_update_trains_model_tokens_only(tmp_path):
    resps = [[40, 41, 9, 9, 40], [50, 51], [40, 9, 40], [60, 61, 62]]
    advs = [1.0, -1.0, 1.0, -1.0]
    masks = [[1, 1, 0, 0, 1], [1, 1], [1, 0, 1], [1, 1, 1]]
    results, metrics = [], []
    for i, garbage in enumerate((False, True)):
        events: list = []
        op = make_op(tmp_path / str(i), events, lr=3e-3, steps=1)
        op.process(_multiturn(op, resps, advs, masks, garbage), "batch")
        results.append(_params(op))
        metrics.append([e for e in events if e["kind"] == "train_step"][0]["metrics"])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results))
    assert any(not torch.equal(a, b) for a, b in zip(results[0], _params(make_op(tmp_path / "init", [], steps=1))))
    m = metrics[0]
    assert m["tokens"] == 10   # model tokens only (13 in all)
    assert (m["turns_mean"], m["tool_calls"], m["tool_errors"], m["tool_wait_s"]) == (1.5, 2.0, 1.0, 0.75)


def test_an_all_ones_mask_changes_nothing(tmp_path):
    resps = [[40, 41, 40], [50, 51], [40, 40], [60, 61, 62]]
    advs = [1.0, -1.0, 1.0, -1.0]
    results = []
    for i, with_mask in enumerate((True, False)):
        op = make_op(tmp_path / str(i), [], lr=3e-3, steps=1, off_policy={"name": "m2po", "m2_max": 0.04})
        b = rows(op, [0, 0, 1, 1], resps, advs)
        if with_mask:
            b = b.append_column(pa.field("response_mask", COLUMNS["response_mask"]), pa.array([[1] * len(r) for r in resps], COLUMNS["response_mask"]))
        op.process(b, "batch")
        results.append(_params(op))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_multiturn_rows_survive_a_run_checkpoint_and_train(tmp_path):
    """Rows of a multi-turn generate, scored, written to a run checkpoint's pending trajectories (what
    a resume trains first) and read back, keep their masks aligned and train on model tokens; a
    misaligned mask fails the step naming the trajectory."""
    from dora.ops.generate import GenerateOp
    from dora.rl import checkpoint
    from test_generate_multiturn import GREEDY, MODEL, prompts

    gen = GenerateOp()
    gen.setup(op_context("generate", GREEDY, node="gen", model=MODEL, seed=0, report=lambda e: None))
    gen.process(prompts("ttqt"), "prompts")
    batches = []
    while gen.busy():
        batches += list(gen.poll())
    table = pa.Table.from_batches(batches).sort_by("uid")
    table = table.append_column(pa.field("reward", COLUMNS["reward"]), pa.array([1.0, 0.0, 0.0, 1.0], COLUMNS["reward"]))
    table = table.set_column(table.schema.get_field_index("group_id"), "group_id", pa.array([0, 0, 1, 1], COLUMNS["group_id"]))
    adv = AdvantageOp()
    adv.setup(op_context("advantage", {"estimator": "grpo"}, async_={"group_size": 2}))
    scored = pa.Table.from_batches([adv.process(table.combine_chunks().to_batches()[0], "scored")[0]])
    folder = checkpoint.staging(str(tmp_path / "run"), 1)
    checkpoint.write_state(folder, {"step": 1}, scored)
    _, back = checkpoint.read(folder)
    assert back.equals(scored)
    masks, resps = back.column("response_mask").to_pylist(), back.column("response_ids").to_pylist()
    assert [len(m) for m in masks] == [len(r) for r in resps] and any(0 in m for m in masks)
    events: list = []
    op = make_op(tmp_path / "train", events, lr=1e-3, steps=2)
    op.process(back.combine_chunks().to_batches()[0], "batch")
    (step,) = [e for e in events if e["kind"] == "train_step"]
    assert step["metrics"]["tokens"] == sum(sum(m) for m in masks) < sum(len(r) for r in resps)
    bad = back.set_column(back.schema.get_field_index("response_mask"), "response_mask",
                          pa.array([m[:-1] for m in masks], COLUMNS["response_mask"]))
    bad = bad.set_column(bad.schema.get_field_index("uid"), "uid", pa.array([f"x{i}" for i in range(4)], COLUMNS["uid"]))
    with pytest.raises(ValueError, match="response_mask does not have one value per response token"):
        op.process(bad.combine_chunks().to_batches()[0], "batch")
