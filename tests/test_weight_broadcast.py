"""Weight hand-off by torch.distributed broadcast (dora/ops/weights/broadcast.py): gloo on CPU,
trainer rank 0 and two receiver processes, versions bit-exact; a missing version fails clearly;
and one `dora run` end to end with weight_sync: broadcast."""

from __future__ import annotations

import multiprocessing as mp
import queue

import pytest
import torch

from dora.ops.weights.broadcast import WeightBroadcaster, WeightReceiver

DEADLINE_S = 60.0


def _tiny_state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    emb = torch.randn(11, 4, generator=g)
    return {"emb.weight": emb, "lin.weight": torch.randn(3, 4, generator=g).to(torch.bfloat16),
            "lin.bias": torch.randn(3, generator=g), "steps": torch.tensor(version), "head.weight": emb}


def _receiver(run_dir: str, rank: int, versions: list[int], missing: int | None, out) -> None:
    torch.set_num_threads(1)
    try:
        rx = WeightReceiver(run_dir, rank, timeout_s=DEADLINE_S, keep=4)
        for v in versions:
            got = rx.get(v, timeout_s=DEADLINE_S)
            want = _tiny_state(v)
            exact = set(got) == set(want) and all(
                got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
            tied = got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()
            out.put((rank, v, exact, tied))
        if missing is not None:
            try:
                rx.get(missing, timeout_s=1.0)
                out.put((rank, missing, "loaded", None))
            except TimeoutError as e:
                out.put((rank, missing, "timeout", str(e)))
        rx.close()
    except BaseException as e:
        out.put((rank, None, "error", repr(e)))


def _run_ranks(tmp_path, receivers: int, versions: list[int], missing: int | None = None):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(str(tmp_path), r, versions, missing, out), daemon=True)
             for r in range(1, receivers + 1)]
    for p in procs:
        p.start()
    try:
        bc = WeightBroadcaster(str(tmp_path), receivers, timeout_s=DEADLINE_S)
        sizes = [bc.broadcast(v, _tiny_state(v)) for v in versions]
        results = []
        for _ in range(receivers * (len(versions) + (missing is not None))):
            try:
                results.append(out.get(timeout=DEADLINE_S))
            except queue.Empty:
                pytest.fail(f"receivers reported {len(results)} results within {DEADLINE_S} s: {results}")
        bc.close()
        for p in procs:
            p.join(DEADLINE_S)
            assert p.exitcode == 0, f"receiver pid {p.pid} exit code {p.exitcode}"
        return sizes, results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def test_three_versions_reach_two_receivers_bit_exact(tmp_path):
    sizes, results = _run_ranks(tmp_path, 2, [0, 1, 2])
    assert not [r for r in results if r[2] == "error"], results
    assert sorted((r, v) for r, v, *_ in results) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert all(exact is True and tied for _, _, exact, tied in results), results
    # tied head sent once: 11*4*4 + 3*4*2 + 3*4 + 8 bytes
    assert [n for _, n in sizes] == [11 * 4 * 4 + 3 * 4 * 2 + 3 * 4 + 8] * 3
    assert all(s >= 0 for s, _ in sizes)


def test_a_version_that_never_comes_fails_clearly(tmp_path):
    _, results = _run_ranks(tmp_path, 1, [0], missing=5)
    assert results[0][2] is True, results
    rank, v, what, msg = results[1]
    assert (v, what) == (5, "timeout"), results
    assert "weight version 5 did not arrive" in msg and "held: [0]" in msg


def test_broadcaster_without_receivers_fails_after_its_deadline(tmp_path):
    with pytest.raises(TimeoutError, match="1 of 1 generate replicas did not join"):
        WeightBroadcaster(str(tmp_path), 1, timeout_s=0.5)
    with pytest.raises(ValueError, match="broadcast_to >= 1"):
        WeightBroadcaster(str(tmp_path), 0)


