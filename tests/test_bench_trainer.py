"""benchmarks/trainer.py's MFU arithmetic: the model FLOPs it divides by the measured matmul rate
are what torch's own FLOP counter counts for a training step of the same llama (full attention
scores; the benchmark halves them for causal attention)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.trainer import matmul_rate, train_flops


@pytest.mark.parametrize("tied, kv_heads", [(False, 2), (True, 4)])
def test_train_flops_equal_torchs_count_of_a_training_step(tied, kv_heads):
    cfg = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": kv_heads, "intermediate": 96, "vocab": 50}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=kv_heads, intermediate_size=96, vocab_size=50,
                                         tie_word_embeddings=tied, attn_implementation="eager"))
    ids = torch.randint(0, 50, (3, 17))            # 3 sequences of 17 tokens, no padding
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.float().sum().backward()
    assert train_flops(cfg, [17] * 3, causal=False) == counter.get_total_flops()
    scores = 3 * 4 * 2 * 64 * 3 * 17 * 17          # 3 x (QK^T and AV: 2 x 2 s^2 d) x layers x sequences
    assert train_flops(cfg, [17] * 3) == counter.get_total_flops() - scores / 2


def test_matmul_rate_is_a_plausible_cpu_rate_in_flop_per_second():
    rate = matmul_rate("cpu", "float32")
    assert 1e8 < rate < 1e14, rate      # a CPU core's fp32 matmul: 0.1 GFLOP/s .. 100 TFLOP/s
