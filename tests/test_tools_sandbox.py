"""The python tool's sandbox (dora/ops/tools/sandbox.py): output, errors as observations, time,
memory and network limits, no new processes, no writes outside its scratch folder."""

from __future__ import annotations

import os
import socket

import pytest

from dora.ops.tools.python_tool import PythonTool
from dora.ops.tools.sandbox import Limits, run_python

SETTINGS = {"timeout_s": 3.0, "cpu_s": 2, "memory_mb": 128, "max_output_chars": 200}


def tool(**kw) -> PythonTool:
    return PythonTool("python", **{**SETTINGS, **kw})


def test_output_last_expression_and_errors_are_observations():
    t = tool()
    r = t.run({"code": "x = 4837\nprint(x * 2961)\nx + 1"})
    assert (r.text, r.error) == ("14322357\n4838", False)
    r = t.run({"code": "print('before')\n1/0"})
    assert r.error and r.text == "before\nError: ZeroDivisionError: division by zero"
    r = t.run({"code": "def f(:"})
    assert r.error and "SyntaxError" in r.text
    r = t.run({"script": "1"})
    assert r.error and "needs a string argument 'code'" in r.text
    r = t.run({"code": "print('y' * 10000)"})
    assert not r.error and len(r.text) < 300 and "more characters cut" in r.text


def test_time_limits_kill_the_process_group():
    r = tool(timeout_s=1.0, cpu_s=5).run({"code": "import time\ntime.sleep(60)"})
    assert r.error and "timed out after 1 s" in r.text and r.seconds < 5
    r = tool(timeout_s=10.0, cpu_s=1).run({"code": "while True:\n    pass"})
    assert r.error and "CPU-time limit of 1 s" in r.text and r.seconds < 5


def test_memory_limit():
    r = tool(memory_mb=64).run({"code": "x = bytearray(512 * 1024 * 1024)\nprint(len(x))"})
    assert r.error and "MemoryError" in r.text


@pytest.mark.parametrize("netns", [True, False])
def test_no_network_inside_the_tool(netns):
    """A socket connect to a live listener on this machine fails in the child, whichever way the
    network is cut off (a namespace; or, where none is allowed, the audit hook: netns=False)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    r = run_python(code, Limits(wall_s=5, cpu_s=3, memory_mb=128, netns=netns))
    server.setblocking(False)
    with pytest.raises(BlockingIOError):   # a connection would wait in the backlog
        server.accept()
    server.close()
    assert r.returncode != 0 and "connected" not in r.stdout
    if netns:   # root or unprivileged user namespaces: the namespace; else the audit-hook fallback
        assert r.network in ("netns", "audit")
        assert ("Network is unreachable" in r.stderr) if r.network == "netns" else ("refused (no network)" in r.stderr)
    else:
        assert r.network == "audit" and "socket" in r.stderr and "refused (no network)" in r.stderr


def test_no_processes_no_foreign_calls_no_writes_outside(tmp_path):
    outside = tmp_path / "outside.txt"
    for code, refused in (("import os\nos.system('true')", "os.system"),
                          ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
                          ("import ctypes", "ctypes.dlopen"),
                          (f"open({str(outside)!r}, 'w').write('x')", "writing"),
                          (f"import os\nos.remove({str(tmp_path)!r})", "os.remove")):
        r = run_python(code, Limits(wall_s=5, cpu_s=3, memory_mb=128))
        assert r.returncode != 0 and "sandbox:" in r.stderr and refused in r.stderr, (code, r.stderr)
    assert not outside.exists() and tmp_path.exists()
    r = run_python("open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())", Limits(memory_mb=128))
    assert r.ok and r.stdout == "ok\n"
    assert not [p for p in os.listdir(os.path.dirname(str(tmp_path))) if p.startswith("dora-tool-")]
