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

from dora.graph.diagnostics import BadInput
from dora.graph.policy_roles import policy_dir
from dora.graph.resolve import resolve
from dora.graph.validate import FOLDER_NOTE
from dora.graph.yaml_io import to_yaml
from dora.observe.dashboard.live import LIVE_S, LiveDashboard
from dora.observe.metric_sinks import open_for_run
from dora.observe.metrics import MetricsLog, policy_records, summarize, write_summary
from dora.observe.progress import RunProgress
from dora.ops.weights import versions as weights
from dora.rl import lineage, run_state
from dora.rl.driver import RLDriver
from dora.rl.policies_driver import MultiPolicyDriver
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
    os.makedirs(run_dir, exist_ok=True)
    problem = _claim_run_files(graph, run_dir, quiet, write_pipeline=resume is None, policies=list(resolved.policies))
    if problem:
        print(f"dora run: {problem}", file=sys.stderr)
        return 2
    roles = RLRoles.of_policies(resolved) or RLRoles.find(graph, resolved.op_of)
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


def _claim_run_files(graph, run_dir: str, quiet: bool, write_pipeline: bool, policies: list[str] = ()) -> str | None:
    """Remove what dead runs left, claim this run's /dev/shm folder (one per policy in a run of several:
    each trainer writes its versions under its own RUN_DIR/policies/<update>), write pipeline.yaml (a
    fresh run: exactly what runs, overrides applied); what stands in the way, or None."""
    swept = run_files.sweep_stale()
    if swept and not quiet:
        print(f"dora run: removed what {len(swept)} dead run(s) left: {', '.join(swept)}", file=sys.stderr)
    for folder in _weights_folders(run_dir, policies):
        shm = weights.shm_dir(folder)
        if os.access(os.path.dirname(shm), os.W_OK):
            try:   # before anything in run_dir is written: a live run's files stay untouched
                run_files.claim(shm, run_dir)   # exclusive, 0700
            except run_files.RunFilesError as e:
                return str(e)
    if write_pipeline:
        with open(os.path.join(run_dir, "pipeline.yaml"), "w", encoding="utf-8") as fh:
            if graph.source_file:   # (--resume imports modules from beside the original, as this run does)
                fh.write(f"{FOLDER_NOTE}{os.path.dirname(os.path.abspath(graph.source_file))}\n")
            fh.write(to_yaml(graph))
    return None


def _weights_folders(run_dir: str, policies: list[str]) -> list[str]:
    """The folders whose weight versions the run writes: RUN_DIR, or each policy's."""
    return [policy_dir(run_dir, u) for u in policies] if policies else [run_dir]


def _build(graph, run_dir: str, resolved, roles, *, seed: int, quiet: bool, source: str | None,
           resume, dashboard_port: int | None, live_state: bool, controller: dict[str, Any]) -> _Run | int:
    """The run's observers, driver and controller; an exit code when one of them cannot start.
    `roles`: an RLRoles, {update node: RLRoles} for a run of several policies, or None (dataflow)."""
    a = resolved.async_
    earlier = None
    if resume is not None:   # one lineage: what the dead run did after checkpoint N goes to rolled_back/
        _roll_back(run_dir, resume, quiet)
        earlier = lineage.kept_records(run_dir)
    logged = {"pipeline": source, "mode": a.mode, "max_staleness": a.max_staleness, "train_batch": a.train_batch,
              "rollout_batch": a.rollout_batch, "seed": seed}
    sinks = open_for_run(graph, run_dir, logged)
    if sinks is None:
        return 1
    metrics = MetricsLog(run_dir, sinks, append=resume is not None, earlier=earlier,
                         open_sinks=lambda: open_for_run(graph, run_dir, logged))   # (again after a trainer restart)
    several = isinstance(roles, dict)
    total = (sum(resolved.params[u]["steps"] for u in roles) if several else
             resolved.params[roles.update]["steps"] if roles else 0)
    progress = RunProgress(total, graph.name, quiet=quiet)
    driver = (MultiPolicyDriver(resolved, roles, metrics, progress) if several else
              RLDriver(resolved, roles, metrics, progress) if roles else None)
    try:   # the held-out sets' prompts: a row no engine can take refuses the run now, not at its first evaluation
        if isinstance(driver, RLDriver):
            driver.evaluations.load()
    except BadInput as e:
        print(f"dora run: bad input: {e}", file=sys.stderr)
        metrics.close()
        return 2
    restores = None
    if resume is not None:
        restores = _restore(driver, resume, graph)
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


