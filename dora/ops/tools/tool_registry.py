"""Tool declarations: the generate op's `tools` param, a list of
    {name: <what the model calls it>, kind: <a kind below; default: the name>, <that kind's settings>}
Kinds and their settings are declared on the tool classes (`Tool.settings`, ParamSpecs), so one
check serves `dora validate` (tools_problems, keys like "tools.1.timeout_s" that the validator turns
into file:line) and the op (build_tools fills defaults and builds the tools)."""

from __future__ import annotations

import re
from typing import Any

from dora.graph.opspec import did_you_mean, import_object
from dora.ops.tools.tool_base import Tool

KINDS = {
    "python": "dora.ops.tools.python_tool:PythonTool",
    "search": "dora.ops.tools.search_tool:SearchTool",
}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")   # also a tag name (<python>...</python>)


def tool_class(kind: str) -> type[Tool]:
    return import_object(KINDS[kind])


def tools_problems(decls: Any) -> list[tuple[str, str]]:
    """Every problem of a `tools` list as (param key path, message)."""
    if not isinstance(decls, list):
        return [("tools", f"tools must be a list of {{name: ..., <settings>}}, got {decls!r}")]
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, d in enumerate(decls):
        at = f"tools.{i}"
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            problems.append((at, f"a tool is declared as {{name: <tool name>, kind: <{', '.join(KINDS)}>, <settings>}}, got {d!r}"))
            continue
        name = d["name"]
        if not NAME.match(name):
            problems.append((f"{at}.name", f"tool name {name!r} must be letters, digits and _ (not starting with a digit)"))
        if name in seen:
            problems.append((f"{at}.name", f"tool {name!r} is declared twice"))
        seen.add(name)
        kind = d.get("kind", name)
        if not isinstance(kind, str) or kind not in KINDS:
            hint = did_you_mean(str(kind), list(KINDS)) or f"kinds are {', '.join(KINDS)}"
            key = f"{at}.kind" if "kind" in d else f"{at}.name"
            problems.append((key, f"unknown tool kind {kind!r} ({hint}; a tool named otherwise says its kind: "
                                  f"{{name: {name}, kind: python}})"))
            continue
        settings_problems = _settings_problems(tool_class(kind), d, at)
        problems += settings_problems or [(f"{at}.{k}", f"tool {name!r}: {m}") for k, m in tool_class(kind).decl_problems(d)]
    return problems


def _settings_problems(cls: type[Tool], decl: dict, at: str) -> list[tuple[str, str]]:
    problems = []
    for key, value in decl.items():
        if key in ("name", "kind"):
            continue
        spec = cls.settings.get(key)
        if spec is None:
            hint = did_you_mean(key, list(cls.settings)) or f"{cls.kind} settings are {', '.join(cls.settings) or 'none'}"
            problems.append((f"{at}.{key}", f"unknown setting {key!r} for tool kind {cls.kind!r} ({hint})"))
            continue
        value, err = spec.check(value)
        err = err or spec.check_name(value)
        if err:
            problems.append((f"{at}.{key}", f"tool {decl['name']!r} setting {key!r}: {err} ({spec.doc})"))
    return problems


def build_tools(decls: list[dict]) -> dict[str, Tool]:
    """name -> Tool for a checked `tools` list (defaults filled); ValueError on a problem."""
    problems = tools_problems(decls)
    if problems:
        raise ValueError("; ".join(f"{k}: {m}" for k, m in problems))
    tools = {}
    for d in decls:
        cls = tool_class(d.get("kind", d["name"]))
        settings = {k: spec.check(d[k])[0] if k in d else spec.default for k, spec in cls.settings.items()}
        tools[d["name"]] = cls(d["name"], **settings)
    return tools
