"""The `code_exec` reward (reward op `fn: code_exec`): runs the response's program against the row's
tests in the python sandbox, with the python tool's isolation (sandbox.py, isolation.py), and scores
the pass rate or all-pass.

Tests: the row's `tests` column when it has one, else its `answer`, as JSON, one of
  {"stdin": [{"input": "1 2\\n", "output": "3\\n"}, ...]}              stdin/stdout cases
  {"fn": "add", "calls": [{"args": [1, 2], "output": 3}, ...]}        function calls (LiveCodeBench functional)
  {"asserts": ["assert add(1, 2) == 3", ...]}                        MBPP / HumanEval style
An assert is `assert EXPR == LITERAL` (either side), `assert EXPR` or `assert not EXPR`: only EXPR
goes into the sandbox and the expected value stays here (sandbox_harness.py), so a program cannot
read its answers or fake a pass by exiting early. (It shares a process with the harness and could
write result lines of its own, but a result is a value compared here: without the expected values
a forged line passes only where computing the value from the case's input would.) Other asserts
are a data error naming the row.
The program: the last ```python fenced block of the response, else its last ``` block (a block cut
off by max_tokens counts), else the whole response.
Passing: stdin cases compare line by line, trailing whitespace and trailing blank lines ignored
(LiveCodeBench's rule); values compare equal after tuples become lists, floats within 1e-6.
Each case has case_timeout_s; the sandbox's wall clock is the cases' sum plus START_S, its CPU
limit the same. A case that times out, errors, prints past its share of the output limit or is never
reached fails; the row's reward is still a number (a sandbox that cannot start raises instead).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from typing import Any

from dora.graph.opspec import ParamSpec
from dora.ops.tools import sandbox
from dora.ops.tools.sandbox_pool import WarmPool
from dora.ops.tools.sandbox_settings import SANDBOX_SETTINGS, sandbox_limits

P = ParamSpec
SETTINGS = {s.name: s for s in (
    P("score", "str", "pass_rate", "pass_rate: the fraction of cases passed; all_pass: 1 only when every case passes",
      choices=("pass_rate", "all_pass")),
    P("case_timeout_s", "float", 2.0, "wall-clock limit of one test case", min=0.01, max=600),
    *SANDBOX_SETTINGS,
)}
START_S = 5.0      # the sandbox's start-up and the program's own set-up, on top of the cases' time
MAX_CPU_S = 600
FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def params_problems(params: dict[str, Any]) -> list[tuple[str, str]]:
    """(param key, message) for every bad code_exec param."""
    from dora.graph.opspec import did_you_mean
    from dora.ops.tools.isolation import package_problems

    problems = []
    for key, value in params.items():
        spec = SETTINGS.get(key)
        if spec is None:
            hint = did_you_mean(key, list(SETTINGS)) or f"code_exec params are {', '.join(SETTINGS)}"
            problems.append((key, f"unknown code_exec param {key!r} ({hint})"))
            continue
        err = spec.check(value)[1] or spec.check_name(value)
        if err:
            problems.append((key, f"code_exec param {key!r}: {err} ({spec.doc})"))
    if not problems:
        problems += [(f"packages.{i}", m) for i, m in package_problems(params.get("packages", []))]
    return problems


class CodeExecScorer:
    """fn(response_text, answer, row) -> reward, the reward op's scoring function for fn code_exec."""

    def __init__(self, params: dict[str, Any]):
        problems = params_problems(params)
        if problems:
            raise ValueError("; ".join(f"params.{k}: {m}" for k, m in problems))
        self.cfg = {k: spec.check(params[k])[0] if k in params else spec.default for k, spec in SETTINGS.items()}
        # started ahead of their rows: the CPU limit each row gets goes in with its payload (lower only)
        self.base = sandbox_limits(self.cfg, wall_s=START_S, cpu_s=MAX_CPU_S)
        self.pool = WarmPool(self.base, self.cfg["warm"]) if self.cfg["warm"] else None

    def __call__(self, text: str, answer: str, row: dict) -> float:
        cases = parse_tests(row.get("tests") or answer)
        passed = sum(self.run_cases(extract_program(text), cases))
        if self.cfg["score"] == "all_pass":
            return 1.0 if passed == len(cases) else 0.0
        return passed / len(cases)

    def run_cases(self, program: str, cases: list["Case"]) -> list[bool]:
        """Whether each case passed."""
        wall_s = self.cfg["case_timeout_s"] * len(cases) + START_S
        payload = {"kind": "tests", "program": program, "mode": cases[0].mode, "cases": [c.inside for c in cases],
                   "case_timeout_s": self.cfg["case_timeout_s"], "cpu_s": min(MAX_CPU_S, int(math.ceil(wall_s))),
                   "case_output_bytes": max(1024, self.base.output_bytes // (2 * len(cases)))}
        started = self.pool.take() if self.pool is not None else sandbox.start(self.base)
        r = sandbox.finish(started, payload, wall_s)
        if not r.isolation and r.returncode not in (0, None):
            raise RuntimeError(f"code_exec: the sandbox did not start: {r.stderr.strip()[-300:]}")
        results = _result_lines(r.stdout)
        return [c.passes(results.get(i)) for i, c in enumerate(cases)]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


@dataclasses.dataclass(frozen=True)
class Case:
    """One test case: what goes into the sandbox (`inside`), and the check of its result here."""
    mode: str                 # "stdin" or "expr" (sandbox_harness.py)
    inside: dict              # {"input": ...} or {"expr": ..., "args": ...}: never the expected value
    expected: Any
    how: str = "eq"           # eq, truthy (assert EXPR), falsy (assert not EXPR)

    def passes(self, line: dict | None) -> bool:
        if not line or line.get("error") or line.get("cut"):
            return False
        if self.mode == "stdin":
            return _lines(line.get("out", "")) == _lines(str(self.expected))
        try:
            value = ast.literal_eval(line.get("value", ""))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return False
        if self.how == "truthy":
            return bool(value)
        if self.how == "falsy":
            return not value
        return same_value(value, self.expected)


def parse_tests(source: Any) -> list[Case]:
    """The cases of a row's tests (ValueError when they are malformed: a data error)."""
    tests = json.loads(source) if isinstance(source, str) else source
    if not isinstance(tests, dict) or len({"stdin", "calls", "asserts"} & set(tests)) != 1:
        raise ValueError("code_exec tests are a JSON object with one of stdin, fn + calls, asserts; got "
                         f"{str(source)[:120]!r}")
    if "stdin" in tests:
        cases = [Case("stdin", {"input": str(c["input"])}, str(c["output"])) for c in tests["stdin"]]
    elif "calls" in tests:
        if not isinstance(tests.get("fn"), str) or not tests["fn"].isidentifier():
            raise ValueError(f"code_exec tests with calls need fn, the function's name; got {tests.get('fn')!r}")
        cases = [Case("expr", {"expr": tests["fn"], "args": list(c["args"])}, c["output"]) for c in tests["calls"]]
    else:
        cases = [assert_case(a) for a in tests["asserts"]]
    if not cases:
        raise ValueError("code_exec tests hold no case")
    return cases


def assert_case(source: str) -> Case:
    """A Case from `assert EXPR == LITERAL` (either side), `assert EXPR` or `assert not EXPR`."""
    try:
        tree = ast.parse(str(source).strip())
    except SyntaxError as e:
        raise ValueError(f"code_exec: cannot parse the assert {source!r}: {e}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise ValueError(f"code_exec: {source!r} is not one assert statement")
    test = tree.body[0].test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for expr, literal in ((left, right), (right, left)):
            try:
                return Case("expr", {"expr": ast.unparse(expr)}, ast.literal_eval(literal))
            except (ValueError, SyntaxError, TypeError):
                continue
        raise ValueError(f"code_exec: neither side of {source!r} is a literal (the expected value must be one)")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Case("expr", {"expr": ast.unparse(test.operand)}, False, "falsy")
    return Case("expr", {"expr": ast.unparse(test)}, True, "truthy")


def extract_program(text: str) -> str:
    blocks = FENCE.findall(text)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else text.strip()


def same_value(a: Any, b: Any) -> bool:
    """Equality after tuples become lists, with floats within 1e-6 (relative or absolute); a bool
    equals only a bool."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    a, b = (list(x) if isinstance(x, tuple) else x for x in (a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def _lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _result_lines(stdout: str) -> dict[int, dict]:
    """The harness's JSON lines by case (the first line per case; anything else is ignored)."""
    out: dict[int, dict] = {}
    for ln in stdout.splitlines():
        try:
            d = json.loads(ln)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("case"), int) and d["case"] not in out:
            out[d["case"]] = d
    return out
