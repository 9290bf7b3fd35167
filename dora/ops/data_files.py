"""File sources of the dataset op: .jsonl / .json (one JSON object a line) and .parquet, verl-style
rows (the format, with examples: docs/data.md): `prompt` (text, or chat messages [{role, content},
...]), the answer in `reward_model.ground_truth` or `answer`, optional `data_source` (becomes `task`);
other columns are ignored.

Every row is named `PATH:N`: N the line of a .jsonl file, the row (from 1) of a .parquet file. A bad
row (not JSON, not an object, no prompt or answer) is a DatasetError naming it, a BadInput: `dora run`
exits 2 with the message, no traceback; with the dataset's `on_error: skip` the run skips and counts it
(dora/ops/prompt_rows.py collects). `dora validate` reads the first FIRST_ROWS rows of a file source the
same way, `dora validate --data` every row.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator

from dora.graph.diagnostics import BadInput

FIRST_ROWS = 100   # rows `dora validate` reads of a file source (a run reads them all; so does --data)
PROGRESS_ROWS = 4096   # rows between two calls of a reader's progress callback

Progress = Callable[[int, float | None], None]   # (rows read, fraction of the file read, or None)


class DatasetError(BadInput):
    """Unusable data: names the source (file:row) and what is wrong."""


def raw_rows(path: str, progress: Progress | None = None) -> Iterator[tuple[str, object]]:
    """(where, parsed row) for every row of a file, where = "PATH:N"; a row that is not JSON comes as a
    DatasetError in place of the row (the caller's policy decides). A file that cannot be read at all
    raises DatasetError."""
    rows = _parquet_rows(path, progress) if path.endswith(".parquet") else _jsonl_rows(path, progress)
    try:
        yield from rows
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"dataset file {path}: cannot read: {type(e).__name__}: {e}") from None


def _jsonl_rows(path: str, progress: Progress | None) -> Iterator[tuple[str, object]]:
    size = os.path.getsize(path) or 1
    done = 0
    with open(path, "rb") as f:   # (bytes: the position read so far is the progress)
        for lineno, raw in enumerate(f, 1):
            done += len(raw)
            if progress is not None and lineno % PROGRESS_ROWS == 0:
                progress(lineno, done / size)
            if not raw.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield f"{path}:{lineno}", DatasetError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                yield f"{path}:{lineno}", DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg} column {e.colno})")


def _parquet_rows(path: str, progress: Progress | None) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    try:   # batch by batch: validation reads the first rows of a large file only
        reader = pq.ParquetFile(path)
        total = reader.metadata.num_rows or 1
        i = 0
        for batch in reader.iter_batches(batch_size=1024):
            for r in batch.to_pylist():
                i += 1
                yield f"{path}:{i}", r
            if progress is not None:
                progress(i, i / total)
    except (OSError, UnicodeDecodeError):
        raise
    except Exception as e:   # pyarrow's own errors: not a parquet file, a broken one
        raise DatasetError(f"dataset file {path}: cannot read parquet: {type(e).__name__}: {e}") from None


def record_from_row(r: object, where: str, task_default: str) -> dict:
    """{prompt: str | messages, answer: str, task: str} of one file row; DatasetError naming `where`."""
    if isinstance(r, DatasetError):
        raise r
    if not isinstance(r, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(r).__name__}")
    prompt = r.get("prompt")
    if isinstance(prompt, str):
        pass
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        prompt = [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
    else:
        raise DatasetError(f"{where}: column 'prompt' must be text or a list of chat messages "
                           f"[{{role, content}}, ...]; got {type(prompt).__name__} {str(prompt)[:80]!r}")
    answer = None
    rm = r.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        answer = rm["ground_truth"]
    elif r.get("answer") is not None:
        answer = r["answer"]
    if answer is None:
        raise DatasetError(f"{where}: no answer: need column 'reward_model.ground_truth' or 'answer'")
    answer = answer if isinstance(answer, str) else json.dumps(answer)
    return {"prompt": prompt, "answer": answer, "task": str(r.get("data_source") or task_default)}
