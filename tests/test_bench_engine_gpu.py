"""benchmarks/engine_gpu.py, the GPU day-one measurement: bad --only and a budget too small for the
first section exit 2 with what to do; `--device cpu --budget 120` runs every section's CPU path
that fits the budget (each a fork of one process that imported torch once) and exits 0, with its
JSON written; timed regions hold no graph capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import engine_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_unknown_section_exits_2_listing_the_sections(capsys):
    with pytest.raises(SystemExit) as exit_:
        engine_gpu.main(["--device", "cpu", "--only", "paged-check,paged-nope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "['paged-nope']" in err and ", ".join(engine_gpu.SECTIONS) in err


def test_a_budget_too_small_for_the_first_section_exits_2_saying_how_long_it_needs(capsys):
    with pytest.raises(SystemExit) as exit_:
        engine_gpu.main(["--only", "paged-decode,paged-nano", "--budget", "30"])
    first = engine_gpu.need("paged-nano", "cuda") + engine_gpu.MARGIN_S
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"the first section, paged-nano, needs about {first:.0f} s on cuda" in err


@pytest.mark.slow
def test_the_cpu_dry_run_fits_its_budget_and_exits_0(tmp_path):
    out = tmp_path / "engine_gpu.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "engine_gpu.py"), "--device", "cpu",
                           "--budget", "120", "--json", str(out)], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    assert list(res) == engine_gpu.SECTIONS
    failed = {n: r for n, r in res.items() if "error" in r}
    assert not failed, failed                              # a section either ran, or was left out for the budget
    assert all("skipped" not in res[n] and "stopped" not in res[n] for n in engine_gpu.SECTIONS[:3]), res
    assert res["paged-check"]["bf16_ok"] and res["paged-nano"]["captures_in_timed"] == 0
    assert "total" in proc.stdout and "check: bf16 within tolerance" in proc.stdout
