"""The code_exec reward (dora/ops/tools/code_exec.py): the tests' formats and the program's extraction
(no sandbox), then scoring in the sandbox: pass rate, all-pass, per-case time limits, floods, and
programs that try to pass without solving (exit early, look for the answers)."""

from __future__ import annotations

import json
import re

import pytest

from dora.ops.reward import resolve_reward_fn
from dora.ops.tasks import get_task
from dora.ops.tools.code_exec import assert_case, extract_program, params_problems, parse_tests, same_value

STDIN = json.dumps({"stdin": [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2", "output": "4"},
                              {"input": "5 7\n", "output": "12"}]})
CALLS = json.dumps({"fn": "pair", "calls": [{"args": [1, 2], "output": [1, 2]}, {"args": [0.1, 0.2], "output": [0.1, 0.2]}]})
ASSERTS = json.dumps({"asserts": ["assert add(1, 2) == 3", "assert 7 == add(3, 4)", "assert add(1, 0)",
                                  "assert not add(0, 0)"]})


def test_tests_formats_and_the_expected_values_stay_outside():
    cases = parse_tests(ASSERTS)
    assert [(c.inside, c.expected, c.how) for c in cases] == [
        ({"expr": "add(1, 2)"}, 3, "eq"), ({"expr": "add(3, 4)"}, 7, "eq"),
        ({"expr": "add(1, 0)"}, True, "truthy"), ({"expr": "add(0, 0)"}, False, "falsy")]
    assert [c.inside for c in parse_tests(CALLS)] == [{"expr": "pair", "args": [1, 2]}, {"expr": "pair", "args": [0.1, 0.2]}]
    assert [c.inside for c in parse_tests(STDIN)][0] == {"input": "1 2\n"}
    for bad, said in (("{}", "one of stdin"), ('{"stdin": []}', "no case"), ('{"calls": [], "fn": "1x"}', "fn"),
                      ('{"asserts": ["assert f(1) == g(2)"]}', "literal"), ('{"asserts": ["x = 1"]}', "not one assert")):
        with pytest.raises(ValueError, match=said):
            parse_tests(bad)
    assert assert_case("assert f([1, 2]) == (1, 2)").expected == (1, 2)


def test_program_extraction_and_value_equality():
    assert extract_program("text\n```python\na = 1\n```\nmore ```py\nb = 2\n``` end") == "b = 2\n"
    assert extract_program("```\nc = 3\n```") == "c = 3\n"
    assert extract_program("```python\nd = 4\n") == "d = 4\n"          # cut off by max_tokens
    assert extract_program("  e = 5  ") == "e = 5"
    assert same_value((1, [2.0000001]), [1, [2]]) and same_value({"a": (1,)}, {"a": [1]})
    assert not same_value(True, 1) and not same_value(1, "1") and not same_value([1], [1, 2])


def test_params_are_checked():
    assert params_problems({"score": "all_pass", "case_timeout_s": 1}) == []
    problems = dict(params_problems({"case_timeout": 1, "score": "most", "packages": ["/nope/pkg"]}))
    assert "unknown code_exec param 'case_timeout'" in problems["case_timeout"] and "case_timeout_s" in problems["case_timeout"]
    assert "score" in problems


@pytest.fixture(scope="module")
def scorer():
    fn = resolve_reward_fn("code_exec", {"case_timeout_s": 1.0, "warm": 1})
    yield fn
    fn.close()


def test_pass_rates_in_the_sandbox(scorer):
    stdin_program = "```python\na, b = map(int, input().split())\nprint(a + b if a != 2 else 0)\n```"
    assert scorer(stdin_program, STDIN, {}) == pytest.approx(2 / 3)
    # fd-level I/O reads the case's input and is captured too
    raw = "```python\nimport os\na, b = map(int, open(0).read().split())\nos.write(1, str(a + b).encode())\n```"
    assert scorer(raw, STDIN, {}) == 1.0
    assert scorer("def pair(a, b):\n    return (a, b)", CALLS, {}) == 1.0
    assert scorer("def add(a, b):\n    return a + b", ASSERTS, {}) == 1.0
    assert scorer("def add(a, b):\n    return a - b", ASSERTS, {}) == 0.5   # add(1, 0) and not add(0, 0) hold
    assert scorer("this is not python", ASSERTS, {}) == 0.0
    # the row's `tests` column wins over its answer
    assert scorer("def add(a, b):\n    return a + b", "not json", {"tests": ASSERTS}) == 1.0


