"""A trainer that dies restarts itself, inside the same `dora run`, from the run's last complete
checkpoint (or from the initial weights, step 0, when there is none yet), up to run.max_restarts.

The run controller's supervisor kills what is left of the trainer's process group, calls
`prepare` (RLDriver.before_respawn) before the new ranks start, and `restarted`
(RLDriver.on_replica_lost) once they are up. What happens in between is what `dora run --resume`
from checkpoint N does, inside the live run:

- the rollout controller's books of the segment since the last (re)start are closed: trajectories
  trained after step N, finished or being trained, and requests in flight, are dropped with the
  reason `trainer_restart` (run_accounting.py sums the segments, so the identity stays exact);
- the generate replicas stay up: their requests are interrupted, and they load version N again
  (the new trainer republishes its restored weights as version N) before any new dispatch;
- the trajectories the checkpoint held finished (pending.arrow) are trained again as they are;
  every other group dispatched since checkpoint N, trained after it or not, is generated again
  whole under a new group id (rows of the old attempt still on their way are dropped as late);
- the run's files are cut back to step N as --resume does (dora/rl/lineage.py): metrics.jsonl and
  trained.jsonl keep steps <= N, the rest goes to RUN_DIR/rolled_back/restart_K/, the loggers start
  again from a replay of steps 1..N.

To generate again the groups trained after checkpoint N, their prompt rows are kept
(`remember_trained`) until the next checkpoint is committed (`checkpointed`): at most save_every
steps of train_batch prompts.
"""

from __future__ import annotations

import os
from typing import Any

from dora.ops.weights import versions as weights
from dora.rl import checkpoint, lineage, run_state
from dora.rl.run_accounting import merge

RESTART_REASON = "trainer_restart"


class TrainerRestarts:
    """What the RL driver keeps to restart its trainer, and what the restarts did."""

    def __init__(self):
        self.count = 0
        self.restarting = False                             # between prepare and restarted
        self.from_step: int | None = None                   # the step the last restart went back to
        self.trained_since: dict[int, list[list[dict[str, Any]]]] = {}   # step -> prompt rows of its groups
        self.trained_n: dict[int, int] = {}                 # step -> trajectories it trained (same steps)
        self.earlier: dict[str, Any] = {}                   # the closed segments' books (run_accounting.py)
        self.abandoned: set[str] = set()                    # uids interrupted at a restart (late finishes ignored)
        self.restored = 0                                   # finished trajectories put back from checkpoints
        self.regenerated_groups = 0


def not_possible(d) -> str | None:
    """Why the trainer of RLDriver `d` cannot restart (None: it can)."""
    if d.run_cfg.max_restarts == 0:
        return "run.max_restarts is 0"
    if d.ctrl is not None and (any(r.spare == d.roles.update for r in d.ctrl.plan.replicas) or d.ctrl.plan.shared):
        return "a trainer restart is not supported with async.elastic or devices shared by memory shares"
    if d.params[d.roles.update].get("weight_sync") == "broadcast":
        return "a trainer restart is not supported with weight_sync: broadcast (the generate replicas' group is gone)"
    return None


def stale(d, ev: dict) -> bool:
    """A trainer event sent by a dead trainer that arrives after its restart (too late for
    `prepare`): its weights and steps are gone. The new trainer publishes the version it restored,
    then each step's version before that step's train_step, one batch at a time."""
    if d.restarts.count == 0 or d.restarts.restarting:
        return False
    v = int(ev.get("version", -1))
    if ev.get("kind") == "weights" and v == d.initial_version:
        return False
    return d.feed.sent is None or v != d.steps_done + 1


