"""The python tool's sandbox (dora/ops/tools/sandbox.py, isolation.py, seccomp_bpf.py) against code a
model could write: the escape battery (tests/sandbox_battery.py: every attempt in one sandboxed
call, one check each), the limits (bombs, floods, disk fill, clocks) as counted error observations
after which the tool goes on, who the child is on the host, and the interpreter_only opt-out.
Needs bubblewrap (`bash .ci/setup` installs it); the whole module takes a few seconds."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from sandbox_battery import ATTEMPTS, batch_script

from dora.ops.tools import sandbox, seccomp_bpf
from dora.ops.tools.python_tool import PythonTool
from dora.ops.tools.sandbox import Limits, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = {"timeout_s": 10.0, "cpu_s": 1, "memory_mb": 128, "max_output_chars": 200, "disk_mb": 4, "max_threads": 8}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """What the battery aims at on the host: a secret beside a run folder, listeners on loopback and
    an abstract unix socket, a process to signal, a canary in this process's environment."""
    run_dir = tmp_path_factory.mktemp("run")
    canary = "dora-canary-" + uuid.uuid4().hex
    (run_dir / "secret.txt").write_text(canary)
    tcp, unix = socket.socket(), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0))
    unix.bind("\0" + canary)
    for s in (tcp, unix):
        s.listen(1)
        s.setblocking(False)
    sleeper = subprocess.Popen(["sleep", "300"])
    os.environ["DORA_SANDBOX_CANARY"] = canary
    yield {"run_dir": str(run_dir), "secret": str(run_dir / "secret.txt"), "port": tcp.getsockname()[1],
           "abstract": canary, "sleeper": sleeper.pid, "parent": os.getpid(), "canary": canary, "project": ROOT,
           "_procs": (sleeper, tcp, unix)}
    del os.environ["DORA_SANDBOX_CANARY"]
    sleeper.kill()
    sleeper.wait()
    tcp.close()
    unix.close()


@pytest.fixture(scope="module")
def battery(host):
    """Every attempt of the battery in one sandboxed call: {attempt: verdict}."""
    script = batch_script({k: v for k, v in host.items() if not k.startswith("_")},
                          seccomp_bpf.ARCHES[platform.machine()][1])
    r = run_python(script, Limits(wall_s=60, cpu_s=30, memory_mb=256))
    assert r.isolation.startswith("bwrap uid 65534, seccomp on"), (r.isolation, r.stderr[-2000:])
    lines = r.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}


@pytest.mark.parametrize("attempt", list(ATTEMPTS))
def test_escape_attempt_is_held(battery, attempt):
    verdict = battery.get(attempt, "no verdict: the process was replaced or died (an exec or a fork got through?)")
    assert verdict.startswith("held"), f"{attempt}: {verdict}"


def test_the_host_is_untouched_by_the_battery(battery, host):
    sleeper, tcp, unix = host["_procs"]
    assert len(battery) == len(ATTEMPTS)
    assert sleeper.poll() is None
    for s in (tcp, unix):
        with pytest.raises(BlockingIOError):   # a connection would wait in the backlog
            s.accept()
    assert not os.path.exists(os.path.join(host["run_dir"], "written.txt"))
    assert not [p for p in ("/usr/lib/dora-escape", "/usr/lib/dora-a", "/usr/lib/dora-b", "/dora-escape") if os.path.exists(p)]


def test_killing_everything_it_can_reach_kills_only_itself(host):
    sleeper = host["_procs"][0]
    r = run_python("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('survived')", Limits(wall_s=20))
    assert not r.ok and "survived" not in r.stdout
    assert sleeper.poll() is None


