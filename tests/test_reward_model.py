"""The reward_model op on a tiny seeded one-label classifier: scores do not depend on how rows are
batched (right padding, score at each row's last token), a saved folder scores as the section it was
built from, long inputs keep their end and are counted."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dora.ops.classifier_models import classifier_problems, save_tiny_classifier
from dora.ops.reward_model import RewardModelOp
from op_context import op_context

TINY = {"arch": "llama", "hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "tokenizer": "chars",
        "init_std": 0.2}
BATCH = pa.RecordBatch.from_pydict({"uid": [f"u{i}" for i in range(6)], "question": ["3*a"] * 6,
                                    "response_text": ["a" * (3 * i + 1) for i in range(6)], "answer": ["aaa"] * 6})


def score(**params) -> tuple[list[float], dict]:
    op = RewardModelOp()
    op.setup(op_context("reward_model", {"model": TINY, **params}, seed=3))
    (out,) = op.process(BATCH, "trajectories")
    return out.column(params.get("column", "reward")).to_pylist(), op.stats()


def test_scores_do_not_depend_on_the_token_budget_and_a_saved_folder_scores_alike(tmp_path):
    one_by_one, s1 = score(token_budget=1)
    together, s2 = score(token_budget=4096, column="reward/rm")
    assert s1["forward_passes"] == 6 and s2["forward_passes"] == 1
    assert together == pytest.approx(one_by_one, abs=1e-5) and len(set(together)) == 6
    folder = save_tiny_classifier(TINY, str(tmp_path / "rm"), seed=3)
    assert classifier_problems({"path": folder}) == []
    op = RewardModelOp()
    op.setup(op_context("reward_model", {"model": {"path": folder}}))
    (out,) = op.process(BATCH, "trajectories")
    assert out.column("reward").to_pylist() == pytest.approx(one_by_one, abs=1e-5)


def test_long_inputs_keep_their_end_and_are_counted():
    scores, stats = score(max_length=8)
    assert stats["truncated"] == 4 and stats["tokens"] == 5 + 8 + 8 * 4   # BOS "3*a" + 1 or 4 a's fit; the rest cut to 8
    assert scores[4] == pytest.approx(scores[5], abs=1e-6)                 # both now the last 8 characters: all a's
