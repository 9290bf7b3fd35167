"""The multi-turn trajectory (dora/ops/multiturn/trajectory.py): one token list, masks aligned, limits."""

from __future__ import annotations

import msgpack
import pytest

from dora.ops.multiturn.trajectory import Trajectory, TrajectoryError


def two_turns(max_total: int = 100) -> Trajectory:
    t = Trajectory([1, 2, 3], max_turns=3, max_total_tokens=max_total)
    t.add_model_turn([10, 11, 12], [-0.1, -0.2, -0.3], [4, 4, 5])
    assert t.add_observation([20, 21], wait_s=0.5, calls=1, errors=0)
    t.add_model_turn([13], [-0.4], [5])
    return t


def test_turns_append_to_one_token_list_with_aligned_masks():
    t = two_turns()
    assert t.tokens == [10, 11, 12, 20, 21, 13] and t.context() == [1, 2, 3, 10, 11, 12, 20, 21, 13]
    assert t.mask == [1, 1, 1, 0, 0, 1]
    assert t.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4]
    assert t.versions == [4, 4, 5, 5, 5, 5]            # an observation takes the version of the token before it
    assert t.turn_log == [[3, 0.5, 2], [1, 0.0, 0]] and t.turns == 2
    assert t.tool_calls == 1 and t.tool_wait_s == 0.5 and t.final_turn() == [13]
    t.check()


def test_state_survives_msgpack_and_a_misaligned_state_fails_fast():
    t = two_turns()
    back = Trajectory.from_dict(msgpack.unpackb(msgpack.packb(t.to_dict()), raw=False))
    assert back == t
    for field, value in (("mask", [1, 1, 1, 0, 0]), ("logprobs", [0.0] * 7), ("versions", [1]),
                         ("turn_log", [[3, 0.5, 2]]), ("mask", [1, 1, 1, 0, 2, 1]),
                         ("logprobs", [-0.1, -0.2, -0.3, -1.0, 0.0, -0.4])):
        bad = {**t.to_dict(), field: value}
        with pytest.raises(TrajectoryError):
            Trajectory.from_dict(bad)
    with pytest.raises(TrajectoryError, match="expected keys"):
        Trajectory.from_dict({k: v for k, v in t.to_dict().items() if k != "mask"})
    with pytest.raises(TrajectoryError, match="1 tokens, 2 logprobs"):
        Trajectory([1], 2, 10).add_model_turn([5], [-1.0, -1.0], [0])


def test_limits_end_the_trajectory_with_length():
    # an observation cut to the room left ends it
    t = Trajectory([1], max_turns=4, max_total_tokens=6)
    t.add_model_turn([10, 11, 12], [-1.0] * 3, [0] * 3)
    assert not t.add_observation([20, 21, 22, 23], wait_s=0.0, calls=1, errors=1)
    assert t.finish_reason == "length" and t.tokens == [10, 11, 12, 20, 21, 22] and t.final_turn() == []
    assert t.tool_errors == 1
    t.check()
    # the last allowed turn: its observation still lands, no further turn fits
    t = Trajectory([1], max_turns=1, max_total_tokens=50)
    t.add_model_turn([10], [-1.0], [0])
    assert not t.add_observation([20], wait_s=0.0, calls=1, errors=0) and t.finish_reason == "length"
    with pytest.raises(TrajectoryError, match="ended"):
        t.add_model_turn([11], [-1.0], [0])
    # a model turn longer than the room is refused (the loop asks the engine for at most `room`)
    t = Trajectory([1], max_turns=3, max_total_tokens=2)
    with pytest.raises(TrajectoryError, match="room for 2"):
        t.add_model_turn([1, 2, 3], [0.0] * 3, [0] * 3)
    with pytest.raises(TrajectoryError, match="must follow a model turn"):
        Trajectory([1], 3, 10).add_observation([5], wait_s=0, calls=1, errors=0)
