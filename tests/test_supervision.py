"""The supervisor's rule for a rank of a process group that raises (dora/runtime/supervision.py): its
error may be its peer's death, seen a moment later (gloo's "Connection reset by peer" from a
collective the killed rank shared), so the group is respawned if a peer is found lost within
PEER_DEATH_GRACE_S; otherwise, and at once for a replica of its own, the error fails the run."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dora.runtime import supervision
from dora.runtime.errors import RunFailed
from dora.runtime.supervision import GROUP_LOST, Supervisor
from dora.runtime.worker_record import WorkerRecord


class Backend:
    def __init__(self):
        self.gone: list[tuple[str, str]] = []

    def exited(self):
        out, self.gone = self.gone, []
        return out


def controller(*workers: WorkerRecord, groups=("train",)):
    for w in workers:
        w.state, w.last_hb = "running", time.monotonic()
    driver = SimpleNamespace(respawnable=lambda node: True, why_not_respawned=lambda node: None)
    return SimpleNamespace(failure=None, backend=Backend(), workers={w.label: w for w in workers}, hb_timeout=60.0,
                           stall_timeout_s=60.0, call_depth=1,   # (1: no respawn in these checks, only the marks)
                           plan=SimpleNamespace(groups={g: None for g in groups}), driver=driver, stopping=False)


def raised(w: WorkerRecord, what: str = "RuntimeError: gloo: Connection reset by peer") -> None:
    w.on_report({"kind": "error", "where": "poll", "error": what, "traceback": "..."})


def test_a_rank_that_raised_as_its_peer_died_is_respawned_with_its_group():
    leader, follower = WorkerRecord("train", 0), WorkerRecord("train", 1)
    c = controller(leader, follower)
    s = Supervisor(c, max_restarts=3)
    raised(follower)
    s.check()                       # the peer's exit is not seen yet: no verdict
    assert c.failure is None and follower.lost is None
    c.backend.gone.append(("train[0]", "exited (SIGKILL)"))
    s.check()
    assert c.failure is None
    assert leader.lost == "exited (SIGKILL)" and follower.lost == f"{GROUP_LOST} train[0]"


def test_a_rank_error_with_no_peer_lost_fails_the_run_after_the_grace(monkeypatch):
    leader, follower = WorkerRecord("train", 0), WorkerRecord("train", 1)
    c = controller(leader, follower)
    s = Supervisor(c, max_restarts=3)
    raised(follower, "ValueError: a bug")
    s.check()
    assert c.failure is None
    follower.error_at -= supervision.PEER_DEATH_GRACE_S + 0.1
    with pytest.raises(RunFailed, match=r"worker train\[1\] .* raised in poll\(\): ValueError: a bug"):
        s.check()


def test_a_replica_of_its_own_that_raised_fails_the_run_at_once():
    w = WorkerRecord("reward", 0)
    c = controller(w, groups=())
    raised(w, "KeyError: 'x'")
    with pytest.raises(RunFailed, match=r"worker reward\[0\] .* KeyError"):
        Supervisor(c, max_restarts=3).check()
