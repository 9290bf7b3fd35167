"""`dora plot RUN_DIR [RUN_DIR ...] -o out.png`: reward, tokens/s, staleness and versions live
against training step, one line per run, to compare runs (e.g. the async modes) at a glance; and
a panel per held-out set found in the runs' eval.jsonl (mean reward solid, pass@1 dashed, against
the version evaluated).

Reads each folder's metrics.jsonl (from `dora run` or `dora simulate --out`); a line is labelled
with the run's mode and folder name (and a run of several policies gets a line per policy). Needs matplotlib (`pip install 'dora-rl[plot]'`).
Exit codes: 0 written, 1 matplotlib missing or the file cannot be written, 2 bad arguments
(a folder that is not a run, or no run with a step to plot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from dora.observe.dashboard.read_run import NotARun, check_run_dir, read_jsonl
from dora.observe.metrics import policy_names, policy_records

#: (title, [(metrics.jsonl key, line style)]) per panel
PANELS = [
    ("reward (mean)", [("reward_mean", "-")]),
    ("tokens/s", [("tokens_per_s", "-")]),
    ("staleness (max solid, mean dashed)", [("staleness_max", "-"), ("staleness_mean", "--")]),
    ("versions live", [("versions_live", "-")]),
]


def run_label(run_dir: str) -> str:
    """'<mode> · <folder>' from summary.json or state.json, else the folder name."""
    name = os.path.basename(os.path.normpath(run_dir))
    for f, get in (("summary.json", lambda d: d.get("mode")), ("state.json", lambda d: (d.get("run") or {}).get("mode"))):
        try:
            with open(os.path.join(run_dir, f), encoding="utf-8") as fh:
                mode = get(json.load(fh))
        except (OSError, ValueError, AttributeError):
            continue
        if mode and mode not in name:
            return f"{mode} \u00b7 {name}"
        if mode:
            return name
    return name


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in records
           if isinstance(r.get("step"), (int, float)) and isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [p[0] for p in pts], [p[1] for p in pts]


def eval_series(evals: list[dict[str, Any]], name: str, key: str) -> tuple[list[float], list[float]]:
    """(versions, values) of one held-out set's metric, in version order."""
    rows = sorted((r for r in evals if r.get("set") == name), key=lambda r: r.get("version", 0))
    return series([{**r, "step": r.get("version")} for r in rows], key)


def plot_runs(runs: list[tuple[str, list[dict[str, Any]]]], out: str, title: str | None = None,
              evals: list[list[dict[str, Any]]] | None = None) -> str:
    """Draw (label, records) runs into `out` (PNG, SVG or PDF by extension); `evals`: each run's
    eval.jsonl records (a panel per held-out set)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = evals or [[] for _ in runs]
    sets = sorted({str(r.get("set")) for e in evals for r in e})
    rows = 2 + (len(sets) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.6 * rows), sharex=True, squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (panel, keys) in zip(axes.flat, PANELS):
        for i, (label, records) in enumerate(runs):
            for key, style in keys:
                xs, ys = series(records, key)
                if xs:
                    ax.plot(xs, ys, style, color=colours[i % len(colours)], lw=1.5,
                            label=label if style == "-" else None, drawstyle="steps-post" if key == "versions_live" else "default")
        ax.set_title(panel, fontsize=11)
        ax.grid(alpha=0.3)
    for ax, name in zip(list(axes.flat)[len(PANELS):], sets):
        for i, e in enumerate(evals):
            for key, style in (("mean_reward", "-"), ("pass@1", "--")):
                xs, ys = eval_series(e, name, key)
                if xs:
                    ax.plot(xs, ys, style, marker="o", ms=3, color=colours[i % len(colours)], lw=1.5)
        ax.set_title(f"held-out {name}: mean reward (solid), pass@1 (dashed)", fontsize=11)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) + len(sets):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("training step (held-out: version evaluated)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat[1:]:   # a run with no reward (simulated) still gets its legend entry
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97 if title else 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dora plot", description="Plot reward, tokens/s, staleness and versions live "
                                "against step for one or more run folders (one line per run).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (dora run --out / dora simulate --out)")
    p.add_argument("-o", "--output", required=True, help="image file to write (.png, .svg or .pdf)")
    p.add_argument("--title", default=None)
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    runs, evals = [], []
    for d in a.runs:
        try:
            check_run_dir(d)
        except NotARun as e:
            print(f"dora plot: {e}", file=sys.stderr)
            return 2
        path = os.path.join(d, "metrics.jsonl")
        records = read_jsonl(path) if os.path.exists(path) else []
        if not records:
            print(f"dora plot: {d}: no training steps in metrics.jsonl; left out", file=sys.stderr)
            continue
        names = policy_names(records)   # a run of several policies: a line per policy
        added = [(f"{run_label(d)} \u00b7 {u}", policy_records(records, u)) for u in names] or [(run_label(d), records)]
        runs += added
        held = read_jsonl(os.path.join(d, "eval.jsonl")) if os.path.exists(os.path.join(d, "eval.jsonl")) else []
        evals += [held] + [[] for _ in added[1:]]   # (one list per line drawn; held-out sets: one policy only)
    if not runs:
        print("dora plot: none of the runs has a training step to plot", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("dora plot: needs matplotlib: pip install 'dora-rl[plot]' (or pip install matplotlib)", file=sys.stderr)
        return 1
    try:
        plot_runs(runs, a.output, a.title, evals)
    except (OSError, ValueError) as e:
        print(f"dora plot: cannot write {a.output}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0
