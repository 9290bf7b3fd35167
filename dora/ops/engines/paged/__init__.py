"""The pieces of the torch engine (dora/ops/engines/torch_engine.py), one idea per file:

spec.py       what a model must be for the engine to run it (engine_problem)
model.py      the llama / qwen2 decoder over packed tokens and the paged cache
weights.py    transformers state dicts in and out of a model, in place
kv_cache.py   the KV tensor; blocks.py its block pool and prefix cache; memory.py its budget
sequence.py   one request's state; scheduler.py who runs in a step; checks.py what is refused
batch.py      a step's inputs; attention.py / triton_decode.py attention over the paged cache
graphs.py     CUDA graphs of the decode step; runner.py the forward passes of a weight slot
versions.py   which weight slot a request runs on, which one a new version goes into
"""

from .spec import engine_problem

__all__ = ["engine_problem"]
