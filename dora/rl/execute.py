"""Running a validated graph, from `dora run` (dora/rl/launch.py) or a benchmark: the run's files
outside RUN_DIR claimed, its observers (metrics.jsonl and sinks, progress, state.json and the
dashboard) opened, the RL driver (for an RL graph) and the run controller built, the run itself with
its stop signals, and whatever happens, summary.json and trace.json written and the run's shared
memory removed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from dora.graph.resolve import resolve
from dora.graph.yaml_io import to_yaml
from dora.observe.dashboard.live import LIVE_S, LiveDashboard
from dora.observe.metric_sinks import open_for_run
from dora.observe.metrics import MetricsLog, summarize, write_summary
from dora.observe.progress import RunProgress
from dora.ops.weights import versions as weights
from dora.rl import lineage, run_state
from dora.rl.driver import RLDriver
from dora.rl.elastic_lending import elastic_spares
from dora.rl.roles import RLRoles
from dora.runtime import run_files
from dora.runtime.errors import RunFailed
from dora.runtime.run_controller import START_TIMEOUT_S, STALL_TIMEOUT_S, Controller


class StopSignals:
    """SIGTERM / SIGINT during a run: the first asks the controller to stop cleanly (the driver stops
    dispatch and checkpoints, then summary, trace and clean-up as usual); a second one stops at once
    (KeyboardInterrupt: workers are killed, clean-up still runs). Once the workers are gone, a signal
    no longer interrupts anything: what is left is writing the summary, which is quick and must not
    be cut short. Only the main thread can install handlers; elsewhere (a run driven from a thread)
    this does nothing."""

    def __init__(self, ctrl, progress):
        self.ctrl, self.progress = ctrl, progress
        self.received: int | None = None
        self.previous: dict[int, Any] = {}
        self.workers_gone = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.workers_gone:
            self.progress.status(f"{name}: the run has stopped; writing its summary")
            return
        if self.received is not None:
            raise KeyboardInterrupt(f"second signal ({name}): stopping at once")
        self.received = signum
        self.ctrl.stop_requested = name
        self.progress.status(f"{name}: stopping (checkpoint, summary, clean-up); send it again to stop at once")

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number: 143 for SIGTERM, 130 for SIGINT (shell convention)."""
        return 128 + int(self.received or signal.SIGTERM)


@dataclasses.dataclass
class _Run:
    """The parts of one run, as built by _build."""

    metrics: MetricsLog
    progress: RunProgress
    driver: RLDriver | None
    dash: LiveDashboard | None
    ctrl: Controller
    bad_input: bool = False   # the run failed on the user's input (a data file's row): exit 2


def execute(graph, run_dir: str, backend: str = "local", seed: int = 0, quiet: bool = False,
            deadline_s: float | None = None, source: str | None = None, hb_timeout: float = 30.0, resolved=None,
            start_timeout_s: float = START_TIMEOUT_S, stall_timeout_s: float = STALL_TIMEOUT_S, resume=None,
            dashboard_port: int | None = None, live_state: bool = True) -> int:
    """Run a validated graph; returns the exit code (0 finished, 1 failed, 2 bad input found while
    running (a data file's row, named file:line), 143 / 130 preempted by
    SIGTERM / SIGINT). Shared by the CLI and benchmarks/modes.py. Whatever happens, summary.json and
    trace.json are written and the run's shared memory is removed. live_state keeps RUN_DIR/state.json
    current (False: no live counters at all, for the dashboard's overhead benchmark); dashboard_port
    also serves it (0: any free port)."""
    resolved = resolved or resolve(graph)
    problem = _claim_run_files(graph, run_dir, quiet, write_pipeline=resume is None)
    if problem:
        print(f"dora run: {problem}", file=sys.stderr)
        return 2
    roles = RLRoles.find(graph, resolved.op_of)
    if resume is not None and roles is None:
        print("dora run: --resume continues RL runs only (this graph has no dataset -> generate -> update)", file=sys.stderr)
        return 2
    run = _build(graph, run_dir, resolved, roles, seed=seed, quiet=quiet, source=source, resume=resume,
                 dashboard_port=dashboard_port, live_state=live_state,
                 controller=dict(backend=backend, seed=seed, deadline_s=deadline_s, hb_timeout=hb_timeout,
                                 start_timeout_s=start_timeout_s, stall_timeout_s=stall_timeout_s))
    if not isinstance(run, _Run):
        return run
    t0 = time.monotonic()
    signals = StopSignals(run.ctrl, run.progress)
    with signals:
        ended, error = _run(run, signals)
        summary = _summary(run, graph, run_dir, backend=backend, seed=seed, source=source, resume=resume, ended=ended,
                           error=error, wall=time.monotonic() - t0)
    run.progress.summary_table(summary)
    if ended == "preempted":
        print(f"dora run: preempted ({summary['stop_reason']}); summary in {run_dir}", file=sys.stderr)
        return signals.exit_code
    if error and run.bad_input:
        print(f"dora run: bad input: {error}", file=sys.stderr)
        return 2
    if error:
        print(f"dora run: run failed: {error}", file=sys.stderr)
        return 1
    return 0


