"""Generation engines behind one interface (base.Engine): `torch` (continuous batching, KV
export/import) and `vllm` (an adapter over vLLM in its own venv)."""

from .engine import (Completion, Engine, EngineStats, SamplingRequest, SequenceState, state_from_wire, state_to_wire,
                   states_from_wire, states_to_wire)

__all__ = ["Completion", "Engine", "EngineStats", "SamplingRequest", "SequenceState", "state_from_wire", "state_to_wire",
           "states_from_wire", "states_to_wire"]
