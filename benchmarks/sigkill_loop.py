"""The generate-SIGKILL chaos scenario (tests/test_run_lifecycle.py) in a loop, optionally under CPU
load: a dora-mode quickstart run of 20 steps whose rollout replicas are SIGKILLed twice at random
moments. A run that makes no step for --hang-s seconds is counted as hung, its process tree's
stacks are written next to its run folder (py-spy, when installed) and it is killed.

    python benchmarks/sigkill_loop.py [--runs 15] [--load 1] [--nice 19] [--hang-s 90] [--out DIR]

--load N starts N busy processes beside it, then this process (the killer included) and its runs
go to --nice below them: the timing under which a kill can land between a replica's `finished`
event and its rows leaving the process.
Prints one line per run and a table: runs, finished, hung, failed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_run_lifecycle import QUICK, _workers_of, children  # noqa: E402

DORA = ["async.mode=dora", "async.max_staleness=2", "async.rollout_batch=24", "nodes.train.params.steps=20"]


def steps_done(out: Path) -> int:
    m = out / "metrics.jsonl"
    return len(m.read_text().splitlines()) if m.exists() else 0


def dump_stacks(pid: int, path: Path) -> None:
    if shutil.which("py-spy") is None:
        return
    with open(path, "w") as f:
        for p in [pid] + children(pid):
            f.write(f"==== pid {p}\n")
            f.write(subprocess.run(["py-spy", "dump", "--pid", str(p)], capture_output=True, text=True).stdout)


def one_run(out: Path, seed: int, hang_s: float) -> str:
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(f"{out}.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "dora.cli", "run",
                          str(ROOT / "pipelines" / "quickstart.yaml"), *QUICK, *DORA, "--out", str(out)],
                         cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    rng = random.Random(seed)
    for target in sorted(rng.sample(range(1, 6), 2)):   # as the chaos test: two kills in steps 1-5
        while steps_done(out) < target and p.poll() is None:
            time.sleep(0.5)
        time.sleep(rng.uniform(0.0, 1.0))
        victims = _workers_of(p.pid, "rollout")
        if victims and p.poll() is None:
            os.kill(rng.choice(victims), signal.SIGKILL)
            deadline = time.monotonic() + 120            # the next kill waits for this respawn
            while time.monotonic() < deadline and len(_workers_of(p.pid, "rollout")) < 2 and p.poll() is None:
                time.sleep(0.2)
    last, since = steps_done(out), time.monotonic()
    while p.poll() is None:
        time.sleep(1.0)
        now_steps = steps_done(out)
        if now_steps != last:
            last, since = now_steps, time.monotonic()
        elif time.monotonic() - since > hang_s:
            dump_stacks(p.pid, Path(f"{out}.stacks"))
            p.kill()
            p.wait()
            return f"hung at step {now_steps}"
    return "finished" if p.returncode == 0 and steps_done(out) == 20 else f"failed (exit {p.returncode})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--load", type=int, default=1, help="busy processes started beside the runs")
    ap.add_argument("--nice", type=int, default=19, help="niceness of this process and its runs (below the load)")
    ap.add_argument("--hang-s", type=float, default=90.0, help="no step for this long: hung")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--out", default="runs/sigkill_loop")
    a = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    os.nice(a.nice)
    outcomes: list[str] = []
    try:
        for i in range(a.runs):
            out = Path(a.out) / f"run{i}"
            outcomes.append(one_run(out, a.seed + i, a.hang_s))
            print(f"run {i}: {outcomes[-1]}", flush=True)
            if outcomes[-1] == "finished":
                shutil.rmtree(out, ignore_errors=True)
    finally:
        for b in burners:
            b.kill()
    hung = sum(o.startswith("hung") for o in outcomes)
    ok = outcomes.count("finished")
    print("| runs | finished | hung | failed | load | nice |\n|---|---|---|---|---|---|")
    print(f"| {len(outcomes)} | {ok} | {hung} | {len(outcomes) - ok - hung} | {a.load} | {a.nice} |")
    return 0 if ok == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
