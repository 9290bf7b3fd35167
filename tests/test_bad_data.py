"""Bad data is bad input: `dora validate` reads a file source's first rows as the run will (parsed,
tokenized, held to the prompt limit) and names file:line, `--data` every row; `dora run` on a bad row
exits 2 naming file:line with no traceback before any step; `on_error: skip` skips and counts bad rows
(malformed or over max_prompt_tokens); a raising reward function with `on_error: zero` scores 0 and is
counted (on_error: fail in a run: tests/test_e2e_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

from dora.graph.diagnostics import errors_of
from dora.graph.validate import check_file
from dora.ops.data_files import FIRST_ROWS
from tests.e2e_audit import PIPELINES, RunDir, SHORT, dora_run

QUICKSTART = str(PIPELINES / "quickstart.yaml")
RUN = ["async.train_batch=16", "async.rollout_batch=16", "nodes.train.params.steps=2", "nodes.prompts.params.size=0",
       *SHORT]


def _data(path: Path, bad_lines: dict[int, str], n: int = 40) -> str:
    lines = [json.dumps({"prompt": f"say {i}", "answer": str(i)}) for i in range(n)]
    for lineno, text in bad_lines.items():
        lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def flaky_reward(text: str, answer: str, row: dict) -> float:
    """Raises on every trajectory of prompts whose answer is odd (a reward function with a bug)."""
    if int(answer) % 2:
        raise RuntimeError(f"cannot score answer {answer}")
    return float(answer in text)


def _errors(*overrides: str) -> list[str]:
    _, diags = check_file(QUICKSTART, list(overrides))
    return [d.format() for d in errors_of(diags)]


def test_validate_reads_the_first_rows_of_a_file_source(tmp_path):
    bad = _data(tmp_path / "d.jsonl", {3: '{"prompt": "x", "answer": '})
    errs = _errors(f"nodes.prompts.params.source={bad}")
    assert len(errs) == 1 and "d.jsonl:3: error: node 'prompts': not valid JSON" in errs[0] and "on_error: skip" in errs[0], errs
    assert _errors(f"nodes.prompts.params.source={bad}", "nodes.prompts.params.on_error=skip") == []
    late = _data(tmp_path / "late.jsonl", {FIRST_ROWS + 5: "oops"}, n=FIRST_ROWS + 10)
    assert _errors(f"nodes.prompts.params.source={late}") == []          # past the first rows: the run finds it
    errs = _errors(f"nodes.prompts.params.source={tmp_path / 'none.jsonl'}")
    assert len(errs) == 1 and "does not exist" in errs[0], errs
    no_answer = _data(tmp_path / "q.jsonl", {2: json.dumps({"prompt": "no answer"})})
    errs = _errors(f"nodes.prompts.params.source={no_answer}")
    assert len(errs) == 1 and "q.jsonl:2: error: node 'prompts': no answer" in errs[0], errs


def test_validate_holds_prompts_to_the_generate_nodes_context_and_the_limit(tmp_path, capsys):
    """The model's context is 512 positions: the torch engine takes prompts of at most 511 tokens. A
    longer prompt is named file:line; a max_prompt_tokens above what the context takes is refused at its
    line; `--data` reads every row and names every bad one, in the first rows or not."""
    from dora.cli import main

    long = json.dumps({"prompt": "x" * 600, "answer": "1"})
    data = _data(tmp_path / "d.jsonl", {4: long, FIRST_ROWS + 7: long, FIRST_ROWS + 9: "oops"}, n=FIRST_ROWS + 10)
    errs = _errors(f"nodes.prompts.params.source={data}")
    assert len(errs) == 1 and f"d.jsonl:4: error: node 'prompts': the prompt is 600 tokens, over the limit of 511 " \
        "(the longest prompt generate node 'rollout' takes: model context 512 positions less 1 to generate" in errs[0], errs
    errs = _errors(f"nodes.prompts.params.source={data}", "nodes.prompts.params.max_prompt_tokens=2000")
    assert len(errs) == 1 and "max_prompt_tokens=2000>: error: node 'prompts': max_prompt_tokens 2000 is over the " \
        "longest prompt generate node 'rollout' takes: 511" in errs[0], errs
    assert _errors(f"nodes.prompts.params.source={data}", "nodes.prompts.params.on_error=skip") == []   # warnings
    capsys.readouterr()
    assert main(["validate", QUICKSTART, f"nodes.prompts.params.source={data}", "--data"]) == 2
    err = capsys.readouterr().err
    bad = sorted(int(line.split(":")[1]) for line in err.splitlines() if line.startswith(data))
    assert bad == [4, FIRST_ROWS + 7, FIRST_ROWS + 9], err
    assert f"{FIRST_ROWS + 10:,} rows read" in err, err


def test_dora_run_on_a_bad_row_exits_2_naming_file_and_line_before_any_step(tmp_path, capsys, remove_shm_weights):
    """A prompt longer than the model's context (512 positions) past the rows validation reads: the
    dataset refuses it at start-up (max_prompt_tokens resolved from the generate node's context), exit 2
    naming file:line, no step taken. (A malformed row takes the same path: tests/test_dataset.py.)"""
    long = json.dumps({"prompt": "x" * 600, "answer": "1"})
    late = _data(tmp_path / "late.jsonl", {FIRST_ROWS + 3: long, FIRST_ROWS + 5: "oops"}, n=FIRST_ROWS + 10)
    assert _errors(f"nodes.prompts.params.source={late}") == []   # validation passes: past the first rows
    rc = dora_run(tmp_path / "run", QUICKSTART, f"nodes.prompts.params.source={late}", *RUN, deadline=120)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"late.jsonl:{FIRST_ROWS + 3}: the prompt is 600 tokens, over the limit of 511" in err, err
    assert "Traceback" not in err, err
    summary = RunDir(tmp_path / "run").summary
    assert summary["ended"] == "failed" and "Traceback" not in summary["error"] and summary["steps"] == 0


def test_skipped_rows_and_raising_rewards_are_counted(tmp_path, remove_shm_weights):
    data = _data(tmp_path / "d.jsonl", {2: "not json", 5: "[1, 2]", 9: '{"prompt": "no answer"}',
                                        12: json.dumps({"prompt": "x" * 100, "answer": "1"})})
    rc = dora_run(tmp_path / "run", QUICKSTART, f"nodes.prompts.params.source={data}", "nodes.prompts.params.on_error=skip",
                  "nodes.prompts.params.max_prompt_tokens=50", "nodes.reward.params.fn=test_bad_data:flaky_reward", "nodes.reward.params.on_error=zero", *RUN,
                  deadline=150)
    run = RunDir(tmp_path / "run")
    assert rc == 0, run.describe()
    acc = run.accounting
    assert acc["dataset_skipped_rows"] == 4 and acc["lost"] == 0   # 3 malformed, 1 over max_prompt_tokens
    trained = [u for rec in run.ledger for u in rec["uids"]]
    assert len(trained) == len(set(trained)) == 2 * 16
    assert acc["reward_errors"] > 0   # odd answers raise: scored 0 and counted, the run goes on