def _claim_run_files(graph, run_dir: str, quiet: bool, write_pipeline: bool) -> str | None:
    """Remove what dead runs left, claim this run's /dev/shm folder, write pipeline.yaml (a fresh
    run: exactly what runs, overrides applied); what stands in the way, or None."""
    swept = run_files.sweep_stale()
    if swept and not quiet:
        print(f"dora run: removed what {len(swept)} dead run(s) left: {', '.join(swept)}", file=sys.stderr)
    shm = weights.shm_dir(run_dir)
    if os.access(os.path.dirname(shm), os.W_OK):
        try:   # before anything in run_dir is written: a live run's files stay untouched
            run_files.claim(shm, run_dir)   # exclusive, 0700
        except run_files.RunFilesError as e:
            return str(e)
    if write_pipeline:
        with open(os.path.join(run_dir, "pipeline.yaml"), "w", encoding="utf-8") as fh:
            fh.write(to_yaml(graph))
    return None


def _build(graph, run_dir: str, resolved, roles: RLRoles | None, *, seed: int, quiet: bool, source: str | None,
           resume, dashboard_port: int | None, live_state: bool, controller: dict[str, Any]) -> _Run | int:
    """The run's observers, driver and controller; an exit code when one of them cannot start."""
    a = resolved.async_
    earlier = None
    if resume is not None:   # one lineage: what the dead run did after checkpoint N goes to rolled_back/
        rolled = lineage.roll_back(run_dir, int(resume.state["step"]), untrusted=resume.skipped)
        if rolled.get("folder") and not quiet:
            print(f"dora run: --resume from step {rolled['resumed_from_step']}: moved {rolled['metrics_rows']} step(s) "
                  f"and {rolled['trained_trajectories']} trained trajectories the checkpoint never saw to "
                  f"{rolled['folder']}", file=sys.stderr)
        earlier = lineage.kept_records(run_dir)
    logged = {"pipeline": source, "mode": a.mode, "max_staleness": a.max_staleness, "train_batch": a.train_batch,
              "rollout_batch": a.rollout_batch, "seed": seed}
    sinks = open_for_run(graph, run_dir, logged)
    if sinks is None:
        return 1
    metrics = MetricsLog(run_dir, sinks, append=resume is not None, earlier=earlier,
                         open_sinks=lambda: open_for_run(graph, run_dir, logged))   # (again after a trainer restart)
    total = resolved.params[roles.update]["steps"] if roles else 0
    progress = RunProgress(total, graph.name, quiet=quiet)
    driver = RLDriver(resolved, roles, metrics, progress) if roles else None
    restores = None
    if resume is not None:
        driver.restore(resume.state, resume.pending)
        driver.checkpoints.append(resume.folder)   # (what a trainer restart goes back to, before a newer one)
        restores = run_state.replica_restores(resume.state, roles, graph, resume.folder)
        _keep_earlier_trace(run_dir)
    dash = None
    if live_state or dashboard_port is not None:
        try:
            dash = LiveDashboard(graph, run_dir, driver=driver, metrics=metrics, total_steps=total or None, port=dashboard_port)
        except OSError as e:
            print(f"dora run: --dashboard: cannot listen on 127.0.0.1:{dashboard_port}: {e.strerror or e}", file=sys.stderr)
            metrics.close()
            return 2
    ctrl = Controller(graph, driver=driver, run_dir=run_dir, resolved=resolved, restores=restores,
                      max_restarts=resolved.run.max_restarts, live_s=LIVE_S if dash else 0.0,
                      monitor=dash.state if dash else None, spares=elastic_spares(graph), **controller)
    if driver is not None:
        driver.attach(ctrl)
    return _Run(metrics, progress, driver, dash, ctrl)


