"""File sources of the dataset op: .jsonl / .json (one JSON object a line) and .parquet, verl-style
rows: `prompt` (text, or chat messages [{role, content}, ...]), the answer in
`reward_model.ground_truth` or `answer`, optional `data_source` (becomes `task`).

A bad row (not JSON, not an object, no prompt or answer) is bad input: DatasetError names
file:line (a BadInput: `dora run` exits 2 with the message, no traceback). With the dataset's
`on_error: skip` bad rows are skipped and counted instead (Loaded.skipped, the first few named).
`dora validate` reads the first FIRST_ROWS rows of a file source the same way (first_rows_problem).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Iterator

from dora.graph.diagnostics import BadInput

FIRST_ROWS = 100   # rows `dora validate` parses of a file source (whole files are read at run start)
NAMED_SKIPS = 5    # skipped rows named in the run's report; the rest are counted


class DatasetError(BadInput):
    """Unusable data: names the source (file) and the row."""


@dataclasses.dataclass
class Loaded:
    records: list[dict]
    skipped: int = 0
    skipped_where: list[str] = dataclasses.field(default_factory=list)   # the first NAMED_SKIPS, with why


def raw_rows(path: str) -> Iterator[tuple[str, object]]:
    """(where, parsed row) for every row of a file, where = "PATH line N" / "PATH row N"; a row that
    is not JSON comes as a DatasetError in place of the row (the caller's policy decides)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:   # batch by batch: validation reads the first rows of a large file only
            batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
            i = 0
            for batch in batches:
                for r in batch.to_pylist():
                    yield f"{path} row {i}", r
                    i += 1
        except Exception as e:
            raise DatasetError(f"dataset file {path}: cannot read parquet: {type(e).__name__}: {e}") from None
        return
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path} line {lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{path} line {lineno}", DatasetError(f"{path} line {lineno}: not valid JSON ({e.msg})")


def file_records(path: str, size: int, on_error: str = "fail", limit: int | None = None) -> Loaded:
    """The records of a file source (the first `size` good rows; 0 = all); `limit`: read at most
    this many rows (validation's look at the first rows)."""
    if not os.path.isfile(path):
        raise DatasetError(f"dataset file {path!r} does not exist")
    task_default = f"file:{os.path.basename(path)}"
    out = Loaded([])
    for where, row in itertools.islice(raw_rows(path), limit):
        try:
            if isinstance(row, DatasetError):
                raise row
            out.records.append(record_from_row(row, where, task_default))
        except DatasetError as e:
            if on_error != "skip":
                raise
            out.skipped += 1
            if len(out.skipped_where) < NAMED_SKIPS:
                out.skipped_where.append(str(e))
        if size and len(out.records) >= size:
            break
    if not out.records:
        skipped = f" ({out.skipped} bad row(s) skipped, first: {out.skipped_where[0]})" if out.skipped else ""
        raise DatasetError(f"dataset file {path}: no rows{skipped}")
    return out


def record_from_row(r: object, where: str, task_default: str) -> dict:
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


def first_rows_problem(path: str, on_error: str) -> str | None:
    """What `dora validate` says of a file source: its first FIRST_ROWS rows parsed as a run would
    (None: they do)."""
    try:
        file_records(path, 0, on_error, limit=FIRST_ROWS)
    except DatasetError as e:
        return str(e)
    except (OSError, UnicodeDecodeError) as e:
        return f"dataset file {path}: cannot read: {type(e).__name__}: {e}"
    return None