def test_the_child_is_host_nobody_without_capabilities():
    """Seen from the host: the sandboxed interpreter runs as uid/gid 65534 (never root, whoever calls),
    with no capabilities, no_new_privs and two seccomp filters; nothing of it is left after the call."""
    started = sandbox.start(Limits(wall_s=20, memory_mb=131))
    try:
        status = _wait_for_child(started.proc.pid, '"memory_mb": 131')
        assert re.search(r"^Uid:\s+65534\s+65534\s+65534\s+65534$", status, re.M), status
        assert re.search(r"^Gid:\s+65534\s+65534\s+65534\s+65534$", status, re.M)
        assert re.search(r"^CapEff:\s+0+$", status, re.M) and re.search(r"^CapPrm:\s+0+$", status, re.M)
        assert re.search(r"^NoNewPrivs:\s+1$", status, re.M) and re.search(r"^Seccomp_filters:\s+2$", status, re.M)
    finally:
        r = sandbox.finish(started, {"kind": "cell", "code": "print(1)"}, 20)
    assert r.ok and r.stdout == "1\n"
    deadline = time.monotonic() + 10   # (the kernel tears the namespaces' last processes down just after)
    while _processes_with('"memory_mb": 131') and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_with('"memory_mb": 131')


def test_limits_are_counted_error_observations_and_the_tool_goes_on():
    tool = PythonTool("python", **BASE, warm=1)
    bombs = [("import os\nwhile True:\n    os.fork()", "refused", "PermissionError"),
             ("import threading, time\nts = []\ntry:\n    while True:\n        t = threading.Thread(target=time.sleep, "
              "args=(30,), daemon=True)\n        t.start()\n        ts.append(t)\nexcept RuntimeError:\n    print(len(ts))\n"
              "    raise",
              "threads", "can't start new thread"),
             ("x = bytearray(1 << 30)", "memory", "MemoryError"),
             ("i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (1 << 19))\n    i += 1", "disk",
              "No space left on device"),
             ("while True:\n    print('x' * 1000)", "output", "File too large"),
             ("while True:\n    pass", "cpu", "CPU-time limit of 1 s")]
    try:
        seen = {}
        for code, kind, said in bombs:
            seen[kind] = r = tool.run({"code": code})
            assert r.error and said in r.text, (kind, r.text)
            assert tool.run({"code": "print(6 * 7)"}).text == "42"   # the next call works
        threads = int(re.search(r"^(\d+)$", seen["threads"].text, re.M).group(1))
        assert 0 < threads < BASE["max_threads"]
        assert tool.stats() == {"refused": 1, "threads": 1, "memory": 1, "disk": 1, "output": 1, "cpu": 1}
    finally:
        tool.close()


def test_wall_clock_kills_the_whole_sandbox():
    r = run_python("import time\ntime.sleep(60)", Limits(wall_s=1.0, memory_mb=133))
    assert r.timed_out and r.returncode is None and r.seconds < 10
    deadline = time.monotonic() + 5
    while _processes_with('"memory_mb": 133') and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_with('"memory_mb": 133')


def test_output_errors_and_allowed_packages():
    t = PythonTool("python", **BASE, warm=0, packages=["numpy"])
    try:
        r = t.run({"code": "x = 4837\nprint(x * 2961)\nx + 1"})
        assert (r.text, r.error) == ("14322357\n4838", False)
        r = t.run({"code": "print('before')\n1/0"})
        assert r.error and r.text == "before\nError: ZeroDivisionError: division by zero"
        assert "SyntaxError" in t.run({"code": "def f(:"}).text
        assert "needs a string argument 'code'" in t.run({"script": "1"}).text
        r = t.run({"code": "print('y' * 10000)"})
        assert not r.error and len(r.text) < 300 and "more characters cut" in r.text
        r = t.run({"code": "import numpy\nprint(int(numpy.arange(5).sum()))\nimport os\nprint(sorted(os.listdir('/dora/packages')))"})
        assert r.text.splitlines()[0] == "10" and "'numpy'" in r.text, r.text
        r = t.run({"code": "import pyarrow"})   # installed here, not allowed
        assert r.error and "No module named 'pyarrow'" in r.text
    finally:
        t.close()


def test_a_non_root_caller_gets_the_same_isolation(tmp_path):
    """Run by an unprivileged user (uid 65534 here, with the system's python3 that it can read): bwrap
    starts directly, the user namespace maps the sandbox to the caller."""
    system_python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(system_python) or not shutil_which("setpriv"):
        pytest.skip("needs root (to become another user), /usr/bin/python3 and setpriv")
    if not isolation_reachable(ROOT):
        pytest.skip(f"{ROOT} is not readable by uid 65534")
    code = ("import sys; sys.path.insert(0, %r); from dora.ops.tools.sandbox import run_python, Limits; "
            "r = run_python('import os, socket\\nprint(os.getuid(), sorted(os.listdir(\"/\")))\\nsocket.socket()', Limits()); "
            "print(r.isolation); print(r.stdout); print(r.stderr)") % ROOT
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system_python, "-c", code],
                         capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert "bwrap uid 65534, seccomp on" in out.stdout, out.stdout + out.stderr
    assert "65534 ['dev', 'dora', 'lib', 'lib64', 'proc', 'tmp', 'usr']" in out.stdout
    assert "PermissionError: [Errno 1] Operation not permitted" in out.stdout


