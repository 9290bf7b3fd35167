"""The pieces of the torch engine (dora/ops/engines/torch_engine.py), one idea per file:

model_spec.py     what a model must be for the engine to run it (engine_problem)
decoder.py        the llama / qwen2 decoder over packed tokens and the paged cache
hf_weights.py     transformers state dicts in and out of a decoder, in place
kv_cache.py       the KV tensor; blocks.py its block pool and prefix cache; kv_budget.py its size
sequence.py       one request's state; scheduler.py who runs in a step; checks.py what is refused
step_inputs.py    a step's model inputs; attention.py, triton_decode.py attention over the paged cache
cuda_graphs.py    CUDA graphs of the decode step; runner.py the forward passes of a weight slot
weight_slots.py   which weight slot a request runs on, which one a new version goes into
sleep_wake.py     what sleep() releases and keeps (the captured graphs survive a keep_graphs sleep)
"""

from .model_spec import engine_problem

__all__ = ["engine_problem"]
