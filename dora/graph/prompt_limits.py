"""The dataset's prompt limit, one rule for `dora validate` and the run, and the rows held to it.

A dataset node's prompts go to the generate nodes downstream of it, and a prompt must fit their
context: the longest prompt a generate node takes is its engine's rule over the model's context
(dora.ops.generate_settings:prompt_room). The limit of a dataset is its `max_prompt_tokens` when set
(a user's limit above what a generate node takes is an error: no row could use the difference), else
that room, when the model's context is known without loading it (a tiny model, a model folder, a
packaged model once converted). resolve() hands the run this limit as the node's max_prompt_tokens
(`derive`); the dataset op refuses or skips, per on_error, every row over it (dora/ops/prompt_rows.py).

`dora validate` reads the first FIRST_ROWS rows of every file source as the run reads them (parsed,
rendered with the model's tokenizer, held to the limit) and names each bad one as file:N; `dora
validate --data` reads every row and names every bad one (`every_row`, with progress). Counting a
prompt's tokens needs the model's tokenizer: a tiny model's is built in; a real model's imports
transformers, only then.
"""

from __future__ import annotations

import os
import contextlib
import contextvars
from typing import Any, Callable, Iterator

from dora.graph.diagnostics import Diagnostic, error, warning
from dora.graph.model import Graph, SourceLoc
from dora.graph.opspec import OpSpec, import_object

CONTEXT_OF = "dora.ops.model_section:context_length"        # model section -> positions | None
TOKENIZER_OF = "dora.ops.model_section:available_tokenizer"  # model section -> tokenizer | None
ROOM_OF = "dora.ops.generate_settings:prompt_room"          # (generate params, context) -> (tokens, why)
IS_FILE = "dora.ops.dataset_settings:is_file_source"
SCAN = "dora.ops.prompt_rows:scan_file"                      # the rows of a file, as the run reads them
FIRST_ROWS = "dora.ops.data_files:FIRST_ROWS"
NAMED_ROWS = 20   # bad rows named one by one by plain `dora validate` (--data names every one)

Progress = Callable[[str, int, "float | None"], None]   # (file, rows read, fraction of it read or None)
# what validation reads of a file source: (None, progress, rows read per file) for every row
_EVERY_ROW: contextvars.ContextVar[tuple[Progress | None, dict[str, int]] | None] = contextvars.ContextVar("every_row", default=None)


@contextlib.contextmanager
def every_row(progress: Progress | None = None) -> Iterator[dict[str, int]]:
    """Inside it, validation reads every row of every file source and names every bad one
    (`dora validate --data`); yields {file: rows read}, filled as files are read."""
    counts: dict[str, int] = {}
    token = _EVERY_ROW.set((progress, counts))
    try:
        yield counts
    finally:
        _EVERY_ROW.reset(token)


def _datasets(specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[str]:
    return [n for n, s in specs.items() if s is not None and s.name == "dataset" and n in params]


def fed_generates(g: Graph, specs: dict[str, OpSpec | None], dataset: str) -> list[str]:
    """The generate nodes downstream of `dataset` along data edges, in graph order."""
    seen, todo = {dataset}, [dataset]
    while todo:
        for e in g.consumers(todo.pop()):
            if e.dst not in seen:
                seen.add(e.dst)
                todo.append(e.dst)
    return [n for n in g.nodes if n in seen and specs.get(n) is not None and specs[n].is_generate]


def room(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]],
         dataset: str) -> tuple[int, str, str] | None:
    """(the longest prompt every generate node fed by `dataset` takes, why, the tightest node), or None
    when the model's context is not known before loading it (or no generate node is fed)."""
    gens = [n for n in fed_generates(g, specs, dataset) if n in params]
    context = import_object(CONTEXT_OF)(g.model) if gens and isinstance(g.model, dict) else None
    if context is None:
        return None
    rooms = [(*import_object(ROOM_OF)(params[n], context), n) for n in gens]
    return min(rooms, key=lambda r: r[0])


