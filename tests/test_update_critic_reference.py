"""ReferenceOp (frozen initial policy) and CriticOp (value model trained on GAE returns)."""

import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from op_context import op_context
from dora.ops.batching import collate
from dora.ops.critic import CriticOp
from dora.ops.logprobs import response_logprobs
from dora.ops.models import load_policy
from dora.ops.reference import ReferenceOp

torch.set_num_threads(1)
TINY = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}


def ctx(op, params, events=None):
    return op_context(op, params, model=TINY, seed=0, report=(events.append if events is not None else (lambda e: None)))


def trajs(prompts, resps, rewards=None):
    cols = {"uid": [f"u{i}" for i in range(len(prompts))], "prompt_ids": prompts, "response_ids": resps}
    if rewards is not None:
        cols["reward"] = rewards
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in cols.items()], names=list(cols))


def test_reference_logprobs_equal_initial_policy_row_by_row():
    op = ReferenceOp()
    op.setup(ctx("reference", {"micro_batch_tokens": 8}))
    prompts = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    resps = [[20, 21], [22, 23, 24], [25]]
    out = op.process(trajs(prompts, resps), "trajectories")[0]
    ref = out.column("ref_logprobs").to_pylist()
    policy, _ = load_policy(TINY, "cpu", seed=0)   # the trainer's initial weights
    for p, r, got in zip(prompts, resps, ref):
        with torch.no_grad():
            want, _ = response_logprobs(policy, collate([p], [r]))
        assert got == pytest.approx(want[0].tolist(), abs=1e-5)
        assert len(got) == len(r) and all(x < 0 for x in got)


def test_critic_emits_values_and_learns_the_return():
    events = []
    op = CriticOp()
    op.setup(ctx("critic", {"lr": 3e-3, "value_clip": 10.0}, events))
    prompts, resps = [[5, 6], [7, 8, 9]], [[20, 21, 22], [23]]
    first = None
    for _ in range(15):
        out = op.process(trajs(prompts, resps, [1.0, 1.0]), "trajectories")[0]
        values = out.column("values").to_pylist()
        assert [len(v) for v in values] == [3, 1]
        first = first if first is not None else values
        assert op.busy()
        op.poll()
        assert not op.busy()
    assert first == [[0.0] * 3, [0.0]]  # zero-initialised head
    last = [x for v in values for x in v]
    assert min(last) > 0.5, last      # gamma = lam = 1, reward 1 at the end: every return is 1
    steps = [e for e in events if e["kind"] == "critic_step"]
    assert len(steps) == 15 and steps[-1]["metrics"]["value_loss"] < steps[0]["metrics"]["value_loss"] / 4