def test_time_limits_floods_and_programs_that_do_not_solve(scorer):
    slow = "```python\nn = int(input().split()[0])\nwhile n == 2:\n    pass\nprint(n + int(input() or 0) if False else '')\n```"
    loops = "```python\na, b = map(int, input().split())\nwhile a == 2:\n    pass\nprint(a + b)\n```"
    assert scorer(loops, STDIN, {}) == pytest.approx(2 / 3)   # the looping case fails at its limit, the others pass
    assert scorer(slow, STDIN, {}) == 0.0
    flood = "```python\na, b = map(int, input().split())\nprint('x' * (10 ** 7) if a == 1 else a + b)\n```"
    assert scorer(flood, STDIN, {}) == pytest.approx(2 / 3)
    cheats = ["import sys\nsys.exit(0)",                                                     # exit before the checks
              "import os\nos._exit(0)",
              "import gc\nwant = [o for o in gc.get_objects() if isinstance(o, int) and o in (3, 7)]\n"
              "def add(a, b):\n    return want[0] if want else None",                  # look for the answers
              "def add(a, b):\n    raise SystemExit(0)"]
    for program in cheats:
        assert scorer(program, ASSERTS, {}) <= 0.5, program
    all_pass = resolve_reward_fn("code_exec", {"score": "all_pass", "warm": 0})
    assert all_pass("def add(a, b):\n    return a - b", ASSERTS, {}) == 0.0
    assert all_pass("def add(a, b):\n    return a + b", ASSERTS, {}) == 1.0


def test_the_code_task_rows_score_their_reference():
    rows = get_task("code_functions").make(64, seed=3)
    tests = [json.loads(r["answer"]) for r in rows]
    assert {len(t["calls"]) for t in tests} == {4} and all(r["prompt"][-1]["content"].startswith("Write a Python") for r in rows)
    sources = {"times": "def {fn}(x):\n    return x * {k}", "reverse": "def {fn}(s):\n    return s[::-1]",
               "fib": "def {fn}(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"}
    checked = 0
    for row, t in zip(rows, tests):
        stem, _, k = t["fn"].partition("_") if t["fn"].startswith("times_") else (t["fn"], "", "")
        if stem in sources and checked < 3:
            program = "```python\n" + sources[stem].format(fn=t["fn"], k=k) + "\n```"
            assert get_task("code_functions").score(program, row["answer"]) == 1.0, t
            assert get_task("code_functions").score(program.replace("return", "return 1 +", 1), row["answer"]) < 1.0
            checked += 1
            sources.pop(stem)
    assert checked == 3


def test_the_code_task_takes_templates_by_name_and_validate_names_a_wrong_one(tmp_path):
    from test_graph_helpers import BASE, errors, line_of

    rows = get_task("code_functions").make(40, seed=1, templates=["reverse", "count"])
    assert {json.loads(r["answer"])["fn"].split("_")[0] for r in rows} == {"reverse", "count"}
    assert get_task("code_functions").make(5, seed=1) == get_task("code_functions").make(5, seed=1, templates=None)
    for bad, said in ((["revers"], "unknown templates ['revers']; known: times,"), ("reverse", "list of names"),
                      ([], "list of names")):
        with pytest.raises(ValueError, match=re.escape(said)):
            get_task("code_functions").make(1, seed=0, templates=bad)
    text = BASE.replace("params: {group_size: 4}", "params: {group_size: 4, source: 'synthetic:code_functions',\n"
                        "                                task_params: {templates: [revers]}}")
    (d,) = errors(tmp_path, text)
    assert d.node == "prompts" and "unknown templates ['revers']" in d.message and d.loc.line == line_of(text, "revers")
