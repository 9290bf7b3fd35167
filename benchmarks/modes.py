"""Real runs of pipelines in every async mode and off-policy correction, side by side, on this machine.

    python benchmarks/modes.py run --out DIR [--pipelines pipelines/quickstart.yaml,pipelines/grpo.yaml]
        [--modes sync,one_step_off,partial:1,dora:1,dora:2] [--corrections default|tis,m2po,...]
        [--seeds 0,1,2,3] [--steps 80] [--variants "-;k=v k=v"] [k=v ...]
    python benchmarks/modes.py report --out DIR [same filters] [--png curves.png] [--md table.md]

`run` appends one line per finished run to DIR/runs.jsonl and skips every run already there, so a
long sweep can be split over several invocations (or resumed after a crash) and `report` reads
whatever has been collected. A mode is `name` or `name:K` (K = async.max_staleness); a correction
is an `off_policy` name of the update op ("default" = the pipeline's own setting). Corrections
apply to the async modes only: sync runs once per pipeline, on-policy.

The report, per pipeline, mode and correction (means over seeds, with the per-seed values):
  reward at equal steps   mean reward of the last 20 steps (seed std and min..max)
  reward at equal time    mean reward of the last 10 steps finished by the time the FASTEST run of
                          the pipeline ended (every run has reached that time)
  tokens/s                every trained prompt + response token over the run's wall time (start-up
                          included), and its ratio to sync's
  gain                    last-20 reward minus first-5 reward: a mode that does not learn shows ~0
  paired gap              last-20 reward minus sync's, seed by seed, mean ± standard error
and staleness, the importance-weight statistics, C1 violations and re-prefilled tokens. --png draws
reward vs step and vs wall time, mean and seed band per mode.

Held-out evaluation (the pipelines' `eval:` sets, RUN_DIR/eval.jsonl), per pipeline, mode and set:
  at equal steps          pass@1 and mean reward of the last version evaluated (the run's final one),
                          mean ± std over seeds, and the paired gap to sync ± its standard error
  at equal time           the same for the newest version evaluated that was published by the time
                          the fastest run of the pipeline ended
  trainer tok/s           summary.json tokens_per_s (trained tokens over the trainer's step time):
                          --variants "-;eval=null run.keep_best=null" runs each run with and without
                          its evaluation, seed by seed, so the two show what evaluation costs the trainer
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LAST, FIRST, AT_TIME = 20, 5, 10          # steps averaged for "equal steps", "first", "equal time"
PER_STEP = ("reward_mean", "wall_s", "staleness_mean", "is_seq_ess", "is_weight_mean", "is_dropped_frac",
            "is_log_ratio_m2", "lr_scale", "response_len_mean", "tokens")


# ---------------------------------------------------------------------------------------------- runs
def parse_mode(spec: str) -> tuple[str, int | None]:
    name, _, k = spec.partition(":")
    if name not in ("sync", "one_step_off", "partial", "dora"):
        raise ValueError(f"unknown mode {spec!r}; use sync, one_step_off, partial[:K], dora[:K]")
    if k and not k.isdigit():
        raise ValueError(f"mode {spec!r}: K must be a whole number")
    return name, (int(k) if k else None)


def run_key(pipeline: str, mode: str, correction: str, seed: int, steps: int, overrides: list[str]) -> str:
    return "|".join([os.path.basename(pipeline), mode, correction, str(seed), str(steps), " ".join(overrides)])


def plan(a) -> list[dict]:
    """Seed-major: every mode's (and variant's) run of seed s comes before any run of seed s+1, so a
    machine whose load drifts over a long sweep slows every mode alike instead of the modes that ran
    last."""
    runs = []
    for seed in a.seeds:
        for pipeline in a.pipelines:
            for mode in a.modes:
                name, _ = parse_mode(mode)
                for correction in (["default"] if name == "sync" else a.corrections):
                    for variant in a.variants:
                        ov = a.overrides + variant
                        runs.append({"pipeline": pipeline, "mode": mode, "correction": correction, "seed": seed,
                                     "steps": a.steps, "overrides": ov,
                                     "key": run_key(pipeline, mode, correction, seed, a.steps, ov)})
    return runs


def run_one(r: dict, out_root: str) -> dict:
    from dora.rl.launch import execute, load_graph
    name, k = parse_mode(r["mode"])
    ov = list(r["overrides"]) + [f"async.mode={name}", f"nodes.train.params.steps={r['steps']}"]
    if k is not None:
        ov.append(f"async.max_staleness={k}")
    if r["correction"] != "default":
        ov.append(f"nodes.train.params.off_policy={{name: {r['correction']}}}")
    graph = load_graph(os.path.join(ROOT, r["pipeline"]) if not os.path.isabs(r["pipeline"]) else r["pipeline"], ov)
    if graph is None:
        raise SystemExit(2)
    run_dir = os.path.join(out_root, "runs", r["key"].replace("|", "_").replace(" ", "_").replace("/", "-"))
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    code = execute(graph, run_dir, seed=r["seed"], quiet=True, hb_timeout=r.get("hb_timeout", 30.0))
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    per_step: dict[str, list] = {k: [] for k in PER_STEP}
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        for line in fh:
            m = json.loads(line)
            for k in PER_STEP:
                per_step[k].append(m.get(k))
    shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)   # the disk fills otherwise
    acc = summary.get("accounting") or {}
    evals = []
    if os.path.exists(os.path.join(run_dir, "eval.jsonl")):
        with open(os.path.join(run_dir, "eval.jsonl")) as fh:
            evals = [{k: e.get(k) for k in ("set", "version", "pass@1", "mean_reward", "published_s", "seconds")}
                     for e in map(json.loads, fh)]
    return {**{k: r[k] for k in ("key", "pipeline", "mode", "correction", "seed", "steps", "overrides")},
            "ok": code == 0 and len(per_step["reward_mean"]) == r["steps"], "error": summary.get("error"),
            "wall_s": summary.get("wall_s"), "tokens": summary.get("tokens"), "tokens_per_s": summary.get("tokens_per_s"),
            "staleness_max": summary.get("staleness_max"), "c1_violations": summary.get("c1_violations", 0),
            "c3_violations": summary.get("c3_violations", 0), "reprefill_tokens": summary.get("reprefill_tokens") or 0,
            "migrated_requests": summary.get("migrated_requests") or 0, "lost": acc.get("lost"),
            "rollout_only_fraction": summary.get("rollout_only_fraction"), "per_step": per_step, "evals": evals,
            "eval_failed": len((summary.get("eval") or {}).get("failed") or []),
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def load_results(out_root: str) -> list[dict]:
    path = os.path.join(out_root, "runs.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    latest = {}
    for r in rows:                  # a key run again (after a failure) keeps its last result
        latest[r["key"]] = r
    return list(latest.values())


def cmd_run(a) -> int:
    os.makedirs(a.out, exist_ok=True)
    done = {r["key"] for r in load_results(a.out) if r["ok"]}
    todo = [r for r in plan(a) if r["key"] not in done]
    print(f"[modes] {len(todo)} run(s) to do, {len(plan(a)) - len(todo)} already in {a.out}/runs.jsonl", file=sys.stderr)
    failed = 0
    for i, r in enumerate(todo, 1):
        print(f"[modes] {i}/{len(todo)} {r['key']} ...", file=sys.stderr, flush=True)
        for attempt in range(1 + a.retries):   # a loaded machine can miss the workers' start-up deadline
            res = run_one({**r, "hb_timeout": a.hb_timeout}, a.out)
            if res["ok"]:
                break
            print(f"[modes]   attempt {attempt + 1} failed: {res['error']}", file=sys.stderr, flush=True)
        failed += not res["ok"]
        with open(os.path.join(a.out, "runs.jsonl"), "a") as fh:
            fh.write(json.dumps(res) + "\n")
        print(f"[modes]   {'ok' if res['ok'] else 'FAILED: ' + str(res['error'])}  wall {res['wall_s']:.0f} s  "
              f"last-{LAST} reward {_mean_tail(res['per_step']['reward_mean'], LAST):.3f}", file=sys.stderr, flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------- report
def _mean_tail(xs: list, n: int) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs[-n:]) if xs else float("nan")


def _reward_by_time(r: dict, t: float) -> tuple[float, int]:
    """(mean reward of the last AT_TIME steps finished by wall time t, steps finished by t)."""
    pairs = [(w, x) for w, x in zip(r["per_step"]["wall_s"], r["per_step"]["reward_mean"]) if w is not None and w <= t]
    return (statistics.fmean(x for _, x in pairs[-AT_TIME:]) if pairs else float("nan")), len(pairs)


def _stats(xs: list[float]) -> dict:
    """Over the seeds that have a value (a run with no step by the equal-time point has none)."""
    ok = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    if not ok:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "by_seed": xs}
    return {"mean": statistics.fmean(ok), "std": statistics.stdev(ok) if len(ok) > 1 else 0.0,
            "min": min(ok), "max": max(ok), "by_seed": xs}


def summarize(results: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if r["ok"]:
            key = (os.path.basename(r["pipeline"]), r["mode"], r["correction"], r["steps"], " ".join(r["overrides"]))
            groups.setdefault(key, []).append(r)
    t_eq = {}
    for (pipe, _, _, steps, ov), runs in groups.items():
        t_eq[(pipe, steps, ov)] = min(t_eq.get((pipe, steps, ov), math.inf), min(r["wall_s"] for r in runs))
    rows = []
    for (pipe, mode, corr, steps, ov), runs in sorted(groups.items()):
        runs.sort(key=lambda r: r["seed"])
        at_t = [_reward_by_time(r, t_eq[(pipe, steps, ov)]) for r in runs]
        row = {"pipeline": pipe, "mode": mode, "correction": corr, "steps": steps, "overrides": ov,
               "seeds": [r["seed"] for r in runs],
               "reward_last": _stats([_mean_tail(r["per_step"]["reward_mean"], LAST) for r in runs]),
               "reward_first": _stats([statistics.fmean(r["per_step"]["reward_mean"][:FIRST]) for r in runs]),
               "reward_at_time": _stats([x for x, _ in at_t]), "steps_at_time": statistics.fmean(n for _, n in at_t),
               "time_eq_s": t_eq[(pipe, steps, ov)],
               "tokens_per_s": _stats([r["tokens_per_s"] for r in runs]), "wall_s": _stats([r["wall_s"] for r in runs]),
               "staleness_mean": statistics.fmean(_mean_tail(r["per_step"]["staleness_mean"], steps) for r in runs),
               "is_seq_ess": statistics.fmean(_mean_tail(r["per_step"]["is_seq_ess"], steps) for r in runs),
               "is_dropped_frac": statistics.fmean(_mean_tail(r["per_step"]["is_dropped_frac"], steps) for r in runs),
               "lr_scale": statistics.fmean(_mean_tail(r["per_step"]["lr_scale"], steps) for r in runs),
               "c1_violations": sum(r["c1_violations"] for r in runs), "c3_violations": sum(r["c3_violations"] for r in runs),
               "reprefill_tokens": sum(r["reprefill_tokens"] for r in runs),
               "migrated_requests": sum(r["migrated_requests"] for r in runs),
               "lost": sum(r["lost"] or 0 for r in runs)}
        row["gain"] = row["reward_last"]["mean"] - row["reward_first"]["mean"]
        rows.append(row)
    for row in rows:
        sync = next((s for s in rows if s["mode"] == "sync" and s["pipeline"] == row["pipeline"]
                     and s["steps"] == row["steps"] and s["overrides"] == row["overrides"]), None)
        row["x_sync"] = row["tokens_per_s"]["mean"] / sync["tokens_per_s"]["mean"] if sync else None
        row["gap_to_sync"] = row["reward_last"]["mean"] - sync["reward_last"]["mean"] if sync else None
        row["paired_gap"] = paired_gap(row, sync) if sync and row is not sync else None
    return rows


def paired_gap(row: dict, sync: dict) -> dict | None:
    """The gap to sync seed by seed (seed s of both modes starts from the same weights and prompts),
    mean and standard error over the seeds both have: the seed-to-seed spread, which both modes
    share, cancels, so this resolves smaller gaps than the difference of the two means."""
    mine = dict(zip(row["seeds"], row["reward_last"]["by_seed"]))
    theirs = dict(zip(sync["seeds"], sync["reward_last"]["by_seed"]))
    diffs = [mine[s] - theirs[s] for s in sorted(mine.keys() & theirs.keys())]
    if not diffs:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {"mean": statistics.fmean(diffs), "se": se, "n": len(diffs)}


def table(rows: list[dict]) -> str:
    head = ("| pipeline | mode | off_policy | overrides | seeds | reward last 20 (mean ± std; per seed) | vs sync | gain | "
            "paired gap ± se (seeds) | reward at equal time (s; steps) | tok/s (x sync) | wall s | stale | ESS | dropped | C1 | re-prefill |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        rl, rt, tps = r["reward_last"], r["reward_at_time"], r["tokens_per_s"]
        gap = "" if r["gap_to_sync"] is None else f"{r['gap_to_sync']:+.3f}"
        ratio = "-" if r["x_sync"] is None else f"{r['x_sync']:.2f}"
        pg = r["paired_gap"]
        paired = "" if pg is None else f"{pg['mean']:+.3f} ± {pg['se']:.3f} ({pg['n']})"
        out.append(
            f"| {r['pipeline'].removesuffix('.yaml')} | {r['mode']} | {r['correction']} | {r['overrides'] or '-'} | {len(r['seeds'])} "
            f"| {rl['mean']:.3f} ± {rl['std']:.3f}; {' / '.join(f'{x:.2f}' for x in rl['by_seed'])} | {gap} "
            f"| {r['gain']:+.3f} | {paired} | {rt['mean']:.3f} ± {rt['std']:.3f} ({r['time_eq_s']:.0f} s; {r['steps_at_time']:.0f}) "
            f"| {tps['mean']:,.0f} ({ratio}) | {r['wall_s']['mean']:.0f} | {r['staleness_mean']:.2f} "
            f"| {r['is_seq_ess']:.2f} | {r['is_dropped_frac']:.4f} | {r['c1_violations']} | {r['reprefill_tokens']} |")
    return "\n".join(out)


HELD_OUT = ("pass@1", "mean_reward")


def _held_out_at(r: dict, name: str, t: float | None) -> dict | None:
    """The run's evaluation on set `name` of its last version (t None), or of the newest version
    published by wall time t."""
    rows = sorted((e for e in r.get("evals") or [] if e["set"] == name), key=lambda e: e["version"])
    if t is not None:
        rows = [e for e in rows if e["published_s"] is not None and e["published_s"] <= t]
    return rows[-1] if rows else None


def held_out_rows(results: list[dict], rows: list[dict]) -> list[dict]:
    """Per summarized row and held-out set: pass@1 / mean reward at equal steps and at equal time."""
    out = []
    for row in rows:
        runs = sorted((r for r in results if r["ok"] and os.path.basename(r["pipeline"]) == row["pipeline"]
                       and r["mode"] == row["mode"] and r["correction"] == row["correction"] and r["steps"] == row["steps"]
                       and " ".join(r["overrides"]) == row["overrides"]), key=lambda r: r["seed"])
        for name in sorted({e["set"] for r in runs for e in r.get("evals") or []}):
            h = {"pipeline": row["pipeline"], "mode": row["mode"], "correction": row["correction"], "set": name,
                 "overrides": row["overrides"], "tokens_per_s": row["tokens_per_s"], "steps": row["steps"],
                 "time_eq_s": row["time_eq_s"]}
            for when, t in (("equal_steps", None), ("equal_time", row["time_eq_s"])):
                got = {r["seed"]: _held_out_at(r, name, t) for r in runs}
                got = {s: e for s, e in got.items() if e is not None}
                h[when] = {m: dict(zip(got, [e[m] for e in got.values()])) for m in HELD_OUT}
                h[when]["version"] = statistics.fmean(e["version"] for e in got.values()) if got else None
            out.append(h)
    for h in out:
        sync = next((s for s in out if s["mode"] == "sync" and s["pipeline"] == h["pipeline"] and s["set"] == h["set"]
                     and s["overrides"] == h["overrides"] and s["steps"] == h["steps"]), None)
        for when in ("equal_steps", "equal_time"):
            for m in HELD_OUT:
                mine, theirs = h[when][m], (sync[when][m] if sync is not None and sync is not h else {})
                diffs = [mine[s] - theirs[s] for s in sorted(mine.keys() & theirs.keys())]
                se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
                h[when][f"{m}_gap"] = {"mean": statistics.fmean(diffs), "se": se, "n": len(diffs)} if diffs else None
    return out


def held_out_table(hs: list[dict]) -> str:
    def cell(d: dict) -> str:
        xs = list(d.values())
        if not xs:
            return "-"
        return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"

    def gap(g: dict | None) -> str:
        return "" if g is None else f"{g['mean']:+.3f} ± {g['se']:.3f}"

    head = ("| pipeline | mode | set | overrides | seeds | pass@1, equal steps (version) | paired gap | "
            "mean reward, equal steps | paired gap | pass@1, equal time (s; version) | paired gap | "
            "mean reward, equal time | paired gap | trainer tok/s |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for h in hs:
        st, tm = h["equal_steps"], h["equal_time"]
        n = len(st["pass@1"])
        v = lambda x: "-" if x is None else f"{x:.0f}"   # noqa: E731
        out.append(f"| {h['pipeline'].removesuffix('.yaml')} | {h['mode']} | {h['set']} | {h['overrides'] or '-'} | {n} "
                   f"| {cell(st['pass@1'])} ({v(st['version'])}) | {gap(st['pass@1_gap'])} | {cell(st['mean_reward'])} "
                   f"| {gap(st['mean_reward_gap'])} | {cell(tm['pass@1'])} ({h['time_eq_s']:.0f} s; {v(tm['version'])}) "
                   f"| {gap(tm['pass@1_gap'])} | {cell(tm['mean_reward'])} | {gap(tm['mean_reward_gap'])} "
                   f"| {h['tokens_per_s']['mean']:,.0f} |")
    return "\n".join(out)


def _smooth(xs: list[float], w: int = 5) -> list[float]:
    return [statistics.fmean(xs[max(0, i - w + 1): i + 1]) for i in range(len(xs))]


def plot(results: list[dict], rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    pipes = sorted({r["pipeline"] for r in rows})
    fig, axes = plt.subplots(len(pipes), 2, figsize=(13, 4.2 * len(pipes)), squeeze=False)
    for pi, pipe in enumerate(pipes):
        mine = [r for r in rows if r["pipeline"] == pipe]
        for row in mine:
            runs = [r for r in results if r["ok"] and os.path.basename(r["pipeline"]) == pipe and r["mode"] == row["mode"]
                    and r["correction"] == row["correction"] and r["steps"] == row["steps"]]
            label = row["mode"] + ("" if row["correction"] == "default" or row["mode"] == "sync" else f" {row['correction']}")
            ys = np.array([_smooth(r["per_step"]["reward_mean"]) for r in runs])
            x = np.arange(1, ys.shape[1] + 1)
            m, s = ys.mean(0), ys.std(0)
            line, = axes[pi][0].plot(x, m, label=f"{label} ({len(runs)} seeds)")
            axes[pi][0].fill_between(x, m - s, m + s, alpha=0.15, color=line.get_color())
            grid = np.linspace(max(r["per_step"]["wall_s"][0] for r in runs), min(r["per_step"]["wall_s"][-1] for r in runs), 200)
            yt = np.array([np.interp(grid, r["per_step"]["wall_s"], _smooth(r["per_step"]["reward_mean"])) for r in runs])
            mt, st = yt.mean(0), yt.std(0)
            axes[pi][1].plot(grid, mt, color=line.get_color(), label=label)
            axes[pi][1].fill_between(grid, mt - st, mt + st, alpha=0.15, color=line.get_color())
        axes[pi][0].set(title=f"{pipe}: reward vs training step", xlabel="step", ylabel="reward (5-step mean)")
        axes[pi][1].set(title=f"{pipe}: reward vs wall time", xlabel="wall s (from launch)", ylabel="reward (5-step mean)")
        axes[pi][0].legend(fontsize=8, loc="upper left")
        for ax in axes[pi]:
            ax.grid(alpha=0.3)
    fig.suptitle("mean over seeds, band = ± 1 std across seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def cmd_report(a) -> int:
    want = {run_key(**{k: r[k] for k in ("pipeline", "mode", "correction", "seed", "steps", "overrides")})
            for r in plan(a)}
    results = [r for r in load_results(a.out) if r["key"] in want]
    failed = [r for r in results if not r["ok"]]
    rows = summarize(results)
    if not rows:
        print(f"modes.py: no finished runs in {a.out}/runs.jsonl match the filters", file=sys.stderr)
        return 2
    text = table(rows)
    hs = held_out_rows(results, rows)
    if hs:
        text += "\n\nHeld-out evaluation (eval.jsonl):\n\n" + held_out_table(hs)
    print(text)
    for r in failed:
        print(f"FAILED run {r['key']}: {r['error']}")
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text + "\n")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "held_out": hs}, fh, indent=1)
    if a.png:
        plot(results, rows, a.png)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "report"))
    p.add_argument("--out", required=True, help="results folder (runs.jsonl, run folders)")
    p.add_argument("--pipelines", default="pipelines/quickstart.yaml,pipelines/grpo.yaml")
    p.add_argument("--modes", default="sync,one_step_off,partial:1,dora:1,dora:2")
    p.add_argument("--corrections", default="default", help="off_policy names for the async modes, or default")
    p.add_argument("--seeds", default="0,1,2,3")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--retries", type=int, default=1, help="run a failed run again at once, this many times")
    p.add_argument("--hb-timeout", type=float, default=30.0, help="dora run --hb-timeout for every run (a crowded "
                   "machine can starve a worker's heartbeat thread)")
    p.add_argument("--png", default=None)
    p.add_argument("--md", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--variants", default="-", help="';'-separated sets of overrides, each run as its own variant "
                   "of every run ('-': none), e.g. \"-;eval=null run.keep_best=null\" for with and without evaluation")
    p.add_argument("overrides", nargs="*", help="pipeline overrides k=v for every run")
    a = p.parse_intermixed_args(argv)   # overrides may follow the options
    a.variants = [[] if v.strip() in ("", "-") else v.split() for v in a.variants.split(";")]
    split = lambda s: [x for x in s.split(",") if x]
    a.pipelines, a.modes, a.corrections = split(a.pipelines), split(a.modes), split(a.corrections)
    try:
        a.seeds = [int(s) for s in split(a.seeds)]
    except ValueError:
        p.error(f"--seeds must be whole numbers, got {a.seeds!r}")
    for m in a.modes:
        try:
            parse_mode(m)
        except ValueError as e:
            p.error(str(e))
    if a.steps < LAST + FIRST:
        p.error(f"--steps must be >= {LAST + FIRST} (the report averages the first {FIRST} and the last {LAST})")
    return cmd_run(a) if a.command == "run" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
