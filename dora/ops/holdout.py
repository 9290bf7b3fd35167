"""The hold-out rule the dataset op trains by and held-out sets with `split: holdout` evaluate by:
a prompt is held out when a hash of its text falls in the share, so both agree on every run and
every machine without sharing any state."""

from __future__ import annotations

import hashlib


def prompt_text(record: dict) -> str:
    """The prompt as written in the source (chat messages joined), before any template."""
    p = record["prompt"]
    return p if isinstance(p, str) else "\n".join(f"{m.get('role')}: {m.get('content')}" for m in p)


def held_out(record: dict, share: float) -> bool:
    """Is this prompt in the held-out `share` of its source?"""
    if share <= 0:
        return False
    digest = hashlib.sha1(prompt_text(record).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < share
