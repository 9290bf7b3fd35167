"""async.versions_per_instance (M): validated in `dora validate` (M >= 1, with the line), resolved
per engine (a vllm generate node runs with 1: its replicas hold one set of weights), and bounded by
memory in the simulator (M weight copies next to one request of the maximum length)."""

from __future__ import annotations

from test_graph_helpers import BASE, diagnose, line_of, write

from dora.graph.resolve import resolve
from dora.graph.yaml_io import load_graph
from dora.sim.costmodel import MODELS, CostModel


def _with_m(m: int) -> str:
    return BASE.replace("async: {mode: sync,", f"async: {{versions_per_instance: {m}, mode: sync,")


def test_validate_accepts_one_or_more_and_refuses_zero_with_its_line(tmp_path):
    for m in (1, 2, 3):
        assert not [d for d in diagnose(tmp_path, _with_m(m)) if d.severity == "error"]
    errors = [d for d in diagnose(tmp_path, _with_m(0)) if d.severity == "error"]
    assert len(errors) == 1 and "must be >= 1, got 0" in errors[0].message, errors
    assert errors[0].loc.line == line_of(_with_m(0), "versions_per_instance")


def test_the_run_uses_m_on_torch_and_one_on_vllm(tmp_path):
    text = BASE.replace("params: {max_tokens: 8}", "params: {max_tokens: 8, engine: ENGINE}")
    torch = resolve(load_graph(write(tmp_path, text.replace("ENGINE", "torch"))))
    assert torch.async_.versions_per_instance == 2                  # the declared default
    vllm = resolve(load_graph(write(tmp_path, _with_m(3).replace("params: {max_tokens: 8}",
                                                                 "params: {max_tokens: 8, engine: vllm}"))))
    assert vllm.async_.versions_per_instance == 1


def test_memory_bound_states_the_numbers():
    cost = CostModel(MODELS["qwen2.5-32b"])   # 65.6 GB of weights, 288 GB usable per 4-GPU instance
    assert cost.versions_problem(2, 131_072) is None
    problem = cost.versions_problem(4, 131_072)
    assert "262.4 GB" in problem and "288.0 GB" in problem and "34.4 GB" in problem
    assert cost.versions_problem(0, 1) == "versions per instance must be >= 1, got 0"
