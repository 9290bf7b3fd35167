"""Run untrusted Python in a confined child process with time, memory and output limits and no network.

The child (sandbox_child.py, stdlib only) confines itself before it runs the code: an empty
network namespace (or an audit hook refusing sockets where namespaces are not allowed), rlimits on
CPU time, address space and file size, no new processes, no foreign calls, no file changes outside
its scratch folder (and uid nobody when running as root, where the standard library allows it).
Here the parent adds the wall clock: the child is its own process group (start_new_session), killed
whole with SIGKILL when `wall_s` passes. stdout and stderr go to files in the scratch folder, each
at most OUTPUT_BYTES (RLIMIT_FSIZE: a child writing more is killed by SIGXFSZ); the caller cuts
what the model reads. The whole call is bounded:
wall_s, then at most KILL_WAIT_S for the killed group to be reaped.

It confines model-written code against accidents and the obvious escapes; it is not a boundary
against a determined attacker with a kernel exploit (use a VM for that).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
MARKER = "\x00dora-sandbox: "
KILL_WAIT_S = 5.0
OUTPUT_BYTES = 1 << 20
NOBODY = 65534


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 256
    netns: bool = True        # False: skip the namespace and refuse sockets with the audit hook (tests the fallback)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None    # None: killed at the wall clock
    timed_out: bool
    seconds: float
    network: str              # "netns" or "audit": how the network was cut off ("" if the child never said)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(code: str, limits: Limits) -> SandboxResult:
    t0 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="dora-tool-")
    try:
        if os.getuid() == 0:   # the child may drop to nobody: its scratch folder must stay its own
            os.chown(scratch, NOBODY, NOBODY)
        cfg = {"cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb, "netns": limits.netns, "scratch": scratch,
               "output_bytes": OUTPUT_BYTES}
        out_path, err_path = os.path.join(scratch, ".stdout"), os.path.join(scratch, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", CHILD, json.dumps(cfg)], stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, cwd=scratch, start_new_session=True, close_fds=True,
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            timed_out = False
            try:
                proc.communicate(code.encode("utf-8", "replace"), timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)
                raise
        stdout = _read(out_path)
        stderr, network = _read(err_path), ""
        if stderr.startswith(MARKER):
            first, _, stderr = stderr.partition("\n")
            network = first[len(MARKER):]
        return SandboxResult(stdout, stderr, None if timed_out else proc.returncode, timed_out,
                             time.perf_counter() - t0, network)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
