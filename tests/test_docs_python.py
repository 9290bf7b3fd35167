"""docs/python.md runs as written: its python blocks, in order, in one namespace, from the repository's
root (run folders under a temp folder), compiled as docs/python.md so that the lines dora names are the
guide's own lines. One 2-step run of a tiny model."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "python.md"


def blocks(text: str) -> list[tuple[int, str]]:
    """(line before the block's first line, code) of every ```python block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            j = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
            out.append((i + 1, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_the_python_guide_runs_as_written(tmp_path, monkeypatch, capsys, remove_shm_weights):
    text = GUIDE.read_text()
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    for before, code in blocks(text):
        code = code.replace('"runs/', f'"{tmp_path}/')
        exec(compile("\n" * before + code, "docs/python.md", "exec"), namespace)
    out = capsys.readouterr().out
    # errors name the guide's own lines (the Python line that made the node, the call with the typo)
    typo = line_of(text, 'typo.node("rollout", "generate", temprature=1.0)')
    assert f"docs/python.md:{typo}: error: node 'rollout': unknown param 'temprature' for op 'generate' " \
           "(did you mean 'temperature'?)" in out, out
    asyn = line_of(text, 'dora.Pipeline("x", asyn_=')
    assert f"docs/python.md:{asyn}: unknown Pipeline() key 'asyn_' (did you mean 'async_'?)" in out, out
    assert "names node 'trian', which the pipeline does not have (did you mean 'train'?" in out, out
    assert "holds an earlier run" in out and "finished 2" in out, out
    assert (tmp_path / "grpo-py.html").stat().st_size > 1000 and "graph" in out   # drawn, and the Mermaid text
    summary = namespace["summary"]
    assert summary["accounting"]["lost"] == 0 and summary["trajectories"] == 2 * 16
    assert re.search(r"%train\s+=\s+update\(batch=advantage\)", out) and "steps  40" in out, out
