"""A judge's verdict (the text it generated) as a score in [0, 1].

Parsers (the judge op's `parser` param):
  number   the first number in the text, inside `range` [lo, hi]: (x - lo) / (hi - lo)
  yes_no   the first word yes or no (any case): `values` (default yes 1, no 0; other words may be added)
  letter   the first standalone letter grade (A B C D F, capitals): `values` (default A 1, B 0.75, C 0.5,
           D 0.25, F 0)
  regex    `pattern`'s first group: looked up in `values` when given, else a number in `range`
A verdict that does not parse raises VerdictError (the op counts it as judge_parse_errors and
follows its on_error).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

PARSERS = ("number", "yes_no", "letter", "regex")
DEFAULT_VALUES = {
    "yes_no": {"yes": 1.0, "no": 0.0},
    "letter": {"A": 1.0, "B": 0.75, "C": 0.5, "D": 0.25, "F": 0.0},
}
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


class VerdictError(ValueError):
    """A verdict that does not parse to a score (the message quotes it)."""


def make_parser(kind: str, pattern: str | None, bounds: list[float], values: dict[str, float]) -> Callable[[str], float]:
    """verdict text -> score, for checked params (verdict_problems found nothing)."""
    lo, hi = float(bounds[0]), float(bounds[1])

    def in_range(text: str, found: str) -> float:
        x = float(found)
        if not lo <= x <= hi:
            raise VerdictError(f"{x:g} is outside the range [{lo:g}, {hi:g}] in verdict {_quote(text)}")
        return (x - lo) / (hi - lo)

    if kind == "number":
        def number(text: str) -> float:
            m = NUMBER.search(text)
            if m is None:
                raise VerdictError(f"no number in verdict {_quote(text)}")
            return in_range(text, m.group(0))
        return number
    if kind in DEFAULT_VALUES:
        fold = kind == "yes_no"   # yes / Yes / YES; a letter grade is a capital
        table = _table(values or DEFAULT_VALUES[kind], fold=fold)
        words = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
        regex = re.compile(rf"(?<![A-Za-z0-9])({words})(?![A-Za-z0-9])", re.IGNORECASE if fold else 0)

        def word(text: str) -> float:
            m = regex.search(text)
            if m is None:
                raise VerdictError(f"none of {sorted(table)} in verdict {_quote(text)}")
            return table[m.group(1).lower() if fold else m.group(1)]
        return word
    compiled = re.compile(pattern or "", re.DOTALL)
    table = _table(values, fold=False) if values else None

    def by_regex(text: str) -> float:
        m = compiled.search(text)
        if m is None:
            raise VerdictError(f"pattern {compiled.pattern!r} does not match verdict {_quote(text)}")
        found = (m.group(1) if compiled.groups else m.group(0)).strip()
        if table is not None:
            if found not in table:
                raise VerdictError(f"{found!r} is none of {sorted(table)} in verdict {_quote(text)}")
            return table[found]
        if not NUMBER.fullmatch(found):
            raise VerdictError(f"{found!r} is not a number in verdict {_quote(text)}")
        return in_range(text, found)
    return by_regex


def verdict_problems(p: dict[str, Any]) -> list[tuple[str, str]]:
    """The parser settings' problems as (param, message): a regex that does not compile, a range
    that is not [lo, hi] with lo < hi, values that are not numbers."""
    problems = []
    kind = p["parser"]
    if kind == "regex":
        if not p["pattern"]:
            problems.append(("pattern", "parser regex needs a pattern (its first group is the verdict)"))
        else:
            try:
                compiled = re.compile(p["pattern"], re.DOTALL)
            except re.error as e:
                problems.append(("pattern", f"pattern {p['pattern']!r} does not compile: {e}"))
            else:
                if compiled.groups > 1:
                    problems.append(("pattern", f"pattern {p['pattern']!r} has {compiled.groups} groups; the verdict is "
                                                "its first group (use (?:...) for the others)"))
    elif p["pattern"]:
        problems.append(("pattern", f"pattern is read by parser regex only (parser is {kind!r})"))
    bounds = p["range"]
    if (not isinstance(bounds, list) or len(bounds) != 2 or not all(_number(b) for b in bounds)
            or not float(bounds[0]) < float(bounds[1])):
        problems.append(("range", f"range must be [lo, hi], two finite numbers with lo < hi, got {bounds!r}"))
    for key, value in (p["values"] or {}).items():
        if not _number(value):
            problems.append((f"values.{key}", f"verdict {key!r} maps to {value!r}, not a finite number"))
    if p["values"] and kind == "number":
        problems.append(("values", "values map words to scores; parser number reads a number (use range)"))
    return problems


def _table(values: dict[str, float], fold: bool) -> dict[str, float]:
    return {(str(k).lower() if fold else str(k)): float(v) for k, v in values.items()}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _quote(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 80 else text[:77] + "...")
