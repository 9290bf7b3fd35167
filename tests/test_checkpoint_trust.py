"""Checkpoints you can trust (dora/rl/checkpoint.py): a manifest of sizes and sha256 written last;
`--resume` names a torn or corrupted checkpoint and continues from the one before (a real resume past
a corrupted checkpoint: tests/test_run_lifecycle.py); a disk that fills up during a checkpoint (an
injected ENOSPC) leaves the earlier checkpoints whole and fails the run (exit 1) naming the path and
the bytes needed."""

from __future__ import annotations

import errno
import json
import re

from dora.rl import checkpoint
from tests.e2e_audit import PIPELINES, RunDir, SHORT, dora_run

RUN = [str(PIPELINES / "quickstart.yaml"), "async.train_batch=16", "async.rollout_batch=16", "run.save_every=1",
       "nodes.train.params.steps=3", *SHORT]


def _committed(tmp_path, step: int) -> str:
    path = checkpoint.staging(str(tmp_path), step)
    (tmp_path / "checkpoints" / f"step_{step}.partial" / "sub").mkdir()
    (tmp_path / "checkpoints" / f"step_{step}.partial" / "sub" / "w.bin").write_bytes(b"x" * 1000)
    checkpoint.write_state(path, {"step": step}, None)
    return checkpoint.commit(str(tmp_path), step, keep=5)


def test_manifest_names_what_is_torn_or_corrupted(tmp_path):
    good, torn, bad = (_committed(tmp_path, s) for s in (2, 4, 6))
    assert checkpoint.verify(good) is None
    (tmp_path / "checkpoints" / "step_4" / "manifest.json").unlink()          # died before the manifest
    with open(tmp_path / "checkpoints" / "step_6" / "sub" / "w.bin", "r+b") as f:
        f.seek(500)
        f.write(b"y")                                                          # a flipped byte
    assert "no manifest.json" in checkpoint.verify(torn)
    assert "sub/w.bin does not match its checksum" in checkpoint.verify(bad)
    (tmp_path / "checkpoints" / "step_6" / "sub" / "w.bin").write_bytes(b"x" * 10)
    assert "sub/w.bin has 10 bytes, the manifest says 1000" in checkpoint.verify(bad)
    found, skipped = checkpoint.trusted(str(tmp_path))
    assert found == (2, good) and [p for p, _ in skipped] == [bad, torn]


def test_enospc_during_a_checkpoint_keeps_the_last_one_and_fails_naming_path_and_bytes(tmp_path, monkeypatch, capsys,
                                                                                        remove_shm_weights):
    real, full = checkpoint.write_state, []

    def disk_full_at_step_3(path, state, pending):
        if state["step"] == 3 and not full:
            full.append(path)
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(path, state, pending)

    monkeypatch.setattr(checkpoint, "write_state", disk_full_at_step_3)
    out = tmp_path / "run"
    assert dora_run(out, *RUN) == 1
    err = capsys.readouterr().err
    assert f"no space left on device writing checkpoint {out}/checkpoints/step_3.partial" in err, err
    assert re.search(r"it needs about \d+ bytes \([\d.]+ MiB\), \d+ bytes \([\d.]+ MiB\) are free", err), err
    assert "checkpoint step_2 is intact" in err and "Traceback" not in err, err
    assert not (out / "checkpoints" / "step_3.partial").exists()
    assert checkpoint.verify(str(out / "checkpoints" / "step_2")) is None
    assert RunDir(out).summary["ended"] == "failed"
    # run.save_optimizer: last (the default): the newest checkpoint holds the optimizer, the older one kept
    # is weights and run state, and its manifest still matches every file it has
    assert (out / "checkpoints" / "step_2" / "sharded").is_dir()
    assert not (out / "checkpoints" / "step_1" / "sharded").exists()
    assert checkpoint.verify(str(out / "checkpoints" / "step_1")) is None


def test_a_checkpoint_sized_down_loads_back(tmp_path):
    """save_optimizer never / save_dtype bfloat16: no optimizer shards, weights in bf16 (half the bytes);
    a restore takes the weights (rounded to bf16, into the fp32 trainer) and says AdamW starts afresh."""
    import torch

    from dora.ops.models import load_policy
    from dora.ops.sharding.fsdp_model import ShardedModel
    from dora.ops.weights import pretrained

    cfg = {"hidden": 32, "layers": 1, "heads": 4, "kv_heads": 2, "intermediate": 64}
    model, tok = load_policy(cfg, "cpu", seed=0)
    sharded = ShardedModel(model, None, "cpu")
    opt = torch.optim.AdamW(sharded.params(), lr=1e-2)
    ids = torch.tensor([[5, 6, 7, 8]])
    model(ids, labels=ids).loss.backward()
    opt.step()
    sizes = {}
    for dtype in ("training", "bfloat16"):
        (tmp_path / dtype).mkdir()
        pretrained.save_training_checkpoint(sharded, opt, tok, str(tmp_path / dtype), {"step": 1},
                                            with_optimizer=False, dtype=dtype)
        assert not pretrained.holds_optimizer(str(tmp_path / dtype))
        sizes[dtype] = (tmp_path / dtype / "model.safetensors").stat().st_size
    assert sizes["bfloat16"] < 0.55 * sizes["training"]
    fresh, _ = load_policy(cfg, "cpu", seed=1)
    fresh_sharded = ShardedModel(fresh, None, "cpu")
    assert pretrained.load_training_checkpoint(fresh_sharded, torch.optim.AdamW(fresh_sharded.params()),
                                               str(tmp_path / "bfloat16")) is False
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert b.dtype == torch.float32 and torch.equal(a.to(torch.bfloat16).float(), b), name
