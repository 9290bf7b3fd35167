"""UpdateOp on a tiny Llama: it learns, takes exact whole-group batches, publishes versions, checkpoints."""

import os
import re

import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from dora.ops.weights import versions as weights
from op_context import op_context

from dora.graph.sections import ModeError, resolve_mode
from dora.ops.models import load_policy
from dora.ops.reference import batch_logprobs
from dora.ops.update import UpdateOp

torch.set_num_threads(1)
TINY = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}


pytestmark = pytest.mark.usefixtures("remove_shm_weights")
PROMPT = [5, 6, 7, 8]
GOOD = 40  # the rewarded token


def make_op(tmp_path, events, train_batch=4, **params):
    op = UpdateOp()
    ctx = op_context("update", params, model=TINY, run_dir=str(tmp_path),
                     async_={"mode": "dora", "train_batch": train_batch, "max_staleness": 1}, report=events.append)
    op.setup(ctx)
    return op


def rows(op, group_ids, responses, advs, version=0, start=0):
    """Arrow rows with behaviour logprobs computed by op's current weights (on-policy data)."""
    prompts = [PROMPT] * len(responses)
    beh = batch_logprobs(op.model, prompts, responses, 4096)
    data = {
        "uid": [f"u{start + i}" for i in range(len(responses))],
        "group_id": group_ids,
        "prompt_ids": prompts,
        "response_ids": responses,
        "behavior_logprobs": beh,
        "advantages": [[a] * len(r) for a, r in zip(advs, responses)],
        "policy_version": [version] * len(responses),
        "reward": [max(a, 0.0) for a in advs],
    }
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in data.items()], names=list(data))


def good_logprob(op):
    return batch_logprobs(op.model, [PROMPT], [[GOOD, GOOD]], 4096)[0][0]


