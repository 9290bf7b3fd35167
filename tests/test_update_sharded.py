"""A 2-rank FSDP2 trainer (gloo, 2 processes) trains exactly like the 1-rank trainer.

Same seed, same three batches: the 2-rank run (with activation checkpointing on, which must not
change the numbers) reports the same loss and gradient norm every step and ends with the same
parameters (max |diff| < 1e-5, fp32), while each rank holds half the parameters. The tolerance is
far below what a step moves (checked), and loss / grad norm are compared too because AdamW's update
barely changes when every gradient is scaled (a missing or doubled reduction would not show in the
weights, it shows in the gradient norm).
"""

from __future__ import annotations

import glob
import json
import os
import random

import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from dora.ops.weights import versions as weights
from op_context import op_context
from dora.ops.sharding.local_ranks import LocalRanks

TINY = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}
# lr 1e-3: AdamW turns float summation-order noise on near-zero gradients into steps ~lr x 1e-3
# (tests/test_update_op.py saw 1.2e-5 at lr 1e-2), far below the 1e-5 bound; a step moves weights ~lr.
PARAMS = {"lr": 1e-3, "steps": 3, "micro_batch_tokens": 24, "grad_clip": 1.0, "kl_coef": 0.0}
ASYNC = {"mode": "dora", "train_batch": 8, "max_staleness": 1}
TOL = 1e-5


def make_batches() -> list[dict[str, list]]:
    """Three steps of 8 trajectories in groups of 2, uneven lengths, behaviour logprobs of the initial model."""
    from dora.ops.models import load_policy
    from dora.ops.reference import batch_logprobs

    model, _ = load_policy(TINY, "cpu", seed=0)
    rng = random.Random(7)
    out = []
    for step in range(3):
        prompts = [[rng.randrange(4, 60) for _ in range(rng.randrange(2, 7))] for _ in range(8)]
        resps = [[rng.randrange(4, 60) for _ in range(rng.randrange(1, 11))] for _ in range(8)]
        advs = [rng.choice([-1.0, -0.5, 0.5, 1.0]) for _ in range(8)]
        out.append({
            "uid": [f"s{step}-{i}" for i in range(8)], "group_id": [step * 4 + i // 2 for i in range(8)],
            "prompt_ids": prompts, "response_ids": resps,
            "behavior_logprobs": batch_logprobs(model, prompts, resps, 4096),
            "advantages": [[a] * len(r) for a, r in zip(advs, resps)], "policy_version": [step] * 8,
            "reward": [max(a, 0.0) for a in advs],
        })
    return out


def to_batch(d: dict[str, list]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in d.items()], names=list(d))


def feed(op, batches: list[dict]) -> None:
    for b in batches:
        op.process(to_batch(b), "batch")


def rank_context(env, op: str, params: dict, events: list, **kw):
    """The OpContext the runtime would give this rank of a new group."""
    return op_context(op, params, replica=env.rank, replicas=env.world, rendezvous=env.rendezvous(),
                      report=env.report(events), **kw)


def rank_main(env, run_dir: str, batches: list[dict], extra: dict | None = None) -> dict:
    from dora.ops.update import UpdateOp

    torch.set_num_threads(1)
    events: list[dict] = []
    op = UpdateOp()
    op.setup(rank_context(env, "update", {**PARAMS, **(extra or {}), "activation_checkpointing": True}, events, model=TINY,
                          run_dir=run_dir, async_=ASYNC))
    env.drive(op, lambda: feed(op, batches))
    stats = op.stats()
    op.teardown()
    return {"stats": stats, "events": events}


def rank_restore(env, run_dir: str, ckpt: str) -> dict:
    """A 2-rank trainer set up from a checkpoint: its step and the weights it publishes at start."""
    from dora.ops.update import UpdateOp

    torch.set_num_threads(1)
    events: list[dict] = []
    op = UpdateOp()
    op.setup(rank_context(env, "update", PARAMS, events, model=TINY, run_dir=run_dir, async_=ASYNC,
                          restore={"checkpoint": ckpt}))
    out = {"step": op.step, "weights": published(events) if env.rank == 0 else None}
    op.teardown()
    return out


def published(events: list[dict]) -> dict[str, torch.Tensor]:
    """The last version a run published, loaded as a generate replica loads it."""
    from dora.ops.models import load_policy

    model, _ = load_policy(TINY, "cpu", seed=1)
    weights.load_version(model, [e for e in events if e["kind"] == "weights"][-1]["path"])
    return model.state_dict()


@pytest.fixture(scope="module")
def two_ranks():
    """Two rank processes for every 2-rank call of this module: torch's import paid once per rank."""
    with LocalRanks(2) as ranks:
        yield ranks


