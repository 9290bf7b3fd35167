"""The allocator setting every dora process makes (dora/runtime/allocator.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CALL = "from dora.runtime.allocator import tune_malloc; print(tune_malloc(), tune_malloc())"


def _run(env_extra: dict[str, str]) -> str:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", CALL], capture_output=True, text=True, env=env, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_thresholds_once_per_process():
    assert _run({}) == "True True"


def test_opt_out_leaves_malloc_alone():
    assert _run({"DORA_MALLOC_TUNE": "0"}) == "False False"
