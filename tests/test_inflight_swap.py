"""partial_inflight on a real replica (ReplicaInstance.load_version_in_flight): the requests are
interrupted with their tokens and KV, the new version is loaded, and they are imported back as the
new version's with their KV marked as the new version's, so the engine reuses it (PipelineRL's
stale KV) instead of prefilling again. Driven against a recording stand-in for the run controller."""

from __future__ import annotations

import types

from dora.rl.replica_instance import ReplicaInstance
from dora.runtime.wire import WithBuffers


class Recorder:
    def __init__(self):
        self.calls = []

    def call(self, node, replica, method, args, timeout=None, buffers=()):
        self.calls.append((method, args, list(buffers)))
        if method == "interrupt_all":
            wire = {"request": {"uid": "g0.0", "version": 0, "prompt_ids": [1, 2, 3]}, "response_ids": [7, 8],
                    "logprobs": [-0.1, -0.2], "token_versions": [0, 0], "kv": [[{}, {}]], "kv_version": 0}
            return WithBuffers({"states": [wire], "frame_counts": [2], "hosted": [0]}, [b"k", b"v"])
        return {"hosted": [1]}


def test_an_in_flight_swap_keeps_the_kv_under_the_new_version():
    rec = Recorder()
    driver = types.SimpleNamespace(ctrl=rec, clock=types.SimpleNamespace(now=lambda: 0.0),
                                   trace=types.SimpleNamespace(span=lambda *a, **k: None), weight_paths={1: "/w/v1"},
                                   weight_loads=0, prompts=types.SimpleNamespace(group_of=lambda uid: uid.split(".")[0]))
    inst = ReplicaInstance(driver, "gen", 0, slots=4)
    inst.load_version_in_flight(1)
    assert [c[0] for c in rec.calls] == ["interrupt_all", "load_version", "import_"]
    method, args, frames = rec.calls[-1]
    (state,) = args["state"]["states"]
    assert state["request"]["version"] == 1 and state["kv_version"] == 1      # reused, not prefilled again
    assert state["token_versions"] == [0, 0] and state["response_ids"] == [7, 8]   # the tokens so far stay v0's
    assert frames == [b"k", b"v"] and args["state"]["frame_counts"] == [2]
    assert inst.version == 1 and inst.hosted == (1,)
