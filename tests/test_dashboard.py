"""The dashboard's parts without a browser: edge rates, the timeline from the rollout control
code's trace, the state of a real dataflow run, a simulated run's folder, the HTTP server
(taken port, self-contained page), `dora dashboard` and `dora plot` on bad input."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from dora.graph.viz import figure
from dora.graph.viz.svg import svg_python
from dora.graph.yaml_io import load_graph
from dora.observe.dashboard.page import page_html
from dora.observe.dashboard.read_run import load_state
from dora.observe.dashboard.server import DashboardServer
from dora.observe.dashboard.state import RATE_WINDOW_S, Rates, RunState
from dora.observe.dashboard.timeline import timeline_of_trace
from dora.runtime.run_controller import Controller
from tests.e2e_audit import PIPELINES, ROOT
from tests.runtime_graphs import pipeline

KEYS = {"nodes", "edges", "replicas", "steps"}


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "dora.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), env=env)


def test_rates_over_the_window_and_back_to_zero_when_counters_stop():
    r = Rates(t0=0.0)
    for t in range(1, 11):                       # 10 rows/s, 2 batches/s for 10 s
        r.add("e", float(t), (2 * t, 10 * t))
    assert r.rate("e", 10.0) == pytest.approx((2.0, 10.0))
    # a worker sends counters only when they change: silence means nothing moved
    assert r.rate("e", 10.0 + RATE_WINDOW_S + 0.1) == pytest.approx((0.0, 0.0))
    assert r.rate("missing", 5.0) is None


def test_figure_is_the_viz_drawing_with_a_place_for_every_node_and_edge():
    g = load_graph(str(PIPELINES / "grpo.yaml"))
    f = figure(g)
    assert f["svg"] == svg_python(g)
    assert [n["name"] for n in f["nodes"]] == list(g.nodes)
    assert {e["id"] for e in f["edges"] if e["kind"] == "data"} == {e.label for e in g.edges}
    assert len([e for e in f["edges"] if e["kind"] == "weights"]) == len(g.weights)
    for e in f["edges"]:
        assert 0 <= e["anchor"][0] <= f["width"] and 0 <= e["anchor"][1] <= f["height"], e


def test_run_state_of_a_real_dataflow_run(tmp_path):
    """Counters from the workers' heartbeats: rates while it runs, exact totals at the end."""
    g = pipeline(rows=6000, group_size=4, batch_rows=100, map_replicas=2, red_replicas=1)
    g.nodes["src"].params["delay_s"] = 0.05            # ~3 s of steady flow
    state = RunState(g, str(tmp_path))
    seen = []
    refresh = state.refresh

    def keep(ctrl, now, force_write=False):
        refresh(ctrl, now, force_write)
        seen.append(json.loads(state.latest))
    state.refresh = keep
    ctrl = Controller(g, run_dir=str(tmp_path), deadline_s=120, live_s=0.2, monitor=state)
    res = ctrl.run()
    state.finish(ctrl, res.ok, None)
    final = json.loads((tmp_path / "state.json").read_text())
    assert KEYS <= set(final) and final["run"]["status"] == "finished"
    assert [n["name"] for n in final["nodes"]] == list(g.nodes)
    assert sorted(r["name"] for r in final["replicas"]) == sorted(res.stats)
    assert all(r["state"] == "finished" for r in final["replicas"])
    for e in final["edges"]:
        producers = [s for label, s in res.stats.items() if label.startswith(e["src"] + "[")]
        assert e["rows"] == sum(s["out"][e["id"]]["rows"] for s in producers), e
        assert e["bytes"] == sum(s["out"][e["id"]]["bytes"] for s in producers), e
        assert e["window"] == g.edges[0].capacity * g.nodes[e["src"]].replicas
    src_edge = "src/out -> map.in"
    live_rates = [e["rows_per_s"] for s in seen if s["run"]["status"] == "running" for e in s["edges"] if e["id"] == src_edge]
    assert max(live_rates, default=0) > 100, live_rates       # 100 rows per 50 ms batch (less on a busy machine)
    assert len(set(live_rates)) > 1, "rates never changed between snapshots"
    assert state.builds >= 2


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    p = _cli("simulate", "--modes", "dora,sync", "--gpus", "64", "--steps", "6", "--train-batch", "512",
             "--out", str(out / "runs"), "--json", str(out / "deep" / "er" / "sim.json"))
    assert p.returncode == 0, p.stderr
    return out


