"""The generate op's multi-turn rollouts with a tiny model and deterministic tools: token in, token
out (a teacher-forced pass over prompt + response reproduces every model token's logprob, and every
observation is exactly the tool's output), masks aligned, limits, export/import of requests mid-turn
and waiting on a tool, and `dora validate` naming a bad tool declaration at file:line."""

from __future__ import annotations

import msgpack
import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from dora.ops.generate import GenerateOp
from dora.ops.models import load_policy
from dora.ops.tokenizers import CharTokenizer
from dora.ops.tools.search_tool import SearchTool
from engine_helpers import teacher_forced_logprobs
from op_context import op_context
from test_graph_helpers import BASE, errors, line_of

torch.set_num_threads(1)
MODEL = {"arch": "llama", "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64, "max_positions": 256}
TOK = CharTokenizer()
# a turn that ends on a stop character calls the one tool with the turn's text before it
SAMPLED = {"engine": "torch", "temperature": 1.0, "max_tokens": 24, "stop": ["e", "a", " ", "t"], "max_batch": 8,
           "max_turns": 3, "max_total_tokens": 90, "tools": [{"name": "search", "max_output_chars": 30}],
           "tool_parser": "stop", "observation_template": "<{observation}>"}
# greedy: this random model repeats its last token, so a prompt ending in "t" calls the tool at once,
# and the observation template ends in "t" again: tool call after tool call until max_turns
GREEDY = {"engine": "torch", "temperature": 0.0, "max_tokens": 6, "stop": ["t"], "max_batch": 8, "max_turns": 3,
          "max_total_tokens": 64, "tools": [{"name": "python", "timeout_s": 5.0}], "tool_parser": "stop",
          "observation_template": "<{observation}>t"}


def make_op(params: dict, replica: int = 0) -> tuple[GenerateOp, list]:
    events: list = []
    op = GenerateOp()
    op.setup(op_context("generate", params, node="gen", replica=replica, replicas=2, model=MODEL, seed=0,
                        report=events.append))
    return op, events


def prompts(last_chars: str) -> pa.RecordBatch:
    ids = [[10 + i, 20, TOK.token_id(c)] for i, c in enumerate(last_chars)]
    return pa.RecordBatch.from_pydict(
        {"uid": [f"u{i}" for i in range(len(ids))], "group_id": list(range(len(ids))), "prompt_ids": ids},
        schema=pa.schema({c: COLUMNS[c] for c in ("uid", "group_id", "prompt_ids")}))


def drain(op: GenerateOp, limit: int = 5000) -> list[dict]:
    out = []
    for _ in range(limit):
        if not op.busy():
            return pa.Table.from_batches(out).to_pylist() if out else []
        out += list(op.poll())
    raise AssertionError("generate op still busy")


def model_turns(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of model tokens."""
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_token_in_token_out_masks_and_observations():
    op, events = make_op(SAMPLED)
    op.process(prompts("abcdefgh"), "prompts")
    rows = drain(op)
    search = SearchTool("search", corpus=None, top_k=3, max_output_chars=30)
    policy, _ = load_policy(MODEL, "cpu", seed=0)   # the generate replica's weights: a function of config and seed
    assert len(rows) == 8 and max(r["turns"] for r in rows) >= 2 and sum(r["tool_calls"] for r in rows) >= 2
    for r in rows:
        ids, mask, lps = r["response_ids"], r["response_mask"], r["behavior_logprobs"]
        assert len(ids) == len(mask) == len(lps) == len(r["token_versions"]) <= 90
        turns = model_turns(mask)
        assert len(turns) == r["turns"] and r["tool_errors"] == 0 and r["finish_reason"] in ("stop", "length")
        # the model was conditioned on exactly prompt + response: a teacher-forced pass reproduces its logprobs
        want = teacher_forced_logprobs(policy, r["prompt_ids"], ids, 1.0)
        model = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(lps)[model], want[model], atol=1e-4)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if m == 0)
        # every observation is the template around the tool's output for the turn before it
        for (s, e), nxt in zip(turns, turns[1:] + [(len(ids), None)]):
            if e == len(ids):
                continue
            turn = TOK.decode(ids[s:e])
            query = turn[:-1]
            assert turn[-1] in SAMPLED["stop"]
            expected = TOK.encode("<" + search.run({"query": query}).text + ">")
            assert ids[e:nxt[0]] == expected[:nxt[0] - e]
        assert r["final_turn_text"] == (TOK.decode(ids[turns[-1][0]:]) if mask[-1] == 1 else "")
    by_uid = {r["uid"]: r for r in rows}
    for ev in (e for e in events if e["kind"] == "finished"):
        for uid, turns, calls, trace in zip(ev["uids"], ev["turns"], ev["tool_calls"], ev["turn_trace"]):
            assert (turns, calls) == (by_uid[uid]["turns"], by_uid[uid]["tool_calls"])
            assert sum(t[0] + t[2] for t in trace) == len(by_uid[uid]["response_ids"])


def _wire(result) -> tuple[dict, list]:
    return msgpack.unpackb(msgpack.packb(result.value), raw=False), [memoryview(bytes(b)) for b in result.buffers]


def test_export_import_mid_turn_and_in_a_tool_wait_changes_nothing():
    """Greedy: a trajectory moved to another replica mid-turn or while its tool runs ends exactly
    as it would have where it started."""
    ref, _ = make_op(GREEDY)
    ref.process(prompts("ttttqtvt"), "prompts")
    want = {r["uid"]: r for r in drain(ref)}
    assert {r["finish_reason"] for r in want.values()} == {"length"}
    assert max(r["turns"] for r in want.values()) == 3 and min(r["turns"] for r in want.values()) == 1
    assert want["u0"]["tool_calls"] == 2   # the third turn's call is past max_turns: not run

    a, _ = make_op(GREEDY, 0)
    b, b_events = make_op(GREEDY, 1)
    a.process(prompts("ttttqtvt"), "prompts")
    for _ in range(200):
        a.poll()
        if a.agent.waiting and a.engine.has_work():
            break
    waiting = sorted(a.agent.waiting)
    assert waiting and a.call("stats", {})["tool_waiting"] == len(waiting)
    state, frames = _wire(a.call("interrupt_all", {}))
    assert not a.busy() and a.call("stats", {})["active"] == 0
    assert sorted(b.call("import_", {"state": state, "buffers": frames})["imported"]) == [f"u{i}" for i in range(8)]
    got = {r["uid"]: r for r in drain(b)}
    assert set(got) == set(want)
    for uid, r in got.items():
        for col in ("response_ids", "response_mask", "token_versions", "turns", "tool_calls", "finish_reason",
                    "final_turn_text", "prompt_ids"):
            assert r[col] == want[uid][col], (uid, col)
        assert r["behavior_logprobs"] == pytest.approx(want[uid]["behavior_logprobs"], abs=1e-5)
    assert sorted(u for e in b_events if e["kind"] == "finished" for u in e["uids"]) == sorted(want)


def test_a_tool_wait_moves_with_its_finished_output_or_its_calls(monkeypatch):
    """Exported while its tool runs, a trajectory carries its parsed calls (run again where it lands);
    exported after the tool finished, it carries the output. Either way it ends as it would have."""
    import dora.ops.multiturn.agent_loop as loop
    ref, _ = make_op(GREEDY)
    ref.process(prompts("tt"), "prompts")
    want = {r["uid"]: r for r in drain(ref)}
    # an idle poll would wait up to 50 ms for a tool: a warm sandbox answers sooner, and the two
    # trajectories would never wait at once
    monkeypatch.setattr(loop, "IDLE_WAIT_S", 0.0)
    a, _ = make_op(GREEDY, 0)
    b, _ = make_op(GREEDY, 1)
    a.process(prompts("tt"), "prompts")
    for _ in range(2000):   # (bounded: a failure, never a hang)
        if len(a.agent.waiting) == 2:
            break
        a.poll()
    assert len(a.agent.waiting) == 2
    monkeypatch.undo()
    running = not a.agent.runner.jobs["u0"].done()
    state0, frames0 = _wire(a.call("export", {"uids": ["u0"]}))
    a.agent.runner.jobs["u1"].result(timeout=10)
    state1, frames1 = _wire(a.call("export", {"uids": ["u1"]}))
    (wait0,), (wait1,) = [[s["request"]["meta"]["tool_wait"] for s in st["states"]] for st in (state0, state1)]
    assert "outcome" in wait1 and ("calls" in wait0 if running else "outcome" in wait0)
    b.call("import_", {"state": state0, "buffers": frames0})
    b.call("import_", {"state": state1, "buffers": frames1})
    got = {r["uid"]: r for r in drain(b)}
    assert not a.busy() and set(got) == {"u0", "u1"}
    for uid, r in got.items():
        assert (r["response_ids"], r["response_mask"], r["tool_calls"]) == (
            want[uid]["response_ids"], want[uid]["response_mask"], want[uid]["tool_calls"])


def test_abort_in_a_tool_wait_and_the_total_token_limit():
    op, events = make_op({**GREEDY, "max_turns": 10, "max_total_tokens": 11})
    op.process(prompts("tt"), "prompts")
    for _ in range(200):
        op.poll()
        if op.agent.waiting:
            break
    uid = sorted(op.agent.waiting)[0]
    assert op.call("abort", {"uids": [uid]}) == {"aborted": [uid]}
    rows = drain(op)
    assert [r["uid"] for r in rows] == [u for u in ("u0", "u1") if u != uid]
    # turns "t" and observations "<>t" (code "" prints nothing): 1+3+1+3+1, then the third observation
    # is cut to the 2 tokens left and the trajectory ends
    r = rows[0]
    assert r["finish_reason"] == "length" and r["turns"] == 3 and r["tool_calls"] == 3
    assert r["response_mask"] == [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0] and r["final_turn_text"] == ""
    assert TOK.decode(r["response_ids"]) == "t<>tt<>tt<>"
    (ev,) = [e for e in events if e["kind"] == "finished"]
    assert ev["turn_trace"] == [[[1, ev["turn_trace"][0][0][1], 3], [1, ev["turn_trace"][0][1][1], 3], [1, ev["turn_trace"][0][2][1], 2]]]
    # turns 2 and 3 prefilled the 3 prompt tokens and all but the new observation again: 4 + 8
    assert ev["context_prefill_tokens"] == [12] and ev["prompt_tokens"] == [3]


TOOLS_YAML = """\
  rollout:
    op: generate
    pool: rollout
    replicas: 2
    inputs: {prompts: prompts/out}
    params:
      max_tokens: 8
      max_turns: 3
      tools:
        - {name: python, timeout_s: 2}
        - {name: calculator}
        - {name: search, top_k: 0}
"""


def test_validate_names_a_bad_tool_at_its_line(tmp_path):
    text = BASE.replace("  rollout: {op: generate, pool: rollout, replicas: 2, inputs: {prompts: prompts/out}, "
                        "params: {max_tokens: 8}}\n", TOOLS_YAML)
    errs = errors(tmp_path, text)
    assert len(errs) == 2 and all(e.node == "rollout" for e in errs)
    kind, top_k = sorted(errs, key=lambda e: e.loc.line)
    assert kind.loc.line == line_of(text, "calculator") and "unknown tool kind 'calculator'" in kind.message
    assert top_k.loc.line == line_of(text, "top_k: 0") and "top_k" in top_k.message and ">= 1" in top_k.message
    fixed = text.replace("        - {name: calculator}\n", "").replace("top_k: 0", "top_k: 2")
    assert errors(tmp_path, fixed) == []
    no_turns = fixed.replace("max_turns: 3", "max_turns: 1")
    (e,) = errors(tmp_path, no_turns)
    assert "never read a tool's output" in e.message and e.loc.line == line_of(no_turns, "max_turns: 1")
