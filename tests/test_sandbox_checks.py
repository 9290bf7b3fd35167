"""What dora validate and dora run say about the sandbox before anything runs
(dora/ops/tools/sandbox_check.py): no bubblewrap -> exit 2 naming the package, for a python tool and
a code_exec reward (its fn or a weighted source's) alike; `sandbox: interpreter_only` -> a warning;
a package that does not exist and a mistyped code_exec param -> an error at the file:line that
declares it."""

from __future__ import annotations

import os

import pytest

from dora.cli import main
from dora.ops.tools import isolation, sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = open(os.path.join(ROOT, "pipelines", "quickstart.yaml")).read()   # a tiny model: no weights to check
ROLLOUT = "    params: {temperature: 1.0, max_tokens: 128, max_batch: 32}\n"
TOOLS = "    params:\n      max_turns: 2\n      tools:\n{tools}"
REWARD = "    params: {fn: synthetic}\n"


def _pipeline(tmp_path, tools: str = "        - {name: python}\n", reward: str = REWARD) -> tuple[str, str]:
    assert ROLLOUT in QUICKSTART and REWARD in QUICKSTART
    text = QUICKSTART.replace(ROLLOUT, TOOLS.format(tools=tools)).replace(REWARD, reward)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return str(path), text


CODE_REWARD = "    params: {fn: code_exec, params: {case_timeout_s: 1.0}}\n"


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(isolation, "tools", lambda: (None, None))
    sandbox.unavailable.cache_clear()
    yield
    sandbox.unavailable.cache_clear()


CODE_SOURCE = ("    params:\n      sources:\n        - {name: task, fn: synthetic}\n"
               "        - {name: code, fn: code_exec, weight: 0.5, params: {case_timeout_s: 1.0}}\n")


@pytest.mark.parametrize("uses", ["tool", "code_exec", "code_exec source"])
def test_without_bubblewrap_validate_and_run_exit_2_naming_the_package(no_bwrap, uses, capsys, tmp_path):
    if uses == "tool":
        pipeline, _ = _pipeline(tmp_path)
    else:   # single-turn, no tools: only the reward needs the sandbox (its fn, or one of its weighted sources)
        pipeline = str(tmp_path / "p.yaml")
        open(pipeline, "w").write(QUICKSTART.replace(REWARD, CODE_REWARD if uses == "code_exec" else CODE_SOURCE))
    assert main(["validate", pipeline]) == 2
    err = capsys.readouterr().err
    assert "package `bubblewrap`" in err and "apt-get install bubblewrap" in err, err
    assert main(["run", pipeline, "--out", str(tmp_path / "run")]) == 2
    assert "package `bubblewrap`" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run" / "summary.json")


def test_interpreter_only_is_a_warning(tmp_path, capsys):
    path, _ = _pipeline(tmp_path, "        - {name: python, sandbox: interpreter_only}\n")
    assert main(["validate", path]) == 0
    out = capsys.readouterr()
    assert "warning" in out.err and "sandbox: interpreter_only" in out.err and "not a security boundary" in out.err
    assert "1 warning(s)" in out.out


def test_a_package_that_does_not_exist_is_an_error_at_its_line(tmp_path, capsys):
    block = "        - name: python\n          packages:\n            - numpy\n            - /nope/pkg\n"
    path, text = _pipeline(tmp_path, block)
    line = text.splitlines().index("            - /nope/pkg") + 1
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{line}: error" in err and "package path '/nope/pkg' does not exist" in err, err


def test_a_mistyped_code_exec_param_is_an_error_at_its_line(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    text = QUICKSTART.replace(REWARD, "    params:\n      fn: code_exec\n      params: {case_timeout: 3}\n")
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f":{text.splitlines().index('      params: {case_timeout: 3}') + 1}: error" in err, err
    assert "unknown code_exec param 'case_timeout'" in err and "did you mean 'case_timeout_s'" in err
