"""KV parking across tool waits (generate param park_kv, the torch engine): a trajectory waiting on
a tool holds no decode slot and keeps its KV parked, the next turn prefills only the observation,
the KV is released when the trajectory ends or leaves; when the pool runs short parked KV is dropped
and the continuation prefilled again, counted in the engine's stats and the `finished` events.
Greedy runs, so parking changes how much is prefilled, never what is generated."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from test_generate_multiturn import GREEDY, drain, make_op, prompts

torch.set_num_threads(1)
COLS = ("response_ids", "response_mask", "token_versions", "turns", "tool_calls", "finish_reason")
LAST = "ttttqtvt"   # prompts ending in "t" call the tool at once (see GREEDY)


def run(params: dict, last: str = LAST) -> tuple[dict, dict, list]:
    op, events = make_op(params)
    op.process(prompts(last), "prompts")
    rows, polls = [], 0
    while op.busy():
        rows += [r for b in op.poll() for r in b.to_pylist()]
        polls += 1
        st = op.engine.stats()
        if params.get("park_kv", True) and not st.parked_dropped:
            # every trajectory between turns is parked and holds no decode slot; nothing else stays parked
            assert st.parked_requests == len(op.agent.waiting)
        assert st.active + st.queued + len(op.agent.waiting) <= len(last)
        assert polls < 5000
    st = op.engine.stats()
    assert st.parked_requests == 0 and st.kv_blocks_used == 0   # released when each trajectory ended
    op.teardown()
    return {r["uid"]: r for r in rows}, st.to_dict(), events


@pytest.fixture(scope="module")
def without():
    return run({**GREEDY, "park_kv": False})


def test_parking_prefills_only_the_observations_and_changes_no_token(without):
    parked_rows, parked, events = run(GREEDY)
    rows, plain, _ = without
    assert max(r["turns"] for r in rows.values()) == 3
    for uid, r in rows.items():
        for c in COLS:
            assert parked_rows[uid][c] == r[c], (uid, c)
        assert parked_rows[uid]["behavior_logprobs"] == pytest.approx(r["behavior_logprobs"], abs=1e-5)
    assert parked["prefill_tokens"] < plain["prefill_tokens"]
    assert parked["continuation_reprefill_tokens"] == plain["continuation_reprefill_tokens"] == 0
    # without parking a continuation prefills everything the prefix cache does not hold; with it,
    # only the observation (less its last token, which the first decode step feeds, as for a prompt)
    finished = [e for e in events if e["kind"] == "finished"]
    observed = sum(t[2] for e in finished for tr in e["turn_trace"] for t in tr[:-1])
    prompts_prefill = sum(p - 1 for e in finished for p in e["prompt_tokens"])
    assert parked["prefill_tokens"] == prompts_prefill + observed
    waits = [e for e in events if e["kind"] == "tool_waits"]
    assert waits and waits[-1]["waiting"] == 0
    assert sorted(u for e in waits for u in e["started"]) == sorted(u for e in waits for u in e["ended"])


# a model whose KV fills a 0.001 GiB pool (16 blocks of 16 tokens): 24 trajectories, each parked between
# its turns, do not fit, so parked KV must go
BIG_KV = {"arch": "llama", "hidden": 128, "layers": 4, "heads": 4, "kv_heads": 4, "intermediate": 64, "max_positions": 256}


def test_a_short_pool_drops_parked_kv_and_counts_the_prefill_again(monkeypatch):
    import test_generate_multiturn as mt
    monkeypatch.setattr(mt, "MODEL", BIG_KV)
    want, _, _ = run({**GREEDY, "park_kv": False}, "t" * 24)
    got, st, events = run({**GREEDY, "kv_cache_gb": 0.001}, "t" * 24)
    assert st["kv_tokens_capacity"] == 256
    assert st["parked_dropped"] > 0 and st["continuation_reprefill_tokens"] > 0
    finished = [e for e in events if e["kind"] == "finished"]
    assert sum(e["parked_dropped"] for e in finished) == st["parked_dropped"]
    assert sum(e["continuation_reprefill_tokens"] for e in finished) == st["continuation_reprefill_tokens"]
    for uid, r in want.items():
        for c in COLS:
            assert got[uid][c] == r[c], (uid, c)


def test_every_turn_of_a_trajectory_is_on_its_version():
    """C1 across turns: a replica refuses a new version while trajectories wait on a tool (their next
    turn would run on it); every token of a multi-turn trajectory carries the one version."""
    op, _ = make_op(GREEDY)
    op.process(prompts(LAST), "prompts")
    for _ in range(2000):
        if op.agent.waiting:
            break
        op.poll()
    assert op.agent.waiting
    with pytest.raises(RuntimeError, match="wait on a tool"):
        op.load_version(1, "unused.safetensors")
    rows = drain(op)
    assert max(r["turns"] for r in rows) == 3
    assert all(set(r["token_versions"]) == {r["policy_version"]} for r in rows)
    op.teardown()


def test_with_two_versions_per_replica_a_load_leaves_tool_waits_on_their_version(tmp_path):
    """versions_per_instance 2: a new version loads while trajectories of the old one wait on a tool;
    their later turns still run on the old version (kept hosted while they wait), new trajectories
    run on the new one, and the old version's weights leave once its last trajectory ended."""
    from dora.ops.generate import GenerateOp
    from dora.ops.weights.versions import save_version
    from op_context import op_context
    from test_generate_multiturn import MODEL

    op, events = GenerateOp(), []
    op.setup(op_context("generate", GREEDY, node="gen", model=MODEL, seed=0, report=events.append,
                        async_={"versions_per_instance": 2}))
    torch.manual_seed(1)
    path, _ = save_version({k: v + 0.01 * torch.randn_like(v) for k, v in op.engine.weights().items()}, str(tmp_path), 1)
    op.process(prompts(LAST), "prompts")
    ready, op.agent.runner.ready = op.agent.runner.ready, lambda timeout: []   # the tools take their time
    rows = []
    while op.engine.has_work():
        rows += [r for b in op.poll() for r in b.to_pylist()]
    assert op.agent.waiting                  # v0 has no request in the engine, only trajectories in a tool wait
    assert op.load_version(1, path)["hosted"] == [0, 1]
    op.agent.runner.ready = ready
    op.process(prompts("tt").set_column(0, "uid", pa.array(["n0", "n1"])), "prompts")   # on the current version, 1
    with pytest.raises(RuntimeError, match="all 2 weight slot"):
        op.load_version(2, path)             # v0 (waiting on a tool) and v1 (running) fill both slots
    rows += drain(op)
    assert len(rows) == len(LAST) + 2 and max(r["turns"] for r in rows) == 3
    for r in rows:
        v = 1 if r["uid"].startswith("n") else 0
        assert r["policy_version"] == v and set(r["token_versions"]) == {v}, r["uid"]
    assert op.call("stats", {})["hosted"] == [1]
    op.teardown()
