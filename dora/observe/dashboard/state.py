"""The run's state as the dashboard shows it: one JSON object, served live at /api/state and
kept in RUN_DIR/state.json, so the live page and `dora dashboard RUN_DIR` read the same thing.

    {"format": 1,
     "run":      {name, mode, status (starting|running|finished|failed), source (run|simulate),
                  elapsed_s, updated_at, step, total_steps, max_staleness, run_dir, error,
                  dashboard_cpu_s (CPU seconds this run spent on its dashboard, controller side)},
     "graph":    {svg, width, height}                  the `dora viz` drawing
     "nodes":    [{name, op, pool, replicas, box}]
     "edges":    [{id, kind (data|weights), src, dst, port, anchor,
                   data:    batches, rows, bytes, batches_per_s, rows_per_s, mb_per_s, queued, window
                   weights: versions, last_version, bytes, loads}]
     "replicas": [{name, node, replica, op, pool, pid, state, version, running, queued, kv_used,
                   kv_capacity, tokens_per_s, generated_tokens, step}]
     "timeline": {now, rows: [{name, segments [[t0, t1, v]], loads [[t, v]],
                               migrations [[t, v, +in/-out requests, peers]]}], versions}
     "steps":    [{step, policy_version, reward_mean, tokens_per_s, staleness_max, staleness_mean,
                   step_time_s, rollout_only_s, rollout_only_share, versions_live, wall_s, turns_mean,
                   tool_wait_s, migrated_requests, fast_lane_requests, prefill_tokens, prefix_hit_tokens,
                   kv_blocks_used, kv_blocks_free}],
     "evals":    [eval.jsonl's lines: {version, set, mean_reward, pass@1, ...}]
     "samples":  [the newest SHOWN_SAMPLES lines of samples.jsonl]}
A run of several policies (dora/graph/policies.py) adds `policy` to each step (its keys unprefixed)
and to each timeline row: the page draws a curve per policy and labels the rows.

Everything comes from the run's own state: the workers' live counters (out edges, op
live_stats) riding on their heartbeats, the controller's view of each worker, the rollout
controller's trace (timeline) and the step records of metrics.jsonl. RunState builds it on the
controller's thread, once a second, and the HTTP server only hands out the last bytes built.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

from dora.observe.dashboard.timeline import Timeline

FORMAT = 1
STATE_FILE = "state.json"
SNAPSHOT_EVERY_S = 1.0    # the page asks once a second; a fresher snapshot would go unseen
WRITE_EVERY_S = 2.0       # RUN_DIR/state.json, for `dora dashboard RUN_DIR` on a run still going
RATE_WINDOW_S = 3.0       # edge and token rates: counts over the last few seconds
MAX_STEPS = 2000          # longer runs are thinned evenly (the last step always kept)
SHOWN_SAMPLES = 12        # the page's "latest samples" table
STEP_KEYS = ("step", "policy_version", "reward_mean", "tokens_per_s", "staleness_max", "staleness_mean",
             "step_time_s", "rollout_only_s", "versions_live", "wall_s", "turns_mean", "tool_wait_s",
             "migrated_requests", "fast_lane_requests", "prefill_tokens", "prefix_hit_tokens", "kv_blocks_used",
             "kv_blocks_free")


def steps_section(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curves' data from metrics.jsonl records (rollout_only_share = rollout_only_s / step_time_s).
    A run of several policies: each step of each policy, its keys unprefixed and `policy` naming it."""
    if len(records) > MAX_STEPS:
        stride = len(records) / MAX_STEPS
        records = [records[int(i * stride)] for i in range(MAX_STEPS - 1)] + [records[-1]]
    out = []
    for r in records:
        policy = r.get("policy")
        if isinstance(policy, str):
            r = {"policy": policy, "step": r.get("step"), **{k[len(policy) + 1:]: v for k, v in r.items()
                                                            if k.startswith(f"{policy}/")}}
        s = {k: r.get(k) for k in STEP_KEYS + (("policy",) if isinstance(policy, str) else ())}
        st, ro = r.get("step_time_s"), r.get("rollout_only_s")
        s["rollout_only_share"] = ro / st if isinstance(st, (int, float)) and st > 0 and isinstance(ro, (int, float)) else None
        out.append(s)
    return out


