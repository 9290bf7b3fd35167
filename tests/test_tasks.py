"""Synthetic tasks: the quickstart task's prompts, heavy-tailed targets and scorer."""

import statistics

import pytest

from dora.ops.tasks import get_task
from dora.ops.tasks.quickstart import DEFAULT_CLASSES
from dora.ops.tokenizers import CharTokenizer

QS = get_task("synthetic:quickstart")


def test_registry():
    assert get_task("quickstart") is QS
    with pytest.raises(ValueError, match="unknown synthetic task 'nope'.*quickstart"):
        get_task("synthetic:nope")


def test_quickstart_rows_are_seeded_and_consistent():
    rows = QS.make(200, seed=5)
    assert rows == QS.make(200, seed=5) and rows != QS.make(200, seed=6)
    tok = CharTokenizer()
    for r in rows:
        count, sym = r["prompt"].split("*")
        assert r["answer"] == sym * int(count)
        assert tok.decode(tok.encode(r["prompt"])) == r["prompt"]
        cls = next(c for c in DEFAULT_CLASSES if c[0] == sym)
        assert cls[1] <= int(count) <= cls[2]


def test_quickstart_targets_are_long_tailed():
    # the ideal policy's lengths: in every block of 16 prompts (one step of 16 x 4) max/median >= 10
    rows = QS.make(16 * 50, seed=0)
    lengths = [len(r["answer"]) for r in rows]
    ratios = [max(b) / statistics.median(b) for b in (lengths[i:i + 16] for i in range(0, len(lengths), 16))]
    assert statistics.median(ratios) >= 10
    assert statistics.median(lengths) <= 4 and max(lengths) >= 100


def test_quickstart_max_count_and_bad_classes():
    assert max(len(r["answer"]) for r in QS.make(300, 0, max_count=32)) <= 32
    with pytest.raises(ValueError, match="quickstart classes"):
        QS.make(5, 0, classes=[["ab", 1, 2, 1.0]])
    rows = QS.make(20, 0, classes=[["x", 3, 3, 1.0]])
    assert {r["prompt"] for r in rows} == {"3*x"}


@pytest.mark.parametrize("response, answer, expected", [
    ("aaa", "aaa", 1.0),                 # perfect
    ("", "aaa", 0.0),                    # empty
    ("a", "aaa", 1 / 3),                 # right symbol, a third of the length
    ("aaaaaa", "aaa", 0.5),              # twice too long
    ("bbb", "aaa", 0.5),                 # right length, wrong symbol: half credit
    ("abab", "aaaa", 0.75),              # right length, half the symbols
    ("a" * 128, "a", 1 / 128),           # never stopping scores near 0
])
def test_quickstart_scorer_cases(response, answer, expected):
    assert QS.score(response, answer) == pytest.approx(expected)


def test_quickstart_reward_in_unit_interval():
    import random

    rng = random.Random(0)
    for r in QS.make(100, seed=1):
        for _ in range(5):
            resp = "".join(rng.choice("abcd*1") for _ in range(rng.randint(0, 150)))
            assert 0.0 <= QS.score(resp, r["answer"]) <= 1.0


def test_arithmetic_task():
    t = get_task("arithmetic")
    rows = t.make(10, 0)
    assert all(r["prompt"].endswith("=") for r in rows)
    assert t.score(f" {rows[0]['answer']} ", rows[0]["answer"]) == 1.0 and t.score("x", rows[0]["answer"]) == 0.0
    assert str(eval(rows[0]["prompt"][:-1])) == rows[0]["answer"]  # noqa: S307 - digits and +/- only


def test_tool_arithmetic_task():
    t = get_task("synthetic:tool_arithmetic")
    rows = t.make(20, 0, digits=3)
    a, b = rows[0]["prompt"][-1]["content"].removeprefix("What is ").removesuffix("?").split(" * ")
    assert rows[0]["answer"] == str(int(a) * int(b)) and 100 <= int(a) <= 999
    roles = [m["role"] for m in rows[0]["prompt"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "<python>print(12*34)</python>" in rows[0]["prompt"][0]["content"]
    hermes = t.make(1, 0, call_format="hermes")[0]["prompt"][2]["content"]
    assert hermes == '<tool_call>{"name": "python", "arguments": {"code": "print(12*34)"}}</tool_call>'
    ans = rows[0]["answer"]
    assert t.score(f"The answer is {int(ans):,}.", ans) == 1.0 and t.score(f"{ans} or 7", ans) == 0.0
    assert t.score("no idea", ans) == 0.0 and t.score(f"<python>print({ans})</python>", ans) == 0.0
    with pytest.raises(ValueError, match="call_format"):
        t.make(1, 0, call_format="json")
