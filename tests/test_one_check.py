"""One check for validate and run: whatever `dora validate` accepts, run start-up accepts.

For every shipped pipeline under random overrides (good and bad values for every declared
setting, pools, replicas, model keys), when validation reports no error, then `dora run --dry-run`
exits 0 and run's config resolution raises nothing: params resolved, placement planned, the RL
driver's rollout config resolved, every replica's config message encodable.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dora.graph.diagnostics import errors_of
from dora.graph.model import AsyncConfig, RunConfig
from dora.graph.op_registry import resolve_op
from dora.graph.sections import section_specs
from dora.graph.validate import check_file
from dora.graph.yaml_io import load_graph

ROOT = os.path.join(os.path.dirname(__file__), "..")
PIPELINES = sorted(glob.glob(os.path.join(ROOT, "pipelines", "*.yaml")))
SCALARS = st.one_of(
    st.integers(-3, 300), st.floats(-2.0, 3.0, allow_nan=False), st.booleans(), st.none(),
    st.sampled_from(["sync", "dora", "partial", "one_step_off", "grpo", "grop", "ppo_clip", "k3", "token_mean",
                     "synthetic:quickstart", "synthetic:arithmetic", "torch", "vllm", "broadcast", "file", "zero", "x"]))


def _keys(path: str) -> list[str]:
    """Every setting path of a pipeline: node params, replicas, memory shares, pools, async, run, model keys."""
    g = load_graph(path)
    keys = [f"async.{k}" for k in section_specs(AsyncConfig)] + [f"run.{k}" for k in section_specs(RunConfig)]
    for name, node in g.nodes.items():
        keys += [f"nodes.{name}.replicas", f"nodes.{name}.memory"]
        keys += [f"nodes.{name}.params.{p}" for p in resolve_op(node.op).params]
    for pool in g.pools:
        keys += [f"pools.{pool}.count", f"pools.{pool}.device"]
    keys += [f"model.{k}" for k in ("hidden", "heads", "kv_heads", "layers", "vocab", "arch")]
    return keys


KEYS = {p: _keys(p) for p in PIPELINES}


def _yaml_value(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


@st.composite
def pipeline_and_overrides(draw):
    path = draw(st.sampled_from(PIPELINES))
    n = draw(st.integers(0, 4))
    overrides = [f"{draw(st.sampled_from(KEYS[path]))}={_yaml_value(draw(SCALARS))}" for _ in range(n)]
    return path, overrides


def _run_start_up(path: str, overrides: list[str]) -> None:
    """Everything `dora run` does before it starts a process, raising on any refusal."""
    import msgpack

    from dora.graph.resolve import resolve
    from dora.rl.launch import run_main
    from dora.rl.driver import RLDriver
    from dora.rl.elastic_lending import elastic_spares
    from dora.rl.roles import RLRoles
    from dora.runtime.placement import format_plan, plan
    from dora.runtime.run_controller import Controller

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = run_main([path, *overrides, "--dry-run"])
    assert code == 0, out.getvalue()
    g = load_graph(path, overrides)
    r = resolve(g)
    format_plan(plan(g, spares=elastic_spares(g)), "local")
    roles = RLRoles.find(g, r.op_of)
    if roles is not None:
        RLDriver(r, roles, metrics=None, progress=None)
    ctrl = Controller(g, resolved=r, spares=elastic_spares(g))
    for w in ctrl.workers.values():
        msgpack.packb(ctrl.startup.config(w))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_and_overrides())
@example((os.path.join(ROOT, "pipelines", "dapo.yaml"), ["async.max_staleness=0"]))        # dora needs K >= 1
@example((os.path.join(ROOT, "pipelines", "quickstart.yaml"), ["async.train_batch=62"]))   # not whole groups
@example((os.path.join(ROOT, "pipelines", "grpo.yaml"), ["nodes.train.params.loss=ppo_clp"]))
@example((os.path.join(ROOT, "pipelines", "agentic_calc.yaml"), ["nodes.rollout.replicas=null"]))   # (crashed validate once)
def test_validate_ok_implies_run_start_up_ok(case):
    path, overrides = case
    graph, diags = check_file(path, overrides)
    if graph is None or errors_of(diags):
        return
    _run_start_up(path, overrides)


@pytest.mark.parametrize("path", PIPELINES, ids=os.path.basename)
def test_every_shipped_pipeline_starts_up(path):
    graph, diags = check_file(path)
    assert graph is not None and not errors_of(diags), diags
    _run_start_up(path, [])
