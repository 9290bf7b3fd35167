"""The Python front door (dora/api.py) beyond docs/python.md's walk-through (tests/test_docs_python.py):
`import dora` stays light, what refuses to run refuses before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dora

ROOT = os.path.join(os.path.dirname(__file__), "..")
QUICKSTART = os.path.join(ROOT, "pipelines", "quickstart.yaml")


def test_import_dora_loads_its_names_at_first_use():
    code = ("import sys, dora; assert not [m for m in sys.modules if m.startswith('dora.')], sorted(sys.modules); "
            "dora.Pipeline; assert 'dora.graph.builder' in sys.modules and 'dora.rl.launch' not in sys.modules; "
            "assert 'torch' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(AttributeError, match="no attribute 'Pipelin'"):
        dora.Pipelin


def test_bad_input_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(dora.GraphError, match="did you mean 'train'"):
        dora.run(QUICKSTART, out=str(tmp_path / "r"), overrides="nodes.trian.params.steps=2")   # one override as a string
    assert not (tmp_path / "r").exists()
    with pytest.raises(dora.LaunchRefused, match="resume=True needs out=RUN_DIR"):
        dora.run(QUICKSTART, resume=True)
    with pytest.raises(dora.LaunchRefused, match="not a run directory"):
        dora.run(None, out=str(tmp_path), resume=True)
    with pytest.raises(TypeError, match="expected a dora.Pipeline, a dora.Graph or a pipeline file path"):
        dora.validate(42)
    assert [d.format() for d in dora.validate(QUICKSTART, ["async.mode=dora"])] == []
    g = dora.load(QUICKSTART, ["nodes.train.params.steps=3"])
    assert isinstance(g, dora.Graph) and g.nodes["train"].params["steps"] == 3
    assert dora.draw(g).startswith(("flowchart", "graph", "%%"))