def remember_trained(d, step: int, uids: list[str]) -> None:
    """Step `step` trained these uids: keep their groups' prompt rows until a checkpoint covers it."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for u in uids:
        row = d.prompts.payloads.get(str(u))
        if row is not None:
            groups.setdefault(str(row["group_id"]), []).append(row)
    d.restarts.trained_since[step] = list(groups.values())
    d.restarts.trained_n[step] = len(uids)


def checkpointed(d, step: int) -> None:
    """Checkpoint `step` is committed: the groups trained by then are never generated again."""
    r = d.restarts
    r.trained_since = {s: g for s, g in r.trained_since.items() if s > step}
    r.trained_n = {s: n for s, n in r.trained_n.items() if s > step}


def last_checkpoint(d) -> tuple[int, str | None]:
    """(step, folder) of the run's newest complete checkpoint: one this process committed (whole: its
    manifest was written last), or the one it resumed from; (0, None) when there is none (never
    a folder an earlier run left in an --overwrite'd RUN_DIR)."""
    if not d.checkpoints:
        return 0, None
    folder = d.checkpoints[-1]
    return int(os.path.basename(folder).removeprefix("step_")), folder


def prepare(d, why: str) -> dict[str, dict[str, Any]]:
    """The trainer of RLDriver `d` died: go back to the last checkpoint (see the module doc) and
    return what each new trainer rank restores from (label -> OpContext.restore)."""
    r = d.restarts
    r.restarting = True
    for _ in range(5):   # what the dead ranks sent before they died reaches the controller in ms
        d.ctrl.pump(20)
    d.ctrl.deliver_events()   # ... and is handled under the old books
    step, folder = last_checkpoint(d)
    state, pending = checkpoint.read(folder) if folder else ({"trained_before": d.trained_before}, None)
    _close_segment(d, step)
    _generate_again(d, step, pending)
    _cut_files(d, step)
    d.evaluations.rolled_back(step)   # evaluations of versions after it are gone with their lines
    d.initial_version = d.steps_done = d.feed.batches_sent = step
    d.feed.pending = d.feed.sent = None
    d.snapshot = None
    d.trained_here = int(state["trained_before"]) - d.trained_before
    for table in (d.weight_paths, d.weight_sync):
        for v in [v for v in table if v >= step]:
            del table[v]   # version `step` comes again from the new trainer; newer ones are gone
    d.published_at.clear()
    r.from_step = step
    ranks = d.graph.nodes[d.roles.update].replicas
    return {f"{d.roles.update}[{i}]": {"checkpoint": folder} for i in range(ranks)} if folder else {}


def restarted(d, why: str) -> None:
    """The new trainer ranks are up (they publish version N at setup, which starts rollout again)."""
    r = d.restarts
    r.restarting = False
    r.count += 1
    d.progress.status(f"trainer lost ({why.splitlines()[0][:120]}); restarted from step {r.from_step} "
                      f"(restart {r.count} of {d.run_cfg.max_restarts}); its groups since then are generated again")
    d.trace.instant("trainer", "restart", f"restart from step {r.from_step}", d.clock.now(), restarts=r.count)


def _close_segment(d, step: int) -> None:
    """Close the rollout controller's books: what it holds that checkpoint `step` did not train is
    dropped (reason trainer_restart); the generate replicas' requests are interrupted."""
    r, rc = d.restarts, d.rc
    if rc is None:
        return
    instances = list(rc.manager.instances.values())
    for inst in instances:
        inst.interrupt_all()
        inst.version = None        # whatever it holds, version `step` is loaded before new work
    acc = rc.finish()
    rolled = sum(n for s, n in r.trained_n.items() if s > step)   # trained by steps the restart rolls back
    dropped = rolled + acc["finished_untrained"] + acc["in_flight_at_end"] + acc["in_training_at_end"]
    acc["trained"] -= rolled
    acc["finished_untrained"] = acc["in_flight_at_end"] = acc["in_training_at_end"] = 0
    acc["dropped"] += dropped
    acc["dropped_by_reason"] = {**acc["dropped_by_reason"]}
    acc["dropped_by_reason"][RESTART_REASON] = acc["dropped_by_reason"].get(RESTART_REASON, 0) + dropped
    r.earlier = merge(r.earlier, acc)
    d.rc, d.reused_instances = None, instances


def _generate_again(d, step: int, pending) -> None:
    """Every group dispatched since checkpoint `step` goes again, whole and under a new id, except
    those the checkpoint held finished: those are trained as they are (their rows from the checkpoint)."""
    r, prompts, feed = d.restarts, d.prompts, d.feed
    for s, groups in r.trained_since.items():   # trained after the checkpoint: open again
        if s > step:
            for rows in groups:
                for row in rows:
                    prompts.payloads[str(row["uid"])] = row
                prompts.open_groups[str(rows[0]["group_id"])] = [str(row["uid"]) for row in rows]
    r.trained_since, r.trained_n = {}, {}
    keep = {str(u) for u in pending.column("uid").to_pylist()} if pending is not None else set()
    again = [g for g, uids in prompts.open_groups.items() if uids[0] not in keep]
    r.abandoned.update(u for g in again for u in prompts.open_groups[g])   # their late rows and events are ignored
    r.regenerated_groups += prompts.reissue(again, forget=lambda uid: feed.scored.pop(uid, None))
    feed.scored.clear()   # (only the checkpoint's rows are trained from here)
    d.restored_finished = []
    if pending is not None:
        run_state.put_back(d, pending)
        r.restored += pending.num_rows


def _cut_files(d, step: int) -> None:
    """One lineage: the run's files back to step `step` (dora/rl/lineage.py), the weights versions
    of the dead trainer after it removed (the new one's pruning keeps the newest)."""
    run_dir = d.ctrl.run_dir

    def cut() -> list[dict[str, Any]]:
        lineage.roll_back(run_dir, step, kind="restart", policy=d.policy, files_dir=d.files_dir)
        return lineage.kept_records(run_dir)

    d.metrics.restart_at(cut)
    for v, path in weights.list_versions(d.files_dir):
        if v >= step:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
