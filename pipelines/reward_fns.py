"""Example reward functions, the contract a reward node's `fn` (or a source's fn) follows
(docs/reward_functions.md). A module beside the pipeline file imports without PYTHONPATH: name it
"reward_fns:length_penalty" in any pipeline of this folder; `dora validate` imports it and checks
that the arguments bind.

    fn(response_text: str, answer: str, row: dict, **params) -> float     (or `async def`)
"""

from __future__ import annotations

import asyncio


def length_penalty(response_text: str, answer: str, row: dict, per_char: float = 0.01, free: int = 0) -> float:
    """-per_char for each character past `free` (a penalty: give it a positive weight, it is already negative)."""
    return -per_char * max(0, len(response_text) - free)


def exact_match(response_text: str, answer: str, row: dict) -> float:
    """1.0 if the response, stripped, is the answer. `row` holds every column of the trajectory
    (uid, group_id, question, prompt, answer, task, response_ids, finish_reason, ...)."""
    return 1.0 if response_text.strip() == answer.strip() else 0.0


async def stops_cleanly(response_text: str, answer: str, row: dict, bonus: float = 1.0) -> float:
    """An async reward function: the rows of a batch are scored concurrently (one event loop per
    batch), so one that waits on a service does not wait row by row. Bound your own waits
    (asyncio.wait_for): the reward op does not time them out."""
    await asyncio.sleep(0)   # (a real one would await an HTTP call or a sandbox here)
    return bonus if row.get("finish_reason") == "stop" else 0.0
