"""Small Python functions to write, checked by running them (pipelines/code_exec.yaml): the code
task of the code_exec reward (dora/ops/tools/code_exec.py), generated offline from templates.

Prompt (chat messages): a system message asking for one ```python block, one worked example (a
function and its block), then the task, e.g. "Write a Python function `times_7(x)` that returns x
multiplied by 7." The answer is the tests as code_exec reads them: {"fn": NAME, "calls": [{"args": [...],
"output": ...}, ...]}, `calls` cases from the template's reference implementation on random inputs.
The reward (fn code_exec, or fn synthetic through `score`) is the pass rate in the sandbox.

Templates vary the function's name and constants, so a model must read the task. A few are
trivial, most take a loop or a library call. SmolLM2-135M-Instruct always passes some, never others;
task_params `templates` (names, e.g. [reverse, count]) picks the ones to train on, and
benchmarks/code_base_rates.py measures a model's pass rate on each (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Callable, NamedTuple

class Template(NamedTuple):
    """One kind of function to write; {k} in `pattern` and `returns` is a constant drawn per row."""

    pattern: str                                  # the function's name, e.g. "times_{k}"
    params: str                                   # its parameters as the prompt writes them
    returns: str                                  # what it returns, in words
    ref: Callable[[int], Callable[..., Any]]      # k -> the reference implementation
    gen: Callable[[random.Random], list]          # one call's arguments

    @property
    def name(self) -> str:
        """What task_params `templates` calls it: the pattern without its constant ("times")."""
        return self.pattern.replace("_{k}", "")


_INT = lambda r: [r.randint(-50, 50)]                                           # noqa: E731
_TWO = lambda r: [r.randint(-50, 50), r.randint(-50, 50)]                       # noqa: E731
_LIST = lambda r: [[r.randint(-9, 9) for _ in range(r.randint(1, 6))]]          # noqa: E731
_WORD = lambda r: ["".join(r.choice("abcdeiou") for _ in range(r.randint(1, 8)))]   # noqa: E731
_NAT = lambda r: [r.randint(0, 9999)]                                            # noqa: E731
_SMALL = lambda r: [r.randint(0, 12)]                                            # noqa: E731
TEMPLATES: list[Template] = [
    Template("times_{k}", "x", "x multiplied by {k}", lambda k: lambda x: x * k, _INT),
    Template("larger", "a, b", "the larger of a and b", lambda k: lambda a, b: max(a, b), _TWO),
    Template("reverse", "s", "the string s reversed", lambda k: lambda s: s[::-1], _WORD),
    Template("is_even", "x", "True if x is even, else False", lambda k: lambda x: x % 2 == 0, _INT),
    Template("count_{k}", "xs", "the number of times {k} appears in the list xs", lambda k: lambda xs: xs.count(k),
        lambda r: [[r.choice([r.randint(2, 9), r.randint(-9, 9)]) for _ in range(r.randint(1, 8))]]),
    Template("evens", "xs", "the number of even numbers in the list xs", lambda k: lambda xs: sum(x % 2 == 0 for x in xs), _LIST),
    Template("sum_squares", "xs", "the sum of the squares of the numbers in the list xs",
        lambda k: lambda xs: sum(x * x for x in xs), _LIST),
    Template("product", "xs", "the product of the numbers in the list xs", lambda k: lambda xs: math.prod(xs), _LIST),
    Template("digit_sum", "n", "the sum of the decimal digits of the non-negative integer n",
        lambda k: lambda n: sum(map(int, str(n))), _NAT),
    Template("no_vowels", "s", "the string s with every vowel (a, e, i, o, u) removed",
        lambda k: lambda s: "".join(c for c in s if c not in "aeiou"), _WORD),
    Template("is_palindrome", "s", "True if the string s reads the same backwards, else False",
        lambda k: lambda s: s == s[::-1], lambda r: [r.choice(["abba", "abc", "a", "racecar", "ab", "aba", "abca"])]),
    Template("descending", "xs", "the list xs sorted from largest to smallest", lambda k: lambda xs: sorted(xs, reverse=True), _LIST),
    Template("above_{k}", "xs", "a list of the numbers in xs that are greater than {k}, in order",
        lambda k: lambda xs: [x for x in xs if x > k], lambda r: [[r.randint(0, 12) for _ in range(r.randint(1, 7))]]),
    Template("factorial", "n", "the factorial of n", lambda k: lambda n: math.factorial(n), _SMALL),
    Template("fib", "n", "the n-th Fibonacci number, where fib(0) is 0 and fib(1) is 1",
        lambda k: lambda n: _fib(n), _SMALL),
    Template("clamp_{k}", "x", "x limited to the range from -{k} to {k}", lambda k: lambda x: max(-k, min(k, x)),
        lambda r: [r.randint(-15, 15)]),
    Template("max_index", "xs", "the index of the largest number in the list xs (the first one if several are equal)",
        lambda k: lambda xs: xs.index(max(xs)), _LIST),
    Template("words", "s", "the number of words in the string s (words are separated by single spaces)",
        lambda k: lambda s: len(s.split(" ")), lambda r: [" ".join(_WORD(r)[0] for _ in range(r.randint(1, 5)))]),
]


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


EXAMPLE = ("add", "a, b", "the sum of a and b", "def add(a, b):\n    return a + b")
SYSTEM = "You write Python functions. Reply with only the function, in one ```python code block."


class CodeFunctions:
    name = "code_functions"

    def make(self, size: int, seed: int, cases: int = 4, templates: list[str] | None = None) -> list[dict]:
        """`size` rows, each of a template drawn from `templates` (names; null: every template)."""
        chosen = select(templates)
        if cases < 1:
            raise ValueError(f"code_functions: cases must be >= 1, got {cases}")
        rng = random.Random(seed)
        return [row(chosen[rng.randrange(len(chosen))], rng, cases) for _ in range(size)]

    def score(self, response_text: str, answer: str) -> float:
        return _scorer()(response_text, answer, {})


def select(names: list[str] | None) -> list[Template]:
    """The templates task_params `templates` names, in the order given (null: all of them)."""
    if names is None:
        return list(TEMPLATES)
    known = {t.name: t for t in TEMPLATES}
    if isinstance(names, str) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"code_functions: templates must be a non-empty list of names, got {names!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"code_functions: unknown templates {unknown}; known: {', '.join(known)}")
    return [known[n] for n in names]


def row(t: Template, rng: random.Random, cases: int) -> dict:
    """One prompt of template `t` (its constant and test inputs drawn from `rng`) and its tests."""
    k = rng.randint(2, 9)
    fn, f = t.pattern.format(k=k), t.ref(k)
    calls = [{"args": args, "output": f(*args)} for args in (t.gen(rng) for _ in range(cases))]
    return {"prompt": messages(fn, t.params, t.returns.format(k=k)), "answer": json.dumps({"fn": fn, "calls": calls})}


def messages(fn: str, params: str, returns: str) -> list[dict[str, str]]:
    ex_fn, ex_params, ex_returns, ex_code = EXAMPLE
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask(ex_fn, ex_params, ex_returns)},
            {"role": "assistant", "content": f"```python\n{ex_code}\n```"},
            {"role": "user", "content": ask(fn, params, returns)}]


def ask(fn: str, params: str, returns: str) -> str:
    return f"Write a Python function `{fn}({params})` that returns {returns}."


_SCORER: list = []


def _scorer():
    """One code_exec scorer per process (its warm sandboxes), made on first use."""
    if not _SCORER:
        from dora.ops.tools.code_exec import CodeExecScorer

        _SCORER.append(CodeExecScorer({}))
    return _SCORER[0]


TASK = CodeFunctions()