def _keep_earlier_trace(run_dir: str) -> None:
    """A resumed run writes its own trace.json; the earlier segments' stay as trace-1.json, ..."""
    path = os.path.join(run_dir, "trace.json")
    if os.path.isfile(path):
        n = 1
        while os.path.exists(os.path.join(run_dir, f"trace-{n}.json")):
            n += 1
        os.replace(path, os.path.join(run_dir, f"trace-{n}.json"))


def _run(run: _Run, signals: StopSignals) -> tuple[str, str | None]:
    """(how it ended: finished | preempted | failed, the error if any). The shared memory is removed
    whatever happens."""
    ended, error = "failed", None
    try:
        run.ctrl.run()
        ended = "preempted" if run.ctrl.stop_requested else "finished"
    except RunFailed as e:
        error = str(e)   # names the node and replica, with the worker's traceback (none for bad input)
        run.bad_input = e.bad_input
    except KeyboardInterrupt as e:
        ended, error = "preempted", str(e) or "interrupted"
    except Exception as e:   # a driver or control error: a named failure, not a bare traceback
        error = f"the run's control code failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        signals.workers_gone = True
        run.progress.close()
        run.metrics.close()
        weights.cleanup(run.ctrl.run_dir)   # the /dev/shm copies; checkpoints stay in run_dir
    return ended, error


def _summary(run: _Run, graph, run_dir: str, *, backend: str, seed: int, source: str | None, resume, ended: str,
             error: str | None, wall: float) -> dict[str, Any]:
    """summary.json (with the driver's accounting of every dispatched trajectory) and trace.json,
    written whatever happened; then the dashboard's last snapshot."""
    ctrl, driver = run.ctrl, run.driver
    summary: dict[str, Any] = summarize(run.metrics.records, name=graph.name, mode=graph.async_.mode, backend=backend,
                                        seed=seed, wall_s=wall, run_dir=run_dir, ok=ended == "finished", error=error,
                                        source=source, ended=ended, wire_rejected=ctrl.rejected())
    if ended == "preempted":
        summary["stop_reason"] = ctrl.stop_requested or "interrupted"
    if resume is not None:
        summary["resumed_from_step"] = int(resume.state["step"])   # (informational: the files hold one lineage)
    summary["respawn_log"] = ctrl.respawn_log   # {replica, why, seconds until it took work again}
    try:
        if driver is not None:
            summary["accounting"] = driver.finish()
            summary["stop_reason"] = summary.get("stop_reason") or driver.stop_reason
            for key in ("c1_violations", "c2_violations", "c3_violations"):
                summary[key] = max(summary.get(key, 0), summary["accounting"].get(key, 0))
            summary["weight_loads"] = driver.weight_loads
            summary["trainer_restarts"] = driver.restarts.count   # (dora/rl/trainer_restart.py)
            if driver.elastic is not None:   # lends, hand-back seconds, requests and KV bytes moved
                summary["elastic"] = driver.elastic.summary()
            if driver.shared is not None:    # sleeps before each step, wakes at each publish, bytes handed back
                summary["shared_devices"] = driver.shared.summary()
            if driver.evaluations.sets:   # per set: best version per metric, the last; failures
                summary["eval"] = driver.evaluations.summary()
            summary["checkpoints"] = driver.checkpoint_log
            driver.trace.write(os.path.join(run_dir, "trace.json"))
        else:
            with open(os.path.join(run_dir, "trace.json"), "w") as fh:
                json.dump({"traceEvents": []}, fh)
    finally:
        write_summary(run_dir, summary)
        if run.dash is not None:
            run.dash.close(ctrl, ended == "finished", error)
    return summary
