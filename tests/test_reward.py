"""Reward op: math-verify equivalence, reasoning-gym scorers, synthetic scorers, format,
user functions, and the on_error policy (fail names the uid; zero counts and reports)."""

import json
import os
import sys

import pyarrow as pa
import pytest

from dora.graph.columns import COLUMNS
from op_context import op_context
from dora.ops.reward import RewardError, RewardOp, final_answer, last_boxed

sys.path.insert(0, os.path.dirname(__file__))  # user reward fns below are imported as "test_reward:NAME"

# -- user reward functions (referenced by import path, as a pipeline would) --
def exact(response_text: str, answer: str, row: dict) -> float:
    return 1.0 if response_text.strip() == answer else 0.0


def boom_on_b(response_text: str, answer: str, row: dict) -> float:
    if "b" in response_text:
        raise RuntimeError("cannot score b")
    return 0.5


def nan_reward(response_text: str, answer: str, row: dict) -> float:
    return float("nan")


def scaled(response_text: str, answer: str, row: dict, scale: float = 1.0) -> float:
    return scale * len(response_text)


def make(fn, on_error="fail", params=None, events=None):
    op = RewardOp()
    op.setup(op_context("reward", {"fn": fn, "on_error": on_error, "params": params or {}},
                        report=(events.append if events is not None else (lambda e: None))))
    return op


def score(fn, texts, answers, tasks=None, extra=None, **kw):
    cols = {"uid": [f"u{i}" for i in range(len(texts))], "response_text": texts, "answer": answers}
    if tasks is not None:
        cols["task"] = tasks
    cols.update(extra or {})
    (out,) = make(fn, **kw).process(pa.RecordBatch.from_pydict(cols), "trajectories")
    assert out.schema.field("reward").type == COLUMNS["reward"] == pa.float32()
    assert out.column("uid").to_pylist() == cols["uid"]  # other columns pass through
    return out.column("reward").to_pylist()


@pytest.mark.parametrize("text, answer, expected", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("2 + 2 = 4, then 4 * 3 = 12. Final: 12", "12", 1.0),
    ("The total is 1,234 apples", "1234", 1.0),
    ("\\boxed{x^2+1}", "1+x^2", 1.0),
    ("\\boxed{\\sqrt{2}}", "2^{1/2}", 1.0),
    ("<answer>288</answer>", "288", 1.0),
    ("answer: 13", "12", 0.0),
    ("\\boxed{3} but later 4", "4", 0.0),   # boxed wins over the last number
    ("no number here", "7", 0.0),
    ("\\boxed{-4}", "\\boxed{-4}", 1.0),      # gold may itself be boxed
])
def test_math_verify_equivalence(text, answer, expected):
    assert score("math_verify", [text], [answer]) == [expected]


def test_final_answer_extraction():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{a}{b}} c") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{unclosed") is None
    assert final_answer("x = -3.5.") == "-3.5"
    assert final_answer("nothing") is None


def test_reasoning_gym_scorer_uses_the_entry():
    rg = pytest.importorskip("reasoning_gym")
    ds = rg.create_dataset("basic_arithmetic", size=2, seed=3)
    e = ds[0]
    meta = json.dumps({"question": e["question"], "answer": e["answer"], "metadata": e["metadata"]})
    task = "reasoning_gym:basic_arithmetic"
    rewards = score("reasoning_gym", [f"thinking <answer>{e['answer']}</answer>", "<answer>99999</answer>", e["answer"]],
                    [e["answer"]] * 3, tasks=[task] * 3, extra={"task_meta": [meta] * 3})
    assert rewards == [1.0, 0.0, 1.0]
    # without task_meta the entry is rebuilt from the answer column
    assert score("reasoning_gym", [f"<answer>{e['answer']}</answer>"], [e["answer"]], tasks=[task]) == [1.0]


def test_synthetic_reward_uses_the_row_task():
    rewards = score("synthetic", ["aaa", "aab", "19"], ["aaa", "aaa", "19"],
                    tasks=["synthetic:quickstart", "synthetic:quickstart", "synthetic:arithmetic"])
    assert rewards[0] == 1.0 and 0 < rewards[1] < 1 and rewards[2] == 1.0
    with pytest.raises(RewardError, match="uid 'u0'.*synthetic:NAME"):
        score("synthetic", ["a"], ["a"], tasks=["reasoning_gym:x"])


def test_multiturn_rows_are_scored_on_the_final_turn():
    """The tool's output inside response_text (the right number) must not earn the reward."""
    op = RewardOp()
    op.setup(op_context("reward", {"fn": "synthetic"}))
    data = {"uid": ["u0", "u1"], "response_text": ["<python>print(2*3)</python><output>6</output>5", "<python>x</python><output>6</output>"],
            "final_turn_text": ["5", ""], "answer": ["6", "6"], "task": ["synthetic:tool_arithmetic"] * 2}
    batch = pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in data.items()], names=list(data))
    assert op.process(batch, "trajectories")[0].column("reward").to_pylist() == [0.0, 0.0]
    data["final_turn_text"] = ["6", "6"]
    batch = pa.RecordBatch.from_arrays([pa.array(v, COLUMNS[k]) for k, v in data.items()], names=list(data))
    assert op.process(batch, "trajectories")[0].column("reward").to_pylist() == [1.0, 1.0]


def test_format_reward():
    assert score("format", ["<answer> 5 </answer>", "<answer></answer>", "5"], ["", "", ""]) == [1.0, 0.0, 0.0]
    assert score("format", ["Final: 5", "5"], ["", ""], params={"pattern": r"^Final: \d+$"}) == [1.0, 0.0]


def test_user_function_and_params():
    assert score("test_reward:exact", [" 4 ", "5"], ["4", "4"]) == [1.0, 0.0]
    assert score("test_reward:scaled", ["abc"], [""], params={"scale": 2.0}) == [6.0]


def test_on_error_fail_names_the_uid():
    with pytest.raises(RewardError, match=r"failed on uid 'u1': RuntimeError: cannot score b"):
        score("test_reward:boom_on_b", ["a", "b"], ["", ""])
    with pytest.raises(RewardError, match="non-finite"):
        score("test_reward:nan_reward", ["a"], [""])


def test_on_error_zero_scores_zero_counts_and_reports():
    events = []
    op = make("test_reward:boom_on_b", on_error="zero", events=events)
    batch = pa.RecordBatch.from_pydict({"uid": ["x", "y", "z"], "response_text": ["a", "b", "bb"], "answer": ["", "", ""]})
    (out,) = op.process(batch, "trajectories")
    assert out.column("reward").to_pylist() == [0.5, 0.0, 0.0]
    assert len(events) == 1 and events[0]["kind"] == "reward_errors" and events[0]["uids"] == ["y", "z"]
    assert "cannot score b" in events[0]["errors"][0]
    assert op.stats() == {"scored": 3, "reward_errors": 2}


def test_bad_fn_names_and_missing_columns():
    with pytest.raises(ValueError, match="unknown"):
        make("math_verfy")
    with pytest.raises(ValueError, match="cannot import"):
        make("no_such_pkg.mod:f")
    with pytest.raises(ValueError, match="no function 'nope'"):
        make("test_reward:nope")
    with pytest.raises(ValueError, match="lacks column"):
        make("format").process(pa.RecordBatch.from_pydict({"uid": ["a"], "answer": ["1"]}), "trajectories")