@pytest.mark.parametrize("netns", [True, False])
def test_interpreter_only_opt_out_still_refuses_the_obvious(tmp_path, netns):
    """sandbox: interpreter_only (no bubblewrap; dora validate warns): the child's own namespace or
    audit hook cuts the network, and the hook refuses processes, ctypes and writes outside scratch."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    only = Limits(wall_s=10, cpu_s=3, memory_mb=128, mode="interpreter_only", netns=netns)
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')", only)
    server.close()
    assert r.returncode != 0 and "connected" not in r.stdout
    assert r.isolation == ("interpreter_only, network " + ("netns" if netns and "netns" in r.isolation else "audit"))
    outside = tmp_path / "outside.txt"
    for code, refused in (("import os\nos.system('true')", "os.system"), ("import ctypes", "ctypes.dlopen"),
                          (f"open({str(outside)!r}, 'w').write('x')", "writing")):
        r = run_python(code, only)
        assert r.returncode != 0 and "sandbox:" in r.stderr and refused in r.stderr, (code, r.stderr)
    assert not outside.exists()
    r = run_python("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())", only)
    assert r.ok and r.stdout == "ok\n"


def test_seccomp_numbers_match_the_kernel_headers():
    headers = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}
    checked = 0
    for machine, path in headers.items():
        if not os.path.exists(path):
            continue
        defined = {m[0]: int(m[1]) for m in re.findall(r"#define __NR_(\w+)\s+(\d+)\b", open(path).read())}
        for name, number in seccomp_bpf.ARCHES[machine][1].items():
            assert defined.get(name) == number, (machine, name, number, defined.get(name))
            checked += 1
    if not checked:
        pytest.skip("no kernel headers here (Debian: linux-libc-dev)")
    for machine in seccomp_bpf.ARCHES:
        prog = seccomp_bpf.base_filter(machine)
        assert len(prog) % 8 == 0 and prog[-4:] == seccomp_bpf.RET_ALLOW.to_bytes(4, sys.byteorder)


def _processes_with(text: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(p))
            except OSError:
                pass
    return out


def _wait_for_child(launcher: int, text: str) -> str:
    """The /proc status of the sandboxed interpreter (its cmdline holds `text`), once it waits on stdin."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for pid in _processes_with(text):
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
            if "python" in status.split("\n", 1)[0] and "Seccomp_filters:\t2" in status:
                return status
        time.sleep(0.02)
    raise AssertionError(f"no sandboxed interpreter under launcher {launcher}")


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def isolation_reachable(path: str) -> bool:
    """Whether uid 65534 can read `path` (every folder on the way lets others through)."""
    parts = os.path.realpath(path).split(os.sep)
    return all(os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & 0o005 == 0o005 for i in range(1, len(parts) + 1))


def test_a_warm_sandbox_that_died_idle_is_never_handed_out():
    from dora.ops.tools.sandbox_pool import WarmPool

    pool = WarmPool(Limits(wall_s=20), size=1)
    try:
        deadline = time.monotonic() + 20
        while not pool.idle and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(pool.idle[0].proc.pid, signal.SIGKILL)
        pool.idle[0].proc.wait(timeout=10)
        r = run_python("print('fresh')", Limits(wall_s=20), pool)
        assert r.ok and r.stdout == "fresh\n" and (pool.warm_starts, pool.cold_starts) == (0, 1)
        deadline = time.monotonic() + 20
        while not pool.idle and time.monotonic() < deadline:   # refilled by its starter thread
            time.sleep(0.02)
        assert run_python("print('warm')", Limits(wall_s=20), pool).stdout == "warm\n" and pool.warm_starts == 1
    finally:
        pool.close()
    assert not pool.idle
