"""The prompts of an RL run, from the dataset edge to the end of each group.

Prompt rows arrive on the managed dataset -> generate edge and wait here as whole groups until the
rollout controller takes them (`take`, its prompt source). From then on a group is *open* until it
is trained or dropped: its rows (payloads) stay here, so that a group whose replica died, or that
was in flight at a checkpoint, can be dispatched again whole (`reissue`) under a new group id, and
rows of the old attempt still on their way are recognised as late. `consumed` counts the groups
taken from each dataset replica: a resumed run's dataset cursors.
"""

from __future__ import annotations

import collections
from typing import Any

import pyarrow as pa

from dora.rl.rollout import Request


class PromptFeed:
    def __init__(self, dataset_replicas: int, group_size: int, rollout_batch: int):
        self.group_size, self.rollout_batch = group_size, rollout_batch
        self.waiting: collections.deque[list[Request]] = collections.deque()   # groups not yet dispatched
        self.payloads: dict[str, dict[str, Any]] = {}      # uid -> prompt row, while its group is open
        self.open_groups: dict[str, list[str]] = {}       # dispatched, not yet trained or dropped: gid -> uids
        self.consumed = [0] * dataset_replicas
        self.schema: pa.Schema | None = None
        self.dataset_done = False      # the dataset sent end-of-stream: no more prompts will come
        self.reissued_groups: set[str] = set()   # dispatched again (a dead replica, a checkpoint): not re-read
        self.reissue_serial = 0
        self.reissued_requests = 0

    # ------------------------------------------------------------ in
    def wants(self) -> bool:
        """Flow control for the prompt edge: hold the dataset back once enough groups wait."""
        return len(self.waiting) * self.group_size < 2 * self.rollout_batch

    def add(self, batch: pa.RecordBatch) -> None:
        if self.schema is None:
            schema = batch.schema
            if "policy_version" not in schema.names:
                schema = schema.append(pa.field("policy_version", pa.int64()))
            self.schema = schema
        groups: dict[Any, list[Request]] = {}
        for row in batch.to_pylist():
            uid = str(row["uid"])
            row.setdefault("policy_version", 0)
            self.payloads[uid] = row
            groups.setdefault(row["group_id"], []).append(
                Request(uid=uid, group_id=str(row["group_id"]), version=0, prompt_tokens=len(row["prompt_ids"]), payload=row))
        self.waiting.extend(groups.values())

    def enough_to_start(self) -> bool:
        # The first dispatch asks for a whole rollout batch; starting earlier would read a
        # momentarily short prompt buffer as an exhausted dataset.
        if self.dataset_done:
            return bool(self.waiting)
        return len(self.waiting) * self.group_size >= self.rollout_batch

    # ------------------------------------------------------------ out
    def take(self, n_groups: int) -> list[list[Request]]:
        """Up to n_groups whole groups for dispatch (the rollout controller's prompt source)."""
        out = []
        while self.waiting and len(out) < n_groups:
            group = self.waiting.popleft()
            gid = group[0].group_id
            self.open_groups[gid] = [r.uid for r in group]
            if gid not in self.reissued_groups:   # the dataset stream position: replica r has group ids r mod R
                self.consumed[int(gid) % len(self.consumed)] += 1
            out.append(group)
        return out

    def group_of(self, uid: str) -> str:
        return str(self.payloads[uid]["group_id"])

    def is_open(self, uid: str) -> bool:
        """False for a row of an attempt that was reissued (or already trained or dropped)."""
        return uid in self.payloads

    # ------------------------------------------------------------ the end of a group
    def close(self, uids) -> None:
        """These trajectories were trained or dropped: their groups are forgotten (memory stays flat)."""
        for u in uids:
            gid = self.payloads.get(str(u), {}).get("group_id")
            for m in self.open_groups.pop(str(gid), None) or []:
                self.payloads.pop(m, None)
            self.payloads.pop(str(u), None)

    def reissue(self, gids: list[str], forget=lambda uid: None) -> int:
        """Dispatch these open groups again, first, as new groups (new group id and uids: rows of the
        old attempt still on their way are recognised and dropped), so C1 and C2 hold. `forget(uid)`
        is called for each old uid. Returns the groups queued again."""
        n = 0
        for gid in gids:
            uids = self.open_groups.pop(gid, None)
            if not uids:
                continue
            self.reissue_serial += 1
            new_gid = -self.reissue_serial          # dataset group ids are >= 0: these never collide
            rows = []
            for i, u in enumerate(uids):
                rows.append({**self.payloads.pop(u), "uid": f"{new_gid}-{i}", "group_id": new_gid, "policy_version": 0})
                forget(u)
            self.requeue(rows)
            self.reissued_requests += len(rows)
            n += 1
        return n

    def requeue(self, rows: list[dict[str, Any]]) -> None:
        """One group's prompt rows, dispatched before any new prompt, never counted as read again."""
        group = []
        for row in rows:
            row = {**row, "policy_version": 0}
            self.payloads[str(row["uid"])] = row
            group.append(Request(uid=str(row["uid"]), group_id=str(row["group_id"]), version=0,
                                 prompt_tokens=len(row["prompt_ids"]), payload=row))
        self.waiting.appendleft(group)
        self.reissued_groups.add(group[0].group_id)
