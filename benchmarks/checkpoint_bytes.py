"""Bytes of the trainer's part of a checkpoint, side by side in one run: the full weights stored
twice (the transformers folder and DCP shards of {model, optimizer}: the layout before issue 22)
and once (the transformers folder and DCP shards of {optimizer}: dora's layout now), after one
AdamW step; and the seconds the manifest's sha256 of the "once" folder takes (dora/rl/checkpoint.py).
Then the checkpoint as run.save_optimizer and run.save_dtype size it (issue 36): with or without the
optimizer state, weights in the training dtype or bfloat16, and what RUN_DIR/checkpoints holds with
the default keep_checkpoints 2 under each save_optimizer.

    python3 -m benchmarks.checkpoint_bytes                       # the quickstart's tiny model
    python3 -m benchmarks.checkpoint_bytes --model smollm2-135m-instruct

Prints a table; docs/benchmarks.md records it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def measure(model_cfg: dict) -> dict:
    from dora.ops.models import load_policy
    from dora.ops.sharding.fsdp_model import ShardedModel
    from dora.ops.weights import pretrained
    from dora.rl import checkpoint

    model, tok = load_policy(model_cfg, "cpu", seed=0)
    model.train()
    sharded = ShardedModel(model, None, "cpu")
    opt = torch.optim.AdamW(sharded.params(), lr=1e-5)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    model(ids, labels=ids).loss.backward()
    opt.step()   # AdamW now holds both moments
    unique = {t.data_ptr(): t for t in model.state_dict().values()}   # tied weights once
    weights = sum(t.numel() * t.element_size() for t in unique.values())
    out = {"weights_fp32": weights}
    with tempfile.TemporaryDirectory() as tmp:
        twice, once = os.path.join(tmp, "twice"), os.path.join(tmp, "once")
        for path in (twice, once):
            os.makedirs(path)
        pretrained.save_training_checkpoint(sharded, opt, tok, once, {"step": 1, "version": 1})
        # the earlier layout: the same folder, and the DCP shards of the model too
        pretrained.save_training_checkpoint(sharded, opt, tok, twice, {"step": 1, "version": 1})
        sharded.save_sharded(opt, os.path.join(twice, pretrained.SHARDED_DIR + "_with_model"), with_model=True)
        out["twice"] = folder_bytes(twice) - folder_bytes(os.path.join(twice, pretrained.SHARDED_DIR))
        out["once"] = folder_bytes(once)
        t0 = time.perf_counter()
        checkpoint.write_manifest(once)
        out["manifest_s"] = time.perf_counter() - t0
        for with_optimizer in (True, False):
            for dtype in ("training", "bfloat16"):
                path = os.path.join(tmp, f"{with_optimizer}-{dtype}")
                os.makedirs(path)
                pretrained.save_training_checkpoint(sharded, opt, tok, path, {"step": 1, "version": 1},
                                                    with_optimizer=with_optimizer, dtype=dtype)
                out[(with_optimizer, dtype)] = folder_bytes(path)
    return out


def sized_table(name: str, r: dict) -> None:
    """One checkpoint per (optimizer, dtype), and RUN_DIR/checkpoints with keep_checkpoints 2."""
    print("| model | save_optimizer, save_dtype | newest checkpoint | an older one kept | checkpoints/ (keep 2) | vs all, training |")
    print("|---|---|---|---|---|---|")
    base = 2 * r[(True, "training")]
    for policy in ("all", "last", "never"):
        for dtype in ("training", "bfloat16"):
            newest = r[(policy != "never", dtype)]
            older = r[(policy == "all", dtype)]
            total = newest + older
            print(f"| {name} | {policy}, {dtype} | {newest:,} | {older:,} | {total:,} | {total / base:.2f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model name (default: the quickstart's tiny llama)")
    args = ap.parse_args(argv)
    cfg = ({"name": args.model} if args.model else
           {"arch": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 0,
            "max_positions": 512, "init_std": 0.05, "tokenizer": "chars"})
    r = measure(cfg)
    name = args.model or "quickstart tiny llama"
    print(f"| model | fp32 weights | weights twice (before) | stored once (now) | once / twice | manifest sha256 s |")
    print("|---|---|---|---|---|---|")
    print(f"| {name} | {r['weights_fp32']:,} | {r['twice']:,} ({r['twice'] / r['weights_fp32']:.2f}x) | "
          f"{r['once']:,} ({r['once'] / r['weights_fp32']:.2f}x) | {r['once'] / r['twice']:.3f} | {r['manifest_s']:.2f} |")
    print()
    sized_table(name, r)


if __name__ == "__main__":
    main()
