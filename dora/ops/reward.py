"""The reward op: scores each trajectory row and adds `reward` (float32).

fn (param):
  synthetic          the scorer of the synthetic task named in the row's `task` column
  math_verify        math-verify answer equivalence of the response's final answer (last
                     \\boxed{...}, else the <answer> tag, else the last number) against `answer`
  reasoning_gym      the reasoning-gym dataset's own scorer (task "reasoning_gym:NAME"; the entry
                     comes from the row's `task_meta` JSON when present); the response's answer
                     is its <answer>...</answer> content, else the whole stripped text
  format             1.0 if the response matches a format: params.pattern (a regex, re.DOTALL)
                     or by default a non-empty <answer>...</answer> tag (params.tag to rename it)
  code_exec          runs the response's program against the row's tests in the python sandbox:
                     pass rate or all-pass (dora/ops/tools/code_exec.py; params there)
  pkg.module:func    a user function (the contract: docs/reward_functions.md)
                       fn(response_text: str, answer: str, row: dict, **params) -> float
                     or `async def` (a batch's rows are then scored concurrently); `dora validate`
                     imports it and checks that these arguments bind. The pipeline file's folder is
                     importable (validate, run and its workers).
sources (param): weighted sources instead of one fn (dora/ops/reward_sources.py): reward = sum of
weight x value, each source's value kept as column reward/<name>.
Multi-turn rows (a `final_turn_text` column, from a generate op with tools) are scored on the
model's final turn, never on the tools' output inside response_text (a user function still gets
the whole row). A failing reward function (exception or non-finite value) names the trajectory uid. on_error
"fail" raises RewardError; "zero" scores it 0, counts it, and reports
{"kind": "reward_errors", "node", "uids", "errors"} once per batch.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import math
import re
import threading
from typing import Any, Callable, Iterable

import pyarrow as pa

from dora.ops.base import OpContext, Operator
from dora.ops.arrow_rows import require_columns, with_column
from dora.ops.reward_sources import Source, parse_sources, sources_problems

BUILTIN_FNS = ("synthetic", "math_verify", "reasoning_gym", "format", "code_exec")

ScoreFn = Callable[[str, str, dict], float]


class RewardError(RuntimeError):
    """A reward function failed on a trajectory (the message names the uid)."""


class RewardOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.on_error = ctx.params["on_error"]
        if ctx.params["sources"]:
            self.sources = parse_sources(ctx.params["sources"])
        else:   # one unnamed source: reward = fn
            self.sources = [Source("", 1.0, ctx.params["fn"], None, dict(ctx.params["params"]))]
        self.fns = {s.name: resolve_reward_fn(s.fn, s.params) for s in self.sources if s.fn is not None}
        self.scored = self.errors = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["response_text", "answer"] + [s.column for s in self.sources if s.column], self.ctx.label)
        rows = batch.to_pylist()
        failed: dict[int, str] = {}
        total = [0.0] * len(rows)
        for s in self.sources:
            values = self._values(s, rows, failed)
            total = [t + s.weight * v for t, v in zip(total, values)]
            if s.name:
                batch = with_column(batch, s.out_column, values)
        self.scored += len(rows)
        if failed:
            self.errors += len(failed)
            uids = [str(rows[i].get("uid", f"row {i}")) for i in failed]
            self.ctx.report({"kind": "reward_errors", "node": self.ctx.node, "uids": uids, "errors": list(failed.values())})
        return [with_column(batch, "reward", total)]

    def _values(self, s: Source, rows: list[dict], failed: dict[int, str]) -> list[float]:
        """Source `s`'s value on each row; a failure is 0 under on_error zero (noted in `failed`)."""
        if s.column is not None:
            results = [_finite(row[s.column]) for row in rows]
        else:
            args = [(row["final_turn_text"] if "final_turn_text" in row else row["response_text"]) or "" for row in rows]
            answers = ["" if row["answer"] is None else str(row["answer"]) for row in rows]
            results = call_all(self.fns[s.name], list(zip(args, answers, rows)))
        values = []
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                what = f"source {s.name!r} ({s.fn or s.column})" if s.name else f"reward fn {s.fn!r}"
                msg = f"{type(r).__name__}: {r}"
                if self.on_error == "fail":
                    uid = rows[i].get("uid", f"row {i}")
                    raise RewardError(f"{self.ctx.label}: {what} failed on uid {uid!r}: {msg}") from r
                failed.setdefault(i, f"{what}: {msg}"[:200])
                r = 0.0
            values.append(r)
        return values

    def stats(self) -> dict[str, Any]:
        return {"scored": self.scored, "reward_errors": self.errors}


