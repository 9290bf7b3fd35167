"""Two policies in one run learn together: pipelines/challenger_solver.yaml (issue 34).

Per seed, one `dora run` of the pipeline (checkpoints every 5 steps, all kept), then:
  - the solver's held-out reward: its last checkpoint and its initial weights sample G answers (T = 1) to
    two fixed sets of quickstart problems it never trained on (held_out_sets: counts 1..120 of a and d,
    the problems a challenger can pose; and the quickstart task's own mix, mostly counts 1..3), scored
    by the task
  - the solver's and the challenger's training reward (metrics.jsonl: solver/reward_mean, the task's
    grade of its answers; challenger/reward_mean, the frontier reward: 1 where the solver succeeds half
    the time), first 3 vs last 3 steps
  - C1-C3 and the accounting (lost) of each policy
With --chaos, seed 0 also runs three times more: a SIGKILL of the solver's trainer, a SIGKILL of the
challenger's trainer (each restarts that policy alone, from its last checkpoint), and a SIGKILL of the
whole `dora run` followed by `dora run --resume`; each is audited for one lineage per policy (every
step of each policy in metrics.jsonl once, every uid in its trained.jsonl once, lost 0).

    python benchmarks/challenger_solver.py --seeds 0 1 --chaos --out runs/bench-challenger-solver
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from dora.observe.metrics import policy_records  # noqa: E402
from dora.ops.models import load_policy  # noqa: E402
from dora.ops.tasks import get_task  # noqa: E402
from task_learnability import sample  # noqa: E402

PIPELINE = ROOT / "pipelines" / "challenger_solver.yaml"
POLICIES = ("solver", "challenger")


def dora_run(out: Path, seed: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "dora.cli", "run", str(PIPELINE), "run.save_every=5",
                             "run.keep_checkpoints=10", "--seed", str(seed), "--out", str(out), "--overwrite",
                             "--quiet", *extra], cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def held_out_sets(prompts: int) -> dict[str, list[dict]]:
    """Two fixed sets of quickstart problems the solver never trains on (it sees only the challenger's):
    `counts` spans the problems a challenger can pose (symbols a and d in turn, counts uniform in
    1..120), `quickstart` is the quickstart task's own mix (80% a with counts 1..3, 20% d with 40..120)."""
    rng = random.Random(12345)
    counts = [{"prompt": f"{n}*{c}", "answer": c * n} for c, n in
              ((("a", "d")[i % 2], rng.randint(1, 120)) for i in range(prompts))]
    return {"counts": counts, "quickstart": get_task("quickstart").make(prompts, 12345, max_count=120)}


@torch.no_grad()
def held_out_reward(model_cfg: dict, seed: int, rows: list[dict], group: int, max_tokens: int = 128) -> float:
    """Mean quickstart reward of `group` samples (T = 1) for each held-out problem, all in one batch."""
    torch.manual_seed(0)
    model, tok = load_policy(model_cfg, seed=seed)
    task = get_task("quickstart")
    gen = torch.Generator().manual_seed(7)
    prompts_ids = [tok.encode(r["prompt"], add_special_tokens=False) for r in rows for _ in range(group)]
    answers = [r["answer"] for r in rows for _ in range(group)]
    scores = []
    for resp, answer in zip(sample(model, prompts_ids, max_tokens, 1.0, tok.eos_token_id, 0, gen), answers):
        scores.append(task.score(tok.decode([t for t in resp if t != tok.eos_token_id]), answer))
    return sum(scores) / len(scores)


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def learning(out: Path, seed: int, args) -> dict:
    p = dora_run(out, seed)
    rc = p.wait()
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0, (rc, p.stdout.read()[-3000:])
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    base = yaml.safe_load((out / "pipeline.yaml").read_text())["model"]   # the initial weights: seeded by the run
    row = {"seed": seed, "wall_s": round(summary["wall_s"], 1)}
    last = max((out / "policies" / "solver" / "checkpoints").glob("step_*"), key=lambda q: int(q.name[5:]))
    row["solver_last_step"] = int(last.name[5:])
    for name, rows in held_out_sets(args.prompts).items():
        row[f"solver_held_out_{name}"] = [round(held_out_reward(cfg, seed, rows, args.group), 4)
                                          for cfg in (base, {"path": str(last)})]
    for u in POLICIES:
        rew = [r["reward_mean"] for r in policy_records(records, u)]
        part = summary["policies"][u]
        row[u] = {"steps": len(rew), "reward_first3": round(mean(rew[:3]), 4), "reward_last3": round(mean(rew[-3:]), 4),
                  "c1_c2_c3": [part["c1_violations"], part["c2_violations"], part["c3_violations"]],
                  "lost": part["accounting"]["lost"]}
    return row


def lineage(out: Path) -> dict:
    """One lineage per policy: each step of it once in metrics.jsonl and trained.jsonl, each uid once."""
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    summary = json.loads((out / "summary.json").read_text())
    got = {}
    for u in POLICIES:
        steps = [r["step"] for r in records if r.get("policy") == u]
        ledger = [json.loads(x) for x in (out / "policies" / u / "trained.jsonl").read_text().splitlines() if x]
        uids = collections.Counter(x for e in ledger for x in e["uids"])
        part = summary["policies"][u]
        got[u] = {"steps": len(steps), "one_lineage": steps == list(range(1, len(steps) + 1))
                  and [e["step"] for e in ledger] == steps and max(uids.values()) == 1,
                  "trainer_restarts": part["trainer_restarts"], "lost": part["accounting"]["lost"],
                  "c1_c2_c3": [part["c1_violations"], part["c2_violations"], part["c3_violations"]]}
    return got


def wait_steps(p: subprocess.Popen, out: Path, policy: str, n: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
        if sum(1 for r in lines if r.get("policy") == policy) >= n:
            return
        if p.poll() is not None:
            raise RuntimeError(p.stdout.read()[-3000:])
        time.sleep(0.5)
    raise TimeoutError(f"{policy}: no {n} steps within {timeout} s")


def trainer_pid(run_pid: int, node: str) -> int:
    """The worker process of node[0] under `dora run` (workers are forked from a zygote: grandchildren)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    family, frontier = set(), {run_pid}
    while frontier:
        frontier = {c for c, pp in parent.items() if pp in frontier}
        family |= frontier
    for pid in family:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--node" in cmd and cmd[cmd.index(b"--node") + 1] == node.encode() and \
                cmd[cmd.index(b"--replica") + 1] == b"0":
            return pid
    raise RuntimeError(f"no worker {node}[0] under {run_pid}")


def chaos(base: Path, seed: int) -> dict:
    out = {}
    for policy, after in (("solver", 7), ("challenger", 4)):
        d = base / f"kill_{policy}"
        p = dora_run(d, seed)
        wait_steps(p, d, policy, after)
        os.kill(trainer_pid(p.pid, policy), signal.SIGKILL)
        assert p.wait() == 0, p.stdout.read()[-3000:]
        out[f"kill {policy} trainer after its step {after}"] = lineage(d)
    d = base / "kill_run_resume"
    p = dora_run(d, seed)
    wait_steps(p, d, "solver", 12)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "dora.cli", "run", "--resume", str(d), "--quiet"], cwd=str(ROOT),
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out["kill dora run after solver step 12, --resume"] = {
        **lineage(d), "resumed_from": json.loads((d / "summary.json").read_text())["resumed_from_step"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default="runs/bench-challenger-solver")
    ap.add_argument("--prompts", type=int, default=48, help="problems in each held-out set")
    ap.add_argument("--group", type=int, default=4, help="samples per held-out prompt")
    ap.add_argument("--chaos", action="store_true", help="also kill each trainer, and the run (then --resume)")
    args = ap.parse_args(argv)
    base = Path(args.out)
    results = {"learning": [learning(base / f"seed_{s}", s, args) for s in args.seeds]}
    print(f"{'seed':>4} {'held-out counts':>16} {'held-out quickstart':>20} {'solver train r':>16} {'challenger r':>16} "
          f"{'C1-C3':>12} {'lost':>5} {'wall s':>7}")
    for row in results["learning"]:
        c, q = row["solver_held_out_counts"], row["solver_held_out_quickstart"]
        print(f"{row['seed']:>4} {c[0]:>7.3f}->{c[1]:.3f} {q[0]:>11.3f}->{q[1]:.3f} "
              f"{row['solver']['reward_first3']:>7.3f}->{row['solver']['reward_last3']:.3f} "
              f"{row['challenger']['reward_first3']:>7.3f}->{row['challenger']['reward_last3']:.3f} "
              f"{str(row['solver']['c1_c2_c3'] + row['challenger']['c1_c2_c3']):>12} "
              f"{row['solver']['lost'] + row['challenger']['lost']:>5} {row['wall_s']:>7}")
    if args.chaos:
        results["chaos"] = chaos(base / "chaos", args.seeds[0])
        for what, per in results["chaos"].items():
            print(what, json.dumps(per))
    (base / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {base / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
