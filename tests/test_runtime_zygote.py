"""The local backend's zygote: workers forked from one process that imported torch once. They show
their own command line, their exit codes come back as Popen's would, and they die with the zygote.
Under DORA_ZYGOTE=keep a process's runs share one (the test suite does)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from dora.runtime.backends.zygote_client import ZygoteClient
from runtime_graphs import alive, pipeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks (Linux)")


def test_forked_workers_look_started_report_their_exit_and_die_with_the_zygote(tmp_path):
    zygote = ZygoteClient({**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}, str(tmp_path / "z.log"))
    try:
        # a worker whose controller never answers: it waits for its config (bounded), alive meanwhile
        argv = ["--control", "tcp://127.0.0.1:9", "--node", "rollout", "--replica", "3"]
        waiting = zygote.fork("rollout[3]", argv, dict(os.environ), str(tmp_path / "w.log"))
        cmdline = b""
        deadline = time.monotonic() + 30
        while b"--node\0rollout" not in cmdline and time.monotonic() < deadline:
            cmdline = open(f"/proc/{waiting.pid}/cmdline", "rb").read()
            time.sleep(0.05)
        assert cmdline.split(b"\0")[1:5] == [b"-m", b"dora.runtime.worker", b"--control", b"tcp://127.0.0.1:9"], cmdline
        assert waiting.poll() is None
        # bad arguments: the worker's own exit code, its message in its own log
        bad = zygote.fork("bad[0]", ["--node", "x"], dict(os.environ), str(tmp_path / "bad.log"))
        assert bad.wait(timeout=30) == 2
        assert "--control" in (tmp_path / "bad.log").read_text()
        # killed: a negative signal number, as Popen reports it
        other = zygote.fork("rollout[4]", [*argv[:-1], "4"], dict(os.environ), None)
        other.kill()
        assert other.wait(timeout=30) == -signal.SIGKILL
    finally:
        zygote.proc.kill()   # a dying zygote takes its workers (PR_SET_PDEATHSIG)
        zygote.proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while alive(waiting.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(waiting.pid)


def test_local_runs_in_one_process_share_the_kept_zygote(tmp_path, monkeypatch):
    from dora.runtime.backends import zygote_client
    from dora.runtime.run_controller import Controller

    monkeypatch.setenv("DORA_ZYGOTE", "keep")
    zygotes = []
    for i in range(2):
        res = Controller(pipeline(200, map_replicas=1, red_replicas=1), run_dir=str(tmp_path / f"run{i}"), deadline_s=120).run()
        assert res.ok, res
        zygotes.append(zygote_client.kept_client())
    assert zygotes[0] is zygotes[1] and zygotes[0].alive()   # the first run's end left it to the second


class FakeZygote:
    """Stands in for ZygoteClient in the bookkeeping test below (no process)."""
    def __init__(self, env):
        self.env, self.closed = env, False

    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


def test_the_kept_zygote_is_replaced_when_the_environment_changes_or_it_died(monkeypatch):
    from dora.runtime.backends import zygote_client

    monkeypatch.setattr(zygote_client, "ZygoteClient", FakeZygote)
    monkeypatch.setattr(zygote_client, "_kept", {})
    env = {"PATH": "/bin", "PYTHONPATH": "/src", "PYTEST_CURRENT_TEST": "a (call)"}
    first = zygote_client.kept(env)
    assert zygote_client.kept({**env, "PYTEST_CURRENT_TEST": "b (call)"}) is first   # per-test noise: kept
    other = zygote_client.kept({**env, "DORA_MAX_MESSAGE_BYTES": "1024"})   # read at import: a new one
    assert other is not first and first.closed and not other.closed
    other.closed = True                                                        # it died
    assert zygote_client.kept({**env, "DORA_MAX_MESSAGE_BYTES": "1024"}) is not other
