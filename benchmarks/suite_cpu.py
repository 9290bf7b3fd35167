"""What each test costs in CPU seconds: the pytest process and every process it started, grandchildren
included (workers forked from a run's zygote, Ray's daemons, the vllm server).

    python benchmarks/suite_cpu.py tests/test_a.py [tests/test_b.py::test_x ...] [--json out.json]

On a shared machine wall time says more about the neighbours than about the test; CPU seconds
(user + sys) do not. Each argument runs as its own `python -m pytest -q ARG`. This process becomes a
child subreaper (PR_SET_CHILD_SUBREAPER), so a process whose parent died before it is reparented
here and reaped, and its CPU is counted too. Inside the pytest process a small plugin (this file,
loaded with -p) does the same per test: user + sys of the process and its reaped descendants from
the test's setup to its teardown (a module-scoped fixture counts in the first test that uses it).

Prints a table (per test, then per argument: CPU s, wall s) and writes it as JSON with --json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

import pytest

PR_SET_CHILD_SUBREAPER = 36
REAP_GRACE_S = 30.0   # how long orphans left by a finished test may take to end before they are left out
OUT_ENV = "SUITE_CPU_OUT"


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def cpu_s() -> float:
    """User + sys of this process, of every descendant reaped so far, and of every live descendant
    with what it reaped (a kept zygote's workers are reaped by the zygote, which lives on)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + _live_descendants_s()


def _stats() -> dict[int, list[str]]:
    """/proc/PID/stat of every process, the fields after the command name (state first)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    out[int(entry)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    return out


def _live_descendants_s() -> float:
    stats = _stats()
    tick = os.sysconf("SC_CLK_TCK")
    found, frontier = [], {os.getpid()}
    while frontier:
        frontier = {pid for pid, f in stats.items() if int(f[1]) in frontier}
        found += frontier
    # utime, stime, cutime, cstime (fields 14-17 of proc(5))
    return sum(sum(int(x) for x in stats[pid][11:15]) for pid in found) / tick


def reap_orphans(grace_s: float, keep: set[int] = frozenset()) -> list[int]:
    """Reap every child that has ended (orphans reparented here); wait up to grace_s for the rest that
    are not in `keep`. Returns the pids still running."""
    deadline = time.monotonic() + grace_s
    while True:
        for pid in _ended_children(keep):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        running = [p for p in _children() if p not in keep]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.2)


def _children() -> list[int]:
    me = str(os.getpid())
    return [pid for pid, f in _stats().items() if f[1] == me]


def _ended_children(keep: set[int]) -> list[int]:
    me = str(os.getpid())
    return [pid for pid, f in _stats().items() if f[1] == me and f[0] == "Z" and pid not in keep]


# ------------------------------------------------------------------ the plugin, inside pytest

_rows: list[dict] = []


def pytest_configure(config):
    become_subreaper()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, t0 = cpu_s(), time.monotonic()
    yield
    left = reap_orphans(0.0)   # zombies only: a module-scoped fixture's live processes are not waited for
    _rows.append({"test": item.nodeid, "cpu_s": round(cpu_s() - c0, 2), "wall_s": round(time.monotonic() - t0, 2),
                  "running_after": len(left)})


def pytest_unconfigure(config):
    path = os.environ.get(OUT_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(_rows, f)


# ------------------------------------------------------------------ the driver

def measure(target: str, extra: list[str]) -> dict:
    import tempfile
    fd, rows_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, OUT_ENV: rows_path,
           "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    c0, t0 = cpu_s(), time.monotonic()
    rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", "-p", "no:cacheprovider",
                         *extra, target], env=env).returncode
    left = reap_orphans(REAP_GRACE_S)
    total = {"target": target, "rc": rc, "cpu_s": round(cpu_s() - c0, 2), "wall_s": round(time.monotonic() - t0, 2),
             "left_running": left}
    with open(rows_path) as f:
        text = f.read()
    os.unlink(rows_path)
    total["tests"] = json.loads(text) if text else []
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="test files or node ids, each run as its own pytest")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--pytest-args", default="", help="more pytest arguments, e.g. '-m \"not slow\"'")
    args = ap.parse_args(argv)
    become_subreaper()
    import shlex
    results = [measure(t, shlex.split(args.pytest_args)) for t in args.targets]
    print(f"\n{'test':<100} {'cpu s':>8} {'wall s':>8}")
    for res in results:
        for row in res["tests"]:
            print(f"{row['test']:<100} {row['cpu_s']:>8.1f} {row['wall_s']:>8.1f}")
        print(f"{'= ' + res['target'] + ' (whole pytest process, rc ' + str(res['rc']) + ')':<100} "
              f"{res['cpu_s']:>8.1f} {res['wall_s']:>8.1f}" + (f"  left running: {res['left_running']}" if res["left_running"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return max(r["rc"] for r in results)


if __name__ == "__main__":
    sys.exit(main())