def limit(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]], dataset: str) -> int | None:
    """The dataset's prompt limit as the run uses it: max_prompt_tokens, else the generate nodes' room."""
    return limit_and_why(g, specs, params, dataset)[0]


def limit_and_why(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]],
                  dataset: str) -> tuple[int | None, str]:
    own = params[dataset]["max_prompt_tokens"]
    if own is not None:
        return own, f"max_prompt_tokens of {dataset!r}"
    r = room(g, specs, params, dataset)
    if r is None or r[0] < 1:
        return None, ""
    return r[0], f"the longest prompt generate node {r[2]!r} takes: {r[1]}"


def derive(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> None:
    """resolve(): each dataset's max_prompt_tokens as the run holds its rows to (see the module doc)."""
    for d in _datasets(specs, params):
        params[d]["max_prompt_tokens"] = limit(g, specs, params, d)


def limit_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """A limit no generate node can take, and the first rows of each file source as the run reads them."""
    diags: list[Diagnostic] = []
    for d in _datasets(specs, params):
        r, own = room(g, specs, params, d), params[d]["max_prompt_tokens"]
        if r is not None and r[0] < 1:
            diags.append(error(f"generate node {r[2]!r} has no room for a prompt: {r[1]}", g.loc_of(f"nodes.{r[2]}.params"),
                               node=r[2], hint="lower max_tokens, or use a model with a longer context"))
            continue
        if r is not None and own is not None and own > r[0]:
            diags.append(error(f"max_prompt_tokens {own} is over the longest prompt generate node {r[2]!r} takes: "
                               f"{r[0]} ({r[1]})", g.loc_of(f"nodes.{d}.params.max_prompt_tokens"), node=d,
                               hint=f"max_prompt_tokens: {r[0]} or less, or null to take {r[0]}"))
            continue
        diags += _rows_as_asked(g, specs, params, d)
    return diags


def _rows_as_asked(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]], d: str) -> list[Diagnostic]:
    every = _EVERY_ROW.get()
    if every is None:
        return rows_problems(g, specs, params, d, rows=import_object(FIRST_ROWS))[0]
    progress, counts = every
    source = params[d]["source"]
    step = (lambda n, fraction: progress(source, n, fraction)) if progress is not None else None
    found, read = rows_problems(g, specs, params, d, rows=None, progress=step)
    if read:
        counts[source] = read
    return found


def rows_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]], dataset: str,
                  rows: int | None, progress: Callable[[int, float | None], None] | None = None) -> tuple[list[Diagnostic], int]:
    """(every bad row among the first `rows` rows (None: all) of the dataset's file source, each at
    file:N: errors when on_error is fail (the run would refuse them), warnings when skip; rows read)."""
    p = params[dataset]
    if not import_object(IS_FILE)(p["source"]) or not os.path.isfile(p["source"]):
        return [], 0   # (a missing file is the source param's own error)
    tokenizer = import_object(TOKENIZER_OF)(g.model) if isinstance(g.model, dict) else None
    most, why = limit_and_why(g, specs, params, dataset)
    read, bad = import_object(SCAN)(p["source"], tokenizer, p["chat_template"], most, rows=rows, progress=progress,
                                    limit_why=why)
    fail = p["on_error"] == "fail"
    make = error if fail else warning
    hint = "on_error: skip skips bad rows" if fail else "on_error: skip: the run skips and counts it"
    named = bad if rows is None else bad[:NAMED_ROWS]
    diags = [make(message, SourceLoc(file, line), node=dataset, hint=hint) for file, line, message in named]
    if len(bad) > len(named):
        diags.append(make(f"{len(bad) - len(named)} more bad row(s) in the first {read} rows of {p['source']}",
                          g.loc_of(f"nodes.{dataset}.params.source"), node=dataset,
                          hint="dora validate --data names every bad row of the whole file"))
    return diags, read
