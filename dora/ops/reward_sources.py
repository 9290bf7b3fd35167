"""Weighted reward sources: a reward node's `sources` param, and the columns a scorer names.

    sources:
      - {name: correct, fn: math_verify, weight: 1.0}             a reward function (built-in or pkg.module:fn)
      - {name: judge, column: reward/judge, weight: 0.5}          a column an upstream node wrote (judge, reward_model)
      - {name: length, fn: rewards:length_penalty, params: {per_token: 0.01}}

reward = sum of weight x value over the sources; each source's value is kept as its own column
`reward/<name>` (float32) and its batch mean goes into the step's metrics under the same name.
Each entry's settings are declared once here (SOURCE_SETTINGS, ParamSpecs), so `dora validate`
names a bad entry's line (keys like "sources.1.weight"), and the op fills the same defaults.
No torch and no user code here: `dora validate` reads this module for every reward node.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from dora.graph.columns import SOURCE_PREFIX
from dora.graph.opspec import ParamSpec, did_you_mean

P = ParamSpec
SOURCE_SETTINGS: dict[str, ParamSpec] = {s.name: s for s in (
    P("name", "str", "", "the source's name: its value is kept as column reward/<name> and metric reward/<name>"),
    P("fn", "str?", None, "a reward function: synthetic, math_verify, reasoning_gym, format or pkg.module:function"),
    P("column", "str?", None, "a column an upstream node wrote (a judge's or reward model's `column`), read as the value"),
    P("weight", "float", 1.0, "the source's weight in the sum (negative for a penalty)"),
    P("params", "dict", {}, "extra keyword arguments for fn"),
)}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    weight: float
    fn: str | None          # a reward function's name, or
    column: str | None      # a column to read
    params: dict[str, Any]

    @property
    def out_column(self) -> str:
        return SOURCE_PREFIX + self.name


def parse_sources(decls: list[dict[str, Any]]) -> list[Source]:
    """Checked declarations (sources_problems found nothing) as Sources, defaults filled."""
    out = []
    for d in decls:
        filled = {k: d.get(k, spec.default) for k, spec in SOURCE_SETTINGS.items()}
        out.append(Source(filled["name"], float(filled["weight"]), filled["fn"], filled["column"], dict(filled["params"])))
    return out


def sources_problems(decls: Any) -> list[tuple[str, str]]:
    """Every problem of a `sources` list as (param key path, message); user functions are not imported here."""
    if not isinstance(decls, list):
        return [("sources", f"sources must be a list of {{name: ..., fn: ... | column: ..., weight: ...}}, got {decls!r}")]
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, d in enumerate(decls):
        at = f"sources.{i}"
        if not isinstance(d, dict):
            problems.append((at, f"a source is a mapping {{name: ..., fn: ... | column: ..., weight: ...}}, got {d!r}"))
            continue
        problems += _entry_problems(d, at)
        name = d.get("name")
        if isinstance(name, str) and name in seen:
            problems.append((f"{at}.name", f"source name {name!r} is used twice (sources {seen[name]} and {i}); each "
                                           "source's value is its own column reward/<name>"))
        elif isinstance(name, str):
            seen[name] = i
    weights = [d.get("weight", 1.0) for d in decls if isinstance(d, dict)]
    if not problems and not math.isfinite(math.fsum(float(w) for w in weights)):
        problems.append(("sources", f"the weights {weights} do not sum to a finite number"))
    return problems


def _entry_problems(d: dict[str, Any], at: str) -> list[tuple[str, str]]:
    problems = []
    for key, value in d.items():
        spec = SOURCE_SETTINGS.get(key)
        if spec is None:
            hint = did_you_mean(str(key), list(SOURCE_SETTINGS)) or f"a source takes {', '.join(SOURCE_SETTINGS)}"
            problems.append((f"{at}.{key}", f"unknown source setting {key!r} ({hint})"))
            continue
        _, err = spec.check(value)
        if err:
            problems.append((f"{at}.{key}", f"source setting {key!r} {err}"))
    if problems:
        return problems
    name = d.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        problems.append((f"{at}.name" if "name" in d else at,
                         f"a source needs a name of letters, digits, _ . - (it names column reward/<name>), got {name!r}"))
    has_fn, has_column = d.get("fn") is not None, d.get("column") is not None
    if has_fn == has_column:
        problems.append((at, "a source gives exactly one of fn (a reward function) or column (a column to read), "
                             f"got {'both' if has_fn else 'neither'}"))
    if d.get("params") and not has_fn:
        problems.append((f"{at}.params", "params are arguments for fn; a column source takes none"))
    weight = d.get("weight", 1.0)
    if isinstance(weight, (int, float)) and not math.isfinite(weight):
        problems.append((f"{at}.weight", f"weight must be a finite number, got {weight!r}"))
    return problems


def reward_columns(params: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """sources: needs each `column` source's column; adds reward/<name> per source"""
    sources = parse_sources(params["sources"]) if not sources_problems(params["sources"]) else []
    needs = tuple(s.column for s in sources if s.column is not None)
    return needs, tuple(s.out_column for s in sources)


def scorer_columns(params: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """adds the column named by `column` (reward by default; reward/<name> to combine it in a reward node)"""
    return (), (params["column"],)


def column_problem(column: Any) -> str | None:
    """A scorer's output column: `reward` (fed to advantage directly) or reward/<name> (a source to combine)."""
    if column == "reward" or (isinstance(column, str) and column.startswith(SOURCE_PREFIX)
                              and NAME.match(column[len(SOURCE_PREFIX):])):
        return None
    return f"column must be 'reward' or '{SOURCE_PREFIX}<name>' (letters, digits, _ . -), got {column!r}"