def test_policy_moves_toward_rewarded_token_and_publishes_versions(tmp_path):
    events = []
    op = make_op(tmp_path, events, lr=3e-3, steps=3)
    assert [e["version"] for e in events if e["kind"] == "weights"] == [0]
    before = good_logprob(op)
    for step in range(3):
        b = rows(op, [2 * step] * 2 + [2 * step + 1] * 2,
                 [[GOOD, GOOD, GOOD], [50, 51], [GOOD, GOOD], [60, 61, 62]], [1.0, -1.0, 1.0, -1.0], version=step,
                 start=4 * step)
        assert op.process(b, "batch") == ()
        if step == 1:
            op.save_checkpoint()   # what the driver asks every run.save_every steps
    op.finish()                    # saves the last step
    after = good_logprob(op)
    assert after > before + 0.5, (before, after)
    kinds = [e["kind"] for e in events]
    assert kinds.count("train_step") == 3 and kinds[-1] == "done"
    assert [e["version"] for e in events if e["kind"] == "weights"] == [0, 1, 2, 3]
    step = [e for e in events if e["kind"] == "train_step"][-1]
    assert step["step"] == 3 and step["version"] == 3 and sorted(step["uids"]) == ["u10", "u11", "u8", "u9"]
    m = step["metrics"]
    for key in ("loss", "grad_norm", "lr", "entropy", "clip_frac", "staleness_max", "staleness_mean", "tokens", "is_weight_mean", "is_seq_ess", "lr_scale"):
        assert key in m, key
    assert m["tokens"] == 10 and m["staleness_max"] == 0 and m["reward_mean"] == 0.5
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy data: behaviour == proximal
    # checkpoints at step 2 (asked) and 3 (finish), loadable by transformers, equal to the trainer's weights
    from transformers import AutoModelForCausalLM
    for s in (2, 3):
        assert os.path.isfile(os.path.join(tmp_path, "checkpoints", f"step_{s}", "config.json"))
    loaded = AutoModelForCausalLM.from_pretrained(os.path.join(tmp_path, "checkpoints", "step_3"))
    for (n, a), (_, b) in zip(op.model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    # the last published version is bit-exact the trainer's weights
    fresh, _ = load_policy(TINY, "cpu", seed=1)
    weights.load_version(fresh, [e for e in events if e["kind"] == "weights"][-1]["path"])
    for n, t in op.model.state_dict().items():
        assert torch.equal(fresh.state_dict()[n], t), n
    # after `steps`, input is dropped and counted
    op.process(rows(op, [99, 99], [[1], [2]], [1.0, -1.0]), "batch")
    assert op.stats()["dropped_rows"] == 2 and op.stats()["done"]


def test_exact_train_batch_whole_groups_oldest_version_first(tmp_path):
    events = []
    op = make_op(tmp_path, events, lr=1e-3, steps=5)
    resp = [[GOOD], [50]]
    op.process(rows(op, [1, 1], resp, [1.0, -1.0], version=3, start=0), "batch")   # newer group first
    assert not op.train_ready()
    op.process(rows(op, [2, 2, 2], resp + [[51]], [1.0, -1.0, 0.0], version=0, start=2), "batch")  # 3 rows: 2+3 != 4
    assert not op.train_ready() and op.stats()["buffered_rows"] == 5
    op.process(rows(op, [3, 3], resp, [1.0, -1.0], version=1, start=5), "batch")
    # groups {1: v3, 2 rows}, {2: v0, 3 rows}, {3: v1, 2 rows}: the oldest (group 2) cannot be part of any
    # exact 4 made of whole groups, so the step takes groups 3 and 1; group 2 waits, never split.
    steps = [e for e in events if e["kind"] == "train_step"]
    assert steps, "group 3 + group 1 make exactly 4"
    assert sorted(steps[0]["uids"]) == ["u0", "u1", "u5", "u6"]
    assert steps[0]["metrics"]["trajectories"] == 4
    assert op.stats()["buffered_rows"] == 3


def test_microbatching_gives_the_same_step_as_one_batch(tmp_path):
    results = []
    for budget in (4096, 7):
        events = []
        op = make_op(tmp_path / str(budget), events, lr=1e-2, steps=1, micro_batch_tokens=budget, agg="seq_mean_token_mean")
        op.process(rows(op, [0, 0, 1, 1], [[GOOD, GOOD, GOOD], [50, 51], [GOOD], [60, 61, 62]], [1.0, -1.0, 0.5, -0.5]),
                   "batch")
        results.append((op.model.state_dict(), [e for e in events if e["kind"] == "train_step"][0]["metrics"]))
        weights.cleanup(str(tmp_path / str(budget)))
    (one, m1), (many, m2) = results
    assert m1["micro_batches"] == 1 and m2["micro_batches"] == 4
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-4)
    init, _ = load_policy(TINY, "cpu", seed=0)
    moved = max(float((one[n] - t).abs().max()) for n, t in init.state_dict().items())
    assert moved > 5e-3  # Adam moved weights by ~lr
    # Adam divides by sqrt(v): a coordinate whose gradient is ~0 turns float-summation-order noise into
    # ~1e-6..1e-5 steps (1.2e-5 seen on one CPU), so compare at 5e-5, still 200x below the step size.
    for n in one:
        torch.testing.assert_close(one[n], many[n], atol=5e-5, rtol=1e-4)


def test_bad_config_and_input_are_clear_errors(tmp_path):
    # settings are checked once, where params are filled and the mode resolved (dora validate runs the same)
    with pytest.raises(ModeError, match="train_batch"):
        resolve_mode("dora", 1, 0, 0, 4)
    with pytest.raises(ValueError, match="unknown name 'ppo2'"):
        make_op(tmp_path, [], loss="ppo2")
    op = make_op(tmp_path, [])
    b = rows(op, [0, 0], [[1], [2]], [1.0, 0.0]).drop_columns(["advantages"])
    with pytest.raises(ValueError, match=r"update\[0\].*advantages"):
        op.process(b, "batch")


