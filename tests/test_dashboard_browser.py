"""The live dashboard in a real browser: headless Chromium (Debian's `chromium`) loads the page of
a quickstart run in dora mode while it runs, and checks that every node and edge is drawn, the
rates change between two reads, the version timeline shows at least two versions, and the page
raises no JavaScript error. The screenshot is kept beside the run's files (RUN_DIR/dashboard.png,
under pytest's tmp folder; the path is printed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.browser_cdp import Chromium
from tests.e2e_audit import PIPELINES, ROOT, SHORT

pytestmark = pytest.mark.browser

RATES_JS = "Array.from(document.querySelectorAll('#figure text.rate')).map(t => [t.dataset.edge, t.textContent])"
VERSIONS_JS = "new Set(Array.from(document.querySelectorAll('#timeline rect.seg')).map(r => r.dataset.version)).size"


def _start_run(out) -> tuple[subprocess.Popen, str]:
    """`dora run quickstart --dashboard 0` in its own process; (process, dashboard URL)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "dora.cli", "run", str(PIPELINES / "quickstart.yaml"), "async.mode=dora",
           "nodes.train.params.steps=16", "async.train_batch=32", "async.rollout_batch=48", *SHORT,
           "--out", str(out), "--quiet", "--deadline", "400", "--dashboard", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), env=env)
    seen, m = [], None
    for line in proc.stderr:           # the URL comes before the workers start (warnings may precede it)
        seen.append(line)
        m = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)", line)
        if m or len(seen) > 50:
            break
    if not m:
        proc.kill()
        raise AssertionError(f"no dashboard URL from dora run: {''.join(seen)}")
    proc.err_lines = []   # drained on a thread: a full pipe would stall the run
    threading.Thread(target=lambda: proc.err_lines.extend(proc.stderr), daemon=True).start()
    return proc, m.group(1)


def _api(url: str) -> dict:
    with urllib.request.urlopen(url + "api/state", timeout=10) as r:
        return json.load(r)


def test_live_dashboard_in_chromium(tmp_path, remove_shm_weights):
    run_dir = tmp_path / "run"
    with Chromium(timeout_s=60) as b:          # up before the run, so its checks fit inside the run
        proc, url = _start_run(run_dir)
        try:
            b.open(url)
            # running, past the first step, and the timeline has two versions
            b.wait_for(f"document.getElementById('status').textContent === 'running' && {VERSIONS_JS} >= 2",
                       timeout_s=300, what="a running run with two versions on the timeline")
            state = _api(url)
            assert {"nodes", "edges", "replicas", "steps"} <= set(state)
            drawn_nodes = b.eval("Array.from(document.querySelectorAll('#figure g.node')).map(g => g.dataset.node)")
            assert sorted(drawn_nodes) == sorted(n["name"] for n in state["nodes"])
            for e in state["edges"]:
                sel = (f"#figure g.edge[data-src='{e['src']}'][data-dst='{e['dst']}'][data-port='{e['port']}']"
                       if e["kind"] == "data" else f"#figure g.weights[data-src='{e['src']}'][data-dst='{e['dst']}']")
                assert b.eval(f'document.querySelectorAll("{sel}").length') == 1, sel
            first = dict(b.eval(RATES_JS))
            assert set(first) == {e["id"] for e in state["edges"]}, first
            updates = int(b.eval("document.body.dataset.updates"))
            time.sleep(2.5)            # the page polls once a second (its pace under load: benchmarks/dashboard.py)
            b.wait_for(f"document.body.dataset.updates > {updates}", what="a redraw")
            second = dict(b.eval(RATES_JS))
            assert any(first[k] != second[k] for k in first if "batch/s" in first[k]), (first, second)
            replicas = b.eval("Array.from(document.querySelectorAll('#replicas tr[data-replica]')).map(r => r.dataset.replica)")
            assert sorted(replicas) == sorted(r["name"] for r in state["replicas"])
            assert b.eval("document.querySelectorAll('#curves polyline.curve').length") >= 6
            shot = b.screenshot(str(run_dir / "dashboard.png"))
            print(f"dashboard screenshot: {shot}")
            assert not b.errors, b.errors
        except BaseException:
            proc.kill()                # a failed check: no need to wait for the run
            proc.wait(timeout=30)
            raise
    rc = proc.wait(timeout=400)
    assert rc == 0, "".join(proc.err_lines)
    final = json.loads((run_dir / "state.json").read_text())
    assert final["run"]["status"] == "finished" and final["run"]["step"] == 16
    assert [s["step"] for s in final["steps"]] == list(range(1, 17))
