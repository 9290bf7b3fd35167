"""Operator declarations: the ports, columns and typed params an op promises.

The graph layer checks pipelines against these declarations without importing any
operator code: a built-in op names its implementation by import path (a string), and a
user op `pkg.module:Class` is imported only to read its class attribute `spec`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from typing import Any

# Param types, by name (strings so that `dora ops --json` can print them). A trailing "?"
# means "or None": "float?" accepts a float or null.
PARAM_TYPES = ("int", "float", "bool", "str", "list", "dict")


class OpError(ValueError):
    """An op name that cannot be resolved to a declaration."""


class ParamError(ValueError):
    """Params that do not match an op's declaration; `problems` lists each one."""

    def __init__(self, op: str, problems: list["ParamProblem"]):
        self.op = op
        self.problems = problems
        super().__init__("; ".join(p.text() for p in problems))


@dataclasses.dataclass(frozen=True)
class ParamProblem:
    key: str
    message: str
    hint: str | None = None

    def text(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One setting, declared once: its type, default, allowed range or names, and what it does."""

    name: str
    type: str            # one of PARAM_TYPES, optionally suffixed "?" (None allowed)
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None          # inclusive bounds for int / float values
    max: float | None = None
    # Names picked from a registry that lives outside dora.graph, as "pkg.module:OBJ": OBJ is a
    # Registry (has .names()), a collection of names, or a function value -> problem text | None.
    # Imported only when a pipeline is checked, so dora.graph stays free of ops and algos.
    names_from: str | None = None

    def __post_init__(self) -> None:
        if self.type.rstrip("?") not in PARAM_TYPES:
            raise ValueError(f"param {self.name!r}: type {self.type!r} is not one of {PARAM_TYPES} (optionally with '?')")

    @property
    def optional(self) -> bool:
        return self.type.endswith("?")

    def check(self, value: Any) -> tuple[Any, str | None]:
        """(coerced value, None) if `value` fits, else (value, what is wrong)."""
        if value is None:
            return (None, None) if self.optional else (value, f"must be {self.type}, got null")
        base = self.type.rstrip("?")
        ok: bool
        if base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok:
                value = float(value)
        elif base == "bool":
            ok = isinstance(value, bool)
        elif base == "str":
            ok = isinstance(value, str)
        elif base == "list":
            ok = isinstance(value, (list, tuple))
            if ok:
                value = list(value)
        else:
            ok = isinstance(value, dict)
        if not ok:
            return value, f"must be {self.type}, got {type(value).__name__} {value!r}"
        if self.choices is not None and value not in self.choices:
            close = did_you_mean(value, [str(c) for c in self.choices]) if isinstance(value, str) else None
            return value, f"must be one of {list(self.choices)}, got {value!r}" + (f" ({close})" if close else "")
        if base in ("int", "float"):
            if self.min is not None and value < self.min:
                return value, f"must be >= {self.min:g}, got {value!r}"
            if self.max is not None and value > self.max:
                return value, f"must be <= {self.max:g}, got {value!r}"
        return value, None

    def check_name(self, value: Any) -> str | None:
        """What is wrong with a name picked from `names_from` (None: fine, or nothing to check)."""
        if self.names_from is None or not isinstance(value, str):
            return None
        source = import_object(self.names_from)
        if callable(source) and not hasattr(source, "names"):
            return source(value)
        names = list(source.names()) if hasattr(source, "names") else list(source)
        if value in names:
            return None
        hint = did_you_mean(value, names) or f"one of {', '.join(map(str, names))}"
        return f"unknown name {value!r} ({hint})"

    @property
    def range_text(self) -> str | None:
        if self.min is None and self.max is None:
            return None
        lo = "" if self.min is None else f"{self.min:g} <= "
        hi = "" if self.max is None else f" <= {self.max:g}"
        return f"{lo}x{hi}"

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "type": self.type, "default": self.default, "doc": self.doc}
        if self.choices is not None:
            d["choices"] = list(self.choices)
        if self.range_text:
            d["range"] = self.range_text
        if self.names_from:
            d["names_from"] = self.names_from
        return d


@dataclasses.dataclass(frozen=True)
class PortSpec:
    name: str
    needs: tuple[str, ...] = ()   # columns that must arrive on this port


@dataclasses.dataclass(frozen=True)
class When:
    """Columns an op needs/adds only for some param values (e.g. advantage estimator=gae
    needs `values` and adds `returns`). Matches when params[param] is in `values`
    (or, with negate=True, when it is not)."""

    param: str
    values: tuple[Any, ...]
    needs: tuple[str, ...] = ()   # on every input port
    adds: tuple[str, ...] = ()
    negate: bool = False

    def matches(self, params: dict[str, Any]) -> bool:
        hit = params.get(self.param) in self.values
        return hit != self.negate


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    inputs: tuple[PortSpec, ...]
    adds: tuple[str, ...]
    params: dict[str, ParamSpec]
    impl: str                               # "pkg.module:Class"; never imported by dora.graph
    outputs: tuple[str, ...] = ("out",)
    is_update: bool = False                 # may be the source of a weights edge
    is_generate: bool = False               # may be the target of a weights edge
    when: tuple[When, ...] = ()
    # Rules that tie several params together (e.g. a loss and the knobs it accepts), next to the
    # op's code: "pkg.module:function", filled params -> [(param, problem)]. Imported only when a
    # pipeline is checked, after every single param checked out.
    check: str | None = None
    # Scale-out. sharded: the node's `replicas` are the ranks of ONE torch.distributed group (FSDP)
    # that acts as one replica on the data edges (rank 0 takes the input and reports). devices_check:
    # an op whose replica may hold several devices (a tensor-parallel group) names a function
    # "pkg.module:function", (filled params, devices) -> problem | None; without one, devices is 1.
    sharded: bool = False
    devices_check: str | None = None
    # What the machine must provide for the node (a sandbox's isolation tool): "pkg.module:function",
    # filled params -> [(param key path, "error" | "warning", message)]; dora validate and dora run
    # report them at the param's file:line. Imported only once every param checked out.
    host_check: str | None = None
    # Columns named by params (a reward source's `reward/<name>`, a scorer's output `column`):
    # "pkg.module:function", filled params -> (needs, adds); its docstring's first line is what
    # `dora ops` prints. Imported only when a pipeline is checked (a module without torch).
    columns: str | None = None
    # The input ports whose columns flow on to the output (None: every port's). An op that starts new
    # rows (to_prompts: a trajectory becomes prompt rows) carries none: its output is what it adds.
    carries: tuple[str, ...] | None = None

    @property
    def is_source(self) -> bool:
        return not self.inputs

    def port(self, name: str) -> PortSpec | None:
        return next((p for p in self.inputs if p.name == name), None)

    def needs(self, port: str, params: dict[str, Any]) -> tuple[str, ...]:
        """Columns needed on input `port`, given filled params."""
        p = self.port(port)
        base = p.needs if p else ()
        extra = tuple(c for w in self.when if w.matches(params) for c in w.needs)
        return tuple(dict.fromkeys(base + extra + self._param_columns(params)[0]))

    def added(self, params: dict[str, Any]) -> tuple[str, ...]:
        """Columns this op adds to its output, given filled params."""
        extra = tuple(c for w in self.when if w.matches(params) for c in w.adds)
        return tuple(dict.fromkeys(self.adds + extra + self._param_columns(params)[1]))

    def _param_columns(self, params: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(needs, adds) named by params (`columns`); nothing for params it cannot read (their own
        errors say why)."""
        if self.columns is None:
            return (), ()
        try:
            needs, adds = import_object(self.columns)(params)
        except (KeyError, TypeError, ValueError, AttributeError):
            return (), ()
        return tuple(needs), tuple(adds)

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (for `dora ops --json`)."""
        return {
            "name": self.name,
            "doc": self.doc,
            "impl": self.impl,
            "inputs": [{"name": p.name, "needs": list(p.needs)} for p in self.inputs],
            "outputs": list(self.outputs),
            "adds": list(self.adds),
            "conditional": [
                {"param": w.param, "values": list(w.values), "negate": w.negate, "needs": list(w.needs), "adds": list(w.adds)}
                for w in self.when
            ],
            "params": [p.describe() for p in self.params.values()],
            "is_update": self.is_update,
            "is_generate": self.is_generate,
            "sharded": self.sharded,
            "devices_check": self.devices_check,
            "columns": self.columns_doc,
        }

    @property
    def columns_doc(self) -> str | None:
        """What `columns` says of the columns params name (its docstring's first line)."""
        if self.columns is None:
            return None
        doc = (import_object(self.columns).__doc__ or "").strip()
        return doc.splitlines()[0] if doc else self.columns


def setting(default: Any, doc: str, **bounds: Any) -> Any:
    """A dataclass field that declares one section setting (`async:`, `run:`): its default, doc and
    bounds (choices, min, max). dora.graph.sections turns these fields into ParamSpecs."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"doc": doc, **bounds})
    return dataclasses.field(default=default, metadata={"doc": doc, **bounds})


def import_object(path: str) -> Any:
    """The object at "pkg.module:NAME"."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def did_you_mean(word: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """'did you mean X?' for the closest candidate, else None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def param_problems(spec: OpSpec, params: dict[str, Any]) -> list[ParamProblem]:
    """Every unknown or mistyped param in `params`, with a hint each."""
    problems: list[ParamProblem] = []
    for key, value in params.items():
        ps = spec.params.get(key)
        if ps is None:
            hint = did_you_mean(key, list(spec.params)) or f"{spec.name} params are {sorted(spec.params)}"
            problems.append(ParamProblem(key, f"unknown param {key!r} for op {spec.name!r}", hint))
            continue
        _, err = ps.check(value)
        if err:
            problems.append(ParamProblem(key, f"param {key!r} {err}", f"{ps.name}: {ps.doc}; default {ps.default!r}"))
    if problems:
        return problems
    filled = fill_params(spec, params, checked=True)
    for key, ps in spec.params.items():
        err = ps.check_name(filled[key])
        if err:
            problems.append(ParamProblem(key, f"param {key!r}: {err}", f"{ps.name}: {ps.doc}"))
    if not problems and spec.check is not None:
        for key, message in import_object(spec.check)(filled):
            problems.append(ParamProblem(key, message))
    return problems


def fill_params(spec: OpSpec, params: dict[str, Any], checked: bool = False) -> dict[str, Any]:
    """Params with defaults filled in and values type-checked (ints widened to floats).

    Raises ParamError listing every problem at once (`checked`: the caller already checked).
    """
    problems = [] if checked else param_problems(spec, params)
    if problems:
        raise ParamError(spec.name, problems)
    out: dict[str, Any] = {}
    for name, ps in spec.params.items():
        if name in params:
            out[name] = ps.check(params[name])[0]
        else:
            # copy mutable defaults so one node cannot change another's
            d = ps.default
            out[name] = list(d) if isinstance(d, list) else dict(d) if isinstance(d, dict) else d
    return out
