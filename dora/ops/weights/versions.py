"""Versioned weight hand-off from the trainer (update op) to rollout engines (generate op).

    save_version(state_dict, run_dir, version) -> (path, bytes)
    load_version(model, path) -> None            in place, strict, bit-exact

One safetensors file per version, `v000007.safetensors`, in a per-run folder on /dev/shm
(`/dev/shm/dora-<run name>-<hash of run_dir>/`: tmpfs, so a save is a memory copy) when /dev/shm
exists and has room for two copies, else in `<run_dir>/weights/`. A file is written under a
temporary name and renamed, so a reader never sees half a version. The update op reports the path
in its {"kind": "weights", "version", "path", "bytes", "seconds"} event; the controller passes it to
generate replicas, which load it between requests.

Tied weights (lm_head sharing the embedding's storage) are stored once, under the first name
in state_dict order; the other names are recorded in the file's metadata ("dora_aliases") and
restored by load_version. Loaders that do not read the metadata (e.g. the torch engine's
load_state_dict_into) see the tied head missing, which they accept for tied models.

Old versions are removed by prune_versions(run_dir, keep); cleanup(run_dir) removes the /dev/shm
folder at the end of a run. The files are always written (any replica may be asked to load any
version in the window); `weight_sync: broadcast` adds a torch.distributed push of every version
into the replicas' memory (dora/ops/weights/broadcast.py), so a load need not touch the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
# torch and safetensors.torch are imported where weights are read or written: the driver of a run
# uses this module only for folder names and cleanup, and does not pay torch's import for them.

SHM = "/dev/shm"
_VERSION_FILE = re.compile(r"^v(\d+)\.safetensors$")


def shm_dir(run_dir: str) -> str:
    absolute = os.path.abspath(run_dir)
    digest = hashlib.sha1(absolute.encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(absolute.rstrip("/")) or "run")
    return os.path.join(SHM, f"dora-{name}-{digest}")


def _disk_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "weights")


def weights_dir(run_dir: str, nbytes: int = 0) -> str:
    """Where versions of this run go: /dev/shm when usable with room for 2 x nbytes, else run_dir/weights."""
    if os.path.isdir(SHM) and os.access(SHM, os.W_OK):
        try:
            if shutil.disk_usage(SHM).free > 2 * nbytes:
                return shm_dir(run_dir)
        except OSError:
            pass
    return _disk_dir(run_dir)


def version_file(version: int) -> str:
    return f"v{int(version):06d}.safetensors"


def _dedupe(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU contiguous tensors with shared storage stored once; returns (tensors, {alias: kept name})."""
    seen: dict[tuple, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state_dict.items():
        t = t.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.to("cpu").contiguous()
    return tensors, aliases


def save_version(state_dict: dict[str, torch.Tensor], run_dir: str, version: int) -> tuple[str, int]:
    """Write one version's weights; returns (path, file size in bytes)."""
    tensors, aliases = _dedupe(state_dict)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    directory = weights_dir(run_dir, nbytes)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, version_file(version))
    tmp = f"{path}.tmp{os.getpid()}"
    from safetensors.torch import save_file
    save_file(tensors, tmp, metadata={"dora_version": str(int(version)), "dora_aliases": json.dumps(aliases)})
    os.replace(tmp, path)
    return path, os.path.getsize(path)


def read_version(path: str) -> dict[str, torch.Tensor]:
    """The full state dict stored at path (aliases restored), on CPU."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file {path!r} does not exist (pruned, or from another run?)")
    from safetensors import safe_open
    from safetensors.torch import load_file
    tensors = load_file(path, device="cpu")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    for alias, name in json.loads(meta.get("dora_aliases", "{}")).items():
        tensors[alias] = tensors[name]
    return tensors


def load_version(model: torch.nn.Module, path: str) -> None:
    """Copy the weights at path into model in place (same names and shapes required)."""
    import torch
    tensors = read_version(path)
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise ValueError(f"weights {path!r} do not fit {type(model).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, dst in own.items():
        src = tensors[name]
        if src.shape != dst.shape:
            raise ValueError(f"weights {path!r}: {name} has shape {tuple(src.shape)}, the model has {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(src)


def list_versions(run_dir: str) -> list[tuple[int, str]]:
    """(version, path) of every stored version of this run, oldest first (both locations)."""
    found = []
    for directory in {shm_dir(run_dir), _disk_dir(run_dir)}:
        if os.path.isdir(directory):
            for f in os.listdir(directory):
                m = _VERSION_FILE.match(f)
                if m:
                    found.append((int(m.group(1)), os.path.join(directory, f)))
    return sorted(found)


def prune_versions(run_dir: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` versions; returns the removed paths."""
    removed = []
    for _, path in list_versions(run_dir)[: -keep if keep > 0 else None]:
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def cleanup(run_dir: str) -> None:
    """Remove this run's /dev/shm folder (call once the run has ended)."""
    shutil.rmtree(shm_dir(run_dir), ignore_errors=True)
