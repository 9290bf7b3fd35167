"""The channel benchmark runs end to end on both transports (tiny sizes, one repeat): it keeps
working as the channel code changes. Its numbers are not checked here (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_channel_benchmark_writes_one_row_per_size(tmp_path, transport):
    import channel

    out = tmp_path / "ch.json"
    assert channel.main(["--sizes", "1000,70000", "--seconds", "0.01", "--repeats", "1",
                         "--transport", transport, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["transport"] for r in rows] == [transport, transport]
    assert [r["size_bytes"] for r in rows][0] < 2000 < rows[1]["size_bytes"]
    for r in rows:
        for k in ("dora_gbps", "raw_zmq_gbps", "memcpy_gbps", "dora_msgs_per_s", "raw_zmq_msgs_per_s", "p50_us", "p99_us"):
            assert r[k] > 0, k
