"""Whole-run checkpoints: everything `dora run --resume` needs, in RUN_DIR/checkpoints/step_N/.

    step_N/                  a transformers folder (config, weights, tokenizer): from_pretrained loads it;
                             the only copy of the full weights (dora/ops/weights/pretrained.py)
    step_N/sharded/, trainer_state.pt, dora_state.json   the trainer's own state: optimizer shards, lr
                             step, RNG (written by the update op)
    step_N/run_state.json    step, version, dataset cursors, generate replicas' RNG, accounting, and the
                             prompt groups that were in flight (dispatched again, whole, on resume)
    step_N/pending.arrow     trajectories finished and scored but not trained yet (whole groups)
    step_N/manifest.json     every other file's size and sha256, written last

Written into step_N.partial/ (the trainer's part first, then the driver's, the manifest last) and
renamed. `--resume` trusts the newest folder whose files match its manifest (trusted()); a torn or
corrupted one is named and skipped for the one before. With run.save_optimizer: last, committing a
checkpoint takes the optimizer state out of the older ones kept (drop_optimizer: manifest first, then
the files), so they are weights and run state; a resume from one says AdamW starts afresh. A disk that fills up during a checkpoint
leaves the earlier ones untouched (the partial folder is removed) and fails the run naming the path
and the bytes needed (NoSpace). The newest `keep` are kept. See docs/architecture.md, "Run lifecycle".
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from typing import Any, NamedTuple

import pyarrow as pa

STATE = "run_state.json"
PENDING = "pending.arrow"
MANIFEST = "manifest.json"
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


def commit(run_dir: str, step: int, keep: int, optimizer_in_newest_only: bool = False) -> str:
    """Write the staged checkpoint's manifest, rename it into place and drop all but the newest `keep`
    complete ones (and, optimizer_in_newest_only, the optimizer state of all but the newest)."""
    final = folder(run_dir, step)
    write_manifest(final + ".partial")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(final + ".partial", final)
    done = complete(run_dir)
    for _, old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    if optimizer_in_newest_only:
        for _, old in done[-keep:-1]:
            drop_optimizer(old)
    return final


OPTIMIZER_DIR = "sharded"   # the trainer's optimizer shards in a checkpoint (dora/ops/weights/pretrained.py)


def drop_optimizer(path: str) -> None:
    """Take the optimizer state out of a committed checkpoint, so that at every moment its manifest
    matches what a resume would read: the manifest without those files first, then the folder renamed
    away (a resume reads no optimizer from then on) and removed."""
    shards = os.path.join(path, OPTIMIZER_DIR)
    if not os.path.isdir(shards):
        return
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return   # not a checkpoint a resume would trust anyway: leave it as it is
    kept = {rel: v for rel, v in files.items() if not rel.startswith(OPTIMIZER_DIR + os.sep)}
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"files": kept}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    gone = shards + ".dropped"
    os.replace(shards, gone)
    shutil.rmtree(gone, ignore_errors=True)


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


# -- manifest: is a checkpoint whole? ------------------------------------------------------------


def _files(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
                  if not (d == path and f == MANIFEST))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(path: str) -> None:
    """Every file of the staged checkpoint with its size and sha256, fsynced: written last, so a
    manifest that matches means every file before it was written whole."""
    files = {rel: {"bytes": os.path.getsize(os.path.join(path, rel)), "sha256": _sha256(os.path.join(path, rel))}
             for rel in _files(path)}
    with open(os.path.join(path, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify(path: str) -> str | None:
    """What is wrong with a checkpoint folder (None: every file its manifest lists is there with its
    size and checksum)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            files = json.load(f)["files"]
    except FileNotFoundError:
        return "no manifest.json (torn: the run died while writing it)"
    except (ValueError, KeyError, TypeError) as e:
        return f"manifest.json unreadable ({type(e).__name__}: {e})"
    for rel, want in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        if os.path.getsize(full) != want["bytes"]:
            return f"{rel} has {os.path.getsize(full)} bytes, the manifest says {want['bytes']}"
        if _sha256(full) != want["sha256"]:
            return f"{rel} does not match its checksum (corrupted)"
    return None


def trusted(run_dir: str) -> tuple[tuple[int, str] | None, list[tuple[str, str]]]:
    """(step, folder) of the newest checkpoint that verifies, and (folder, why) of each newer one
    that does not."""
    skipped = []
    for step, path in reversed(complete(run_dir)):
        problem = verify(path)
        if problem is None:
            return (step, path), skipped
        skipped.append((path, problem))
    return None, skipped


class NoSpace(OSError):
    """The disk filled up during a checkpoint: names the path and the bytes needed."""


def out_of_space(e: BaseException) -> bool:
    """An ENOSPC, raised here or reported by the trainer's worker (its error text)."""
    return getattr(e, "errno", None) == errno.ENOSPC or "[Errno 28]" in str(e) or "No space left on device" in str(e)


def no_space(run_dir: str, step: int, needed: int) -> NoSpace:
    """Remove checkpoint `step`'s partial folder (the earlier checkpoints stay as they were) and say
    how much room the next attempt needs."""
    staged = folder(run_dir, step) + ".partial"
    written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(staged) for f in fs)
    shutil.rmtree(staged, ignore_errors=True)
    free = shutil.disk_usage(os.path.dirname(staged)).free
    need = max(needed, written)
    last = latest(run_dir)
    kept = f"checkpoint step_{last[0]} is intact (resume from it)" if last else "no earlier checkpoint"
    return NoSpace(errno.ENOSPC, f"no space left on device writing checkpoint {staged}: it needs about {need} bytes "
                                 f"({_mib(need)}), {free} bytes ({_mib(free)}) are free; {kept}")


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB"
