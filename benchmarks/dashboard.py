"""What the live dashboard costs a run: the quickstart's throughput with and without it.

    python benchmarks/dashboard.py [--repeats 3] [--pipeline pipelines/quickstart.yaml] [--json out.json] [k=v ...]

Three arms, interleaved (off, state, served, off, state, served, ...), same pipeline and seed:
  off     execute(live_state=False): no live counters from the workers, no snapshots
  state   the default `dora run`: counters on the heartbeats, a snapshot a second on the controller,
          RUN_DIR/state.json every 2 s
  served  `dora run --dashboard`: the same plus the HTTP server, with a client process fetching
          the page once and /api/state once a second (the page's own traffic)
Per run: tokens/s over the whole run (summary tokens / wall_s) and the CPU the controller spent on
the dashboard (state.json run.dashboard_cpu_s: snapshots, state.json writes, answering requests).
Then the worker side, measured directly: one live sample of a generate replica with requests
running (engine stats, out-edge counters, compare), and encoding/decoding the heartbeat that
carries it. Prints tables; --json writes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ARMS = ("off", "state", "served")
POLLER = r"""
import sys, time, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
seen = False
while time.monotonic() < deadline:
    t = time.monotonic()
    try:
        if not seen:
            urllib.request.urlopen(url, timeout=5).read()
        urllib.request.urlopen(url + "api/state", timeout=5).read()
        seen = True
    except OSError:
        if seen:
            break            # the run ended and its server with it
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_arm(arm: str, pipeline: str, overrides: list[str], out_root: str, i: int, deadline_s: float,
            hb_timeout: float) -> dict:
    from dora.rl.launch import execute, load_graph
    graph = load_graph(pipeline, overrides)
    if graph is None:
        raise SystemExit(2)
    run_dir = os.path.join(out_root, f"{arm}-{i}")
    os.makedirs(run_dir, exist_ok=True)
    poller, port = None, None
    if arm == "served":
        port = free_port()
        poller = subprocess.Popen([sys.executable, "-c", POLLER, f"http://127.0.0.1:{port}/", str(deadline_s)])
    try:
        code = execute(graph, run_dir, seed=0, quiet=True, deadline_s=deadline_s, live_state=arm != "off",
                       dashboard_port=port, hb_timeout=hb_timeout)
    finally:
        if poller is not None:
            try:
                poller.wait(timeout=30)
            except subprocess.TimeoutExpired:
                poller.kill()
    with open(os.path.join(run_dir, "summary.json")) as fh:
        s = json.load(fh)
    if code != 0:
        raise RuntimeError(f"{arm} run {i} failed: {s.get('error')}")
    cpu = None
    if arm != "off":
        with open(os.path.join(run_dir, "state.json")) as fh:
            cpu = json.load(fh)["run"]["dashboard_cpu_s"]
    return {"arm": arm, "i": i, "tokens_per_s": s["tokens"] / s["wall_s"], "wall_s": s["wall_s"],
            "dashboard_cpu_s": cpu}


