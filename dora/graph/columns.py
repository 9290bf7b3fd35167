"""The fixed column names every operator agrees on, with their Arrow types.

One row is one trajectory (or one prompt before generation). Fixed names mean any
operator can be wired to any other; ports declare which of these they need and add,
and validation propagates them along the graph.
"""

from __future__ import annotations

import pyarrow as pa

COLUMNS: dict[str, pa.DataType] = {
    "uid": pa.string(),                      # unique per trajectory (per prompt before generation)
    "group_id": pa.int64(),                  # prompt id: the G responses of one prompt share it
    "prompt": pa.string(),                   # prompt text (or chat rendered to text)
    "question": pa.string(),                 # the prompt as written, before any chat template (what a judge reads)
    "prompt_ids": pa.list_(pa.int32()),
    "answer": pa.string(),                   # ground truth for verifiable rewards
    "task": pa.string(),                     # task name, for task-specific verifiers
    "response_ids": pa.list_(pa.int32()),
    "response_text": pa.string(),
    "behavior_logprobs": pa.list_(pa.float32()),  # logprob of each sampled token under the policy that sampled it
    "token_versions": pa.list_(pa.int32()),  # policy version of each response token: C1 is checkable
    "policy_version": pa.int64(),            # version the trajectory was dispatched on
    "finish_reason": pa.string(),            # stop | length | abort
    # multi-turn generate (max_turns > 1): observations live inside response_ids
    "response_mask": pa.list_(pa.int8()),    # per response token: 1 sampled by the model (trained), 0 tool observation
    "final_turn_text": pa.string(),          # the model's last turn ("" when the trajectory ended on an observation)
    "turns": pa.int32(),                     # model turns
    "tool_calls": pa.int32(),                # tool calls made (malformed ones included)
    "tool_errors": pa.int32(),               # of which failed (malformed, unknown tool, error, timeout, over a limit)
    "tool_wait_s": pa.float32(),             # seconds the trajectory waited on its tools
    "reward": pa.float32(),
    "advantages": pa.list_(pa.float32()),
    "returns": pa.list_(pa.float32()),
    "ref_logprobs": pa.list_(pa.float32()),
    "values": pa.list_(pa.float32()),
}


# One column per reward source, `reward/<source>` (a reward node's `sources`, a scorer's `column`):
# float32, as `reward` is.
SOURCE_PREFIX = "reward/"


def arrow_type(name: str) -> pa.DataType | None:
    """The Arrow type of a well-known column (a reward source's included), or None for a task-specific one."""
    if name.startswith(SOURCE_PREFIX):
        return COLUMNS["reward"]
    return COLUMNS.get(name)
