"""Whole-run checkpoints: everything `dora run --resume` needs, in RUN_DIR/checkpoints/step_N/.

    step_N/                  a transformers folder (config, weights, tokenizer): from_pretrained loads it
    step_N/trainer/          the trainer's own state: optimizer, lr step, RNG (written by the update op)
    step_N/run_state.json    step, version, dataset cursors, generate replicas' RNG, accounting, and the
                             prompt groups that were in flight (dispatched again, whole, on resume)
    step_N/pending.arrow     trajectories finished and scored but not trained yet (whole groups)

Written into step_N.partial/ (the trainer's part first, then the driver's) and renamed: a folder named
step_N is always complete. The newest `keep` are kept. See docs/architecture.md, "Run lifecycle".
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, NamedTuple

import pyarrow as pa

STATE = "run_state.json"
PENDING = "pending.arrow"
_STEP = re.compile(r"^step_(\d+)$")


class Resume(NamedTuple):
    """What `dora run --resume` continues from: the checkpoint folder, its run state and pending
    trajectories, and the newer checkpoint folders it did not trust (moved to rolled_back/)."""

    folder: str
    state: dict[str, Any]
    pending: pa.Table | None
    skipped: list[str]


def folder(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{int(step)}")


def staging(run_dir: str, step: int) -> str:
    """A fresh, empty folder to write checkpoint `step` into."""
    path = folder(run_dir, step) + ".partial"
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def write_state(path: str, state: dict[str, Any], pending: pa.Table | None) -> None:
    if pending is not None and pending.num_rows:
        with pa.OSFile(os.path.join(path, PENDING), "wb") as sink, pa.ipc.new_file(sink, pending.schema) as writer:
            writer.write_table(pending)
    with open(os.path.join(path, STATE), "w", encoding="utf-8") as f:
        json.dump(state, f)


def commit(run_dir: str, step: int, keep: int) -> str:
    """Rename the staged checkpoint into place and drop all but the newest `keep` complete ones."""
    final = folder(run_dir, step)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(folder(run_dir, step) + ".partial", final)
    for _, old in complete(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete(run_dir: str) -> list[tuple[int, str]]:
    """(step, folder) of every complete whole-run checkpoint, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    found = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = _STEP.match(name)
            if m and os.path.isfile(os.path.join(root, name, STATE)):
                found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def latest(run_dir: str) -> tuple[int, str] | None:
    found = complete(run_dir)
    return found[-1] if found else None


def read(path: str) -> tuple[dict[str, Any], pa.Table | None]:
    """(run state, pending trajectories or None) of a complete checkpoint folder."""
    with open(os.path.join(path, STATE), encoding="utf-8") as f:
        state = json.load(f)
    pending_path = os.path.join(path, PENDING)
    pending = pa.ipc.open_file(pending_path).read_all() if os.path.isfile(pending_path) else None
    return state, pending
