"""Diagnostics: what is wrong with a pipeline, where, and what would be right.

Loading and validation collect every problem before reporting, so one run of
`dora validate` shows them all; GraphError carries the list.
"""

from __future__ import annotations

import dataclasses

from dora.graph.model import SourceLoc


@dataclasses.dataclass
class Diagnostic:
    severity: str                  # "error" | "warning"
    message: str
    loc: SourceLoc | None = None
    node: str | None = None
    edge: str | None = None        # an edge label, e.g. "reward/out -> advantage.scored"
    hint: str | None = None

    def format(self) -> str:
        where = f"{self.loc}: " if self.loc is not None else ""
        subject = f"node {self.node!r}: " if self.node else f"edge '{self.edge}': " if self.edge else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.severity}: {subject}{self.message}{hint}"

    def __str__(self) -> str:
        return self.format()


def error(message: str, loc: SourceLoc | None = None, node: str | None = None, edge: str | None = None, hint: str | None = None) -> Diagnostic:
    return Diagnostic("error", message, loc, node, edge, hint)


def warning(message: str, loc: SourceLoc | None = None, node: str | None = None, edge: str | None = None, hint: str | None = None) -> Diagnostic:
    return Diagnostic("warning", message, loc, node, edge, hint)


def errors_of(diags: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diags if d.severity == "error"]


def format_diagnostics(diags: list[Diagnostic]) -> str:
    return "\n".join(d.format() for d in diags)


class GraphError(Exception):
    """A pipeline that cannot be loaded or is invalid; `diagnostics` holds every problem."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        n = len(errors_of(self.diagnostics))
        super().__init__(f"{n} error(s) in pipeline:\n" + format_diagnostics(self.diagnostics))


class BadInput(ValueError):
    """The user's input is wrong, found while a run reads it (a data file's row, say): the message
    names where (file:line); the run ends with exit 2 and this message, without a traceback, as
    `dora validate` would have said it."""