# steps 2 and 3 train on data of the initial model: stale, so the correction acts; its whole-step
# statistics (ESS, m2po's batch-wide threshold) must come out the same however rows are split
@pytest.mark.parametrize("off_policy", [None, {"name": "m2po", "m2_max": 1e-4}], ids=["default", "m2po"])
@pytest.mark.usefixtures("remove_shm_weights")
def test_two_ranks_train_exactly_like_one(tmp_path, off_policy, two_ranks):
    from dora.ops.update import UpdateOp

    extra = {"off_policy": off_policy} if off_policy else {}
    batches = make_batches()
    torch.set_num_threads(1)
    events: list[dict] = []
    one = UpdateOp()
    one.setup(op_context("update", {**PARAMS, **extra}, model=TINY, run_dir=str(tmp_path / "one"), async_=ASYNC,
                         report=events.append))
    feed(one, batches)
    one.finish()
    solo = {"stats": one.stats(), "exp_avg": [one.optimizer.state[p]["exp_avg"].clone() for p in one.params]}
    one.teardown()
    two = two_ranks.run(rank_main, str(tmp_path / "two"), batches, extra)
    lead, follower = two

    steps_1 = [e for e in events if e["kind"] == "train_step"]
    steps_2 = [e for e in lead["events"] if e["kind"] == "train_step"]
    assert len(steps_1) == len(steps_2) == 3 and follower["events"] == [], "only rank 0 reports"
    for a, b in zip(steps_1, steps_2):
        assert a["uids"] == b["uids"]
        assert b["metrics"]["train_ranks"] == 2 and a["metrics"]["train_ranks"] == 1
        assert b["metrics"]["micro_batches"] > 1   # several passes per rank (padding passes where counts differ)
        for key in ("loss", "grad_norm", "clip_frac", "entropy", "is_weight_mean", "is_dropped_frac", "lr_scale"):
            assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=TOL, abs=TOL), (a["step"], key)
    stale = steps_1[-1]["metrics"]
    assert (stale["lr_scale"] < 1.0) if off_policy is None else (stale["is_dropped_frac"] > 0), stale
    w1, w2 = published(events), published(lead["events"])
    nbytes = [[e["bytes"] for e in evs if e["kind"] == "weights"][-1] for evs in (events, lead["events"])]
    assert sorted(w1) == sorted(w2) and nbytes[0] == nbytes[1], nbytes   # tied weights stored once by both
    diff = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    from dora.ops.models import load_policy
    init = load_policy(TINY, "cpu", seed=0)[0].state_dict()
    moved = max(float((w1[n] - init[n]).abs().max()) for n in w1)
    assert diff < TOL and moved > 100 * TOL, (diff, moved)

    # each rank holds half of every parameter and of AdamW's moments
    for rank in two:   # (dim 0 of an odd size splits one row unevenly)
        for kind in ("param_bytes", "optimizer_bytes"):
            assert 0.45 < rank["stats"][kind] / solo["stats"][kind] <= 0.55, (kind, rank["stats"], solo["stats"])

    # the last step's checkpoint: a transformers folder of the full weights + both ranks' sharded state
    from transformers import AutoModelForCausalLM
    ckpt = os.path.join(tmp_path, "two", "checkpoints", "step_3")
    loaded = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    assert all(torch.equal(loaded[n], w2[n]) for n in w2)
    state = json.load(open(os.path.join(ckpt, "dora_state.json")))
    assert state["ranks"] == 2 and state["version"] == 3 and state["sharded_state"] == "sharded"
    assert len(glob.glob(os.path.join(ckpt, "sharded", "*.distcp"))) == 2
    assert os.path.isfile(os.path.join(ckpt, "sharded", ".metadata"))
    # the full weights are stored once (the transformers folder): the shards hold the optimizer only;
    # restored on one rank (DCP reshards 2 -> 1), weights and AdamW moments are those of the 1-rank run
    from dora.ops.models import load_policy
    from dora.ops.sharding.fsdp_model import ShardedModel
    from dora.ops.weights import pretrained
    assert {k.split(".")[0] for k in _dcp_keys(os.path.join(ckpt, "sharded"))} == {"optimizer"}
    fresh = ShardedModel(load_policy(TINY, "cpu", seed=5)[0], None, "cpu")
    fresh_opt = torch.optim.AdamW(fresh.params(), lr=1e-3)
    pretrained.load_training_checkpoint(fresh, fresh_opt, ckpt)
    assert all(torch.equal(fresh.module.state_dict()[n], w2[n]) for n in w2)
    restored = [fresh_opt.state[p]["exp_avg"] for p in fresh.params()]
    assert len(restored) == len(solo["exp_avg"]) and all(
        float((a - b).abs().max()) < TOL for a, b in zip(restored, solo["exp_avg"]))
    if off_policy is None:   # and on two ranks again: each keeps its shard of the full weights it read
        back, _ = two_ranks.run(rank_restore, str(tmp_path / "back"), ckpt)
        assert back["step"] == 3 and all(torch.equal(back["weights"][n], w2[n]) for n in w2)
        weights.cleanup(str(tmp_path / "back"))
    ledger = [json.loads(line) for line in open(os.path.join(tmp_path, "two", "trained.jsonl"))]
    assert [r["step"] for r in ledger] == [1, 2, 3] and not os.path.exists(os.path.join(tmp_path, "two", "checkpoints", "step_3.tmp"))
    weights.cleanup(str(tmp_path / "one"))
    weights.cleanup(str(tmp_path / "two"))


