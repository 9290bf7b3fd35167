"""The RL driver's part of a whole-run checkpoint: what to save at a step, and how a resumed run
picks it up (dora/runtime/checkpoint.py holds the folder layout).

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
from typing import Any

import pyarrow as pa

from dora.runtime import checkpoint
from dora.runtime.errors import ReplicaLost
from dora.runtime.rollout import Request, Trajectory


@dataclasses.dataclass
class Snapshot:
    step: int
    state: dict[str, Any]
    pending: pa.Table | None


def capture(driver, step: int) -> Snapshot:
    """The driver's state at the publish of version `step` (its batch just trained)."""
    trained = set(driver.sent_batch["uids"]) if driver.sent_batch else set()
    pending_rows: list[dict] = []
    reissue: list[list[dict]] = []
    for uids in driver.open_groups.values():
        if all(u in trained for u in uids):
            continue
        if all(u in driver.scored for u in uids):
            pending_rows += [driver.scored[u] for u in uids]
        else:
            reissue.append([driver.payloads[u] for u in uids])
    gen = driver.graph.nodes[driver.roles.generate]
    sampling = {}
    for r in range(gen.replicas):
        try:
            got = driver.ctrl.call(gen.name, r, "snapshot", {}, timeout=60.0).get("sampling_state")
        except ReplicaLost:   # dying: a resumed replica starts from its seed instead
            got = None
        sampling[str(r)] = base64.b64encode(got).decode() if got else None
    state = {
        "step": step, "version": step, "consumed": list(driver.consumed), "sampling_states": sampling,
        "reissue": reissue, "trained_before": driver.trained_before + driver.trained_here + len(trained),
        "pending_trajectories": len(pending_rows),
    }
    pending = pa.Table.from_pylist(pending_rows, schema=driver.scored_schema) if pending_rows else None
    return Snapshot(step, state, pending)


def commit(driver, snap: Snapshot, keep: int) -> str:
    """Write the trainer's part (a control call, while the trainer is idle) and the driver's, then
    rename the checkpoint into place."""
    run_dir = driver.ctrl.run_dir
    staged = checkpoint.staging(run_dir, snap.step)
    done = driver.ctrl.call(driver.roles.update, 0, "save_checkpoint", {"folder": staged}, timeout=600.0)
    if int(done["step"]) != snap.step:
        raise RuntimeError(f"the trainer checkpointed step {done['step']}, the run state is of step {snap.step}")
    checkpoint.write_state(staged, snap.state, snap.pending)
    return checkpoint.commit(run_dir, snap.step, keep)


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
    driver.initial_version = driver.steps_done = driver.batches_sent = int(state["step"])
    if driver.steps_done >= driver.total_steps:   # it had finished: nothing left to train
        driver._done = True
        driver.stop_reason = f"already complete: {driver.steps_done} of {driver.total_steps} steps"
    driver.consumed = list(state["consumed"])
    driver.trained_before = int(state["trained_before"])
    for rows in reversed(state["reissue"]):
        group = []
        for row in rows:
            row = {**row, "policy_version": 0}
            driver.payloads[str(row["uid"])] = row
            group.append(Request(uid=str(row["uid"]), group_id=str(row["group_id"]), version=0,
                                 prompt_tokens=len(row["prompt_ids"]), payload=row))
        driver.prompt_groups.appendleft(group)
        driver.reissued_groups.add(group[0].group_id)
    driver.reissued_at_resume = sum(len(rows) for rows in state["reissue"])
    if pending is not None:
        driver.scored_schema = pending.schema
        for row in pending.to_pylist():
            driver.scored[str(row["uid"])] = row
        driver.restored_finished = [
            Trajectory(str(row["uid"]), str(row["group_id"]), int(row["policy_version"]), len(row["prompt_ids"]),
                       len(row["response_ids"]), tuple(sorted(set(row.get("token_versions") or [row["policy_version"]]))),
                       0.0, row)
            for row in pending.to_pylist()]
