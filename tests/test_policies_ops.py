"""issue 34: the ops that carry data across policies. to_prompts makes one prompt group per trajectory
(recording where it came from and the version that wrote it); frontier scores a trajectory once one whole
group of answers to it arrived (R-Zero's uncertainty reward), recording the answering version."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dora.ops.frontier import FrontierOp, frontier_reward
from dora.ops.tasks import get_task
from dora.ops.to_prompts import ToPromptsOp, group_of
from op_context import op_context


def proposals(uids, texts, versions, prompts=("?d", "?a")):
    return pa.RecordBatch.from_pylist([{"uid": u, "group_id": int(u.split("-")[0]), "prompt": p, "response_text": t,
                                        "policy_version": v} for u, t, v, p in zip(uids, texts, versions, prompts)])


def test_to_prompts_makes_one_group_per_trajectory_with_its_source_and_version():
    op = ToPromptsOp()
    op.setup(op_context("to_prompts", {"group_size": 3, "version_column": "challenger_version",
                                       "task_params": {"max_count": 5}}))
    out = op.process(proposals(["7-0", "7-1"], ["dddddddd", ""], [2, 3]), "trajectories")[0].to_pylist()
    assert len(out) == 6
    first, second = out[:3], out[3:]
    assert {r["prompt"] for r in first} == {"5*d"} and first[0]["answer"] == "ddddd"     # count capped at 5
    assert {r["prompt"] for r in second} == {"1*a"}                                        # an empty proposal: count 1
    assert [r["uid"] for r in first] == [f"{group_of('7-0')}-{i}" for i in range(3)]
    assert {r["group_id"] for r in first} == {group_of("7-0")} and group_of("7-0") >= 0
    assert [r["source_uid"] for r in out] == ["7-0"] * 3 + ["7-1"] * 3
    assert [r["challenger_version"] for r in out] == [2] * 3 + [3] * 3
    assert all(r["task"] == "synthetic:quickstart" and r["prompt_ids"] for r in out)
    # the solver's grade of an answer is the quickstart task's
    assert get_task(first[0]["task"]).score("ddddd", first[0]["answer"]) == 1.0


def answers(src, gid, rewards, versions):
    return pa.RecordBatch.from_pylist([{"source_uid": src, "group_id": gid, "reward": r, "policy_version": v}
                                       for r, v in zip(rewards, versions)])


def test_frontier_scores_a_trajectory_on_the_first_whole_group_of_answers():
    op = FrontierOp()
    op.setup(op_context("frontier", {"answers": 2, "version_column": "solver_version"}))
    assert op.process(answers("7-0", 11, [1.0], [4]), "solved") == []          # half a group: nothing yet
    assert op.process(proposals(["7-0", "7-1"], ["dd", "aa"], [1, 1]), "trajectories") == []
    got = op.process(answers("7-0", 11, [0.0], [5]), "solved")[0].to_pylist()
    assert len(got) == 1 and got[0]["uid"] == "7-0" and got[0]["response_text"] == "dd"
    assert got[0]["reward"] == pytest.approx(1.0) and got[0]["answers_reward_mean"] == pytest.approx(0.5)
    assert got[0]["solver_version"] == 5                                       # the newest answering version
    # another attempt at a scored problem (its group dispatched again) is ignored, counted
    assert op.process(answers("7-0", -3, [1.0, 1.0], [6, 6]), "solved") == []
    assert op.stats()["ignored_answers"] == 2
    # a problem the solver always solves is off its frontier
    got = op.process(answers("7-1", 12, [1.0, 1.0], [5, 5]), "solved")[0].to_pylist()
    assert got[0]["reward"] == pytest.approx(0.0) and op.stats()["waiting_rows"] == 0


def test_frontier_reward_peaks_at_the_target():
    assert frontier_reward(0.5, 0.5) == 1.0 and frontier_reward(0.0, 0.5) == frontier_reward(1.0, 0.5) == 0.0
    assert frontier_reward(0.25, 0.5) == pytest.approx(0.5)
    assert frontier_reward(0.7, 0.7) == 1.0 and frontier_reward(0.0, 0.7) == 0.0 and frontier_reward(1.0, 0.7) > 0.5


def test_frontier_repetition_penalty_scores_a_group_at_once():
    op = FrontierOp()
    op.setup(op_context("frontier", {"answers": 2, "repetition": 1.0}, async_={"group_size": 3}))
    op.process(proposals(["9-0", "9-1", "9-2"], ["aaa", "aaa", "a"], [0, 0, 0], prompts=("?a",) * 3), "trajectories")
    rows = lambda src, problem, rewards: pa.RecordBatch.from_pylist(   # noqa: E731
        [{"source_uid": src, "group_id": hash(src) % 1000, "reward": r, "policy_version": 0, "prompt": problem}
         for r in rewards])
    assert op.process(rows("9-0", "3*a", [1.0, 0.0]), "solved") == []
    assert op.process(rows("9-1", "3*a", [1.0, 0.0]), "solved") == []    # two of three scored: the group waits
    got = {r["uid"]: r["reward"] for r in op.process(rows("9-2", "1*a", [1.0, 0.0]), "solved")[0].to_pylist()}
    # each at the frontier (1.0), less the share of the group posing its problem
    assert got == pytest.approx({"9-0": 1 - 2 / 3, "9-1": 1 - 2 / 3, "9-2": 1 - 1 / 3})
