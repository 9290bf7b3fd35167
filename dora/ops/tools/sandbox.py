"""Run untrusted Python in a sandbox: a fresh interpreter per call, isolated by the operating system
(mode "bwrap", the default: bubblewrap's namespaces, a read-only view of the interpreter only, a
private scratch tmpfs, seccomp; isolation.py and seccomp_bpf.py), with limits on wall clock, CPU
time, memory, threads, file size, scratch size and output. The threat model, and what it does not
hold against: docs/architecture.md ("The tool sandbox").

mode "interpreter_only" is the loudly named opt-out for machines without bubblewrap: the child
confines itself from inside the interpreter (sandbox_audit.py), which is not a security boundary.

Here the parent adds the wall clock: the launcher is its own process group (start_new_session),
killed whole with SIGKILL when `wall_s` passes; the sandboxed processes die with it (bubblewrap's
--die-with-parent and its PID namespace). stdout and stderr go to files in a host folder the child
never sees, each at most `output_bytes` (RLIMIT_FSIZE); the caller cuts what the model reads. The
whole call is bounded: wall_s, then at most KILL_WAIT_S for the killed group to be reaped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from dora.ops.tools import isolation, seccomp_bpf

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD, HARNESS = (os.path.join(HERE, f) for f in ("sandbox_child.py", "sandbox_harness.py"))
MARKER = "\x00dora-sandbox: "
KILL_WAIT_S = 5.0
PROBE_WALL_S = 20.0
NOBODY = 65534
MODES = ("bwrap", "interpreter_only")
LAUNCH_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 256
    output_bytes: int = 1 << 20   # each of stdout and stderr, and any file the code writes (RLIMIT_FSIZE)
    disk_mb: int = 16             # the scratch tmpfs (bwrap)
    max_threads: int = 16         # RLIMIT_NPROC in the sandbox's user namespace (bwrap; new processes are refused)
    mode: str = "bwrap"
    packages: tuple[str, ...] = ()   # host paths of the packages the code may import (package_paths)
    netns: bool = True            # interpreter_only: False skips the namespace (tests the audit fallback)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None    # None: killed at the wall clock
    timed_out: bool
    seconds: float
    isolation: str            # what the child reported ("bwrap uid 65534, seccomp on", ...); "" if it never said

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class SandboxUnavailable(RuntimeError):
    """This machine cannot start the sandbox the tool asks for (the message says what to install)."""


@dataclasses.dataclass
class Started:
    """A confined child waiting on stdin for its payload (started cold for one call, or ahead of it
    by a WarmPool)."""
    proc: subprocess.Popen
    host: str                 # host folder of its stdout / stderr files (0700, never inside the sandbox)
    mode: str

    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        _kill_group(self.proc)
        shutil.rmtree(self.host, ignore_errors=True)


def run_python(code: str, limits: Limits, pool=None) -> SandboxResult:
    """Run `code` as a notebook cell (a last expression prints its repr)."""
    return run({"kind": "cell", "code": code}, limits, pool)


def run(payload: dict, limits: Limits, pool=None) -> SandboxResult:
    """Run a payload in a sandbox: a warm one from `pool` (sandbox_pool.WarmPool) when it has one."""
    started = pool.take() if pool is not None else start(limits)
    return finish(started, payload, limits.wall_s)


def start(limits: Limits) -> Started:
    if limits.mode not in MODES:
        raise ValueError(f"sandbox mode {limits.mode!r} is not one of {MODES}")
    host = tempfile.mkdtemp(prefix="dora-sandbox-")
    fds: list[int] = []
    try:
        argv, fds = _bwrap_argv(limits, fds) if limits.mode == "bwrap" else _interpreter_argv(limits, host)
        with open(os.path.join(host, "stdout"), "wb") as out, open(os.path.join(host, "stderr"), "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=host, pass_fds=fds,
                                    start_new_session=True, close_fds=True, env=LAUNCH_ENV)
    except BaseException:
        shutil.rmtree(host, ignore_errors=True)
        raise
    finally:
        _close(fds)
    return Started(proc, host, limits.mode)


def finish(started: Started, payload: dict, wall_s: float) -> SandboxResult:
    """Hand the payload over, wait at most wall_s (then kill the group), read what it wrote."""
    t0 = time.perf_counter()
    try:
        timed_out = _communicate(started.proc, json.dumps(payload).encode("utf-8", "replace"), wall_s)
        stdout, stderr = _read(os.path.join(started.host, "stdout")), _read(os.path.join(started.host, "stderr"))
    finally:
        shutil.rmtree(started.host, ignore_errors=True)
    isolation_said = ""
    if stderr.startswith(MARKER):
        first, _, stderr = stderr.partition("\n")
        isolation_said = first[len(MARKER):]
    status = None if timed_out else _status(started.proc.returncode, started.mode)
    return SandboxResult(stdout, stderr, status, timed_out, time.perf_counter() - t0, isolation_said)


def _status(returncode: int, mode: str) -> int:
    """The child's exit status as Popen reports a process's own (-N: killed by signal N): bubblewrap
    passes on a child killed by signal N as exit status 128 + N."""
    if mode == "bwrap" and 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


def _communicate(proc: subprocess.Popen, data: bytes, wall_s: float) -> bool:
    """Feed stdin and wait; True when the wall clock ran out (the group is then killed)."""
    try:
        proc.communicate(data, timeout=wall_s)
        return False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return True
    except BaseException:
        _kill_group(proc)
        raise


def _bwrap_argv(limits: Limits, fds: list[int]) -> tuple[list[str], list[int]]:
    view = _view(limits.packages)
    seccomp_fd = _memfd("dora-seccomp", _base_filter()) if seccomp_bpf.supported() else None
    fds += [seccomp_fd] if seccomp_fd is not None else []
    arg_fd = os.memfd_create("dora-bwrap-args", 0)
    fds.append(arg_fd)
    files = [(_memfd(name, data), f"{isolation.CHILD_DIR}/{name}") for name, data in _child_scripts()]
    fds += [fd for fd, _ in files]
    cfg = {"mode": "bwrap", "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "output_bytes": limits.output_bytes,
           "max_threads": limits.max_threads, "process_filter": _process_filter().hex(),
           "packages_dir": isolation.PACKAGES_DIR if limits.packages else None}
    child = [isolation.interpreter(), "-I", "-S", "-B", f"{isolation.CHILD_DIR}/sandbox_child.py", json.dumps(cfg)]
    argv, options = isolation.command(view, child, limits.disk_mb << 20, arg_fd, seccomp_fd, files)
    os.write(arg_fd, options)
    os.lseek(arg_fd, 0, os.SEEK_SET)
    return argv, fds


def _interpreter_argv(limits: Limits, host: str) -> tuple[list[str], list[int]]:
    scratch = os.path.join(host, "scratch")
    os.mkdir(scratch)
    if os.getuid() == 0:   # the child may drop to nobody: its scratch folder (and the way to it) must stay its own
        os.chown(scratch, NOBODY, NOBODY)
        os.chmod(host, 0o711)
    cfg = {"mode": "interpreter_only", "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "netns": limits.netns,
           "output_bytes": limits.output_bytes, "scratch": scratch, "max_threads": 0}
    return [sys.executable, "-I", "-S", "-B", CHILD, json.dumps(cfg)], []


@functools.lru_cache(maxsize=16)
def _view(packages: tuple[str, ...]) -> isolation.View:
    return isolation.interpreter_view(list(packages))


@functools.lru_cache(maxsize=1)
def _child_scripts() -> tuple[tuple[str, bytes], ...]:
    """(name, bytes) of the scripts the sandboxed interpreter runs (copied in, never bound)."""
    out = []
    for path in (CHILD, HARNESS):
        with open(path, "rb") as f:
            out.append((os.path.basename(path), f.read()))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _base_filter() -> bytes:
    return seccomp_bpf.base_filter()


@functools.lru_cache(maxsize=1)
def _process_filter() -> bytes:
    return seccomp_bpf.process_filter() if seccomp_bpf.supported() else b""


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close(fds: list[int]) -> None:
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:   # unkillable (D state): leave it; the call itself stays bounded
        pass


def _read(path: str) -> str:
    """The file's text (its size is bounded by the child's RLIMIT_FSIZE)."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


@functools.lru_cache(maxsize=None)
def unavailable(mode: str = "bwrap") -> str | None:
    """Why this machine cannot run sandbox `mode` (None: it can), probed once per process: the tools
    on PATH, then one real sandboxed run (user namespaces may be refused inside a container)."""
    if mode != "bwrap":
        return None
    missing = isolation.missing_tool()
    if missing:
        return missing
    r = run_python("print('ok')", Limits(wall_s=PROBE_WALL_S, cpu_s=10))
    if r.ok and r.stdout == "ok\n":
        return None
    said = " ".join((r.stderr.strip() or f"exit status {r.returncode}").splitlines()[-3:])[:400]
    return (f"bubblewrap is installed but cannot start the python sandbox here ({said}). Inside a container it "
            "needs user namespaces (or run dora in a VM); see docs/architecture.md, 'The tool sandbox'")