def test_receiver_without_trainer_reports_its_deadline(tmp_path):
    rx = WeightReceiver(str(tmp_path), 1, timeout_s=0.3)
    with pytest.raises(RuntimeError, match="no .*weight_sync.json from the trainer"):
        rx.get(0, timeout_s=DEADLINE_S)



GEN_MODEL = {"arch": "llama", "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64, "max_positions": 256}


def _trainer(run_dir: str, release, out) -> None:
    torch.set_num_threads(1)
    try:
        from dora.ops.models import load_policy
        model, _ = load_policy(GEN_MODEL, "cpu", seed=5)
        bc = WeightBroadcaster(run_dir, 1, timeout_s=DEADLINE_S)
        out.put(bc.broadcast(1, model.state_dict()))
        release.wait(DEADLINE_S)
        bc.close()
    except BaseException as e:
        out.put(repr(e))


def test_generate_op_loads_broadcast_versions_and_falls_back_to_the_file(tmp_path, monkeypatch):
    import dora.ops.generate as generate
    from dora.ops.weights import versions as weights
    from op_context import op_context
    from dora.ops.models import load_policy

    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    out, release = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_trainer, args=(str(tmp_path), release, out), daemon=True)
    proc.start()
    try:
        op = generate.GenerateOp()
        op.setup(op_context("generate", {"max_tokens": 4, "max_batch": 4, "weight_sync": "broadcast"}, node="gen",
                            model=GEN_MODEL, seed=0, run_dir=str(tmp_path)))
        sent = out.get(timeout=DEADLINE_S)
        assert isinstance(sent, tuple), sent
        got = op.load_version(1, str(tmp_path / "no-such-file.safetensors"))   # from memory: the path is never read
        assert got["source"] == "broadcast" and op.engine.version == 1
        want = load_policy(GEN_MODEL, "cpu", seed=5)[0].state_dict()
        assert all(torch.equal(t, want[k]) for k, t in op.engine.weights().items())
        # a version never broadcast: after the (shortened) wait, the file is loaded instead
        monkeypatch.setattr(generate, "BROADCAST_WAIT_S", 0.2)
        other = load_policy(GEN_MODEL, "cpu", seed=6)[0].state_dict()
        path, _ = weights.save_version(other, str(tmp_path), 2)
        got = op.load_version(2, path)
        assert got["source"] == "file" and op.engine.version == 2
        assert all(torch.equal(t, other[k]) for k, t in op.engine.weights().items())
        assert op.loads_by_source == {"file": 1, "broadcast": 1}
        release.set()
        proc.join(DEADLINE_S)
        assert proc.exitcode == 0
        op.teardown()
    finally:
        weights.cleanup(str(tmp_path))
        if proc.is_alive():
            proc.kill()


@pytest.mark.slow
def test_dora_run_with_broadcast_weight_sync(tmp_path):
    from e2e_audit import SHORT, RunDir, check_accounting, check_metrics, dora_run

    steps, tb = 3, 16
    rc = dora_run(tmp_path, "quickstart.yaml", f"async.train_batch={tb}", f"async.rollout_batch={tb}",
                  f"nodes.train.params.steps={steps}", "nodes.train.params.weight_sync=broadcast",
                  "nodes.train.params.broadcast_to=2", "nodes.rollout.params.weight_sync=broadcast", *SHORT,
                  deadline=240.0)
    run = RunDir(tmp_path)
    assert rc == 0, run.describe()
    check_metrics(run, steps, tb)
    check_accounting(run, steps, tb)
    assert run.accounting["lost"] == 0, run.accounting
    for r in run.metrics:
        assert r["broadcast_s"] >= 0 and r["broadcast_bytes"] > 0, r
    # every replica loaded each version from the broadcast, never falling back to the file
    logs = sorted((tmp_path / "logs").glob("rollout-*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        assert "from /" not in log.read_text(), log.read_text()[-2000:]
