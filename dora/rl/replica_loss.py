"""What a replica that died held, for the RL driver to reissue once its respawn is up (the run
controller calls RLDriver.on_replica_lost): whole groups, dispatched again as new groups."""

from __future__ import annotations


def replaced(d, node: str, replica: int, why: str) -> None:
    """node[replica] of RLDriver `d` died and its respawn is up: what it held goes again."""
    d.progress.status(f"{node}[{replica}] lost ({why.splitlines()[0][:120]}); respawned, its work reissued")
    d.respawns += 1
    gids, revoked = held_by_lost(d, node, replica)
    if revoked:
        d.feed.pending = None
    d.reissue(gids)


def held_by_lost(d, node: str, replica: int) -> tuple[list[str], list[int]]:
    """(group ids to reissue, revoked training steps) for node[replica] of RLDriver `d`, respawned."""
    if d.rc is None:   # nothing dispatched yet, or a trainer restart under way: nothing held
        for inst in d.reused_instances:
            if inst.name == f"{node}[{replica}]":
                inst.version = 0   # the new process holds the seeded initial weights
        return [], []
    rc = d.rc
    if node == d.roles.generate:
        name = f"{node}[{replica}]"
        if d.elastic is not None and d.elastic.owns(replica):
            gids, revoked = d.elastic.replaced(replica)
        else:
            rc.manager.instances[name].version = 0   # the new process holds the seeded initial weights
            if d.shared is not None:
                d.shared.replaced(name)              # ... and is awake
            gids, revoked = rc.instance_replaced(name)
        more, more_revoked = rows_lost_with(d, name)
        return sorted(set(gids) | set(more)), sorted(set(revoked) | set(more_revoked))
    # rows in its hands (or queued to it) are gone: every group not wholly scored goes again
    sent = set(d.feed.sent["uids"]) if d.feed.sent else set()
    gids = [g for g, uids in d.prompts.open_groups.items()
            if not all(u in d.feed.scored for u in uids) and uids[0] not in sent]
    return gids, rc.on_dropped([d.prompts.open_groups[g][0] for g in gids], reason="replica_lost")


def rows_lost_with(d, name: str) -> tuple[list[str], list[int]]:
    """Groups with a trajectory that finished on the dead generate replica `name` but whose row has
    not reached the trainer's feed: the row may have died in its send buffer (TrainerFeed.lost_with),
    and a batch waiting for it would wait forever. Dropped whole (a taken batch holding one is
    revoked) and reissued, as the groups it held in flight; a row that does arrive later is late."""
    uids = d.feed.lost_with(name, d.prompts.is_open)
    firsts: dict[str, str] = {}
    for u in uids:
        firsts.setdefault(d.prompts.group_of(u), u)
    if not firsts:
        return [], []
    return sorted(firsts), d.rc.on_dropped(list(firsts.values()), reason="replica_lost")