def score_row(fn: ScoreFn, row: dict) -> float:
    """One trajectory's reward as the op scores it (held-out sets score through here): a multi-turn row
    on the model's final turn; a failure (exception, non-number, non-finite value) raises."""
    text = row["final_turn_text"] if "final_turn_text" in row else row["response_text"]
    r = call_all(fn, [(text or "", "" if row["answer"] is None else str(row["answer"]), row)])[0]
    if isinstance(r, BaseException):
        raise r
    return r


def call_all(fn: Callable, calls: list[tuple[str, str, dict]]) -> list[float | BaseException]:
    """fn on every (text, answer, row): a finite float, or the exception it raised. An `async def`
    fn runs the calls concurrently (one event loop per batch)."""
    if not inspect.iscoroutinefunction(fn):
        out: list[float | BaseException] = []
        for args in calls:
            try:
                out.append(_finite(fn(*args)))
            except Exception as e:   # any failure of user or verifier code is reported per uid
                out.append(e)
        return out

    async def one(args):
        try:
            return _finite(await fn(*args))
        except Exception as e:
            return e

    async def every():
        return await asyncio.gather(*(one(a) for a in calls))

    return list(asyncio.run(every()))


def _finite(value: Any) -> float | BaseException:
    try:
        r = float(value)
    except (TypeError, ValueError):
        return TypeError(f"returned {type(value).__name__} {value!r}, not a number")
    return r if math.isfinite(r) else ValueError(f"returned a non-finite reward {r}")


