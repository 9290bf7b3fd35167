"""Run a sharded op's ranks as separate processes (spawned), the way the runtime would: rank 0
binds the rendezvous and reports it, the others get that address; each rank's result comes back
through a queue. Used by the tests of sharded update / critic / reference (gloo on CPU)."""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from typing import Any, Callable

RANK_TIMEOUT_S = 300.0   # a 2-core machine shared with other jobs starts torch slowly


def _rank_main(target: Callable, rank: int, world: int, rdv: Any, results: Any, args: tuple) -> None:
    import torch
    torch.set_num_threads(1)
    try:
        if rank == 0:
            rendezvous = {"host": "127.0.0.1", "port": 0}

            def on_rendezvous(event: dict) -> None:
                for _ in range(world - 1):
                    rdv.put({"host": event["host"], "port": event["port"]})
        else:
            rendezvous = rdv.get(timeout=RANK_TIMEOUT_S)
            on_rendezvous = None
        results.put((rank, "ok", target(rank, world, rendezvous, on_rendezvous, *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(target: Callable, world: int, *args: Any, timeout_s: float = RANK_TIMEOUT_S) -> list[Any]:
    """target(rank, world, rendezvous, on_rendezvous, *args) in `world` processes; their results by rank.
    on_rendezvous (rank 0 only) must be called with the {"kind": "rendezvous"} event rank 0 reports."""
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
