"""What a run keeps outside its run dir (weights in /dev/shm, socket folders), owned by pid.

A run claims each such folder by creating it exclusively with mode 0700 and writing `owner.json`
({pid, run_dir, host}) into it. A folder that exists and is not this run's is refused while its
owner lives; once its owner is dead (a `dora run` that was kill -9ed) any later run removes it
(`sweep_stale`). See docs/architecture.md, "Run lifecycle".
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import tempfile

OWNER = "owner.json"


class RunFilesError(RuntimeError):
    """A folder this run needs belongs to another live run (or to another user)."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # alive, someone else's
    return True


def owner_of(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, OWNER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _is_stale(folder: str) -> bool:
    owner = owner_of(folder)
    if owner is None:
        return False   # not one we can judge: leave it
    if owner.get("host") not in (None, socket.gethostname()):
        return False   # a pid means nothing on another host
    return not pid_alive(int(owner.get("pid", -1)))


def claim(folder: str, run_dir: str) -> None:
    """Create `folder` for this run: exclusively, mode 0700, with an owner file. A stale folder (its
    owner died) is removed first; a live run's or another user's is refused."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        owner = owner_of(folder)
        if owner is not None and int(owner.get("pid", -1)) == os.getpid():
            return
        st = os.stat(folder)
        if st.st_uid != os.getuid():
            raise RunFilesError(f"{folder} exists and belongs to uid {st.st_uid}, not this user: refusing to use it") from None
        if owner is not None and not _is_stale(folder):
            raise RunFilesError(f"{folder} is in use by a live run (pid {owner.get('pid')}, run dir "
                                f"{owner.get('run_dir')}): one run per run dir") from None
        shutil.rmtree(folder, ignore_errors=True)   # stale, or an ownerless leftover of this run dir
        os.mkdir(folder, 0o700)
    write_owner(folder, run_dir)


def write_owner(folder: str, run_dir: str | None = None) -> None:
    """Mark `folder` as this process's (a later run removes it once this process is gone)."""
    with open(os.path.join(folder, OWNER), "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "run_dir": run_dir and os.path.abspath(run_dir), "host": socket.gethostname()}, f)


def stale_roots() -> list[str]:
    """Where runs keep folders: shared memory and the temp dirs socket folders go to."""
    roots = ["/dev/shm", tempfile.gettempdir(), "/tmp"]
    return [r for r in dict.fromkeys(roots) if os.path.isdir(r)]


def sweep_stale() -> list[str]:
    """Remove the dora folders of runs whose owner process is gone; returns what was removed."""
    removed = []
    for root in stale_roots():
        for folder in glob.glob(os.path.join(root, "dora-*")):
            if os.path.isdir(folder) and _is_stale(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed
