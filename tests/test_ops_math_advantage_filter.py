"""AdvantageOp and FilterOp: group buffering, estimator wiring, KL reward penalty, dynamic filtering."""

import pyarrow as pa
import pytest
import torch

from dora.algos import advantages as adv_mod
from dora.graph.columns import COLUMNS
from dora.ops.advantage import AdvantageOp
from op_context import op_context
from dora.ops.filter import FilterOp


def ctx(op, params=None, group_size=None, events=None):
    return op_context(op, params, async_={"group_size": group_size},
                      report=(events.append if events is not None else (lambda e: None)))


def batch(**cols):
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in cols.items()], names=list(cols))


def scored(gids, rewards, lens, start=0, **extra):
    return batch(uid=[f"u{start + i}" for i in range(len(gids))], group_id=gids, reward=rewards,
                 response_ids=[[3] * n for n in lens], **extra)


def test_advantage_waits_for_whole_groups_then_matches_algos():
    op = AdvantageOp()
    op.setup(ctx("advantage", group_size=2))
    assert op.process(scored([1, 2], [1.0, 0.0], [2, 3]), "scored") == []
    out = op.process(scored([1, 3], [0.0, 5.0], [1, 4], start=2), "scored")
    assert len(out) == 1 and out[0].column("uid").to_pylist() == ["u0", "u2"]
    adv = out[0].column("advantages").to_pylist()
    assert [len(a) for a in adv] == [2, 1]
    s = 0.5 / (0.5 ** 0.5 + 1e-6)
    assert adv[0] == pytest.approx([s, s]) and adv[1] == pytest.approx([-s])
    assert op.stats()["pending_rows"] == 2
    # end of stream: incomplete groups are scored, not dropped, and reported
    rest = op.finish()
    assert sorted(rest[0].column("uid").to_pylist()) == ["u1", "u3"]


def test_advantage_rejects_oversized_groups():
    op = AdvantageOp()
    op.setup(ctx("advantage", group_size=2))
    with pytest.raises(ValueError, match="more than group_size=2"):
        op.process(scored([1, 1, 1], [1.0, 0.0, 1.0], [1, 1, 1]), "scored")


def test_gae_adds_returns_and_kl_penalty_enters_rewards():
    op = AdvantageOp()
    op.setup(ctx("advantage", {"estimator": "gae", "whiten": False, "kl_coef": 0.5, "kl_estimator": "k1"}))
    b = scored([0, 0], [1.0, 0.0], [2, 1], values=[[0.5, 0.25], [0.1]],
               behavior_logprobs=[[-1.0, -1.0], [-2.0]], ref_logprobs=[[-1.5, -1.0], [-1.0]])
    out = op.process(b, "scored")[0]
    # token rewards = -0.5 * (beh - ref): row 0 [-0.25, 0] (+1 at the end), row 1 [0.5] (+0)
    want_a, want_r = adv_mod.gae_returns(rewards=torch.tensor([1.0, 0.0]), mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                                         values=torch.tensor([[0.5, 0.25], [0.1, 0.0]]),
                                         token_rewards=torch.tensor([[-0.25, 0.0], [0.5, 0.0]]))
    assert out.column("advantages").to_pylist()[0] == pytest.approx(want_a[0].tolist())
    assert out.column("returns").to_pylist()[1] == pytest.approx([want_r[1, 0].item()])
    # hand check row 1: A = 0.5 + 0 - 0.1 = 0.4; return = 0.5
    assert out.column("advantages").to_pylist()[1] == pytest.approx([0.4])
    assert out.column("returns").to_pylist()[1] == pytest.approx([0.5])


def test_advantage_errors_name_node_and_column():
    op = AdvantageOp()
    op.setup(ctx("advantage", {"estimator": "gae"}))
    with pytest.raises(ValueError, match=r"advantage\[0\].*values"):
        op.process(scored([0], [1.0], [1]), "scored")
    with pytest.raises(ValueError, match="unknown name 'grpo2'"):
        AdvantageOp().setup(ctx("advantage", {"estimator": "grpo2"}))


def test_filter_drops_whole_uniform_groups_and_reports():
    events = []
    op = FilterOp()
    op.setup(ctx("filter", group_size=2, events=events))
    assert op.process(scored([1, 2, 3], [1.0, 0.0, 0.5], [1, 1, 1]), "scored") == []
    out = op.process(scored([1, 2, 3], [1.0, 1.0, 0.5], [1, 1, 1], start=3), "scored")
    # group 1: all 1.0 -> dropped; group 3: all 0.5 -> dropped; group 2: 0 vs 1 -> kept whole
    assert len(out) == 1 and sorted(out[0].column("uid").to_pylist()) == ["u1", "u4"]
    assert events == [{"kind": "filtered", "node": "filter", "groups": 2, "group_ids": [1, 3],
                       "uids": ["u0", "u2", "u3", "u5"]}]
    assert op.stats() == {"groups_seen": 3, "groups_filtered": 2, "rows_filtered": 4}
    # a batch of only uniform groups yields nothing
    assert op.process(scored([7, 7], [0.0, 0.0], [1, 1]), "scored") == []
