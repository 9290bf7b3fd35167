"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def remove_shm_weights(tmp_path):
    """Weight files may go to /dev/shm: remove this test's run folders there, pass or fail."""
    from dora.ops.weights import versions as weights

    yield
    for run in [tmp_path, *tmp_path.iterdir()]:
        weights.cleanup(str(run))
