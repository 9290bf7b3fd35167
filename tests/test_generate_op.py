"""The generate operator over the torch engine: rows in/out, pass-through, reports, control methods."""

from __future__ import annotations

import msgpack
import pyarrow as pa
import pytest
import torch

from dora.graph.columns import COLUMNS
from op_context import op_context
from dora.ops.generate import GenerateOp
from dora.runtime.wire import WithBuffers

torch.set_num_threads(1)
MODEL = {"arch": "llama", "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64, "max_positions": 256}
PARAMS = {"engine": "torch", "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 12, "stop": [], "max_batch": 4}


def make_op(replica: int = 0, **params) -> tuple[GenerateOp, list]:
    events: list = []
    op = GenerateOp()
    op.setup(op_context("generate", {**PARAMS, **params}, node="gen", replica=replica, replicas=2,
                        model=MODEL, seed=0, report=events.append))
    return op, events


def prompts(n: int, version: int | None = None) -> pa.RecordBatch:
    rows = {"uid": [f"u{i}" for i in range(n)], "group_id": [i // 2 for i in range(n)],
            "prompt_ids": [[10 + i, 20, 30 + (i % 5)] for i in range(n)], "answer": [str(i) for i in range(n)]}
    types = {"uid": COLUMNS["uid"], "group_id": COLUMNS["group_id"], "prompt_ids": COLUMNS["prompt_ids"], "answer": COLUMNS["answer"]}
    if version is not None:
        rows["policy_version"] = [version] * n
        types["policy_version"] = COLUMNS["policy_version"]
    return pa.RecordBatch.from_pydict(rows, schema=pa.schema(types))


def run(op: GenerateOp) -> list[pa.RecordBatch]:
    out = []
    for _ in range(1000):
        if not op.busy():
            return out
        out += list(op.poll())
    raise AssertionError("generate op still busy")


def test_rows_stream_out_with_typed_columns_and_pass_through():
    op, events = make_op()
    assert list(op.process(prompts(10), "prompts")) == []
    batches = run(op)
    assert len(batches) > 1   # rows leave as they finish, not as one batch
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 10 and sorted(table["uid"].to_pylist()) == sorted(f"u{i}" for i in range(10))
    for name in ("response_ids", "response_text", "behavior_logprobs", "token_versions", "policy_version",
                 "finish_reason", "group_id", "prompt_ids", "uid"):
        assert table.schema.field(name).type == COLUMNS[name], name
    assert table.schema.field("answer").type == pa.string()
    for row in table.to_pylist():
        i = int(row["uid"][1:])
        assert row["answer"] == str(i) and row["group_id"] == i // 2
        n = len(row["response_ids"])
        assert 1 <= n <= 12 and len(row["behavior_logprobs"]) == n and row["token_versions"] == [0] * n
        assert row["finish_reason"] in ("stop", "length") and row["policy_version"] == 0
        assert row["response_text"] == op.tokenizer.decode(row["response_ids"], skip_special_tokens=True)
    finished = [u for e in events if e["kind"] == "finished" for u in e["uids"]]
    assert sorted(finished) == sorted(table["uid"].to_pylist())
    assert all(e["version"] == 0 for e in events)


def test_row_policy_version_tags_the_request():
    op, events = make_op()
    op.process(prompts(3, version=5), "prompts")
    table = pa.Table.from_batches(run(op))
    assert set(table["policy_version"].to_pylist()) == {5}
    assert {e["version"] for e in events} == {5}
    assert table.schema.field("policy_version").type == COLUMNS["policy_version"]


def _through_msgpack(result: WithBuffers) -> tuple[dict, list]:
    return msgpack.unpackb(msgpack.packb(result.value), raw=False), [memoryview(bytes(b)) for b in result.buffers]


def test_export_import_between_replicas_then_load_version(tmp_path):
    from dora.ops.weights.versions import save_version
    a, _ = make_op(0, temperature=0.0, max_tokens=10)
    b, b_events = make_op(1, temperature=0.0, max_tokens=10)
    ref, _ = make_op(0, temperature=0.0, max_tokens=10)
    ref.process(prompts(4), "prompts")
    want = {r["uid"]: r["response_ids"] for r in pa.Table.from_batches(run(ref)).to_pylist()}

    a.process(prompts(4), "prompts")
    for _ in range(3):
        a.poll()
    state, frames = _through_msgpack(a.call("export", {"uids": ["u0", "u2"]}))
    assert len(frames) == 2 * 2 * 2    # 2 requests x 2 layers x (keys, values)
    assert b.call("import_", {"state": state, "buffers": frames}) == {"imported": ["u0", "u2"], "hosted": [0]}
    got = pa.Table.from_batches(run(a) + run(b)).to_pylist()
    assert {r["uid"]: r["response_ids"] for r in got} == want
    assert {r["uid"] for r in got if r["uid"] in ("u0", "u2")} == {"u0", "u2"}
    assert b.call("stats", {})["reprefill_tokens"] == 0
    assert sorted(u for e in b_events for u in e["uids"]) == ["u0", "u2"]
    assert {r["answer"] for r in got} == {"0", "1", "2", "3"}   # pass-through columns survived migration

    # a new version: interrupt, load, resume; tokens after the switch carry version 1
    torch.manual_seed(3)
    sd = {k: torch.randn_like(v) * 0.05 for k, v in a.engine.weights().items()}
    path, _ = save_version(sd, str(tmp_path), 1)
    a.process(prompts(2), "prompts")
    a.poll()
    with pytest.raises(RuntimeError, match="interrupt_all"):
        a.call("load_version", {"version": 1, "path": path})
    state, frames = _through_msgpack(a.call("interrupt_all", {}))
    assert a.call("load_version", {"version": 1, "path": path})["version"] == 1
    a.call("import_", {"state": state, "buffers": frames})
    rows = pa.Table.from_batches(run(a)).to_pylist()
    assert all(r["token_versions"][0] == 0 and r["token_versions"][-1] == 1 for r in rows if len(r["response_ids"]) > 1)
    assert a.call("stats", {})["version"] == 1


def test_abort_stop_strings_and_errors():
    op, _ = make_op(max_tokens=50)
    op.process(prompts(2), "prompts")
    op.poll()
    assert op.call("abort", {"uids": ["u0", "nope"]}) == {"aborted": ["u0"]}
    assert [r["uid"] for b in run(op) for r in b.to_pylist()] == ["u1"]
    with pytest.raises(ValueError, match="no control method"):
        op.call("teardown", {})
    with pytest.raises(ValueError, match="lacks column 'prompt_ids'"):
        op.process(pa.RecordBatch.from_pydict({"uid": ["x"]}), "prompts")
    with pytest.raises(ValueError, match="single-token"):
        make_op(stop=["ab"])
    sop, _ = make_op(stop=["\n"])
    assert sop.stop_ids == [sop.tokenizer.encode("\n")[0]]
    with pytest.raises(ValueError, match="'engine' must be one of"):
        make_op(engine="tgi")


def test_elastic_spare_starts_asleep_and_serves_after_wake_and_load(tmp_path):
    """A replica past the node's count (async.elastic's spare) holds no weights until woken and loaded;
    then it generates what replica 0 generates with the same weights (greedy)."""
    from dora.ops.weights.versions import save_version
    ref, _ = make_op(0, temperature=0.0, max_tokens=8)
    path, _ = save_version({k: v.clone() for k, v in ref.engine.weights().items()}, str(tmp_path), 0)
    ref.process(prompts(2), "prompts")
    want = {r["uid"]: r["response_ids"] for r in pa.Table.from_batches(run(ref)).to_pylist()}
    spare, _ = make_op(2, temperature=0.0, max_tokens=8)          # replicas=2: index 2 is a spare
    assert spare.ctx.elastic_spare and spare.engine.weight_bytes() == 0
    with pytest.raises(RuntimeError, match="asleep"):
        spare.process(prompts(2), "prompts")
    assert not spare.in_flight
    assert spare.call("wake", {})["bytes"] > 0
    spare.call("load_version", {"version": 0, "path": path})
    spare.process(prompts(2), "prompts")
    got = {r["uid"]: r["response_ids"] for r in pa.Table.from_batches(run(spare)).to_pylist()}
    assert got == want
    assert spare.call("sleep", {})["bytes"] > 0 and spare.engine.weight_bytes() == 0


def test_torch_engine_dtype_kv_budget_and_stats_reach_the_op():
    op, _ = make_op(dtype="bfloat16", kv_cache_gb=0.01)
    assert op.engine.dtype == torch.bfloat16
    op.process(prompts(4), "prompts")
    run(op)
    stats = op.call("stats", {})
    assert stats["prefill_tokens"] > 0 and stats["kv_blocks_used"] == 0 and stats["kv_blocks_free"] > 0
    assert {"prefix_hit_tokens", "parked_requests", "parked_dropped"} <= set(stats) and op.live_stats() == stats
    with pytest.raises(ValueError, match="kv_cache_gb' must be >= 0.001"):
        make_op(kv_cache_gb=0.00001)
    from dora.graph.op_registry import resolve_op
    from dora.graph.opspec import fill_params
    from dora.ops.generate import check_params
    base = fill_params(resolve_op("generate"), {"weight_sync": "file", "dtype": "bfloat16", "kv_cache_gb": None})
    assert check_params({**base, "engine": "torch"}) == [] and check_params({**base, "engine": "vllm"}) == []
    assert check_params({**base, "engine": "vllm", "kv_cache_gb": 2.0})[0][0] == "kv_cache_gb"


def eval_rows(n: int, version: int, temperature: float = 0.0) -> pa.RecordBatch:
    """Held-out evaluation requests as the RL driver sends them (dora.ops.eval_data.eval_rows)."""
    from dora.ops.eval_data import eval_rows as rows
    s = {"samples": 1, "temperature": temperature, "top_p": 1.0, "max_tokens": 6}
    prompts_ = [{"prompt": f"p{i}", "prompt_ids": [10 + i, 20, 30], "answer": str(i), "task": None} for i in range(n)]
    return pa.RecordBatch.from_pylist(rows("h", s, prompts_, version))


def test_evaluation_requests_are_reported_never_emitted_and_never_hold_up_a_load(tmp_path):
    from dora.ops.weights.versions import save_version
    op, events = make_op(0, temperature=1.0, max_tokens=12, max_batch=8)
    op.process(eval_rows(3, 0), "prompts")
    op.process(prompts(2), "prompts")
    emitted = pa.Table.from_batches(run(op)).to_pylist()
    assert sorted(r["uid"] for r in emitted) == ["u0", "u1"]                    # training rows only
    got = [x for e in events if e["kind"] == "eval_finished" for x in e["samples"]]
    assert sorted(x["uid"] for x in got) == [f"eval:h:v0:{i}-0" for i in range(3)]
    assert all(x["token_versions"] == [0] and x["version"] == 0 and x["response_tokens"] <= 6 for x in got)
    assert not any(u.startswith("eval:") for e in events if e["kind"] == "finished" for u in e["uids"])
    again, again_events = make_op(0, temperature=1.0, max_tokens=12, max_batch=8)   # greedy: the same text
    again.process(eval_rows(3, 0), "prompts")
    run(again)
    same = [x for e in again_events if e["kind"] == "eval_finished" for x in e["samples"]]
    assert {x["uid"]: x["response_text"] for x in got} == {x["uid"]: x["response_text"] for x in same}
    # a version this replica does not host: not started, reported
    events.clear()
    op.process(eval_rows(1, 7), "prompts")
    assert events == [{"kind": "eval_aborted", "uids": ["eval:h:v7:0-0"], "reason": "version 7 not hosted"}]
    # one weight slot (M = 1): a load aborts the older version's evaluation requests instead of failing
    events.clear()
    op.process(eval_rows(2, 0), "prompts")
    op.poll()
    path, _ = save_version({k: v.clone() for k, v in op.engine.weights().items()}, str(tmp_path), 1)
    assert op.call("load_version", {"version": 1, "path": path})["version"] == 1
    assert [e["kind"] for e in events] == ["eval_aborted"] and len(events[0]["uids"]) == 2
    # two slots (M = 2): they decode on beside the new version, on their own weights
    two, ev2 = GenerateOp(), []
    two.setup(op_context("generate", {**PARAMS, "max_batch": 8}, node="gen", model=MODEL, seed=0, report=ev2.append,
                         async_={"versions_per_instance": 2}))
    two.process(eval_rows(2, 0), "prompts")
    two.poll()
    assert two.call("load_version", {"version": 1, "path": path})["hosted"] == [0, 1]
    run(two)
    done = [x for e in ev2 if e["kind"] == "eval_finished" for x in e["samples"]]
    assert len(done) == 2 and all(x["token_versions"] == [0] for x in done)
    assert not [e for e in ev2 if e["kind"] == "eval_aborted"]
