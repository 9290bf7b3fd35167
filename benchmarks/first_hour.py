"""A new user's first hour (issue 36), measured before and after on fresh clones, side by side in one run.

    python -m benchmarks.first_hour --before a183038 --after HEAD [--repeats 3] [--skip-runs]

Each ref is cloned afresh (`git clone --shared` of this repository, then checked out) and used
through its own code (PYTHONPATH = the clone; the installed packages are shared). Then, for each
clone, interleaved so that both see the same machine load:

- `dora validate` on every shipped pipeline: wall seconds (median of --repeats) and whether torch /
  transformers were imported (python -X importtime);
- the frictions a new user meets, each as the command or script a user would write: its exit code,
  whether a traceback was printed, and the line that tells the user what happened.

Prints two markdown tables; docs/benchmarks.md records them. The data-file runs (`dora run` on a
file with an over-long prompt) take a minute each on 2 cores; --skip-runs leaves them out.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

BUILD = textwrap.dedent("""
    from dora.graph.builder import Pipeline
    p = Pipeline("py", model={"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128},
                 pools={"rollout": ("cpu", 1), "train": ("cpu", 1)})
    prompts = p.node("prompts", "dataset", size=64, group_size=4, batch_prompts=4)
    rollout = p.node("rollout", "generate", pool="rollout", max_tokens=32, max_batch=16)
    reward = p.node("reward", "reward", fn="synthetic")
    adv = p.node("advantage", "advantage", temprature=1.0)
    train = p.node("train", "update", pool="train", steps=1)
    prompts >> rollout >> reward >> adv.scored.opts(group_by="group_id")
    adv >> train
    train.weights >> rollout.weights
""")

# name -> (kind, payload, what to show): kind "cli" runs `python -m dora.cli ARGS`, "py" runs a script
FRICTIONS = {
    "import path: from dora import Pipeline, run": ("py", "from dora import Pipeline, run\nprint('ok')", "last"),
    "builder error names the Python line": ("py", BUILD + "from dora.graph.validate import validate\n"
                                            "print([d.format() for d in validate(p.graph) if d.severity == 'error'][0])", "last"),
    "graph.print(params=True)": ("py", BUILD + "p.graph.print(params=True)", r"temprature|Error"),
    "typo Pipeline(asyn_=...)": ("py", "from dora.graph.builder import Pipeline\nPipeline('x', asyn_={'mode': 'dora'})", "last"),
    "typo run={'seeed': 1}": ("py", "from dora.graph.builder import Pipeline\nPipeline('x', run={'seeed': 1})", "last"),
    "override nodes.trian.params.steps=3": ("cli", ["validate", "pipelines/quickstart.yaml", "nodes.trian.params.steps=3"],
                                            "first"),
    "dora ops lists model keys": ("cli", ["ops"], r"max_positions"),
    "gpu_single on a machine without a GPU": ("cli", ["run", "pipelines/gpu_single.yaml", "--out", "{tmp}/g1"], "last"),
    "malformed row in the first rows": ("cli", ["validate", "pipelines/quickstart.yaml",
                                               "nodes.prompts.params.source={data}/malformed.jsonl"], "first"),
    "over-long prompt at row 150 (validate)": ("cli", ["validate", "pipelines/quickstart.yaml",
                                                      "nodes.prompts.params.source={data}/long.jsonl"], "first"),
    "dora validate --data (every row)": ("cli", ["validate", "pipelines/quickstart.yaml",
                                                 "nodes.prompts.params.source={data}/long.jsonl", "--data"], "first"),
    "max_prompt_tokens=64, on_error=skip (validate)": ("cli", [
        "validate", "pipelines/quickstart.yaml", "nodes.prompts.params.source={data}/long.jsonl",
        "nodes.prompts.params.max_prompt_tokens=64", "nodes.prompts.params.on_error=skip"], "last"),
    "run.wandb: {project: p, mode: online}": ("cli", ["validate", "pipelines/quickstart.yaml",
                                                     "run.wandb={project: p, mode: online}"], "last"),
    "run.save_optimizer=never": ("cli", ["validate", "pipelines/quickstart.yaml", "run.save_optimizer=never"], "last"),
}
SHORT_RUN = ["nodes.prompts.params.size=0", "nodes.train.params.steps=2", "async.train_batch=16", "async.rollout_batch=16"]
RUNS = {   # 2 steps x 4 prompts: unshuffled, the rows 1-8 are generated (row 6 is over the context); shuffled, some 8
    "over-long prompt at row 150 (dora run)": ["run", "pipelines/quickstart.yaml", "--quiet", "--out", "{tmp}/long",
                                              "nodes.prompts.params.source={data}/long.jsonl", *SHORT_RUN],
    "over-long prompt at row 6 (dora run, unshuffled)": ["run", "pipelines/quickstart.yaml", "--quiet", "--out",
                                                        "{tmp}/early", "nodes.prompts.params.source={data}/early.jsonl",
                                                        "nodes.prompts.params.shuffle=false", *SHORT_RUN],
}


def clone(ref: str, where: str) -> str:
    path = os.path.join(where, re.sub(r"[^A-Za-z0-9_.-]", "_", ref))
    subprocess.run(["git", "clone", "--quiet", "--shared", REPO, path], check=True)
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", ref], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", path, "checkout", "--quiet", sha], check=True)
    return path


CPU_S: dict[str, float] = {}   # the last run's user + sys seconds (less sensitive to a shared machine's load)


def run(tree: str, args: list[str], timeout: float = 600) -> tuple[int, str, float]:
    import resource

    env = {**os.environ, "PYTHONPATH": tree}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S["last"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r.returncode, r.stdout + r.stderr, time.perf_counter() - t0


def write_data(where: str) -> str:
    """200 rows of the quickstart task as a user's file (its reward function scores them), one of them
    broken (malformed.jsonl, row 4) or over the tiny model's 512 positions (long.jsonl, row 150)."""
    from dora.ops.tasks import get_task

    os.makedirs(where, exist_ok=True)
    rows = [json.dumps({"prompt": r["prompt"], "answer": str(r["answer"]), "data_source": "synthetic:quickstart"})
            for r in get_task("synthetic:quickstart").make(200, 0)]
    with open(os.path.join(where, "malformed.jsonl"), "w") as f:
        f.write("\n".join(rows[:3] + ['{"prompt": "no answer"}'] + rows[4:]) + "\n")
    with open(os.path.join(where, "long.jsonl"), "w") as f:   # row 150: over the tiny model's 512 positions
        long = json.dumps({"prompt": "x" * 600, "answer": "1", "data_source": "synthetic:quickstart"})
        f.write("\n".join(rows[:149] + [long] + rows[150:]) + "\n")
    with open(os.path.join(where, "early.jsonl"), "w") as f:   # the same at row 6
        f.write("\n".join(rows[:5] + [long] + rows[6:]) + "\n")
    return where


def shown(out: str, how: str) -> str:
    lines = [x for x in out.splitlines() if x.strip()]
    if not lines:
        return ""
    if how == "last":
        line = lines[-1]
    elif how == "first":
        line = lines[0]
    else:
        line = next((x for x in lines if re.search(how, x)), "(not there)")
    return line.replace("|", "/")[:230]


def validate_times(trees: dict[str, str], repeats: int) -> list[list[str]]:
    rows = []
    for pipeline in sorted(glob.glob(os.path.join(REPO, "pipelines", "*.yaml"))):
        name = os.path.basename(pipeline)
        times: dict[str, list[float]] = {k: [] for k in trees}
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(repeats):
            for label, tree in trees.items():   # interleaved: both see the same load
                rc, _, s = run(tree, ["-m", "dora.cli", "validate", f"pipelines/{name}"])
                times[label].append(s if rc == 0 else float("nan"))
                cpu[label].append(CPU_S["last"])
        heavy = {}
        for label, tree in trees.items():
            _, out, _ = run(tree, ["-X", "importtime", "-m", "dora.cli", "validate", f"pipelines/{name}"])
            heavy[label] = ", ".join(m for m in ("torch", "transformers") if re.search(rf"\|\s+{m}$", out, re.M)) or "-"
        med = {k: statistics.median(v) for k, v in times.items()}
        cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
        before, after = list(trees)
        rows.append([name, f"{med[before]:.2f} ({cpu_med[before]:.2f})", heavy[before],
                     f"{med[after]:.2f} ({cpu_med[after]:.2f})", heavy[after], f"{med[before] / med[after]:.1f}x"])
    return rows


def frictions(trees: dict[str, str], data: str, tmp: str, with_runs: bool, only_runs: bool = False) -> list[list[str]]:
    rows = []
    items = [] if only_runs else list(FRICTIONS.items())
    items += [(k, ("cli", v, "last")) for k, v in RUNS.items()] if with_runs else []
    for name, (kind, payload, how) in items:
        row = [name]
        for label, tree in trees.items():
            if kind == "py":
                script = os.path.join(tmp, f"{label}-{len(rows)}.py")
                with open(script, "w") as f:
                    f.write(payload)
                rc, out, s = run(tree, [script])
            else:
                args = [a.replace("{data}", data).replace("{tmp}", os.path.join(tmp, label)) for a in payload]
                rc, out, s = run(tree, ["-m", "dora.cli", *args])
            row.append(f"exit {rc}{', traceback' if 'Traceback' in out else ''}, {s:.1f} s: {shown(out, how)}")
        rows.append(row)
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the ref a new user had before (e.g. the issue's base commit)")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-runs", action="store_true", help="leave out the `dora run` scenarios (a minute each)")
    ap.add_argument("--only", choices=("validate", "frictions", "runs"), help="one of the two tables (runs: the "
                    "`dora run` rows of the frictions only)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": clone(args.before, os.path.join(tmp, "before")), "after": clone(args.after, os.path.join(tmp, "after"))}
        data = write_data(os.path.join(tmp, "data"))
        load = os.getloadavg()[0]
        if args.only in (None, "validate"):
            print(f"## dora validate, wall seconds (median of {args.repeats}), {args.before} vs {args.after}; "
                  f"load average {load:.1f} on {os.cpu_count()} cores at the start\n", flush=True)
            print(table(["pipeline", "before s (cpu s)", "before imports", "after s (cpu s)", "after imports",
                         "before / after"], validate_times(trees, args.repeats)), flush=True)
        if args.only in (None, "frictions", "runs"):
            print(f"\n## frictions, {args.before} vs {args.after} (load average {os.getloadavg()[0]:.1f})\n", flush=True)
            print(table(["what a new user does", "before", "after"],
                        frictions(trees, data, tmp, not args.skip_runs, only_runs=args.only == "runs")))
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