def _roll_back(run_dir: str, resume, quiet: bool) -> None:
    """Cut the run's files back to the checkpoint a resume starts from: each policy's to its own
    (`resume` a {policy: Resume or None (no checkpoint: from step 0)} in a run of several)."""
    several = isinstance(resume, dict)
    for policy, r in (resume.items() if several else [(None, resume)]):
        step = int(r.state["step"]) if r is not None else 0
        rolled = lineage.roll_back(run_dir, step, untrusted=r.skipped if r is not None else [], policy=policy,
                                   files_dir=policy_dir(run_dir, policy) if policy else None)
        if rolled.get("folder") and not quiet:
            print(f"dora run: --resume {policy + ' ' if policy else ''}from step {rolled['resumed_from_step']}: moved "
                  f"{rolled['metrics_rows']} step(s) and {rolled['trained_trajectories']} trained trajectories the "
                  f"checkpoint never saw to {rolled['folder']}", file=sys.stderr)


def _restore(driver, resume, graph) -> dict[str, dict[str, Any]]:
    """Put the driver (each policy's) where its checkpoint left it; what each replica restores from."""
    pairs = ([(driver.drivers[u], r) for u, r in resume.items()] if isinstance(resume, dict) else [(driver, resume)])
    restores: dict[str, dict[str, Any]] = {}
    for d, r in pairs:
        if r is None:
            continue
        d.restore(r.state, r.pending)
        d.checkpoints.append(r.folder)   # (what a trainer restart goes back to, before a newer one)
        restores.update(run_state.replica_restores(r.state, d.roles, graph, r.folder))
    return restores


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
        for folder in _weights_folders(run.ctrl.run_dir, list(run.ctrl.resolved.policies)):
            weights.cleanup(folder)   # the /dev/shm copies; checkpoints stay in run_dir
    return ended, error


def _driver_part(driver: RLDriver) -> dict[str, Any]:
    """A policy's part of summary.json: the accounting of every trajectory it dispatched, weight loads,
    trainer restarts, checkpoints, elastic lending, shared devices and held-out sets where they ran."""
    part: dict[str, Any] = {"accounting": driver.finish(), "stop_reason": driver.stop_reason}
    part["weight_loads"] = driver.weight_loads
    part["trainer_restarts"] = driver.restarts.count   # (dora/rl/trainer_restart.py)
    if driver.elastic is not None:   # lends, hand-back seconds, requests and KV bytes moved
        part["elastic"] = driver.elastic.summary()
    if driver.shared is not None:    # sleeps before each step, wakes at each publish, bytes handed back
        part["shared_devices"] = driver.shared.summary()
    if driver.evaluations.sets:   # per set: best version per metric, the last; failures
        part["eval"] = driver.evaluations.summary()
    part["checkpoints"] = driver.checkpoint_log
    return part


def _violations(part: dict[str, Any]) -> dict[str, Any]:
    """C1-C3: the larger of what the steps' metrics and the accounting counted."""
    for key in ("c1_violations", "c2_violations", "c3_violations"):
        part[key] = max(part.get(key, 0), part["accounting"].get(key, 0))
    return part


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
    if isinstance(resume, dict):   # (informational: the files hold one lineage per policy)
        summary["resumed_from_step"] = {u: int(r.state["step"]) if r is not None else 0 for u, r in resume.items()}
    elif resume is not None:
        summary["resumed_from_step"] = int(resume.state["step"])   # (informational: the files hold one lineage)
    summary["respawn_log"] = ctrl.respawn_log   # {replica, why, seconds until it took work again}
    try:
        if isinstance(driver, MultiPolicyDriver):   # each policy's part under its name, the sums on top
            summary["policies"] = {u: _violations({**summarize(policy_records(run.metrics.records, u)), **_driver_part(d)})
                                   for u, d in driver.drivers.items()}
            summary["accounting"] = driver.finish()
            summary["stop_reason"] = summary.get("stop_reason") or "; ".join(
                f"{u}: {p['stop_reason']}" for u, p in summary["policies"].items() if p.get("stop_reason")) or None
            for key in ("c1_violations", "c2_violations", "c3_violations", "weight_loads", "trainer_restarts", "tokens",
                        "trajectories", "migrated_requests", "reprefill_tokens"):
                summary[key] = sum(p.get(key) or 0 for p in summary["policies"].values())
            summary["staleness_max"] = max((p.get("staleness_max") or 0) for p in summary["policies"].values())
            driver.trace.write(os.path.join(run_dir, "trace.json"))
        elif driver is not None:
            summary.update({k: v for k, v in _driver_part(driver).items() if k != "stop_reason"})
            summary["stop_reason"] = summary.get("stop_reason") or driver.stop_reason
            _violations(summary)
            driver.trace.write(os.path.join(run_dir, "trace.json"))
        else:
            with open(os.path.join(run_dir, "trace.json"), "w") as fh:
                json.dump({"traceEvents": []}, fh)
    finally:
        write_summary(run_dir, summary)
        if run.dash is not None:
            run.dash.close(ctrl, ended == "finished", error)
    return summary
