"""The judge's parts without a run: verdict parsers, the rubric and its shared head, whole-group
skipping (C2), back-pressure (accepts_input), on_error; and the reward node's weighted sources
(sync and async functions, a column source, reward/<name> columns)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dora.ops.judge.judge_op import JudgeError, JudgeOp, WholeGroups
from dora.ops.judge.rubric import Rubric, template_problem
from dora.ops.judge.verdicts import VerdictError, make_parser
from dora.ops.reward import RewardError, RewardOp
from dora.ops.tokenizers import CharTokenizer
from op_context import op_context

TINY = {"arch": "llama", "hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "tokenizer": "chars"}


@pytest.mark.parametrize("kind, text, expected", [
    ("number", "Score: 7/10", 0.7), ("number", " 10", 1.0), ("yes_no", "yes, it is", 1.0), ("yes_no", "NO.", 0.0),
    ("letter", "Grade: B+", 0.75), ("letter", "I give it an F", 0.0),
])
def test_named_parsers(kind, text, expected):
    assert make_parser(kind, None, [0, 10], {})(text) == pytest.approx(expected)


@pytest.mark.parametrize("kind, text", [("number", "eleven"), ("number", "12"), ("yes_no", "maybe"), ("letter", "Excellent")])
def test_verdicts_that_do_not_parse(kind, text):
    with pytest.raises(VerdictError):
        make_parser(kind, None, [0, 10], {})(text)


def test_regex_parser_reads_its_group_as_a_number_or_a_word():
    assert make_parser("regex", r"<score>(\d+)</score>", [1, 5], {})("ok <score>4</score>") == pytest.approx(0.75)
    assert make_parser("regex", r"verdict: (\w+)", [0, 1], {"good": 1.0, "bad": -1.0})("verdict: bad") == -1.0
    with pytest.raises(VerdictError, match="none of"):
        make_parser("regex", r"verdict: (\w+)", [0, 1], {"good": 1.0})("verdict: meh")


def test_rubric_shares_its_head_and_tokenizes_like_the_whole_text():
    tok = CharTokenizer()
    r = Rubric("Judge {prompt} -> {response}? {answer} {not a placeholder}", tok, chat=True)   # (chars: no template)
    row = {"question": "2+2", "prompt": "<chat>2+2", "response_text": "4", "answer": "4"}
    assert r.head == "Judge " and r.text(row) == "Judge 2+2 -> 4? 4 {not a placeholder}"
    assert r.ids(row) == tok.encode(r.text(row), add_special_tokens=True)
    assert r.ids(row)[:len(r.head_ids)] == r.ids({**row, "question": "9"})[:len(r.head_ids)]
    assert "no {response}" in template_problem("{prompt}") and "{foo}" in template_problem("{response} {foo}")


def _rows(n_groups: int, g: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"uid": [f"{k}-{i}" for k in range(n_groups) for i in range(g)],
                                       "group_id": [k for k in range(n_groups) for _ in range(g)],
                                       "question": ["3*a"] * (n_groups * g),
                                       "response_text": ["a" * (k + i) for k in range(n_groups) for i in range(g)],
                                       "answer": ["aaa"] * (n_groups * g)})


def test_whole_groups_emits_clean_groups_and_drops_failed_ones_whole():
    w = WholeGroups(group_size=2)
    rows = _rows(3, 2).to_pylist()
    assert all(w.arrived_row(r) for r in rows[:5])           # group 2's second row is not here yet
    assert w.judged(rows[:1], failed=set()) == []             # half a group: held
    out = w.judged(rows[1:4], failed={id(rows[2])})           # group 0 whole; group 1 fails
    assert [r["uid"] for r in out] == ["0-0", "0-1"] and w.take_failed() == [(1, ["1-0"])]
    assert w.judged([rows[4]], failed=set()) == []
    assert w.arrived_row(rows[5]) and [r["uid"] for r in w.judged([rows[5]], failed=set())] == ["2-0", "2-1"]
    assert not w.failed and not w.waiting and not w.arrived   # every group closed: nothing kept


def _judge(events, **params) -> JudgeOp:
    op = JudgeOp()
    op.setup(op_context("judge", {"max_tokens": 2, **params}, model=TINY, async_={"group_size": 4},
                        report=events.append))
    return op


def _drain(op: JudgeOp) -> list[dict]:
    out = []
    while op.busy():
        out += [r for b in op.poll() for r in b.to_pylist()]
    return out


def test_on_error_skip_zero_and_fail_with_the_tiny_judge():
    """The tiny random judge's verdicts hardly ever hold a number: skip drops every such group whole and
    reports it, zero scores 0, fail names the uid."""
    batch = _rows(3, 4)
    events = []
    op = _judge(events, on_error="skip", max_in_flight=5)
    op.process(batch, "trajectories")
    assert not op.accepts_input()                             # 12 rows held > max_in_flight 5: back-pressure
    out = _drain(op)
    assert op.accepts_input()
    dropped = {u for e in events if e["kind"] == "filtered" for u in e["uids"]}
    errors = sum(e["parse_errors"] for e in events if e["kind"] == "judge_errors")
    assert {r["group_id"] for r in out}.isdisjoint({int(u.split("-")[0]) for u in dropped})
    assert len(out) % 4 == 0 and errors == op.stats()["parse_errors"] > 0
    assert all(e["reason"] == "judge_error" for e in events if e["kind"] == "filtered")
    assert op.stats()["prefix_hit_tokens"] > 0 and op.stats()["rubric_head_tokens"] > 0   # the head, computed once
    op.teardown()
    zero = _judge([], on_error="zero")
    zero.process(batch, "trajectories")
    scored = _drain(zero)
    assert len(scored) == 12 and all(0.0 <= r["reward"] <= 1.0 for r in scored)
    zero.teardown()
    fail = _judge([], on_error="fail", parser="regex", pattern="^(ZZZ)$")
    fail.process(batch, "trajectories")
    with pytest.raises(JudgeError, match="could not score uid '0-0'"):
        _drain(fail)
    fail.teardown()


def test_weighted_sources_keep_each_value_as_a_column():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pipelines"))
    events = []
    op = RewardOp()
    op.setup(op_context("reward", {"sources": [
        {"name": "exact", "fn": "reward_fns:exact_match", "weight": 2.0},
        {"name": "judge", "column": "reward/judge", "weight": 0.5},
        {"name": "stop", "fn": "reward_fns:stops_cleanly", "params": {"bonus": 0.25}},   # an async one
        {"name": "length", "fn": "reward_fns:length_penalty", "weight": 1.0, "params": {"per_char": 0.1, "free": 2}},
    ], "on_error": "zero"}, report=events.append))
    batch = pa.RecordBatch.from_pydict({"uid": ["a", "b"], "response_text": ["4", "four"], "answer": ["4", "4"],
                                        "finish_reason": ["stop", "length"], "reward/judge": [1.0, None]})
    (out,) = op.process(batch, "trajectories")
    cols = out.to_pydict()
    assert cols["reward/exact"] == [1.0, 0.0] and cols["reward/stop"] == [0.25, 0.0]
    assert cols["reward/judge"] == [1.0, 0.0] and cols["reward/length"] == pytest.approx([0.0, -0.2])
    assert cols["reward"] == pytest.approx([2.0 + 0.5 + 0.25, -0.2])
    assert out.schema.field("reward/exact").type == pa.float32()
    (ev,) = events
    assert ev["uids"] == ["b"] and "source 'judge'" in ev["errors"][0]   # a null column value is a failure
    strict = RewardOp()
    strict.setup(op_context("reward", {"sources": [{"name": "judge", "column": "reward/judge"}]}))
    with pytest.raises(RewardError, match="uid 'b'"):
        strict.process(batch, "trajectories")
