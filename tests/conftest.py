"""Fixtures shared by several test modules."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading

import pytest


# The suite runs dozens of local runs in this process: they share one worker zygote (torch and
# transformers imported once, not once per run; dora/runtime/backends/zygote_client.py).
os.environ.setdefault("DORA_ZYGOTE", "keep")


@pytest.fixture
def remove_shm_weights(tmp_path):
    """Weight files may go to /dev/shm: remove this test's run folders there, pass or fail."""
    from dora.ops.weights import versions as weights

    yield
    for run in [tmp_path, *tmp_path.iterdir()]:
        weights.cleanup(str(run))


# Every test has a wall-clock bound, so a hang fails that one test with the stacks of every thread
# instead of eating the CI job's whole time. The bound is generous: the slowest lanes (real models
# on 2 cores) take a few minutes.
TEST_BOUND_S = int(os.environ.get("DORA_TEST_BOUND_S", "900"))


class RanPastItsBound(Exception):
    """A test ran past TEST_BOUND_S."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if TEST_BOUND_S <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def over_bound(signum, frame):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise RanPastItsBound(f"{item.nodeid} ran past its {TEST_BOUND_S} s bound (DORA_TEST_BOUND_S)")

    previous = signal.signal(signal.SIGALRM, over_bound)
    signal.alarm(TEST_BOUND_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
