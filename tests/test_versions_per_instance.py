"""async.versions_per_instance (M): validated in `dora validate` (declared 1 <= M <= 1: M > 1 is not
built and is refused) and in the simulator's memory model (M weight copies next to one request of the maximum length)."""

from __future__ import annotations

from test_graph_helpers import BASE, diagnose

from dora.sim.costmodel import MODELS, CostModel


def _with_m(m: int) -> str:
    return BASE.replace("async: {mode: sync,", f"async: {{versions_per_instance: {m}, mode: sync,")


def test_validate_accepts_one_and_refuses_zero_and_more(tmp_path):
    assert not [d for d in diagnose(tmp_path, _with_m(1)) if d.severity == "error"]
    for m, msg in ((0, "must be >= 1, got 0"), (2, "must be <= 1, got 2")):
        errors = [d for d in diagnose(tmp_path, _with_m(m)) if d.severity == "error"]
        assert len(errors) == 1 and msg in errors[0].message, errors


def test_memory_bound_states_the_numbers():
    cost = CostModel(MODELS["qwen2.5-32b"])   # 65.6 GB of weights, 288 GB usable per 4-GPU instance
    assert cost.versions_problem(2, 131_072) is None
    problem = cost.versions_problem(4, 131_072)
    assert "262.4 GB" in problem and "288.0 GB" in problem and "34.4 GB" in problem
    assert cost.versions_problem(0, 1) == "versions per instance must be >= 1, got 0"
