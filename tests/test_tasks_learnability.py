"""The quickstart task learns under plain GRPO with the recommended tiny model (slow: ~40-90 s)."""

import argparse
import importlib.util
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_learns_and_is_long_tailed():
    spec = importlib.util.spec_from_file_location("task_learnability", os.path.join(ROOT, "benchmarks", "task_learnability.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.set_num_threads(1)
    args = argparse.Namespace(task="quickstart", task_params="{}", model='{"init_std": 0.05}', steps=40, prompts=16,
                              group=4, size=256, lr=5e-3, temperature=1.0, max_tokens=128, agg="token_mean", verbose=False)
    result = bench.run(args, seed=0)
    assert result["gain"] >= 0.2, result
    assert result["steps_ratio_ge_10"] >= 20, result  # long-tailed in most steps (all but the warm-up)
