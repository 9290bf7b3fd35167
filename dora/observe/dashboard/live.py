"""The dashboard of a run in progress: its RunState (RUN_DIR/state.json kept current) and, with
`dora run --dashboard [PORT]`, the HTTP server showing it. Kept here so dora/rl/launch.py
only adds the flag, starts this and closes it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dora.observe.dashboard.server import DEFAULT_PORT, DashboardServer
from dora.observe.dashboard.state import RunState

LIVE_S = 0.5   # workers sample their live counters this often (the page redraws once a second)


def add_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dashboard", type=int, nargs="?", const=DEFAULT_PORT, default=None, metavar="PORT",
                   help=f"serve a live dashboard on 127.0.0.1 (default port {DEFAULT_PORT}; a taken port falls back to a "
                        "free one; 0 = any free port)")


def bare_flag_first(argv: list[str]) -> list[str]:
    """`--dashboard` takes an optional port: never let it swallow the override after it."""
    out = []
    for i, a in enumerate(argv):
        bare = a == "--dashboard" and not (i + 1 < len(argv) and argv[i + 1].isdigit())
        out.append(f"--dashboard={DEFAULT_PORT}" if bare else a)
    return out


def check_port(port: int | None) -> str | None:
    """What is wrong with a --dashboard port, or None."""
    return None if port is None or 0 <= port <= 65535 else f"--dashboard {port} is not a port (0-65535)"


class LiveDashboard:
    def __init__(self, graph: Any, run_dir: str, *, driver: Any, metrics: Any, total_steps: int | None,
                 port: int | None):
        """Raises OSError when the port cannot be listened on (a taken port falls back instead)."""
        self.run_dir = run_dir
        self.state = RunState(graph, run_dir, driver=driver, metrics=metrics, total_steps=total_steps)
        self.server = DashboardServer(lambda: self.state.latest, port).start() if port is not None else None
        if self.server is not None:
            if self.server.note:
                print(f"dora run: --dashboard: {self.server.note}", file=sys.stderr)
            print(f"dashboard: {self.server.url}", file=sys.stderr, flush=True)

    def close(self, ctrl: Any, ok: bool, error: str | None) -> None:
        """The final snapshot (after the run's accounting), then the server stops."""
        if self.server is not None:
            self.state.server_cpu_s = self.server.httpd.cpu_s
        self.state.finish(ctrl, ok, error)
        if self.server is not None:
            self.server.close()
            print(f"dashboard closed; `dora dashboard {self.run_dir}` shows this run again", file=sys.stderr)
