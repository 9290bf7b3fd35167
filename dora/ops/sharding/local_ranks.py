"""A sharded op's ranks as local processes, without the runtime: what tests and benchmarks use to
drive an op's group directly. It plays the runtime's part of the rendezvous: rank 0 gets
{"host": "127.0.0.1", "port": 0} and reports the port it bound; the other ranks get that address.

    run_local_ranks(target, world, *args) -> [result of rank 0, rank 1, ...]
    target(rank: LocalRank, *args) runs in a spawned process per rank; results come back pickled
    through a multiprocessing queue (a test harness, not a dora socket).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from typing import Any, Callable

RANK_TIMEOUT_S = 300.0   # a busy 2-core machine starts torch slowly


class LocalRank:
    def __init__(self, rank: int, world: int, rdv: Any):
        self.rank, self.world, self.rdv = rank, world, rdv

    def rendezvous(self) -> dict[str, Any]:
        """The `ctx.rendezvous` of this rank for a new group (each call: the next group's address)."""
        if self.rank == 0:
            return {"host": "127.0.0.1", "port": 0}
        return self.rdv.get(timeout=RANK_TIMEOUT_S)

    def report(self, events: list) -> Callable[[dict], None]:
        """A ctx.report that hands rank 0's rendezvous to the other ranks and keeps every other event."""
        def report(event: dict) -> None:
            if event.get("kind") == "rendezvous":
                for _ in range(self.world - 1):
                    self.rdv.put({"host": event["host"], "port": event["port"]})
            else:
                events.append(event)
        return report

    def drive(self, op: Any, feed: Callable[[], Any]) -> Any:
        """Rank 0 runs feed() (the data) and finish(); the others follow its commands until it finishes."""
        out = None
        if self.rank == 0:
            out = feed()
            op.finish()
        else:
            while op.busy():
                op.poll()
        return out


def _rank_main(target: Callable, rank: int, world: int, rdv: Any, results: Any, collected: Any,
               args: tuple) -> None:
    try:
        results.put((rank, "ok", target(LocalRank(rank, world, rdv), *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    # torch sends a result's tensors as shared-memory file descriptors that the sender must still hold
    # when the parent unpickles them: stay alive until the parent has every result
    collected.wait(timeout=RANK_TIMEOUT_S)


def run_local_ranks(target: Callable, world: int, *args: Any, timeout_s: float = RANK_TIMEOUT_S) -> list[Any]:
    """target(LocalRank, *args) in `world` spawned processes; their results by rank. A rank that
    raises, or gives nothing within timeout_s, fails the call naming it."""
    ctx = mp.get_context("spawn")
    rdv, results, collected = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_rank_main, args=(target, r, world, rdv, results, collected, args), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < world:
            try:
                rank, status, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(out))} gave no result within {timeout_s:.0f} s") from None
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        collected.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [out[r] for r in range(world)]
