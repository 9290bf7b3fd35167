"""The dashboard state of a run folder, and `dora dashboard RUN_DIR [--port P]`.

A run folder (from `dora run` or `dora simulate --out`) holds state.json (the last snapshot,
rewritten every few seconds while the run goes), metrics.jsonl, summary.json, trace.json and
pipeline.yaml. The page shows state.json with its steps re-read from metrics.jsonl (the
authoritative record, possibly a step ahead); a folder without state.json (a run killed
before its first snapshot) is pieced together from the other files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from dora.observe.dashboard.state import SHOWN_SAMPLES, STATE_FILE, encode, make_state, steps_section
from dora.observe.dashboard.timeline import timeline_of_trace

RUN_MARKERS = (STATE_FILE, "metrics.jsonl", "summary.json")


class NotARun(ValueError):
    pass


def check_run_dir(path: str) -> None:
    """Raise NotARun with a helpful message unless `path` is a run folder."""
    if not os.path.isdir(path):
        raise NotARun(f"{path}: no such folder")
    if any(os.path.exists(os.path.join(path, m)) for m in RUN_MARKERS):
        return
    inside = sorted(d for d in os.listdir(path)
                    if any(os.path.exists(os.path.join(path, d, m)) for m in RUN_MARKERS))
    hint = f"; runs inside it: {', '.join(os.path.join(path, d) for d in inside)}" if inside else ""
    raise NotARun(f"{path} is not a run folder (it has none of {', '.join(RUN_MARKERS)}){hint}")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The complete JSON lines of a file (a line being written right now is skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_state(run_dir: str) -> dict[str, Any]:
    check_run_dir(run_dir)
    p = lambda name: os.path.join(run_dir, name)   # noqa: E731
    metrics = read_jsonl(p("metrics.jsonl")) if os.path.exists(p("metrics.jsonl")) else None
    if os.path.exists(p(STATE_FILE)):
        state = _read_json(p(STATE_FILE))
        if metrics is not None:
            state["steps"] = steps_section(metrics)
            if state["steps"]:
                state["run"]["step"] = state["steps"][-1]["step"]
    else:
        state = _state_from_files(run_dir, metrics or [])
    state["evals"] = read_jsonl(p("eval.jsonl")) if os.path.exists(p("eval.jsonl")) else []
    state["samples"] = tail_jsonl(p("samples.jsonl"), SHOWN_SAMPLES)
    return state


def tail_jsonl(path: str, n: int, chunk: int = 1 << 16) -> list[dict[str, Any]]:
    """The last n records of a jsonl file, reading only its end (samples.jsonl grows with the run)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - chunk))
        lines = fh.read().decode("utf-8", errors="replace").splitlines()[-n - 1:]
    out = []
    for line in lines[-n:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue   # (the first line of the chunk may be cut)
    return out


def _state_from_files(run_dir: str, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    from dora.graph.diagnostics import GraphError
    from dora.graph.viz import figure
    from dora.graph.yaml_io import load_graph

    p = lambda name: os.path.join(run_dir, name)   # noqa: E731
    summary = _read_json(p("summary.json")) if os.path.exists(p("summary.json")) else {}
    fig = {"svg": "", "width": 0, "height": 0, "nodes": [], "edges": []}
    name, mode, k = summary.get("name", os.path.basename(os.path.abspath(run_dir))), summary.get("mode"), None
    if os.path.exists(p("pipeline.yaml")):
        try:
            g = load_graph(p("pipeline.yaml"))
            fig, name, mode, k = figure(g), g.name, g.async_.mode, g.async_.max_staleness
        except GraphError:
            pass   # e.g. a user op no longer importable: the rest of the page still helps
    trace = _read_json(p("trace.json")) if os.path.exists(p("trace.json")) else {"traceEvents": []}
    steps = steps_section(metrics)
    status = "finished" if summary.get("ok") else "failed" if summary else "unknown"
    run = {"name": name, "mode": mode, "max_staleness": k, "status": status, "source": "run",
           "elapsed_s": summary.get("wall_s"), "step": steps[-1]["step"] if steps else 0, "total_steps": None,
           "run_dir": os.path.abspath(run_dir), "error": summary.get("error"), "partial": True}
    edges = [dict(e) for e in fig["edges"]]   # no counters were kept: the page shows dashes
    for e in edges:
        e.update(batches=None, rows=None, bytes=None, batches_per_s=None, rows_per_s=None, mb_per_s=None,
                 queued=None, window=None, versions=None, last_version=None, loads=None)
    return make_state(run, fig, edges, [], timeline_of_trace(trace), steps)


class FolderState:
    """state() for the server: the run folder's state, re-read when its files change."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.key: tuple | None = None
        self.body = b""

    def __call__(self) -> bytes:
        key = tuple(_mtime(os.path.join(self.run_dir, m)) for m in (STATE_FILE, "metrics.jsonl", "trace.json",
                                                                     "eval.jsonl", "samples.jsonl"))
        if key != self.key:
            self.body, self.key = encode(load_state(self.run_dir)), key
        return self.body


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0.0


def dashboard_main(argv: list[str] | None = None) -> int:
    from dora.observe.dashboard.server import DEFAULT_PORT, DashboardServer

    p = argparse.ArgumentParser(prog="dora dashboard", description="Serve the dashboard page of a run folder "
                                "(finished, failed, simulated, or still running in another process).")
    p.add_argument("run_dir", help="a run folder: dora run --out DIR, or dora simulate --out DIR (one folder per mode)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; a taken port falls back to a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if not 0 <= a.port <= 65535:
        print(f"dora dashboard: --port {a.port} is not a port (0-65535)", file=sys.stderr)
        return 2
    try:
        load_state(a.run_dir)
    except NotARun as e:
        print(f"dora dashboard: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"dora dashboard: cannot read the run in {a.run_dir}: {e}", file=sys.stderr)
        return 2
    try:
        server = DashboardServer(FolderState(a.run_dir), a.port, a.host)
    except OSError as e:
        print(f"dora dashboard: cannot listen on {a.host}:{a.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    if server.note:
        print(f"dora dashboard: {server.note}", file=sys.stderr)
    print(f"dashboard of {a.run_dir}: {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0
