"""sleep() / wake() of the torch engine: what goes, what stays, and why.

Both only when idle. Parked requests are dropped and the prefix cache forgotten either way.
- Full sleep (async.elastic lends the trainer's own devices, so the memory must really go): the
  weights, the KV tensor and, on CUDA, the captured graphs (they point at both) and the
  allocator's cache are released. wake() allocates weights and KV again; the first decode after
  it captures the graph ladder again (graph_captures grows).
- keep_graphs (a replica sharing its device with the trainer by declared memory shares,
  dora/rl/shared_devices.py: the trainer's allocator is capped at its own share, so memory this
  replica hands back would serve no one): what the captured graphs point to stays (weights, the
  KV tensor, the graph pool), so the graphs survive: the next version loads in place and nothing
  is captured again (graph_captures stays flat over a sync run). Only the allocator's cache goes.
  With no graphs captured (CPU, cuda_graphs off) nothing pins the memory, and it sleeps fully.
Either way the engine holds no version after wake() and serves nothing until load_weights().
"""

from __future__ import annotations

import torch

from . import hf_weights as W


def sleep(eng, keep_graphs: bool) -> int:
    """Put TorchEngine `eng` to sleep; returns the bytes released."""
    if eng.has_work():
        raise RuntimeError(f"torch engine: sleep() with {eng.sched.active} running and {len(eng.sched.waiting)} "
                           "queued requests; export them first")
    if eng.asleep:
        return 0
    while eng.sched.parked:
        eng.sched.drop_oldest_parked()
    eng.sched.pool.forget_all()
    eng.kept_memory = keep_graphs and eng.runner.has_graphs()
    if eng.kept_memory:
        eng.slots.unhost_all()
        freed = 0
    else:
        eng.runner.drop_graphs()
        freed = eng.slots.release_all() + eng.runner.kv.release()
    if eng.device.type == "cuda":
        torch.cuda.empty_cache()
    eng.asleep = True
    return freed


def wake(eng) -> int:
    """Wake TorchEngine `eng`: weights and KV allocated again unless sleep kept them; the bytes allocated."""
    if not eng.asleep:
        return 0
    allocated = 0
    if not eng.kept_memory:
        allocated = W.allocate(eng.runner.slots[0].model, eng.runner.shapes)
        eng.allocate_kv()
        allocated += eng.runner.kv.nbytes
    eng.asleep, eng.needs_weights, eng.kept_memory = False, True, False
    return allocated