def fn_problem(name: str) -> str | None:
    """What is wrong with a `fn` param (None: it resolves), without calling anything."""
    if name in BUILTIN_FNS:
        return None
    try:
        resolve_reward_fn(name, {})
    except ValueError as e:
        return str(e)
    return None


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Rules across the reward op's params (dora validate): fn or sources, and each user function's
    signature against the contract fn(response_text, answer, row, **params)."""
    if p["sources"]:
        if p["fn"] != "synthetic" or p["params"]:
            return [("sources", "give either fn (with params) or sources, not both: with sources, each source names "
                                "its own fn and params")]
        problems = sources_problems(p["sources"])
        for i, s in enumerate(parse_sources(p["sources"]) if not problems else []):
            if s.fn is not None:
                problem = fn_problem(s.fn) or signature_problem(s.fn, s.params)
                if problem:
                    problems.append((f"sources.{i}.fn", problem))
        return problems
    problem = signature_problem(p["fn"], p["params"])
    return [("fn", problem)] if problem else []


def signature_problem(name: str, params: dict[str, Any]) -> str | None:
    """Whether a user function `pkg.module:fn` takes (response_text, answer, row, **params)."""
    if name in BUILTIN_FNS:
        return None
    module_name, _, attr = name.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):   # a builtin or C function without one: nothing to check
        return None
    try:
        sig.bind("response", "answer", {}, **params)
    except TypeError as e:
        return (f"reward fn {name!r}{sig} cannot be called as fn(response_text, answer, row"
                + "".join(f", {k}=..." for k in params) + f"): {e} (the contract: docs/reward_functions.md)")
    return None


def resolve_reward_fn(name: str, params: dict[str, Any]) -> ScoreFn:
    """The scoring function (response_text, answer, row) -> float for a `fn` param."""
    if name == "synthetic":
        return synthetic_reward
    if name == "math_verify":
        return math_verify_reward
    if name == "reasoning_gym":
        return reasoning_gym_reward
    if name == "format":
        pattern = params.get("pattern")
        regex = re.compile(pattern, re.DOTALL) if pattern else _answer_tag(params.get("tag", "answer"))
        return lambda text, answer, row: 1.0 if regex.search(text) else 0.0
    if name == "code_exec":
        from dora.ops.tools.code_exec import CodeExecScorer
        return CodeExecScorer(params)
    if ":" not in name:
        from dora.graph.opspec import did_you_mean
        hint = did_you_mean(name, BUILTIN_FNS) or f"use one of {list(BUILTIN_FNS)} or 'pkg.module:function'"
        raise ValueError(f"reward fn {name!r} is unknown ({hint})")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ValueError(f"reward fn {name!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward fn {name!r}: {module_name} has no function {attr!r}")
    if params:
        if inspect.iscoroutinefunction(fn):
            async def with_params(text, answer, row):
                return await fn(text, answer, row, **params)
            return with_params
        return lambda text, answer, row: fn(text, answer, row, **params)
    return fn


# -- synthetic -------------------------------------------------------------------------------


def synthetic_reward(text: str, answer: str, row: dict) -> float:
    from dora.ops.tasks import get_task

    task = row.get("task")
    if not task or not str(task).startswith("synthetic:"):
        raise ValueError(f"fn 'synthetic' needs a task column 'synthetic:NAME', got {task!r}")
    return get_task(str(task)).score(text, answer)


# -- math-verify -----------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1: j]
    return None


def final_answer(text: str) -> str | None:
    """The response's final answer: last \\boxed{}, else the <answer> tag, else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    m = _answer_tag("answer").findall(text)
    if m:
        return m[-1].strip()
    nums = _NUMBER.findall(text)
    return nums[-1].replace(",", "") if nums else None


def _as_latex(s: str) -> str:
    s = s.strip()
    return s if ("$" in s or "\\boxed" in s) else f"${s}$"


def math_verify_reward(text: str, answer: str, row: dict) -> float:
    from math_verify import parse, verify

    pred = final_answer(text)
    if pred is None:
        return 0.0
    # math-verify's timeouts use SIGALRM, which only works on the main thread
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_answer = last_boxed(answer) or answer
    gold = parse(_as_latex(gold_answer), parsing_timeout=timeout)
    target = parse(_as_latex(pred), parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math_verify cannot parse the reference answer {answer!r}")
    return 1.0 if target and verify(gold, target, timeout_seconds=timeout) else 0.0


logging.getLogger("math_verify").setLevel(logging.ERROR)  # silence "timeout disabled" off the main thread


# -- reasoning-gym ---------------------------------------------------------------------------


def reasoning_gym_reward(text: str, answer: str, row: dict) -> float:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    task = str(row.get("task") or "")
    if not task.startswith("reasoning_gym:"):
        raise ValueError(f"fn 'reasoning_gym' needs a task column 'reasoning_gym:NAME', got {task!r}")
    entry = json.loads(row["task_meta"]) if row.get("task_meta") else {"question": "", "answer": answer, "metadata": {}}
    scorer = _rg_scorer(task.split(":", 1)[1], reasoning_gym)
    pred = extract_answer(text)
    return float(scorer(answer=pred if pred is not None else text.strip(), entry=entry))


_RG_SCORERS: dict[str, Callable] = {}


def _rg_scorer(name: str, reasoning_gym) -> Callable:
    if name not in _RG_SCORERS:
        _RG_SCORERS[name] = reasoning_gym.get_score_answer_fn(name)
    return _RG_SCORERS[name]


def _answer_tag(tag: str) -> re.Pattern:
    t = re.escape(tag)
    return re.compile(rf"<{t}>\s*(\S.*?)\s*</{t}>", re.DOTALL)
