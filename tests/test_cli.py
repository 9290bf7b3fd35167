"""`dora` CLI: exit codes 0 ok / 1 failure / 2 bad input, and no tracebacks for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dora.cli import main
from test_graph_helpers import BASE, write

ROOT = os.path.join(os.path.dirname(__file__), "..")
QUICKSTART = os.path.join(ROOT, "pipelines", "quickstart.yaml")


def test_validate_ok(capsys):
    assert main(["validate", QUICKSTART]) == 0
    assert "ok: pipeline 'grpo-quickstart'" in capsys.readouterr().out


def test_validate_errors_exit_2_with_file_line(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("op: generate", "op: generat"))
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7: error: node 'rollout': unknown op 'generat'" in err and "Traceback" not in err


def test_validate_overrides(tmp_path, capsys):
    assert main(["validate", QUICKSTART, "nodes.rollout.replicas=4"]) == 2
    assert "oversubscribed" in capsys.readouterr().err
    assert main(["validate", QUICKSTART, "nodes.rollout.replicas=4", "pools.rollout.count=4"]) == 0
    # options before, between or after the overrides, as `dora run` takes them
    assert main(["validate", QUICKSTART, "--data", "nodes.rollout.replicas=4", "pools.rollout.count=4"]) == 0
    assert main(["validate", QUICKSTART, "nodes.rollout.replicas=4", "--data", "pools.rollout.count=4"]) == 0
    assert main(["viz", QUICKSTART, "-o", str(tmp_path / "q.mmd"), "async.mode=dora"]) == 0


def test_scale_errors_exit_2_with_file_line(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("replicas: 2, inputs", "replicas: 2, devices: 2, inputs"))
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    line = 1 + open(path).read().splitlines().index(next(x for x in open(path).read().splitlines() if "devices: 2" in x))
    assert f"{path}:{line}: error: node 'rollout': devices: 2 asks for tensor parallelism" in err and "Traceback" not in err
    assert "oversubscribed" in err   # and 2 x 2 devices do not fit the pool of 2


def test_warnings_exit_0(tmp_path, capsys):
    path = write(tmp_path, BASE.replace("weights:\n  - {from: train, to: rollout}\n", ""))
    assert main(["validate", path]) == 0
    cap = capsys.readouterr()
    assert "warning: node 'rollout'" in cap.err and "1 warning(s)" in cap.out


def test_missing_file_and_bad_arguments_exit_2(capsys):
    assert main(["validate", "no/such/file.yaml"]) == 2
    assert "cannot read pipeline file" in capsys.readouterr().err
    assert main(["nonsense"]) == 2
    assert main(["validate"]) == 2
    assert main([]) == 2


def test_version_and_help(capsys):
    assert main(["--version"]) == 0
    assert "dora 0.1.0" in capsys.readouterr().out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "dora validate pipelines/quickstart.yaml" in out


def test_viz_writes_each_format(tmp_path, capsys):
    for ext in ("html", "svg", "dot", "mmd"):
        out = tmp_path / f"g.{ext}"
        assert main(["viz", QUICKSTART, "-o", str(out)]) == 0
        assert "rollout" in out.read_text()
    assert main(["viz", QUICKSTART, "--format", "mmd"]) == 0
    assert capsys.readouterr().out.count("flowchart LR") == 1
    assert main(["viz", QUICKSTART, "-o", str(tmp_path / "g.png")]) == 2
    assert main(["viz", QUICKSTART, "-o", str(tmp_path / "missing-dir" / "g.svg")]) == 0   # folders are made
    assert (tmp_path / "missing-dir" / "g.svg").exists()
    (tmp_path / "a-file").write_text("x")
    assert main(["viz", QUICKSTART, "-o", str(tmp_path / "a-file" / "g.svg")]) == 1       # cannot be made


def test_viz_refuses_invalid_unless_forced(tmp_path):
    path = write(tmp_path, BASE.replace("{prompts: prompts/out}", "{prompts: train/out}"))
    assert main(["viz", path, "-o", str(tmp_path / "g.svg")]) == 2
    assert main(["viz", path, "-o", str(tmp_path / "g.svg"), "--force", "--engine", "python"]) == 0


def test_ops(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "advantage:" in out and "estimator: str = \"grpo\"" in out and "when     estimator in ['gae']" in out
    assert main(["ops", "--json"]) == 0
    ops = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in ops][:2] == ["dataset", "generate"]
    assert {p["name"] for p in ops[1]["params"]} >= {"temperature", "max_tokens", "park_kv"}
    # the tool kinds generate's `tools` entries may name, with their settings
    tools = {o["name"]: {p["name"] for p in o["params"]} for o in ops if o.get("tool")}
    assert tools["python"] >= {"timeout_s", "cpu_s", "memory_mb"} and "top_k" in tools["search"]
    # the pipeline's sections, every key with its default: model, async, run, eval (one held-out set's keys)
    sections = {o["name"]: {p["name"]: p["default"] for p in o["params"]} for o in ops if o.get("section")}
    assert list(sections) == ["model", "async", "run", "eval"]
    assert sections["eval"]["temperature"] == 0.0 and sections["run"]["keep_best"] is None
    assert sections["model"]["max_positions"] == 512 and {"path", "name", "arch"} <= set(sections["model"])
    assert sections["async"]["mode"] == "sync" and sections["run"]["save_optimizer"] == "last"
    assert "model: (pipeline section)" in out and "max_positions: int = 512" in out


def test_the_reference_in_docs_is_what_dora_ops_prints(capsys):
    """docs/reference.md is generated from the declarations: a setting added or changed must be
    regenerated (`dora ops --markdown > docs/reference.md`)."""
    import pathlib
    assert main(["ops", "--markdown"]) == 0
    out = capsys.readouterr().out
    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()
    assert doc == out, "docs/reference.md is out of date: run `dora ops --markdown > docs/reference.md`"
    assert "### `model:`" in doc and "| `max_positions` | int | `512` |" in doc and "| `save_optimizer` |" in doc


def test_run_and_simulate_dispatch(monkeypatch, capsys):
    # main() forwards the remaining argv and returns the callee's code
    import dora.rl.launch
    import dora.sim.simulate_cli

    monkeypatch.setattr(dora.rl.launch, "run_main", lambda argv: print("run", argv) or 7)
    monkeypatch.setattr(dora.sim.simulate_cli, "simulate_main", lambda argv: print("simulate", argv) or 5)
    assert main(["run", "p.yaml", "--out", "x"]) == 7
    assert "run ['p.yaml', '--out', 'x']" in capsys.readouterr().out
    assert main(["simulate", "--gpus", "64"]) == 5
    assert "simulate ['--gpus', '64']" in capsys.readouterr().out


def test_missing_subsystem_is_a_clear_failure(monkeypatch, capsys):
    import dora.cli

    monkeypatch.setitem(dora.cli.DISPATCH, "simulate", ("dora.sim.not_there_module", "simulate_main"))
    assert main(["simulate", "--json", "x"]) == 1
    assert "dora simulate: not available" in capsys.readouterr().err


def test_console_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "dora.cli", "validate", QUICKSTART], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "ok:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "dora.cli", "validate", QUICKSTART, "async.mode=fast"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "async.mode: unknown name 'fast'" in r.stderr and "Traceback" not in r.stderr
