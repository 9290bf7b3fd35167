"""Run a sharded op's ranks as separate processes (spawned), the way the runtime would: rank 0
binds the rendezvous and reports it, the others get that address; each rank's result comes back
through a queue. Used by the tests of sharded update / critic / reference (gloo on CPU)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from typing import Any, Callable

RANK_TIMEOUT_S = 300.0   # a 2-core machine shared with other jobs starts torch slowly


class RankEnv:
    """What one rank's process knows: its rank, and how to reach rank 0's rendezvous."""

    def __init__(self, rank: int, world: int, rdv: Any):
        self.rank, self.world, self.rdv = rank, world, rdv

    def context(self, op: str, params: dict, events: list, **kw: Any):
        """An OpContext for this rank of a new group (each call is a new rendezvous, as a new node)."""
        from op_context import op_context

        if self.rank == 0:
            rendezvous = {"host": "127.0.0.1", "port": 0}
        else:
            rendezvous = self.rdv.get(timeout=RANK_TIMEOUT_S)

        def report(event: dict) -> None:
            if event["kind"] == "rendezvous":
                for _ in range(self.world - 1):
                    self.rdv.put({"host": event["host"], "port": event["port"]})
            else:
                events.append(event)

        return op_context(op, params, replica=self.rank, replicas=self.world, rendezvous=rendezvous, report=report, **kw)

    def drive(self, op, feed: Callable[[], Any]) -> Any:
        """Rank 0 runs feed() (the data) then finish(); the others follow rank 0's commands until it finishes."""
        out = None
        if self.rank == 0:
            out = feed()
            op.finish()
        else:
            while op.busy():
                op.poll()
        return out


def _rank_main(target: Callable, rank: int, world: int, rdv: Any, results: Any, args: tuple) -> None:
    import torch
    torch.set_num_threads(1)
    try:
        results.put((rank, "ok", target(RankEnv(rank, world, rdv), *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(target: Callable, world: int, *args: Any, timeout_s: float = RANK_TIMEOUT_S) -> list[Any]:
    """target(RankEnv, *args) in `world` spawned processes; their results, by rank."""
    ctx = mp.get_context("spawn")
    rdv, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(target, r, world, rdv, results, args), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < world:
            try:
                rank, status, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"ranks {sorted(set(range(world)) - set(out))} gave no result within {timeout_s:.0f} s")
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world)]
