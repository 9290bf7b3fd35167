"""Looking at a run: the live dashboard (`dora run --dashboard`, `dora dashboard RUN_DIR`).

    state.py      the state JSON (/api/state, RUN_DIR/state.json) and RunState, its live builder
    timeline.py   the version timeline from the rollout control code's trace
    page.py       the self-contained HTML page
    server.py     the HTTP server (127.0.0.1, / and /api/state)
    live.py       a run's RunState and server, as `dora run` starts and closes them
    read_run.py   a run folder's state, and `dora dashboard`
"""
