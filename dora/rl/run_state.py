"""The RL driver's part of a whole-run checkpoint: what to save at a step, and how a resumed run
picks it up (dora/rl/checkpoint.py holds the folder layout).

Taken at the publish of version v, before any request of v is dispatched: every dispatched group
not trained by step v is either *pending* (finished, every member scored: its rows are saved and
trained after resume) or *reissued* (some member still generating or being scored: the whole group
is dispatched again on resume, under the newest version, so C1 and C2 hold). The dataset replicas'
cursors count the groups taken for dispatch, reissued ones included, so no prompt is read twice;
the generate replicas' sampler states let a seeded sync run resume exactly.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import time
from typing import Any

import pyarrow as pa

from dora.rl import checkpoint
from dora.runtime.errors import CallError, ReplicaLost, RunFailed
from dora.rl.rollout import Trajectory


@dataclasses.dataclass
class Snapshot:
    step: int
    state: dict[str, Any]
    pending: pa.Table | None


def capture(driver, step: int) -> Snapshot:
    """The driver's state at the publish of version `step` (its batch just trained)."""
    feed, prompts = driver.feed, driver.prompts
    trained = set(feed.sent["uids"]) if feed.sent else set()
    pending_rows: list[dict] = []
    reissue: list[list[dict]] = []
    for uids in prompts.open_groups.values():
        if all(u in trained for u in uids):
            continue
        if all(u in feed.scored for u in uids):
            pending_rows += [feed.scored[u] for u in uids]
        else:
            reissue.append([prompts.payloads[u] for u in uids])
    # groups queued to go again (a dead replica's, a trainer restart's) are past the dataset cursors
    reissue += [[r.payload for r in group] for group in prompts.waiting if group[0].group_id in prompts.reissued_groups]
    gen = driver.graph.nodes[driver.roles.generate]
    sampling = {}
    for r in range(gen.replicas):
        try:
            got = driver.ctrl.call(gen.name, r, "snapshot", {}, timeout=60.0).get("sampling_state")
        except ReplicaLost:   # dying: a resumed replica starts from its seed instead
            got = None
        sampling[str(r)] = base64.b64encode(got).decode() if got else None
    state = {
        "step": step, "version": step, "consumed": list(prompts.consumed), "sampling_states": sampling,
        "reissue": reissue, "trained_before": driver.trained_before + driver.trained_here + len(trained),
        "pending_trajectories": len(pending_rows),
        # (a resumed run numbers its reissued groups on from here: -1, -2, ... of the groups requeued
        # above stay theirs, and a to_prompts node downstream never sees one trajectory uid twice)
        "reissue_serial": prompts.reissue_serial,
    }
    pending = pa.Table.from_pylist(pending_rows, schema=feed.schema) if pending_rows else None
    return Snapshot(step, state, pending)


def commit(driver, snap: Snapshot, keep: int) -> str:
    """Write the trainer's part (a control call, while the trainer is idle) and the driver's, then
    rename the checkpoint into place."""
    run_dir = driver.files_dir
    staged = checkpoint.staging(run_dir, snap.step)
    run = driver.run_cfg
    done = driver.ctrl.call(driver.roles.update, 0, "save_checkpoint",
                            {"folder": staged, "optimizer": run.save_optimizer != "never", "dtype": run.save_dtype},
                            timeout=600.0)
    if int(done["step"]) != snap.step:
        raise RuntimeError(f"the trainer checkpointed step {done['step']}, the run state is of step {snap.step}")
    checkpoint.write_state(staged, snap.state, snap.pending)
    return checkpoint.commit(run_dir, snap.step, keep, optimizer_in_newest_only=run.save_optimizer == "last")


def replica_restores(state: dict[str, Any], roles, graph, folder: str) -> dict[str, dict[str, Any]]:
    """What each replica gets at setup in a resumed run (OpContext.restore), by replica label."""
    # every rank of a sharded trainer loads its shards (any rank count: DCP reshards)
    out: dict[str, dict[str, Any]] = {f"{roles.update}[{r}]": {"checkpoint": folder}
                                      for r in range(graph.nodes[roles.update].replicas)}
    for r, n in enumerate(state["consumed"]):
        out[f"{roles.dataset}[{r}]"] = {"consumed": n}
    for r in range(graph.nodes[roles.generate].replicas):
        blob = state["sampling_states"].get(str(r))
        if blob:
            out[f"{roles.generate}[{r}]"] = {"sampling_state": base64.b64decode(blob)}
    return out


