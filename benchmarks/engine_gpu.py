"""The torch engine on one GPU, in one short call: correctness first, then throughput, within a budget.

On the GPU machine (one H200 or H100; ../shared/GPU.md), from the checkout, the whole day-one call:

    bash benchmarks/gpu_day_one.sh               # the two wheels from .whl/, this script, then `pytest -m gpu`

or this script alone:

    python3 benchmarks/engine_gpu.py --json engine_gpu.json            # --budget 420 s, every section that fits
    python3 benchmarks/engine_gpu.py --only paged-check,paged-nano,paged-decode --budget 200
    python3 benchmarks/engine_gpu.py --device cpu --budget 120         # the CPU path of every section (a dry run)

Needs only the checkout, torch, transformers, safetensors and (for the two single-* sections, real
`dora run`s) the pyzmq wheel of ../shared/GPU.md on PYTHONPATH. Sections run most important first,
each in a process of its own, forked from this one once it imported torch and transformers (so a
section pays no start-up, and a crash or a hang in one still leaves the others' numbers):

  1. paged-check    bf16 correctness: the paged engine as configured on the device (CUDA graphs with
                    padded batches, the Triton kernel, chunked prefill, a shared prompt) against a
                    transformers forward, before and after a version load and both kinds of sleep
                    (benchmarks/engine_check.py), with graph_captures after each phase; fp32 too
  2. paged-nano     nano-vLLM's shape: 256 requests, prompt and output lengths uniform in 100..1024
  3. paged-decode   decode ms per step at batch 64 and 256, at contexts ~150 and ~900
  4. single-sync, single-dora   pipelines/gpu_single.yaml, 3 steps each (rollout and trainer on the one GPU)
  5. eager-decode, eager-nano (the eager baseline, benchmarks/baselines), paged-grpo (64 prompts x 8,
     long-tailed outputs), paged-lifecycle (start, warm-up, loads, sleeps, wakes), eager-grpo,
     hf-nano, hf-grpo (transformers generate)

Budget (--budget, default 420 s): a section starts only if its estimate (NEEDS) fits what is left,
and is stopped at the budget; the results so far are printed and written (--json) after every
section, so a stop at any moment leaves them. Timed regions exclude compiles and exports
(benchmarks/engine_gpu_sections.py). Exit 2: an unknown section in --only (the list is printed), or
a budget too small for the first section (it says how long that needs).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing

SECTIONS = ["paged-check", "paged-nano", "paged-decode", "single-sync", "single-dora", "eager-decode", "eager-nano",
            "paged-grpo", "paged-lifecycle", "eager-grpo", "hf-nano", "hf-grpo"]
# estimated seconds per section, (cuda: one H200, start-up of its process included; cpu: the 2-core dev machine,
# where a section is a fork that imports nothing (preload) and a single-* is a whole `dora run`)
NEEDS = {"paged-check": (45, 5), "paged-nano": (50, 3), "paged-decode": (60, 3), "single-sync": (100, 25),
         "single-dora": (100, 25), "eager-decode": (60, 3), "eager-nano": (45, 3), "paged-grpo": (45, 3),
         "paged-lifecycle": (45, 3), "eager-grpo": (45, 3), "hf-nano": (45, 3), "hf-grpo": (45, 3)}
MARGIN_S = 5.0   # of the budget, kept to print and write what was measured


def need(name: str, device: str) -> float:
    return NEEDS[name][0 if device == "cuda" else 1]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole call (default 420)")
    ap.add_argument("--cap", type=float, default=None, help="seconds a measured run may take (cuda 25, cpu 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on cpu")
    ap.add_argument("--single-timeout", type=float, default=None,
                    help="seconds a gpu_single.yaml run may take (cuda 110, cpu 90)")
    ap.add_argument("--only", default=None, help=f"comma-separated sections of {','.join(SECTIONS)}")
    ap.add_argument("--json", default=None, help="write the results here (after every section)")
    ap.add_argument("--section", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.cap = a.cap or (25.0 if a.device == "cuda" else 5.0)
    a.single_timeout = a.single_timeout or (110.0 if a.device == "cuda" else 90.0)
    return a


def chosen(a: argparse.Namespace) -> list[str]:
    """The sections to run, most important first; exit 2 on a bad --only or a budget too small."""
    asked = [n.strip() for n in a.only.split(",") if n.strip()] if a.only else SECTIONS
    unknown = [n for n in asked if n not in SECTIONS]
    if unknown or not asked:
        print(f"engine_gpu: unknown section(s) {unknown or a.only!r}; the sections are: {', '.join(SECTIONS)}",
              file=sys.stderr)
        sys.exit(2)
    names = [n for n in SECTIONS if n in asked]
    first = need(names[0], a.device) + MARGIN_S
    if a.budget < first:
        total = sum(need(n, a.device) for n in names) + MARGIN_S
        print(f"engine_gpu: --budget {a.budget:.0f} s is too small: the first section, {names[0]}, needs about "
              f"{first:.0f} s on {a.device} (all {len(names)} chosen: about {total:.0f} s)", file=sys.stderr)
        sys.exit(2)
    return names


def preload() -> None:
    """What every section imports, imported once here: each section is a fork of this process. (No
    CUDA call before the fork: a forked child could not initialise CUDA again.) transformers loads
    its model classes lazily, on first use: named here, or every section would pay their import
    (~3 s of CPU, more than a CPU section's own work)."""
    import torch  # noqa: F401
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: F401

    from benchmarks import engine_check, engine_gpu_sections  # noqa: F401
    from benchmarks.baselines import eager_engine  # noqa: F401
    from dora.ops.engines import torch_engine  # noqa: F401
    from dora.ops.engines.paged import blocks  # noqa: F401
    from dora.ops.weights import versions  # noqa: F401


def run_one(a: argparse.Namespace, name: str, limit: float) -> dict:
    """Run one section in a child process of its own process group, killed whole at `limit` seconds:
    a fork of this process, or (should an import have initialised CUDA here, which a fork could not
    use) a fresh interpreter running `--section NAME`."""
    import torch

    if torch.cuda.is_initialized():
        cmd = [sys.executable, os.path.abspath(__file__), "--section", name, "--device", a.device, "--dtype", a.dtype,
               "--cap", str(a.cap), "--threads", str(a.threads), "--single-timeout", str(a.single_timeout)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)
        return _collect(proc.pid, os.dup(proc.stdout.fileno()), limit)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: run the section, send its result, exit
        os.setsid()
        os.close(read_end)
        os._exit(_child(a, name, write_end))
    os.close(write_end)
    return _collect(pid, read_end, limit)


def _collect(pid: int, fd: int, limit: float) -> dict:
    """The child's last RESULT line, read from `fd` until it closes or `limit` seconds pass."""
    deadline, chunks = time.monotonic() + limit, []
    with os.fdopen(fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                os.killpg(pid, signal.SIGKILL)    # the section and what it started (a `dora run` and its workers)
                os.waitpid(pid, 0)
                return {"stopped": f"killed after {limit:.0f} s"}
            chunk = pipe.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    lines = [ln for ln in b"".join(chunks).decode(errors="replace").splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": f"the section's process ended (wait status {status}) without a result"}
    return json.loads(lines[-1][len("RESULT "):])


def _child(a: argparse.Namespace, name: str, fd: int) -> int:
    """Run section `name`; write "RESULT <json>" to fd (its error, if it raised); the exit code."""
    try:
        from benchmarks.engine_gpu_sections import run_section
        result, code = run_section(a, name), 0
    except BaseException as e:                    # reported, never raised: a section fails alone
        traceback.print_exc()
        result, code = {"error": f"{type(e).__name__}: {str(e)[:300]}"}, 1
    data = ("RESULT " + json.dumps(result) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def write(a: argparse.Namespace, res: dict, t0: float) -> None:
    if not a.json:
        return
    doc = {"device": a.device, "dtype": a.dtype, "budget_s": a.budget, "cap_s": a.cap,
           "elapsed_s": time.perf_counter() - t0, "results": res}
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, a.json)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.section:                                 # (run_one's fallback: one section in a fresh interpreter)
        return _child(a, a.section, sys.stdout.fileno())
    names = chosen(a)
    t0, res = time.perf_counter(), {}
    preload()
    for name in names:
        left = a.budget - MARGIN_S - (time.perf_counter() - t0)
        if left < need(name, a.device):
            res[name] = {"skipped": f"needs about {need(name, a.device):.0f} s, {max(0.0, left):.0f} s of the budget left"}
        else:
            started = time.perf_counter()
            res[name] = {**run_one(a, name, left), "section_s": time.perf_counter() - started}
        print(f"[{time.perf_counter() - t0:6.0f} s] {name}: {json.dumps(res[name])}", flush=True)
        write(a, res, t0)
    from benchmarks.engine_gpu_table import print_tables
    print_tables(res, a.device)
    print(f"total {time.perf_counter() - t0:.0f} s of a {a.budget:.0f} s budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
