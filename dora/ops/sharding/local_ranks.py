"""A sharded op's ranks as local processes, without the runtime: what tests and benchmarks use to
drive an op's group directly. It plays the runtime's part of the rendezvous: rank 0 gets
{"host": "127.0.0.1", "port": 0} and reports the port it bound; the other ranks get that address.

    run_local_ranks(target, world, *args) -> [result of rank 0, rank 1, ...]
    target(rank: LocalRank, *args) runs in a spawned process per rank; results come back pickled
    through a multiprocessing queue (a test harness, not a dora socket).
    with LocalRanks(world) as ranks: ranks.run(target, *args); ranks.run(...)   # processes started once
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


def _rank_loop(rank: int, world: int, rdv: Any, tasks: Any, results: Any) -> None:
    """A rank process: run each (target, args) it is given, send its result, until it is given None."""
    last = None
    while True:
        task = tasks.get()
        if task is None:
            return
        target, args = task
        try:
            last = (rank, "ok", target(LocalRank(rank, world, rdv), *args))
        except BaseException:
            last = (rank, "error", traceback.format_exc())
        # torch sends a result's tensors as shared-memory file descriptors that the sender must still
        # hold when the parent unpickles them: `last` keeps them until the next task (or the end)
        results.put(last)


class LocalRanks:
    """`world` spawned rank processes kept for several calls, so torch's import and the process
    start are paid once: `run(target, *args)` runs target(LocalRank, *args) on every rank, each call
    in new process groups (an op's teardown leaves its group). A call that fails ends the processes
    (a rank left inside a collective is of no further use)."""

    def __init__(self, world: int, timeout_s: float = RANK_TIMEOUT_S):
        ctx = mp.get_context("spawn")
        self.world, self.timeout_s = world, timeout_s
        self.rdv, self.results = ctx.Queue(), ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.procs = [ctx.Process(target=_rank_loop, args=(r, world, self.rdv, self.tasks[r], self.results), daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, target: Callable, *args: Any) -> list[Any]:
        """target(LocalRank, *args) on every rank; their results by rank. A rank that raises, or gives
        nothing within timeout_s, fails the call naming it."""
        if not self.procs:
            raise RuntimeError("these local ranks were closed (an earlier call failed)")
        for q in self.tasks:
            q.put((target, args))
        out: dict[int, Any] = {}
        try:
            while len(out) < self.world:
                try:
                    rank, status, value = self.results.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise TimeoutError(f"ranks {sorted(set(range(self.world)) - set(out))} gave no result within "
                                       f"{self.timeout_s:.0f} s") from None
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                out[rank] = value
        except BaseException:
            self.close(kill=True)
            raise
        return [out[r] for r in range(self.world)]

    def close(self, kill: bool = False) -> None:
        if not kill:
            for q in self.tasks:
                q.put(None)
        for p in self.procs:
            p.join(timeout=0 if kill else 10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs = []

    def __enter__(self) -> "LocalRanks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(kill=exc[0] is not None)


def run_local_ranks(target: Callable, world: int, *args: Any, timeout_s: float = RANK_TIMEOUT_S) -> list[Any]:
    """target(LocalRank, *args) in `world` new spawned processes; their results by rank (LocalRanks.run
    on ranks started for this one call)."""
    with LocalRanks(world, timeout_s) as ranks:
        return ranks.run(target, *args)
