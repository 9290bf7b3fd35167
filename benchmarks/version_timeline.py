"""The figure of docs/concepts.md: which policy version each rollout instance hosts, over time, in
sync and in dora mode, from the simulator (the real rollout control code on a virtual clock, so
the figure is the same on every machine: deterministic, seeded).

    python -m benchmarks.version_timeline                 # writes docs/images/version_timeline.png
    python -m benchmarks.version_timeline -o out.png --steps 8 --max-staleness 2

Rows: the rollout instances (a bar per version hosted, coloured by version) and the trainer (a bar per
training step); a dashed line where the trainer published a new version.
The trace is the one `dora run` writes to RUN_DIR/trace.json and the dashboard draws: the same
events, folded by dora.observe.dashboard.timeline.
"""

from __future__ import annotations

import argparse
import os
import re

OUT = os.path.join(os.path.dirname(__file__), "..", "docs", "images", "version_timeline.png")


def simulated_trace(mode: str, steps: int, max_staleness: int, gpus: int, seed: int) -> list[dict]:
    from dora.observe.trace import TraceWriter
    from dora.sim.simulator import SimConfig, simulate

    trace = TraceWriter(enabled=True)
    simulate(SimConfig(mode=mode, model="qwen2.5-1.5b", gpus=gpus, steps=steps, seed=seed, train_batch=256,
                       group_size=8, max_staleness=max_staleness), trace=trace)
    return trace.to_json()["traceEvents"]


def train_steps(events: list[dict]) -> list[tuple[float, float, int]]:
    """(start s, end s, version made) of each training step in a trace."""
    out = []
    for e in events:
        m = re.match(r"train step (\d+)$", str(e.get("name", "")))
        if e.get("ph") == "X" and e.get("cat") == "trainer" and m:
            out.append((e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, int(m.group(1)) + 1))
    return out


def draw_panel(ax, events: list[dict], title: str, colors) -> None:
    from dora.observe.dashboard.timeline import timeline_of_trace

    tl = timeline_of_trace(events)
    rows = tl["rows"]
    for y, row in enumerate(rows):
        for start, end, v in row["segments"]:
            ax.barh(y, end - start, left=start, height=0.8, color=colors(v % 10), edgecolor="white", linewidth=0.5)
            if end - start > tl["now"] / 25:
                ax.text((start + end) / 2, y, f"v{v}", ha="center", va="center", fontsize=7)
    y = len(rows)
    for start, end, v in train_steps(events):
        ax.barh(y, end - start, left=start, height=0.8, color="0.3")
        ax.axvline(end, color="0.3", linestyle="--", linewidth=0.6)
        ax.text(end, y + 0.55, f"v{v}", ha="center", va="top", fontsize=6)
    ax.set_yticks(range(len(rows) + 1), [r["name"] for r in rows] + ["trainer"], fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel("simulated seconds", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", default=OUT)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True)
    for ax, mode in zip(axes, ("sync", "dora")):
        k = 0 if mode == "sync" else args.max_staleness
        events = simulated_trace(mode, args.steps, args.max_staleness, args.gpus, args.seed)
        steps = train_steps(events)
        mean = (steps[-1][1] - steps[0][1]) / max(1, len(steps) - 1) if steps else 0.0
        draw_panel(ax, events, f"{mode} (K = {k}): {len(steps)} training steps, {mean:.0f} s apart", colors)
    fig.suptitle(f"Policy versions per rollout instance: qwen2.5-1.5b on {args.gpus} simulated GPUs, dapo-math "
                 f"lengths, 256 trajectories per step (benchmarks/version_timeline.py)", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    fig.savefig(args.output, dpi=110, metadata={"Software": None})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