# ------------------------------------------------------------------ reference and critic of 2 ranks

REF_BATCHES = [([[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]], [[20, 21], [22, 23, 24, 25, 26], [27], [28, 29, 30]]),
               ([[31, 32], [33, 34, 35]], [[36], [37, 38, 39, 40]])]


def trajectories(prompts, resps, rewards=None) -> pa.RecordBatch:
    cols = {"uid": [f"u{i}" for i in range(len(prompts))], "prompt_ids": prompts, "response_ids": resps,
            "reward": rewards or [float(len(r) % 2) for r in resps]}
    return pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in cols.items()], names=list(cols))


def run_reference_and_critic(make_ctx, drive) -> dict:
    """The reference's logprobs and the critic's values and step metrics over REF_BATCHES."""
    from dora.ops.critic import CriticOp
    from dora.ops.reference import ReferenceOp

    out: dict = {"events": []}
    ref = ReferenceOp()
    ref.setup(make_ctx("reference", {"micro_batch_tokens": 8}, out["events"]))
    out["ref"] = drive(ref, lambda: [ref.process(trajectories(*b), "trajectories")[0].column("ref_logprobs").to_pylist()
                                     for b in REF_BATCHES])
    ref.teardown()
    critic = CriticOp()
    critic.setup(make_ctx("critic", {"lr": 3e-3, "micro_batch_tokens": 8, "value_clip": 10.0}, out["events"]))

    def feed_critic():
        values = []
        for _ in range(2):   # second pass: values after one step of training
            for b in REF_BATCHES:
                values.append(critic.process(trajectories(*b), "trajectories")[0].column("values").to_pylist())
                while critic.busy():
                    critic.poll()   # rank 0: one training step on what was queued
        return values

    out["values"] = drive(critic, feed_critic)
    critic.teardown()
    return out


def ref_critic_rank(env) -> dict:
    torch.set_num_threads(1)
    return run_reference_and_critic(lambda op, params, events: rank_context(env, op, params, events, model=TINY, seed=0),
                                    env.drive)


def test_reference_and_critic_of_two_ranks_match_one(two_ranks):
    torch.set_num_threads(1)

    def solo_drive(op, feed_fn):
        out = feed_fn()
        op.finish()
        return out

    one = run_reference_and_critic(lambda op, params, events: op_context(op, params, model=TINY, seed=0,
                                                                          report=events.append), solo_drive)
    lead, follower = two_ranks.run(ref_critic_rank)
    assert follower["events"] == [] and follower["ref"] is None
    for a, b in zip(one["ref"], lead["ref"]):          # same rows, same order, same logprobs
        assert [len(x) for x in a] == [len(x) for x in b]
        assert [y for x in b for y in x] == pytest.approx([y for x in a for y in x], abs=TOL)
    for a, b in zip(one["values"], lead["values"]):
        assert [y for x in b for y in x] == pytest.approx([y for x in a for y in x], abs=TOL)
    steps_1 = [e["metrics"] for e in one["events"] if e["kind"] == "critic_step"]
    steps_2 = [e["metrics"] for e in lead["events"] if e["kind"] == "critic_step"]
    assert len(steps_1) == len(steps_2) == 4 and steps_2[0]["ranks"] == 2
    for a, b in zip(steps_1, steps_2):
        for key in ("value_loss", "grad_norm", "returns_mean", "value_clip_frac"):
            assert b[key] == pytest.approx(a[key], rel=TOL, abs=TOL), key
    assert max(abs(v) for x in lead["values"][-1] for v in x) > 100 * TOL   # the critic did learn something


def _dcp_keys(path: str) -> list[str]:
    """The state keys a torch.distributed.checkpoint folder holds."""
    from torch.distributed.checkpoint import FileSystemReader
    return list(FileSystemReader(path).read_metadata().state_dict_metadata)
