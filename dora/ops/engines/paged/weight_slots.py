"""Which weight slot a request runs on, and which slot a new version is loaded into.

An engine holds up to `max_versions` slots. A request runs on the slot holding its dispatched
version (or, for imported KV, the version that computed it) when one does, else on the latest
version. A new version goes into a slot none of whose requests is in flight: a free slot first,
then the slot of the oldest version; a version's slot is thus free once its last request is done,
and loading v+1 leaves the requests running on v untouched. With max_versions = 1 that is the
classic rule: load only when idle.
"""

from __future__ import annotations

from .runner import ModelRunner, WeightSlot


def route(slots: list[WeightSlot], version: int | None, latest: int) -> int:
    for i, slot in enumerate(slots):
        if slot.version is not None and slot.version == version:
            return i
    return latest


def slot_to_load(runner: ModelRunner, busy: set[int], max_versions: int, *, counts: str) -> int:
    """Index of the slot to load a new version into (a new slot is made when allowed);
    RuntimeError naming what holds every slot otherwise."""
    idle = [i for i in range(len(runner.slots)) if i not in busy]
    free = [i for i in idle if runner.slots[i].version is None]
    if free:
        return free[0]
    if idle and (len(runner.slots) >= max_versions or max_versions == 1):
        return min(idle, key=lambda i: runner.slots[i].version)
    if len(runner.slots) < max_versions:
        runner.new_slot()
        return len(runner.slots) - 1
    raise RuntimeError(f"torch engine: cannot load a new version: all {max_versions} weight slot(s) hold versions "
                       f"with requests in flight ({counts}); switch only when idle or after interrupt_all()")
