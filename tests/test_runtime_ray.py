"""The exactly-once proof on the ray backend: same graph, same worker code, actors in placement groups."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")

from dora.runtime.run_controller import Controller
from tests.runtime_graphs import alive, pipeline, read_sink
from tests.test_runtime_dataflow import check_exactly_once


@pytest.mark.ray
@pytest.mark.slow
def test_exactly_once_ray_100k(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rows, g = 100_000, 4
    ctl = Controller(pipeline(rows, g), backend="ray", backend_options={"num_cpus": 2}, run_dir=str(tmp_path),
                     deadline_s=110, start_timeout_s=90)
    res = ctl.run()
    assert res.ok and res.rejected == 0
    check_exactly_once(read_sink(str(tmp_path)), rows, g)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in ctl.pids().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in ctl.pids().values()), "actor processes left running"