def restore(driver, state: dict[str, Any], pending: pa.Table | None) -> None:
    """Put the driver where the checkpoint left it: steps, cursors, groups to dispatch again first,
    finished trajectories to train."""
    driver.initial_version = driver.steps_done = driver.feed.batches_sent = int(state["step"])
    if driver.steps_done >= driver.total_steps:   # it had finished: nothing left to train
        driver._done = True
        driver.stop_reason = f"already complete: {driver.steps_done} of {driver.total_steps} steps"
    driver.prompts.consumed = list(state["consumed"])
    driver.prompts.reissue_serial = int(state.get("reissue_serial", 0))
    driver.trained_before = int(state["trained_before"])
    for rows in reversed(state["reissue"]):
        driver.prompts.requeue(rows)
    driver.reissued_at_resume = sum(len(rows) for rows in state["reissue"])
    if pending is not None:
        put_back(driver, pending)


def put_back(driver, pending: pa.Table) -> None:
    """A checkpoint's finished, untrained trajectories: scored rows for the trainer, open groups (so a
    later checkpoint saves them again while untrained), and the rollout controller's queue at start."""
    driver.feed.schema = driver.feed.schema or pending.schema
    for row in pending.to_pylist():
        uid = str(row["uid"])
        driver.feed.scored[uid] = row
        driver.prompts.payloads[uid] = row
        members = driver.prompts.open_groups.setdefault(str(row["group_id"]), [])
        if uid not in members:
            members.append(uid)
    driver.restored_finished = pending_trajectories(pending)


def pending_trajectories(pending: pa.Table) -> list[Trajectory]:
    """A checkpoint's finished, untrained trajectories, for the rollout controller's queue."""
    return [Trajectory(str(row["uid"]), str(row["group_id"]), int(row["policy_version"]), len(row["prompt_ids"]),
                       len(row["response_ids"]), tuple(sorted(set(row.get("token_versions") or [row["policy_version"]]))),
                       0.0, row)
            for row in pending.to_pylist()]


STOP_CHECKPOINT_S = 30.0  # a stopped run checkpoints within this, so the whole stop fits in a minute


def checkpoint_due(version: int, total_steps: int, save_every: int) -> bool:
    """Is the publish of `version` a checkpoint (every save_every steps, and the last step)?"""
    return version >= total_steps or (save_every > 0 and version % save_every == 0)


def commit_timed(driver, snap: Snapshot) -> bool:
    """commit, keeping the run's newest checkpoints and logging {step, seconds, bytes}. False when the
    trainer died first (it restarts from the checkpoint before: dora/rl/trainer_restart.py)."""
    t0 = time.monotonic()
    try:
        folder = commit(driver, snap, driver.run_cfg.keep_checkpoints)
    except ReplicaLost as e:
        driver.progress.status(f"checkpoint of step {snap.step} not written: {e}")
        return False
    except (OSError, CallError) as e:
        if not checkpoint.out_of_space(e):
            raise
        needed = driver.checkpoint_log[-1]["bytes"] if driver.checkpoint_log else 0
        raise RunFailed(str(checkpoint.no_space(driver.files_dir, snap.step, needed))) from None
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
    driver.checkpoints.append(folder)
    driver.checkpoint_log.append({"step": snap.step, "seconds": round(time.monotonic() - t0, 3), "bytes": size})
    return True


def checkpoint_at_stop(driver) -> None:
    """A stopped run (a signal) checkpoints the step the trainer last finished, within
    STOP_CHECKPOINT_S; past that, or on any error, the last periodic checkpoint stands."""
    deadline = time.monotonic() + STOP_CHECKPOINT_S
    try:
        while True:
            # returns once the trainer is between steps; a batch already sent is still trained
            # (it may wait in its inbox): the checkpoint comes after it, so nothing sent is lost
            driver.ctrl.call(driver.roles.update, 0, "stats", {}, timeout=max(1.0, deadline - time.monotonic()))
            driver.ctrl.deliver_events()   # the step it just finished, if any (written and maybe checkpointed)
            if driver.feed.sent is None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the trainer did not finish step {driver.steps_done + 1} within {STOP_CHECKPOINT_S:.0f} s")
            time.sleep(0.05)
        if driver.steps_done > driver.initial_version and (
                not driver.checkpoints or not driver.checkpoints[-1].endswith(f"step_{driver.steps_done}")):
            commit_timed(driver, capture(driver, driver.steps_done))
    except Exception as e:
        driver.progress.status(f"no checkpoint at stop ({type(e).__name__}: {e}); the last one stands")