def test_kl_entropy_and_several_ppo_epochs(tmp_path):
    events = []
    op = make_op(tmp_path, events, lr=1e-2, steps=1, ppo_epochs=3, kl_coef=0.1, entropy_coef=0.01, loss="dapo")
    b = rows(op, [0, 0, 1, 1], [[GOOD, GOOD], [50, 51], [GOOD], [60]], [1.0, -1.0, 1.0, -1.0])
    ref = b.column("behavior_logprobs")  # the initial policy is the reference
    op.process(b.append_column("ref_logprobs", ref), "batch")
    m = [e for e in events if e["kind"] == "train_step"][0]["metrics"]
    # epochs 2 and 3 run on moved weights: the ratio leaves 1 and KL to the reference grows from 0
    assert m["ratio_max"] > 1.0 and m["kl"] > 0 and m["approx_kl"] > 0
    assert m["entropy"] > 0


def stale(batch, shift):
    """The same rows as if an older policy had sampled them: behaviour logprobs moved by `shift` per token."""
    beh = [[x + shift[i % len(shift)] for x in row] for i, row in enumerate(batch.column("behavior_logprobs").to_pylist())]
    i = batch.schema.get_field_index("behavior_logprobs")
    return batch.set_column(i, "behavior_logprobs", pa.array(beh, COLUMNS["behavior_logprobs"]))


@pytest.mark.parametrize("spec", [{"name": "m2po", "m2_max": 0.05}, {"name": "ess_lr", "power": 1.0}, {"name": "tis", "cap": 1.1}])
def test_off_policy_correction_is_the_same_however_the_step_is_split(tmp_path, spec):
    results = []
    for budget in (4096, 7):
        events = []
        op = make_op(tmp_path / str(budget), events, lr=1e-2, steps=1, micro_batch_tokens=budget, off_policy=spec)
        b = rows(op, [0, 0, 1, 1], [[GOOD, GOOD, GOOD], [50, 51], [GOOD], [60, 61, 62]], [1.0, -1.0, 0.5, -0.5])
        op.process(stale(b, [0.6, -0.4, 0.1, -0.05]), "batch")
        results.append((op.model.state_dict(), [e for e in events if e["kind"] == "train_step"][0]["metrics"]))
        weights.cleanup(str(tmp_path / str(budget)))
    (one, m1), (many, m2) = results
    assert m1["micro_batches"] == 1 and m2["micro_batches"] == 4
    for key in ("is_weight_mean", "is_dropped_frac", "is_seq_ess", "lr_scale", "lr", "grad_norm"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-4), key
    assert m1["is_seq_ess"] < 1.0
    if spec["name"] == "ess_lr":
        assert m1["lr_scale"] == pytest.approx(m1["is_seq_ess"]) and m1["lr"] == pytest.approx(1e-2 * m1["lr_scale"])
    if spec["name"] == "m2po":
        assert m1["is_dropped_frac"] > 0     # 0.6^2 = 0.36 > 0.05: the most stale tokens go
    for n in one:
        torch.testing.assert_close(one[n], many[n], atol=2e-5, rtol=1e-4)


def test_bad_off_policy_is_a_clear_error(tmp_path):
    """Checked where dora validate checks params (update's check_params), the same check at run start-up."""
    from dora.ops.training.update_settings import check_params

    for spec, msg in (({"cap": 2.0}, "must be a mapping"), ({"name": "tiss"}, "valid names"),
                      ({"name": "tis", "cap": -1}, "cap must be a positive"), ({"name": "m2po", "cap": 2.0}, "unknown parameter")):
        p = {"loss": "ppo_clip", "clip_eps": 0.2, "clip_eps_high": None, "dual_clip": None, "agg": "token_mean",
             "off_policy": spec}
        problems = check_params(p)
        assert len(problems) == 1 and problems[0][0] == "off_policy" and re.search(msg, problems[0][1]), problems
        with pytest.raises(ValueError, match=r"off_policy.*" + msg):   # op_context checks as dora run does
            make_op(tmp_path, [], off_policy=spec)
