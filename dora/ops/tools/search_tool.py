"""The `search` tool: BM25 (dora/ops/tools/bm25.py) over a JSONL corpus, one document per line
{"id": str, "title": str, "text": str}. The default corpus ships with dora
(dora/ops/tools/data/elements.jsonl: the elements hydrogen to krypton, symbol, atomic number,
standard atomic weight, category, period and group). Returns the top documents as
"[title] text" lines, or says that nothing matched."""

from __future__ import annotations

import json
import os
from typing import Any

from dora.graph.opspec import ParamSpec
from dora.ops.tools.bm25 import BM25
from dora.ops.tools.tool_base import Tool, ToolResult, clip_text

SHIPPED_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "elements.jsonl")
P = ParamSpec


class SearchTool(Tool):
    kind = "search"
    doc = "BM25 search over a JSONL corpus (default: the shipped periodic-table corpus); returns the best documents"
    main_arg = "query"
    settings = {s.name: s for s in (
        P("corpus", "str?", None, "JSONL file of {id, title, text} (null = the shipped elements corpus)",
          names_from="dora.ops.tools.search_tool:corpus_problem"),
        P("top_k", "int", 3, "documents returned per query", min=1, max=50),
        P("max_output_chars", "int", 2000, "output returned to the model, at most", min=16),
    )}

    def __init__(self, name: str, **settings: Any):
        super().__init__(name, **settings)
        self.docs = load_corpus(self.cfg["corpus"] or SHIPPED_CORPUS)
        self.index = BM25([f"{d['title']} {d['text']}" for d in self.docs])

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        query = self.text_arg(arguments, self.main_arg)
        if isinstance(query, ToolResult):
            return query
        hits = self.index.top(query, self.cfg["top_k"])
        if not hits:
            return ToolResult(f"No document matches {query!r}.", error=False)
        text = "\n".join(f"[{self.docs[i]['title']}] {self.docs[i]['text']}" for i, _ in hits)
        return ToolResult(clip_text(text, self.cfg["max_output_chars"]), error=False)


def load_corpus(path: str) -> list[dict[str, str]]:
    """The documents of a JSONL corpus; ValueError naming file:line for a bad one."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"search corpus {path}: {e.strerror}") from None
    docs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON: {e.msg}") from None
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("id", "title", "text")):
            raise ValueError(f"{path}:{i}: a document needs string fields id, title and text")
        docs.append(d)
    if not docs:
        raise ValueError(f"search corpus {path} has no documents")
    return docs


def corpus_problem(path: str) -> str | None:
    """What is wrong with a `corpus` setting (None: it loads)."""
    try:
        load_corpus(path)
    except ValueError as e:
        return str(e)
    return None
