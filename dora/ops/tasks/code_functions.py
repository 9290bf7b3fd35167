"""Small Python functions to write, checked by running them (pipelines/code_exec.yaml): the code
task of the code_exec reward (dora/ops/tools/code_exec.py), generated offline from templates.

Prompt (chat messages): a system message asking for one ```python block, one worked example (a
function and its block), then the task, e.g. "Write a Python function `add_7(x)` that returns x plus
7." The answer is the tests as code_exec reads them: {"fn": NAME, "calls": [{"args": [...],
"output": ...}, ...]}, `calls` cases from the template's reference implementation on random inputs.
The reward (fn code_exec, or fn synthetic through `score`) is the pass rate in the sandbox.

Templates vary the function's name and constants, so a model must read the task; they are simple
enough that SmolLM2-135M-Instruct solves some at the start (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable

# (name pattern, parameters, what it returns, reference, input generator); {k} is a constant
Template = tuple[str, str, str, Callable[..., Any], Callable[[random.Random], list]]
_INT = lambda r: [r.randint(-50, 50)]                                           # noqa: E731
_TWO = lambda r: [r.randint(-50, 50), r.randint(-50, 50)]                       # noqa: E731
_LIST = lambda r: [[r.randint(-9, 9) for _ in range(r.randint(1, 6))]]          # noqa: E731
_WORD = lambda r: ["".join(r.choice("abcdeiou") for _ in range(r.randint(1, 8)))]   # noqa: E731
TEMPLATES: list[Template] = [
    ("add_{k}", "x", "x plus {k}", lambda k: lambda x: x + k, _INT),
    ("times_{k}", "x", "x multiplied by {k}", lambda k: lambda x: x * k, _INT),
    ("minus_{k}", "x", "x minus {k}", lambda k: lambda x: x - k, _INT),
    ("square", "x", "the square of x", lambda k: lambda x: x * x, _INT),
    ("larger", "a, b", "the larger of a and b", lambda k: lambda a, b: max(a, b), _TWO),
    ("smaller", "a, b", "the smaller of a and b", lambda k: lambda a, b: min(a, b), _TWO),
    ("total", "xs", "the sum of the numbers in the list xs", lambda k: lambda xs: sum(xs), _LIST),
    ("last", "xs", "the last element of the list xs", lambda k: lambda xs: xs[-1], _LIST),
    ("first", "xs", "the first element of the list xs", lambda k: lambda xs: xs[0], _LIST),
    ("count", "xs", "the number of elements in the list xs", lambda k: lambda xs: len(xs), _LIST),
    ("is_even", "x", "True if x is even, else False", lambda k: lambda x: x % 2 == 0, _INT),
    ("absolute", "x", "the absolute value of x", lambda k: lambda x: abs(x), _INT),
    ("reverse", "s", "the string s reversed", lambda k: lambda s: s[::-1], _WORD),
    ("upper", "s", "the string s in upper case", lambda k: lambda s: s.upper(), _WORD),
    ("length", "s", "the number of characters in the string s", lambda k: lambda s: len(s), _WORD),
    ("repeat_{k}", "s", "the string s repeated {k} times", lambda k: lambda s: s * k, _WORD),
]
EXAMPLE = ("add", "a, b", "the sum of a and b", "def add(a, b):\n    return a + b")
SYSTEM = "You write Python functions. Reply with only the function, in one ```python code block."


class CodeFunctions:
    name = "code_functions"

    def make(self, size: int, seed: int, cases: int = 4, templates: int = len(TEMPLATES)) -> list[dict]:
        if cases < 1 or not 1 <= templates <= len(TEMPLATES):
            raise ValueError(f"code_functions: cases >= 1 and 1 <= templates <= {len(TEMPLATES)}; got cases={cases}, "
                             f"templates={templates}")
        rng = random.Random(seed)
        rows = []
        for _ in range(size):
            name, params, returns, ref, gen = TEMPLATES[rng.randrange(templates)]
            k = rng.randint(2, 9)
            fn, f = name.format(k=k), ref(k)
            calls = [{"args": args, "output": f(*args)} for args in (gen(rng) for _ in range(cases))]
            rows.append({"prompt": messages(fn, params, returns.format(k=k)),
                         "answer": json.dumps({"fn": fn, "calls": calls})})
        return rows

    def score(self, response_text: str, answer: str) -> float:
        return _scorer()(response_text, answer, {})


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
