"""Rows to prompts, one code for the run and for `dora validate`: a row is parsed (file sources,
dora/ops/data_files.py), rendered (the chat template, then the tokenizer) and held to the prompt limit;
what cannot be used is a DatasetError naming the row, which `on_error` turns into a refused run (fail)
or a skipped, counted row (skip).

The limit is the dataset's `max_prompt_tokens` as the run resolves it (dora/graph/prompt_limits.py):
the user's, else, when the model's context is known, the longest prompt the generate nodes it feeds
can take (engine torch: the context less one position to generate; vllm: less max_tokens).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Callable, Iterable, Iterator

from dora.ops.data_files import DatasetError, Progress, raw_rows, record_from_row

NAMED_SKIPS = 5    # skipped rows named in the run's report; the rest are counted


@dataclasses.dataclass
class Loaded:
    records: list[dict]
    skipped: int = 0
    skipped_where: list[str] = dataclasses.field(default_factory=list)   # the first NAMED_SKIPS, with why


def render(record: dict, tokenizer, chat_template: str | None) -> dict:
    """record with `prompt` as the text fed to the model and `prompt_ids` its tokens.

    chat_template: None = the tokenizer's own template if it has one (chat models), else the
    raw text; "none" = never apply a template; any other string = a Jinja template to use.
    """
    prompt = record["prompt"]
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    use_template = chat_template != "none" and (chat_template is not None or getattr(tokenizer, "chat_template", None))
    if use_template and not hasattr(tokenizer, "apply_chat_template"):
        raise DatasetError(f"chat_template is set but the model's tokenizer ({type(tokenizer).__name__}) has no chat "
                           "support; use chat_template: none, or a chat model")
    if use_template:
        kwargs = {"chat_template": chat_template} if chat_template else {}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        # the template already holds the special tokens; adding BOS again would double it
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)
        ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise DatasetError(f"empty prompt after tokenization: {str(prompt)[:80]!r}")
    # what a judge reads as {prompt}: the prompt as written (the last user message), before any template
    question = prompt if isinstance(prompt, str) else next((m["content"] for m in reversed(messages) if m.get("role") == "user"), text)
    return {**record, "prompt": text, "question": question, "prompt_ids": [int(i) for i in ids]}


LIMIT_WHY = "the dataset's max_prompt_tokens, or unset, the longest prompt the generate node's context takes"


def prepared(rows: Iterable[tuple[str, Any]], tokenizer, chat_template: str | None, limit: int | None,
             parse: Callable[[Any, str], dict] | None = None,
             limit_why: str = LIMIT_WHY, keep: Callable[[dict], bool] | None = None) -> Iterator[tuple[str, dict | DatasetError]]:
    """(where, rendered record) per row, or (where, DatasetError) for a row that cannot be used.
    `parse` turns a raw row into a record (file rows); without it rows are records already. A record
    `keep` refuses (the dataset's held-out share) is left out before rendering, neither used nor bad."""
    for where, row in rows:
        try:
            record = parse(row, where) if parse is not None else row
            if keep is not None and not keep(record):
                continue
            try:
                out = render(record, tokenizer, chat_template)
            except DatasetError as e:
                raise DatasetError(f"{where}: {e}") from None
            if limit is not None and len(out["prompt_ids"]) > limit:
                raise DatasetError(f"{where}: the prompt is {len(out['prompt_ids'])} tokens, over the limit of "
                                   f"{limit} ({limit_why})")
            yield where, out
        except DatasetError as e:
            yield where, e


def collect(rows: Iterable[tuple[str, dict | DatasetError]], on_error: str, size: int, source: str) -> Loaded:
    """The first `size` usable records (0 = all): a bad row raises (on_error: fail) or is skipped and
    counted (skip); no usable row at all raises."""
    out = Loaded([])
    for _, item in rows:
        if isinstance(item, DatasetError):
            if on_error != "skip":
                raise item
            out.skipped += 1
            if len(out.skipped_where) < NAMED_SKIPS:
                out.skipped_where.append(str(item))
            continue
        out.records.append(item)
        if size and len(out.records) >= size:
            break
    if not out.records:
        skipped = f" ({out.skipped} bad row(s) skipped, first: {out.skipped_where[0]})" if out.skipped else ""
        raise DatasetError(f"dataset {source}: no rows{skipped}")
    return out


def parse_file_row(path: str) -> Callable[[Any, str], dict]:
    """The `parse` of `prepared` for a file source's raw rows (dora/ops/data_files.raw_rows)."""
    task_default = f"file:{os.path.basename(path)}"
    return lambda row, where: record_from_row(row, where, task_default)


def scan_file(path: str, tokenizer, chat_template: str | None, limit: int | None, rows: int | None = None,
              progress: Progress | None = None, limit_why: str = LIMIT_WHY) -> tuple[int, list[tuple[str, int, str]]]:
    """(rows read, [(file, N, what is wrong)] for every row that cannot be used) over the first `rows`
    rows of a file source (None: all). Without a tokenizer rows are parsed only."""
    problems: list[tuple[str, int, str]] = []
    n = 0
    raw = itertools.islice(raw_rows(path, progress), rows)
    if tokenizer is None:
        items = parsed(raw, parse_file_row(path))
    else:
        items = prepared(raw, tokenizer, chat_template, limit, parse_file_row(path), limit_why)
    for where, item in items:
        n += 1
        if isinstance(item, DatasetError):
            file, _, line = where.rpartition(":")
            message = str(item).removeprefix(f"{where}: ")
            problems.append((file, int(line), message))
    return n, problems


def parsed(rows: Iterable[tuple[str, Any]], parse: Callable[[Any, str], dict]) -> Iterator[tuple[str, dict | DatasetError]]:
    """(where, record) per raw row, or (where, DatasetError): parsing only, no tokenizer."""
    for where, row in rows:
        try:
            yield where, parse(row, where)
        except DatasetError as e:
            yield where, e
