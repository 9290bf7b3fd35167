"""Which buffered rows one training step takes: exactly train_batch rows in whole groups, oldest
policy_version first, found by subset sum so an old group that cannot fit never blocks the rest."""

from __future__ import annotations


def choose_whole_groups(group_ids: list, versions: list[int], target: int) -> list[int] | None:
    """Row indices (sorted) of exactly `target` rows in whole groups, preferring groups of the oldest
    policy version; None when no such choice exists."""
    if len(group_ids) < target:
        return None
    groups: dict[object, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    order = sorted(groups, key=lambda g: (min(versions[i] for i in groups[g]), groups[g][0]))
    sizes = [len(groups[g]) for g in order]
    # reach[k] = the row counts that groups order[k:] can make up: a group is taken, oldest first,
    # only if the rest can still complete exactly target (greedy first-fit could block forever on
    # an old group that never fits, and could skip a selection that exists).
    reach = [set() for _ in range(len(order) + 1)]
    reach[-1] = {0}
    for k in range(len(order) - 1, -1, -1):
        reach[k] = reach[k + 1] | {s + sizes[k] for s in reach[k + 1] if s + sizes[k] <= target}
    if target not in reach[0]:
        return None
    chosen: list[int] = []
    need = target
    for k, g in enumerate(order):
        if need - sizes[k] >= 0 and (need - sizes[k]) in reach[k + 1]:
            chosen += groups[g]
            need -= sizes[k]
        if need == 0:
            break
    return sorted(chosen)