def worker_side(n: int = 2000) -> dict:
    """Microseconds per live sample of a generate replica (32 requests running) and per heartbeat."""
    from dora.graph.yaml_io import load_graph
    from dora.ops.engines.engine import SamplingRequest
    from dora.ops.engines.torch_engine import TorchEngine
    from dora.ops.generate import GenerateOp
    from dora.ops.models import load_policy
    from dora.runtime import wire
    from dora.runtime.channel import OutEdge
    from dora.runtime.op_watch import live_counters
    from dora.runtime.worker import Worker

    g = load_graph("pipelines/quickstart.yaml")
    model, _ = load_policy(g.model, "cpu", seed=0)
    engine = TorchEngine(model, version=0, max_batch=32, seed=1)
    for k in range(32):
        engine.submit(SamplingRequest(uid=str(k), prompt_ids=[5 + k % 50] * 20, version=0, max_tokens=128))
    for _ in range(4):
        engine.step()
    w = Worker("tcp://127.0.0.1:1", "rollout", 0)
    try:
        w.op = GenerateOp()
        w.op.engine = engine
        w.outs = [OutEdge(w.zctx, "rollout/out -> reward.trajectories", ["tcp://127.0.0.1:1"], w.label)]
        w.state, w.live_s = "running", 0.5
        t = time.perf_counter()
        for j in range(n):
            w.work = j                      # counters move: every sample is a new one, as in a busy worker
            w.live = live_counters(w.op, w.outs, w.work)   # what the worker's loop samples every live_s
        sample_us = (time.perf_counter() - t) / n * 1e6
        msg = {"kind": "hb", "rejected": 0, "live": w.live, "busy": 1}
        t = time.perf_counter()
        for _ in range(n):
            frames = wire.encode_control(msg)
            wire.decode_control(frames)
        hb_us = (time.perf_counter() - t) / n * 1e6
        plain = wire.encode_control({"kind": "hb", "rejected": 0})[0]
        size = len(wire.encode_control(msg)[0])
    finally:
        for o in w.outs:
            o.close()
        w.ctrl.close(0)
        w.zctx.term()
    return {"sample_us": sample_us, "heartbeat_us": hb_us, "heartbeat_bytes": size, "plain_heartbeat_bytes": len(plain)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default="pipelines/quickstart.yaml")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--deadline", type=float, default=900.0)
    p.add_argument("--hb-timeout", type=float, default=120.0,
                   help="generous: on a shared 2-core machine a starved worker is not what this measures")
    p.add_argument("--tries", type=int, default=2, help="attempts per run (a failed attempt is reported and repeated)")
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="where the runs go (default: a temp dir)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    out_root = a.out or tempfile.mkdtemp(prefix="dora-dashboard-bench-")
    runs = []
    for i in range(a.repeats):
        for arm in ARMS:
            print(f"[dashboard] {arm} {i} ...", file=sys.stderr, flush=True)
            for attempt in range(a.tries):
                try:
                    runs.append(run_arm(arm, a.pipeline, a.overrides, out_root, i, a.deadline, a.hb_timeout))
                    break
                except RuntimeError as e:
                    print(f"[dashboard] attempt {attempt + 1} failed: {e}", file=sys.stderr, flush=True)
            else:
                raise SystemExit(f"{arm} run {i} failed {a.tries} times")
            r = runs[-1]
            print(f"[dashboard] {arm} {i}: {r['tokens_per_s']:,.0f} tok/s, {r['wall_s']:.1f} s, "
                  f"dashboard CPU {r['dashboard_cpu_s']} s", file=sys.stderr, flush=True)
    rows = []
    base = statistics.fmean(r["tokens_per_s"] for r in runs if r["arm"] == "off")
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        tps = [r["tokens_per_s"] for r in rs]
        cpu = [r["dashboard_cpu_s"] / r["wall_s"] for r in rs if r["dashboard_cpu_s"] is not None]
        rows.append({"arm": arm, "runs": len(rs), "tokens_per_s": statistics.fmean(tps), "min": min(tps), "max": max(tps),
                     "ratio_to_off": statistics.fmean(tps) / base, "wall_s": statistics.fmean(r["wall_s"] for r in rs),
                     "controller_cpu_share": statistics.fmean(cpu) if cpu else None})
    ws = worker_side()
    print(f"\n{'arm':8} {'runs':>4} {'tok/s':>8} {'min':>8} {'max':>8} {'x off':>7} {'wall s':>7} {'ctrl CPU':>9}")
    for r in rows:
        share = "-" if r["controller_cpu_share"] is None else f"{r['controller_cpu_share']:.3%}"
        print(f"{r['arm']:8} {r['runs']:>4} {r['tokens_per_s']:>8,.0f} {r['min']:>8,.0f} {r['max']:>8,.0f} "
              f"{r['ratio_to_off']:>7.3f} {r['wall_s']:>7.1f} {share:>9}")
    print(f"\nworker side: {ws['sample_us']:.1f} us per live sample (generate replica, 32 running), "
          f"{ws['heartbeat_us']:.1f} us to encode+decode a heartbeat carrying it ({ws['heartbeat_bytes']} B; "
          f"{ws['plain_heartbeat_bytes']} B without)")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "runs": runs, "worker_side": ws, "pipeline": a.pipeline, "overrides": a.overrides},
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