def make_state(run: dict[str, Any], fig: dict[str, Any], edges: list[dict[str, Any]], replicas: list[dict[str, Any]],
               timeline: dict[str, Any], steps: list[dict[str, Any]], evals: list[dict[str, Any]] = (),
               samples: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"format": FORMAT, "run": run, "graph": {k: fig[k] for k in ("svg", "width", "height")},
            "nodes": fig["nodes"], "edges": edges, "replicas": replicas, "timeline": timeline, "steps": steps,
            "evals": list(evals), "samples": list(samples)[-SHOWN_SAMPLES:]}


def write_state(run_dir: str, state: dict[str, Any] | bytes) -> str:
    """RUN_DIR/state.json, replaced atomically (a reader never sees half a file)."""
    path = os.path.join(run_dir, STATE_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(state if isinstance(state, bytes) else encode(state))
    os.replace(tmp, path)
    return path


def encode(state: dict[str, Any]) -> bytes:
    """Compact JSON; NaN/inf (invalid JSON) become null."""
    try:
        return json.dumps(state, separators=(",", ":"), allow_nan=False, default=str).encode()
    except ValueError:
        from dora.observe.metrics import clean_json
        return json.dumps(clean_json(state), separators=(",", ":"), allow_nan=False, default=str).encode()


class Rates:
    """Per key, counters over time -> per-second rates over the last RATE_WINDOW_S."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.samples: dict[Any, collections.deque] = {}

    def add(self, key: Any, t: float, values: tuple[float, ...]) -> None:
        q = self.samples.setdefault(key, collections.deque([(self.t0, (0,) * len(values))]))
        if t > q[-1][0]:
            q.append((t, values))
        while len(q) > 2 and q[1][0] <= t - RATE_WINDOW_S:
            q.popleft()

    def rate(self, key: Any, now: float) -> tuple[float, ...] | None:
        """Rates at `now`: the last counts hold until now (a worker sends counters only when they change)."""
        q = self.samples.get(key)
        if not q:
            return None
        cur = q[-1][1]
        base_t, base = q[0]
        for t, v in q:          # the newest sample at least a window old is the base
            if t <= now - RATE_WINDOW_S:
                base_t, base = t, v
        dt = now - base_t
        return tuple((c - b) / dt for c, b in zip(cur, base)) if dt > 0 else tuple(0.0 for _ in cur)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class RunState:
    """Builds the state of a live run from the controller (call `tick(controller)` often; it
    keeps its own pace) and keeps the latest encoded snapshot in `latest`."""

    def __init__(self, graph, run_dir: str, *, driver: Any = None, metrics: Any = None, total_steps: int | None = None,
                 write_file: bool = True):
        from dora.graph.viz import figure

        self.graph, self.run_dir, self.driver, self.metrics = graph, run_dir, driver, metrics
        self.total_steps, self.write_file = total_steps, write_file
        self.fig = figure(graph)
        self.edge_of = {e.label: e for e in graph.edges}
        self.t0 = time.monotonic()
        self.started_at = time.time()
        self.rates = Rates(self.t0)
        self.seen_at: dict[str, float] = {}      # worker label -> live_at of the last sample taken
        self.timeline = Timeline()
        self.due = self.write_due = 0.0
        self.status = "starting"
        self.error: str | None = None
        self.build_cpu_s = 0.0   # CPU time spent building and writing snapshots (the dashboard's cost here)
        self.server_cpu_s = 0.0  # and answering the page (set by LiveDashboard at the end)
        self.builds = 0
        self.latest: bytes = encode(self.build(None, self.t0))

    # ------------------------------------------------------------ called by the controller
    def tick(self, ctrl: Any) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + SNAPSHOT_EVERY_S
        if self.status == "starting" and ctrl.workers and all(w.state not in ("starting", "configured", "ready")
                                                              for w in ctrl.workers.values()):
            self.status = "running"
        self.refresh(ctrl, now)

    def refresh(self, ctrl: Any, now: float, force_write: bool = False) -> None:
        t = time.thread_time()
        self.latest = encode(self.build(ctrl, now))
        if self.write_file and (force_write or now >= self.write_due):
            self.write_due = now + WRITE_EVERY_S
            write_state(self.run_dir, self.latest)
        self.build_cpu_s += time.thread_time() - t
        self.builds += 1

    def finish(self, ctrl: Any, ok: bool, error: str | None) -> None:
        """The final snapshot, written whatever happened."""
        self.status, self.error = ("finished" if ok else "failed"), error
        self.refresh(ctrl, time.monotonic(), force_write=True)

    # ------------------------------------------------------------ the snapshot
    def build(self, ctrl: Any, now: float) -> dict[str, Any]:
        workers = list(ctrl.workers.values()) if ctrl is not None else []
        for w in workers:
            if w.live is not None and w.live_at > self.seen_at.get(w.label, 0.0):
                self.seen_at[w.label] = w.live_at
                self._sample(w)
        steps = steps_section(self.metrics.records) if self.metrics is not None else []
        a = self.graph.async_
        run = {"name": self.graph.name, "mode": a.mode, "max_staleness": a.max_staleness, "status": self.status,
               "source": "run", "elapsed_s": round(now - self.t0, 3), "started_at": self.started_at,
               "updated_at": time.time(), "step": steps[-1]["step"] if steps else 0, "total_steps": self.total_steps,
               "run_dir": os.path.abspath(self.run_dir), "error": self.error,
               "dashboard_cpu_s": round(self.build_cpu_s + self.server_cpu_s, 4)}
        m = self.metrics
        return make_state(run, self.fig, self._edges(workers, now), self._replicas(ctrl, workers, now),
                          self._timeline(), steps, getattr(m, "evals", []), getattr(m, "latest_samples", []))

    def _sample(self, w: Any) -> None:
        live = w.live
        for edge, c in (live.get("out") or {}).items() if isinstance(live.get("out"), dict) else ():
            if isinstance(c, list) and len(c) == 4 and all(_num(x) is not None for x in c):
                self.rates.add((w.label, edge), w.live_at, tuple(c[:3]))
        op = live.get("op")
        if isinstance(op, dict) and _num(op.get("generated_tokens")) is not None:
            self.rates.add((w.label, "tokens"), w.live_at, (op["generated_tokens"],))

    def _edges(self, workers: list[Any], now: float) -> list[dict[str, Any]]:
        by_node: dict[str, list[Any]] = collections.defaultdict(list)
        for w in workers:
            by_node[w.node].append(w)
        out = []
        g = self.graph
        sent = {w.label: w.sent() for w in workers}
        for fe in self.fig["edges"]:
            e = dict(fe)
            if fe["kind"] == "data":
                edge = self.edge_of[fe["id"]]
                tot, rate, queued = [0, 0, 0], [0.0, 0.0, 0.0], 0
                for w in by_node.get(edge.src, []):
                    c = sent.get(w.label, {}).get(edge.label, [0, 0, 0, 0])
                    before = w.sent_before.get(edge.label, [0, 0, 0])   # (what a respawned replica sent before)
                    tot = [a + b + d for a, b, d in zip(tot, c[:3], before)]
                    queued += c[3]
                    r = self.rates.rate((w.label, edge.label), now)
                    if r:
                        rate = [a + b for a, b in zip(rate, r)]
                e.update(batches=tot[0], rows=tot[1], bytes=tot[2], batches_per_s=round(rate[0], 3),
                         rows_per_s=round(rate[1], 2), mb_per_s=round(rate[2] / 1e6, 4), queued=queued,
                         window=edge.capacity * g.nodes[edge.src].replicas)
            else:   # (a run of several policies: the driver of the policy whose trainer publishes on it)
                d = (getattr(self.driver, "drivers", None) or {}).get(fe["src"], self.driver)
                published = sorted(getattr(d, "weight_paths", {}) or {})
                sync = getattr(d, "weight_sync", {}) or {}
                last = published[-1] if published else None
                e.update(versions=len(published), last_version=last,
                         bytes=(sync.get(last) or (None, None))[1] if last is not None else None,
                         loads=getattr(d, "weight_loads", 0))
            out.append(e)
        return out

    def _replicas(self, ctrl: Any, workers: list[Any], now: float) -> list[dict[str, Any]]:
        failure = getattr(ctrl, "failure", None) if ctrl is not None else None
        plan = {(r.node, r.replica): r for r in ctrl.plan.replicas} if ctrl is not None else {}
        out = []
        for w in workers:
            node = self.graph.nodes[w.node]
            op = (w.live or {}).get("op") if isinstance((w.live or {}).get("op"), dict) else {}
            rp = plan.get((w.node, w.replica))
            state = _state(w, op, failure, now, getattr(ctrl, "live_s", 0.5))
            if self.status in ("finished", "failed") and state != "failed":
                state = "finished" if self.status == "finished" else "stopped"   # the run is over: every worker was stopped
            row = {"name": w.label, "node": w.node, "replica": w.replica, "op": node.op, "pool": node.pool,
                   "device": getattr(rp, "device", None), "pid": w.pid, "state": state,
                   "version": op.get("version"), "step": op.get("step"), "running": op.get("active"),
                   "queued": op.get("queued"), "kv_used": op.get("kv_tokens_used"),
                   "kv_capacity": op.get("kv_tokens_capacity"), "generated_tokens": op.get("generated_tokens"),
                   "tokens_per_s": None}
            r = self.rates.rate((w.label, "tokens"), now)
            if r is not None:
                row["tokens_per_s"] = round(r[0], 2)
            out.append(row)
        return out

    def _timeline(self) -> dict[str, Any]:
        """The version timeline of the generate replicas: in a run of several policies, every policy's
        replicas, each row naming its policy (versions are per policy)."""
        d = self.driver
        if d is None:
            return {"now": 0.0, "rows": [], "versions": []}
        self.timeline.feed(d.trace.events)
        names, hosting, policy = [], {}, {}
        for u, one in (getattr(d, "drivers", None) or {None: d}).items():
            rc = getattr(one, "rc", None)
            instances = rc.manager.instances if rc is not None else {}
            mine = list(instances) or [f"{one.roles.generate}[{r}]" for r in range(self.graph.nodes[one.roles.generate].replicas)]
            hosting.update({n: i.version for n, i in instances.items()} if instances else {n: 0 for n in mine})
            names += mine
            policy.update({n: u for n in mine})
        section = self.timeline.section(names, d.clock.now(), hosting)
        if any(policy.values()):
            for row in section["rows"]:
                row["policy"] = policy.get(row["name"])
        return section


def _state(w: Any, op: dict[str, Any], failure: Any, now: float, live_s: float) -> str:
    """starting | running | waiting | finished | failed (the run adds stopped once it is over)."""
    if failure is not None and getattr(failure, "node", None) == w.node and getattr(failure, "replica", None) == w.replica:
        return "failed"
    if w.state in ("starting", "configured", "ready"):
        return "starting"
    if w.state != "running":
        return w.state
    if "active" in op:     # an engine: it runs while it holds requests
        return "running" if (op.get("active") or 0) + (op.get("queued") or 0) > 0 else "waiting"
    recent = now - w.live_at <= 2 * live_s + 0.5
    return "running" if (w.in_op or recent) else "waiting"
