"""Generation engines behind one interface (engine.py: Engine, SamplingRequest, Completion, ...):
`torch` (torch_engine.py, continuous batching, KV export/import) and `vllm` (an adapter over vLLM in
its own venv). Nothing is imported here: `dora validate` reaches the torch engine's model check
(paged/model_spec.py) through this package without loading torch."""
