"""What every tool is: a name the model calls it by, its declared settings, and run(arguments) ->
ToolResult. A tool never raises for anything the model sent or for a failure of its own work: it
returns an error result, which becomes the observation the model reads (and is counted)."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

from dora.graph.opspec import ParamSpec


@dataclasses.dataclass(frozen=True)
class ToolResult:
    text: str           # what the model reads back
    error: bool         # the call failed (bad arguments, exception, over a limit): counted as a tool error
    seconds: float = 0.0


class Tool(abc.ABC):
    """A declared tool: `{name: <model-facing name>, kind: <registry name, default = name>, <settings>}`."""

    kind: str = ""
    doc: str = ""
    main_arg: str = ""                      # the argument a tag call's body fills (<python>BODY</python>)
    settings: dict[str, ParamSpec] = {}     # declared once here; checked by `dora validate`

    def __init__(self, name: str, **settings: Any):
        self.name = name
        self.cfg = {**{k: spec.default for k, spec in self.settings.items()}, **settings}

    @abc.abstractmethod
    def run(self, arguments: dict[str, Any]) -> ToolResult: ...

    @classmethod
    def decl_problems(cls, decl: dict[str, Any]) -> list[tuple[str, str]]:
        """Problems of a declaration whose settings each check out, as (setting key path, message)
        (a path that does not exist, ...)."""
        return []

    def stats(self) -> dict[str, int]:
        """Counters of the tool's failures by kind (reported in the generate op's stats)."""
        return {}

    def text_arg(self, arguments: dict[str, Any], key: str) -> str | ToolResult:
        """The string argument `key`, or an error result naming what the call lacked."""
        value = arguments.get(key) if isinstance(arguments, dict) else None
        if not isinstance(value, str):
            return ToolResult(f"Error: tool {self.name!r} needs a string argument {key!r}, got {arguments!r}"[:500],
                              error=True)
        return value

    def close(self) -> None:
        pass


def clip_text(text: str, limit: int) -> str:
    """At most `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... ({len(text) - limit} more characters cut)"