def test_simulate_out_writes_a_run_folder_per_mode(sim_run):
    assert (sim_run / "deep" / "er" / "sim.json").exists()          # output paths get their folders
    for mode in ("dora", "sync"):
        d = sim_run / "runs" / mode
        metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == list(range(1, 7))
        s = load_state(str(d))
        assert KEYS <= set(s) and s["run"]["source"] == "simulate" and s["run"]["mode"] == mode
        assert [x["step"] for x in s["steps"]] == list(range(1, 7))
        assert all(isinstance(x["fast_lane_requests"], int) for x in s["steps"])   # the curve's data
        trace = json.loads((d / "trace.json").read_text())
        rows = [r for r in s["timeline"]["rows"]]
        assert rows and rows == timeline_of_trace(trace, [r["name"] for r in rows])["rows"]
        # every weight load the control code logged is on its instance's row
        loads = [e for e in trace["traceEvents"] if e.get("cat") == "orchestrator" and e["name"].startswith("load v")]
        assert sum(len(r["loads"]) for r in rows) == len(loads)
    dora = load_state(str(sim_run / "runs" / "dora"))
    assert len(dora["timeline"]["versions"]) >= 2
    assert any(len({seg[2] for r in dora["timeline"]["rows"] for seg in r["segments"] if seg[0] <= t <= seg[1]}) >= 2
               for t in [s["wall_s"] for s in dora["steps"]]), "dora never hosted two versions at once"


def test_timeline_marks_migrations_on_both_rows(sim_run):
    trace = json.loads((sim_run / "runs" / "dora" / "trace.json").read_text())
    migs = [e for e in trace["traceEvents"] if e.get("cat") == "orchestrator" and e["name"].startswith("migrate")]
    tl = timeline_of_trace(trace)
    assert migs, "the dora simulation migrated nothing: this test would check nothing"
    out = sum(-m[2] for r in tl["rows"] for m in r["migrations"] if m[2] < 0)
    assert out == sum(e["args"]["requests"] for e in migs)
    ins = [m for r in tl["rows"] for m in r["migrations"] if m[2] > 0]
    assert len(ins) == sum(len(e["args"]["dests"]) for e in migs)


def test_plot_of_simulated_runs(sim_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "new" / "folder" / "modes.png"
    p = _cli("plot", str(sim_run / "runs" / "sync"), str(sim_run / "runs" / "dora"), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_and_dashboard_refuse_a_folder_that_is_not_a_run(sim_run, tmp_path):
    p = _cli("plot", str(tmp_path), "-o", str(tmp_path / "x.png"))
    assert p.returncode == 2 and "not a run folder" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _cli("dashboard", str(sim_run / "runs"))          # the parent of the runs: it names them
    assert p.returncode == 2 and "not a run folder" in p.stderr and os.path.join("runs", "dora") in p.stderr, p.stderr
    p = _cli("dashboard", str(tmp_path / "nowhere"))
    assert p.returncode == 2 and "no such folder" in p.stderr, p.stderr
    p = _cli("dashboard", str(sim_run / "runs" / "dora"), "--port", "70000")
    assert p.returncode == 2 and "not a port" in p.stderr, p.stderr


def test_a_taken_port_falls_back_to_a_free_one_and_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = DashboardServer(lambda: b'{"nodes": []}', port).start()
        try:
            assert server.port != port and f"port {port} is taken" in server.note
            assert server.host == "127.0.0.1"
            with urllib.request.urlopen(server.url + "api/state", timeout=10) as r:
                assert json.load(r) == {"nodes": []}
            with urllib.request.urlopen(server.url, timeout=10) as r:
                assert b"<!DOCTYPE html>" in r.read()
        finally:
            server.close()


def test_dashboard_serves_a_finished_run_folder(sim_run):
    d = sim_run / "runs" / "dora"
    proc = subprocess.Popen([sys.executable, "-m", "dora.cli", "dashboard", str(d), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "api/state", timeout=10) as r:
            served = json.load(r)
        assert served == load_state(str(d))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_page_needs_no_network():
    html = page_html()
    for pattern in (r'src\s*=\s*"https?:', r'href\s*=\s*"https?:', r"@import", r"url\(\s*['\"]?https?:", r"fetch\(\s*['\"]https?:"):
        assert not re.search(pattern, html), pattern
    assert "fetch('api/state'" in html    # its one request: relative, to the server that served it


def test_viz_output_gets_its_missing_folders(tmp_path, capsys):
    from dora.cli import main   # in this process: the console entry point has its own test (test_cli.py)

    for ext in ("html", "svg", "mmd"):
        out = tmp_path / "not" / "yet" / f"q.{ext}"
        rc = main(["viz", str(PIPELINES / "quickstart.yaml"), "-o", str(out)])
        assert rc == 0 and out.stat().st_size > 100, capsys.readouterr().err
