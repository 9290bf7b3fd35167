"""The local backend's side of the zygote (dora/runtime/backends/zygote.py): start it, ask it to fork
workers, and learn from it when they end. `ForkedProcess` gives a forked worker the part of Popen's
interface the backend uses (pid, poll, kill, wait)."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time

from dora.runtime.backends.proc_title import room_argument

READY_TIMEOUT_S = 300.0   # the zygote's imports (torch, transformers) on a loaded machine
REPLY_TIMEOUT_S = 30.0    # a fork


class ZygoteError(RuntimeError):
    pass


class ForkedProcess:
    def __init__(self, client: "ZygoteClient", pid: int):
        self.client, self.pid = client, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.client.pump()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
            self.client.pump(0.05)
        return self.returncode


class ZygoteClient:
    def __init__(self, env: dict[str, str], log_path: str | None = None):
        """`log_path`: where the zygote's own stderr goes (its imports' warnings), else nowhere."""
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "dora.runtime.backends.zygote", room_argument()], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        finally:
            if log_path:
                log.close()
        self.children: dict[int, ForkedProcess] = {}
        self.replies: dict[str, int] = {}      # label -> pid of a fork not yet taken by fork()
        self.exits: dict[int, int] = {}        # pid -> rc of a child that ended before fork() took it
        self.pending = b""
        self.ready = False
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready:
            if time.monotonic() > deadline:
                self.close()
                raise ZygoteError(f"the worker zygote did not finish its imports within {READY_TIMEOUT_S:.0f} s")
            self.pump(0.2)

    def fork(self, label: str, argv: list[str], env: dict[str, str], log: str | None) -> ForkedProcess:
        self.replies.pop(label, None)
        req = json.dumps({"label": label, "argv": argv, "env": env, "log": log}) + "\n"
        try:
            self.proc.stdin.write(req.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ZygoteError(f"the worker zygote is gone ({e}): cannot start {label}") from None
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while label not in self.replies:
            if time.monotonic() > deadline:
                raise ZygoteError(f"the worker zygote did not fork {label} within {REPLY_TIMEOUT_S:.0f} s")
            self.pump(0.05)
        pid = self.replies.pop(label)
        child = self.children[pid] = ForkedProcess(self, pid)
        child.returncode = self.exits.pop(pid, None)   # (it may have ended before we heard of it)
        return child

    def pump(self, wait_s: float = 0.0) -> None:
        """Read what the zygote said (fork replies, exits); if it died, its workers died with it."""
        out = self.proc.stdout.fileno()
        if not select.select([out], [], [], wait_s)[0]:
            return
        chunk = os.read(out, 1 << 16)
        if not chunk:
            self._gone()
            return
        self.pending += chunk
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            self._on_message(json.loads(line))

    def _on_message(self, msg: dict) -> None:
        if msg.get("ready"):
            self.ready = True
        elif "exit" in msg:
            child = self.children.pop(int(msg["pid"]), None)
            if child is not None:
                child.returncode = int(msg["rc"])
            else:
                self.exits[int(msg["pid"])] = int(msg["rc"])
        else:
            self.replies[msg["label"]] = int(msg["pid"])

    def _gone(self) -> None:
        rc = self.proc.poll()
        if not self.ready:
            raise ZygoteError(f"the worker zygote exited during its imports (code {rc})")
        for child in self.children.values():   # PR_SET_PDEATHSIG took them along
            if child.returncode is None:
                child.returncode = -signal.SIGKILL

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the zygote (its workers have ended, or are killed with it)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


# ------------------------------------------------------------------ one zygote kept for the process

# Set by pytest for each test, read by nothing the zygote imports: a change of it alone keeps the zygote.
PER_CALL_VARIABLES = ("PYTEST_CURRENT_TEST",)
_kept: dict[str, tuple[dict[str, str], ZygoteClient]] = {}


def keeping() -> bool:
    """DORA_ZYGOTE=keep: a process that runs several local runs one after another (the test suite,
    a benchmark) keeps one zygote between them and pays its imports once."""
    return os.environ.get("DORA_ZYGOTE") == "keep"


def kept(env: dict[str, str]) -> ZygoteClient:
    """The process's kept zygote, started with `env`. One is reused while it lives and the environment
    it was started with is unchanged (a preloaded module may read a variable at import); otherwise it
    is closed and a new one started. Only the main thread keeps one: a zygote dies with the thread
    that started it (PR_SET_PDEATHSIG), and the main thread lives as long as the process."""
    key = {k: v for k, v in env.items() if k not in PER_CALL_VARIABLES}
    held = _kept.get("main")
    if held is not None and (held[0] != key or not held[1].alive()):
        held[1].close()
        held = None
    if held is None:
        held = _kept["main"] = (key, ZygoteClient(env))
    return held[1]


def kept_client() -> ZygoteClient | None:
    """The kept zygote, if this process holds one."""
    held = _kept.get("main")
    return held[1] if held else None


def close_kept() -> None:
    held = _kept.pop("main", None)
    if held is not None:
        held[1].close()


atexit.register(close_kept)
