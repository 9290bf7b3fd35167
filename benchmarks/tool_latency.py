"""Python tool-call latency, before and after OS isolation (issue 37), side by side.

Each round makes one call in each configuration, in turn, so every configuration sees the same
machine load; the table gives min / p50 / p95 of the call's wall time as the tool runner sees it
(PythonTool.run: start or hand-over, run, read back) and p50 minus the `before` p50 (min is the
closest a loaded machine gets to an idle one).

  before            sandbox: interpreter_only, the confinement main had (a child python that confines
                    itself: netns, rlimits, audit hook); with --before PATH, main's own sandbox.py too
  bwrap cold        the default isolation, each call starting its sandbox (warm: 0)
  bwrap warm        the same with warm sandboxes (warm: 2, the default): started ahead, handed over
  bwrap warm burst  warm, but calls back to back with no gap (the pool cannot refill in time)

    PYTHONPATH=. python benchmarks/tool_latency.py [--rounds 40] [--gap-ms 150] [--before /work/main]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dora.ops.tools.python_tool import PythonTool  # noqa: E402

CODE = "print(482 * 317)"
SETTINGS = {"timeout_s": 10.0, "cpu_s": 5, "memory_mb": 256}


def main_sandbox(checkout: str):
    """main's run_python, loaded from its checkout (its child script sits beside it)."""
    path = os.path.join(checkout, "dora", "ops", "tools", "sandbox.py")
    spec = importlib.util.spec_from_file_location("main_sandbox", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["main_sandbox"] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return lambda: mod.run_python(CODE, mod.Limits(wall_s=10.0, cpu_s=5, memory_mb=256))


def configurations(before: str | None) -> dict:
    tools = {"before (interpreter_only)": PythonTool("python", **SETTINGS, sandbox="interpreter_only", warm=0),
             "bwrap cold": PythonTool("python", **SETTINGS, warm=0),
             "bwrap warm": PythonTool("python", **SETTINGS, warm=2)}
    calls = {name: (lambda t=t: t.run({"code": CODE})) for name, t in tools.items()}
    if before:
        calls = {"before (main's sandbox.py)": main_sandbox(before), **calls}
    return calls, tools


def measure(rounds: int, gap_s: float, before: str | None) -> dict[str, list[float]]:
    calls, tools = configurations(before)
    burst_tool = PythonTool("python", **SETTINGS, warm=2)
    times: dict[str, list[float]] = {name: [] for name in calls}
    times["bwrap warm burst"] = []
    time.sleep(1.0)   # let the pools start their sandboxes
    try:
        for _ in range(rounds):
            for name, call in calls.items():
                t0 = time.perf_counter()
                r = call()
                times[name].append(time.perf_counter() - t0)
                text = r.text if hasattr(r, "text") else r.stdout.strip()
                assert text == "152794", (name, text)
                time.sleep(gap_s)
        for _ in range(rounds):
            t0 = time.perf_counter()
            assert burst_tool.run({"code": CODE}).text == "152794"
            times["bwrap warm burst"].append(time.perf_counter() - t0)
    finally:
        for t in [*tools.values(), burst_tool]:
            t.close()
    return times


def table(times: dict[str, list[float]]) -> str:
    base_name = next(n for n in times if n.startswith("before (interpreter_only)"))
    base = statistics.median(times[base_name])
    lines = ["| configuration | calls | min ms | p50 ms | p95 ms | p50 - before (interpreter_only) ms |",
             "|---|---|---|---|---|---|"]
    for name, ts in times.items():
        ms = sorted(t * 1000 for t in ts)
        p50, p95 = statistics.median(ms), ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
        lines.append(f"| {name} | {len(ms)} | {ms[0]:.1f} | {p50:.1f} | {p95:.1f} | {p50 - base * 1000:+.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--gap-ms", type=float, default=150.0, help="pause after each call (a model turn between calls)")
    ap.add_argument("--before", default=None, help="a checkout of main, to time its sandbox.py as well")
    args = ap.parse_args()
    times = measure(args.rounds, args.gap_ms / 1000, args.before)
    print(table(times))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
