"""One real `dora run` of a shipped pipeline as a subprocess, for the benchmarks that compare real
runs side by side (elastic.py, fast_lanes.py): its summary.json, or the run's error and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 1800


def dora_run(out: str, pipeline: str, overrides: list[str], label: str) -> dict:
    """`dora run pipelines/PIPELINE OVERRIDES --out OUT --quiet`; its summary.json (SystemExit if it failed)."""
    cmd = [sys.executable, "-m", "dora.cli", "run", os.path.join(ROOT, "pipelines", pipeline), *overrides,
           "--out", out, "--quiet"]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    with open(os.path.join(out, "summary.json")) as fh:
        s = json.load(fh)
    if p.returncode != 0 or not s.get("ok"):
        raise SystemExit(f"run {label} failed (exit {p.returncode}): {s.get('error')}\n{p.stdout[-2000:]}")
    return s
