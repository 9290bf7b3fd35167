"""The local backend: one OS process per node replica, no services.

On Linux the workers are forked from a zygote (dora/runtime/backends/zygote.py) that imported what
they all need once, so a run pays torch's and transformers' import once instead of once per worker;
elsewhere (or with DORA_ZYGOTE=0) each is `python -m dora.runtime.worker`. Either way workers
inherit this interpreter and sys.path (so user ops importable here import there too), log to
run_dir/logs/<node>-<replica>.log, and die with their parent (PR_SET_PDEATHSIG).
Data transport: by default each worker's inbox binds an ipc:// (Unix domain) socket in a private
temp folder (mode 0700, removed at the end), because on one machine it moves large batches ~1.7x
faster than tcp loopback (benchmarks/channel.py --transport; docs/benchmarks.md). transport="tcp"
(or DORA_TRANSPORT=tcp) binds a random tcp port on 127.0.0.1 instead. Control stays on tcp.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from dora.runtime.backends.launch_spec import Launch
from dora.runtime.backends import zygote_client
from dora.runtime.backends.zygote_client import ZygoteClient
from dora.runtime.run_files import write_owner


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


def default_transport() -> str:
    return "tcp" if sys.platform == "win32" else "ipc"   # libzmq has no ipc:// on Windows


def resolve_transport(transport: str | None = None) -> str:
    """The data transport a local run uses: the option, else DORA_TRANSPORT, else the default."""
    transport = transport or os.environ.get("DORA_TRANSPORT") or default_transport()
    if transport not in ("tcp", "ipc"):
        raise ValueError(f"local backend transport must be 'tcp' or 'ipc', got {transport!r} "
                         "(the transport option or DORA_TRANSPORT)")
    return transport


def ipc_folder() -> str:
    """A private folder for the inbox sockets. Unix socket paths are limited to ~104 bytes, so a
    long TMPDIR is passed over for /tmp (worker_setup.ipc_socket_path shortens long node names)."""
    base = tempfile.gettempdir()
    if len(base) > 60 and os.path.isdir("/tmp"):
        base = "/tmp"
    folder = tempfile.mkdtemp(prefix="dora-ipc-", dir=base)   # mkdtemp: exclusive, mode 0700
    write_owner(folder)   # so a later run can remove it if this one is kill -9ed
    return folder


class LocalBackend:
    name = "local"

    def __init__(self, host: str = "127.0.0.1", transport: str | None = None, zygote: bool | None = None):
        self.host, self.transport = host, resolve_transport(transport)
        if zygote is None:
            zygote = hasattr(os, "fork") and sys.platform.startswith("linux") and os.environ.get("DORA_ZYGOTE") != "0"
        self.use_zygote = zygote
        self.zygote: ZygoteClient | None = None
        self.zygote_kept = False   # the process's kept zygote (DORA_ZYGOTE=keep): not closed with the run
        self.ipc_dir: str | None = None
        self.procs: dict[str, Any] = {}   # label -> subprocess.Popen or zygote_client.ForkedProcess
        self.logs: dict[str, str] = {}
        self._reported: set[str] = set()

    def start(self, launches: list[Launch]) -> None:
        path = os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)] + [os.getcwd()])
        if self.transport == "ipc" and self.ipc_dir is None:
            self.ipc_dir = ipc_folder()
        for ln in launches:
            self._reported.discard(ln.label)   # (a respawn starts a replica again under its label)
            env = {**os.environ, **ln.env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
            if ln.keys:
                env["DORA_RUN_KEYS"] = json.dumps(ln.keys)   # readable by this user only (/proc/PID/environ)
            argv = ["--control", ln.control, "--node", ln.node, "--replica", str(ln.replica),
                    "--host", self.host] + (["--ipc-dir", self.ipc_dir] if self.ipc_dir else [])
            if self.use_zygote:
                if self.zygote is None:
                    self.zygote = self._zygote({**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}, ln.log_path)
                self.procs[ln.label] = self.zygote.fork(ln.label, argv, env, ln.log_path)
            else:
                out = open(ln.log_path, "ab") if ln.log_path else subprocess.DEVNULL
                self.procs[ln.label] = subprocess.Popen([sys.executable, "-m", "dora.runtime.worker", *argv], env=env,
                                                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                if ln.log_path:
                    out.close()
            if ln.log_path:
                self.logs[ln.label] = ln.log_path

    def _zygote(self, env: dict[str, str], log_path: str | None) -> ZygoteClient:
        """This run's zygote; under DORA_ZYGOTE=keep (from the main thread) the process's kept one."""
        if zygote_client.keeping() and threading.current_thread() is threading.main_thread():
            self.zygote_kept = True
            return zygote_client.kept(env)
        return ZygoteClient(env, os.path.join(os.path.dirname(log_path), "zygote.log") if log_path else None)

    def pid(self, label: str) -> int | None:
        p = self.procs.get(label)
        return p.pid if p else None

    def log_tail(self, label: str, n: int = 20) -> str:
        path = self.logs.get(label)
        if not path or not os.path.exists(path):
            return ""
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")

    def kill(self, label: str) -> None:
        """End one replica's process now (a respawn replaces a hung or failed one)."""
        p = self.procs.get(label)
        if p is not None and p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._reported.add(label)   # its exit is known, not news

    def exited(self) -> list[tuple[str, str]]:
        out = []
        for label, p in self.procs.items():
            rc = p.poll()
            if rc is not None and label not in self._reported:
                self._reported.add(label)
                out.append((label, f"process {p.pid} {describe_exit(rc)}"))
        return out

    def shutdown(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()  # SIGKILL also ends a SIGSTOPped process
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.zygote is not None and not self.zygote_kept:
            self.zygote.close()
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
