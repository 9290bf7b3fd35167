"""Drawing a pipeline: DOT, Mermaid, SVG (Graphviz if installed, else pure Python) and one
self-contained offline HTML page.

    render(graph, "html" | "svg" | "dot" | "mmd") -> str
    write(graph, "out.html")                      # format from the file extension
"""

from __future__ import annotations

import os

from dora.graph.model import Graph
from dora.graph.viz.dot import to_dot
from dora.graph.viz.figure import figure
from dora.graph.viz.html import to_html
from dora.graph.viz.mermaid import to_mermaid
from dora.graph.viz.svg import svg_graphviz, svg_python

FORMATS = ("html", "svg", "dot", "mmd")


def to_svg(g: Graph, engine: str = "auto") -> str:
    """SVG text. engine: "auto" (Graphviz dot if installed, else Python), "dot" or "python"."""
    if engine not in ("auto", "dot", "python"):
        raise ValueError(f"unknown SVG engine {engine!r}: use auto, dot or python")
    if engine in ("auto", "dot"):
        svg = svg_graphviz(to_dot(g))
        if svg is not None:
            return svg
        if engine == "dot":
            raise RuntimeError("Graphviz `dot` is not installed or failed; use engine='python'")
    return svg_python(g)


def render(g: Graph, fmt: str, engine: str = "auto") -> str:
    fmt = fmt.lower().lstrip(".")
    if fmt == "mermaid":
        fmt = "mmd"
    if fmt == "html":
        return to_html(g)
    if fmt == "svg":
        return to_svg(g, engine)
    if fmt in ("dot", "gv"):
        return to_dot(g)
    if fmt == "mmd":
        return to_mermaid(g)
    raise ValueError(f"unknown drawing format {fmt!r}: use one of {', '.join(FORMATS)}")


def format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return {"gv": "dot", "mermaid": "mmd", "htm": "html"}.get(ext, ext)


def write(g: Graph, path: str, fmt: str | None = None, engine: str = "auto") -> str:
    """Write a drawing; the format comes from the extension unless given. Returns the format."""
    fmt = fmt or format_of(path)
    text = render(g, fmt, engine)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return fmt


__all__ = ["FORMATS", "figure", "format_of", "render", "to_dot", "to_html", "to_mermaid", "to_svg", "write"]
