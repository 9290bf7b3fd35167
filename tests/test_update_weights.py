"""Versioned weight hand-off and checkpoints: bit-exact round trips, tied weights, locations, pruning."""

import os

import pytest
import torch

from dora.ops.weights import pretrained as checkpoint, versions as weights
from dora.ops.models import load_policy

torch.set_num_threads(1)
TINY = {"hidden": 32, "layers": 1, "heads": 4, "kv_heads": 2, "intermediate": 64}


@pytest.fixture(autouse=True)
def _remove_shm_weights(tmp_path):
    """Weight files may go to /dev/shm: remove this test's run folders there, pass or fail."""
    yield
    for run in [tmp_path, *tmp_path.iterdir()]:
        weights.cleanup(str(run))


def test_round_trip_is_bit_exact_with_tied_weights(tmp_path):
    src, _ = load_policy(TINY, "cpu", seed=0)
    dst, _ = load_policy(TINY, "cpu", seed=1)
    assert src.config.tie_word_embeddings
    assert not torch.equal(src.state_dict()["model.embed_tokens.weight"], dst.state_dict()["model.embed_tokens.weight"])
    path, nbytes = weights.save_version(src.state_dict(), str(tmp_path), 7)
    assert os.path.basename(path) == "v000007.safetensors" and nbytes == os.path.getsize(path)
    # the tied head is stored once: file ~ the unique parameters' bytes
    unique = sum(p.numel() * 4 for p in src.parameters())
    assert unique <= nbytes < unique + 64 * 1024
    weights.load_version(dst, path)
    for n, t in src.state_dict().items():
        assert torch.equal(dst.state_dict()[n], t), n
    assert dst.lm_head.weight.data_ptr() == dst.model.embed_tokens.weight.data_ptr()  # still tied


def test_location_prune_and_cleanup(tmp_path, monkeypatch):
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    run = str(tmp_path / "run")
    if os.access("/dev/shm", os.W_OK):
        path, _ = weights.save_version(sd, run, 0)
        assert path.startswith("/dev/shm/dora-run-")
    monkeypatch.setattr(weights, "SHM", str(tmp_path / "no-shm"))  # no /dev/shm -> run_dir/weights
    for v in (1, 2, 3):
        path, _ = weights.save_version({"w": sd["w"] + v}, run, v)
        assert path == os.path.join(run, "weights", f"v{v:06d}.safetensors")
    assert torch.equal(weights.read_version(path)["w"], sd["w"] + 3)
    weights.prune_versions(run, keep=2)
    assert [v for v, _ in weights.list_versions(run)] == [2, 3]
    monkeypatch.undo()
    weights.cleanup(run)


def test_load_into_a_different_model_is_a_clear_error(tmp_path):
    src, _ = load_policy(TINY, "cpu", seed=0)
    other, _ = load_policy({**TINY, "hidden": 16}, "cpu", seed=0)
    path, _ = weights.save_version(src.state_dict(), str(tmp_path), 1)
    with pytest.raises(ValueError, match="shape"):
        weights.load_version(other, path)
    with pytest.raises(FileNotFoundError, match="v000009"):
        weights.load_version(src, path.replace("v000001", "v000009"))


def test_training_checkpoint_loads_with_transformers_and_restores_the_optimizer(tmp_path):
    from transformers import AutoModelForCausalLM

    from dora.ops.sharding.fsdp_model import ShardedModel

    model, tok = load_policy(TINY, "cpu", seed=3)
    sharded = ShardedModel(model, None, "cpu")
    opt = torch.optim.AdamW(sharded.params(), lr=1e-2)
    model(torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    opt.step()   # AdamW now holds moments and a step count
    path = str(tmp_path / "ckpt")
    os.makedirs(path)
    checkpoint.save_training_checkpoint(sharded, opt, tok, path, {"step": 5, "version": 5})
    loaded = AutoModelForCausalLM.from_pretrained(path)
    for n, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[n], t), n
    assert os.path.isfile(os.path.join(path, "dora_state.json"))

    fresh, _ = load_policy(TINY, "cpu", seed=4)   # other weights, an empty optimizer
    fresh_sharded = ShardedModel(fresh, None, "cpu")
    fresh_opt = torch.optim.AdamW(fresh_sharded.params(), lr=1e-2)
    checkpoint.load_training_checkpoint(fresh_sharded, fresh_opt, path)
    for n, t in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[n], t), n
    moments = [s["exp_avg"] for s in opt.state.values()]
    restored = [s["exp_avg"] for s in fresh_opt.state.values()]
    assert len(restored) == len(moments) > 0 and all(torch.equal(a, b) for a, b in zip(moments, restored))
