"""Op declarations: the built-ins match the column table in docs/architecture.md; resolve/fill params."""

from __future__ import annotations

import json
import os
import re

import pytest

from dora.graph.builtin_ops import BUILTIN_OPS
from dora.graph.op_registry import resolve_op
from dora.graph.opspec import OpError, OpSpec, ParamError, ParamSpec, PortSpec, fill_params

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "architecture.md")


def doc_table() -> dict[str, dict]:
    """The op table of docs/architecture.md: the column contract between ops (params are not
    copied into the doc: `dora ops` prints them from the one declaration)."""
    with open(DOC) as f:
        text = f.read()
    section = text.split("## Graph layer")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("op", "---"):
            continue
        op, needs, adds, _ = cells
        names = lambda s: [] if s.startswith("-") else [c.strip() for c in re.sub(r"\(.*?\)", "", s).split(",") if c.strip()]
        rows[op] = {"needs": names(needs), "adds": names(adds)}
    return rows


def test_builtins_match_the_architecture_table():
    table = doc_table()
    assert set(table) == set(BUILTIN_OPS) == {"dataset", "generate", "reward", "reward_model", "judge", "reference",
                                              "critic", "advantage", "filter", "update", "to_prompts", "frontier"}
    for op, row in table.items():
        spec = BUILTIN_OPS[op]
        assert [c for p in spec.inputs for c in p.needs] == row["needs"], op
        assert list(spec.adds) == row["adds"], op
    assert BUILTIN_OPS["advantage"].added({"estimator": "gae"}) == ("advantages", "returns")
    assert "values" in BUILTIN_OPS["advantage"].needs("scored", {"estimator": "gae", "kl_coef": 0.0})


def test_ports_and_impl_paths():
    ports = {op: [p.name for p in s.inputs] for op, s in BUILTIN_OPS.items()}
    assert ports == {"dataset": [], "generate": ["prompts"], "reward": ["trajectories"], "reference": ["trajectories"],
                     "critic": ["trajectories"], "advantage": ["scored"], "filter": ["scored"], "update": ["batch"],
                     "reward_model": ["trajectories"], "judge": ["trajectories"],
                     "to_prompts": ["trajectories"], "frontier": ["trajectories", "solved"]}
    for op, s in BUILTIN_OPS.items():
        cls = "".join(w.capitalize() for w in op.split("_")) + "Op"
        assert s.outputs == ("out",) and s.impl == f"dora.ops.{op}:{cls}"
    assert BUILTIN_OPS["update"].is_update and BUILTIN_OPS["generate"].is_generate
    json.dumps([s.describe() for s in BUILTIN_OPS.values()])     # JSON-able for `dora ops --json`


def test_graph_imports_ops_only_through_declared_paths():
    """Importing the graph layer (and the CLI) loads no op, runtime or torch code; checking a pipeline
    imports only what its declarations name (impl, names_from, check): never the runtime."""
    import subprocess
    import sys

    code = ("import sys, dora.graph.validate, dora.graph.resolve, dora.graph.builder, dora.graph.viz, dora.cli; "
            "bad = [m for m in sys.modules if m.startswith(('dora.ops', 'dora.runtime', 'dora.algos', 'torch'))]; "
            "assert not bad, bad; "
            "from dora.graph.yaml_io import load_graph; from dora.graph.validate import validate; "
            "validate(load_graph('pipelines/quickstart.yaml')); "
            "bad = [m for m in sys.modules if m.startswith('dora.runtime')]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(os.path.dirname(__file__), ".."), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_validating_every_shipped_pipeline_imports_no_torch():
    """`dora validate` stays fast: no check of a shipped pipeline needs torch or transformers (the
    algos registries load torch at first use, dora/algos/lazy.py; op checks live beside the ops in
    modules that import no engine; the model section is read as JSON). A check that does need them
    (a data file's prompts under a real model's tokenizer) imports them itself."""
    import glob
    import subprocess
    import sys

    code = ("import sys, glob; from dora.cli import main; "
            "rcs = {p: main(['validate', p]) for p in sorted(glob.glob('pipelines/*.yaml'))}; "
            "assert set(rcs.values()) == {0}, rcs; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'networkx') if m in sys.modules); "
            "assert not heavy, f'dora validate imported {heavy}'")
    root = os.path.join(os.path.dirname(__file__), "..")
    assert len(glob.glob(os.path.join(root, "pipelines", "*.yaml"))) >= 9
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_run_driver_imports_no_torch():
    """`dora run`'s own process (the driver: graph, controller, metrics, run files) imports no torch;
    its workers do (forked from the zygote, which has it preloaded). Each run starts ~2.5 CPU-s lighter."""
    import subprocess
    import sys

    code = ("import sys, dora.cli, dora.rl.launch, dora.rl.execute; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors.torch') if m in sys.modules); "
            "assert not heavy, f'the driver imported {heavy}'")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(os.path.dirname(__file__), ".."),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_resolve_unknown_op_suggests():
    with pytest.raises(OpError, match="did you mean 'advantage'"):
        resolve_op("advantag")
    with pytest.raises(OpError, match="cannot import module 'no_such_module_xyz'"):
        resolve_op("no_such_module_xyz:Op")
    with pytest.raises(OpError, match="has no attribute 'Nope'"):
        resolve_op("dora.graph.opspec:Nope")
    with pytest.raises(OpError, match="no class attribute `spec`"):
        resolve_op("dora.graph.opspec:ParamSpec")


def test_fill_params_defaults_types_and_copies():
    spec = BUILTIN_OPS["update"]
    p = fill_params(spec, {"lr": 1, "clip_eps_high": 0.28})
    assert p["lr"] == 1.0 and isinstance(p["lr"], float) and p["dual_clip"] is None and p["loss"] == "ppo_clip"
    assert list(p) == list(spec.params)
    a, b = fill_params(BUILTIN_OPS["generate"], {}), fill_params(BUILTIN_OPS["generate"], {})
    a["stop"].append("x")
    assert b["stop"] == [] and BUILTIN_OPS["generate"].params["stop"].default == []
    with pytest.raises(ParamError) as ei:
        fill_params(spec, {"lr": "fast", "steps": True, "ppo_epoch": 2, "clip_eps": None})
    keys = [pr.key for pr in ei.value.problems]
    assert keys == ["lr", "steps", "ppo_epoch", "clip_eps"]
    assert "did you mean 'ppo_epochs'" in str(ei.value) and "must be float, got str 'fast'" in str(ei.value)
    assert "must be int, got bool True" in str(ei.value) and "must be float, got null" in str(ei.value)


def test_param_spec_rejects_unknown_types():
    with pytest.raises(ValueError, match="type 'tensor'"):
        ParamSpec("x", "tensor", None, "doc")
    spec = OpSpec("mine", "d", (PortSpec("in", ("reward",)),), ("z",), {"k": ParamSpec("k", "int?", None, "k")}, "m:C")
    assert fill_params(spec, {"k": None}) == {"k": None} and fill_params(spec, {"k": 3}) == {"k": 3}


def test_no_two_modules_share_a_name():
    """A module's name tells its layer: no two files in dora/ share a name (packages' __init__ aside)."""
    import collections

    root = os.path.join(os.path.dirname(__file__), "..", "dora")
    seen = collections.defaultdict(list)
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and f != "__init__.py":
                seen[f].append(os.path.relpath(os.path.join(folder, f), root))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
