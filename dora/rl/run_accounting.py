"""The run's accounting of every dispatched trajectory (summary.json's `accounting`), at its end.

The rollout controller's ledger accounts for one segment: the run from its start, or from the last
trainer restart (dora/rl/trainer_restart.py closes a segment's books and keeps them). The run's
accounting is the sum of its segments, so `dispatched = trained + finished_untrained +
in_flight_at_end + in_training_at_end + dropped` (and `lost` = 0) holds over the whole run; a
resumed run's ties it to the earlier runs (trained_before_resume, reissued_at_resume).
"""

from __future__ import annotations

from typing import Any

UNTRAINED = ("dispatched", "trained", "in_training_at_end", "finished_untrained", "in_flight_at_end", "lost",
             "dropped", "c1_violations", "c2_violations", "c3_violations")


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two segments' books summed: counts add, per-reason counts add by reason."""
    out = dict(b)
    for k, v in a.items():
        if isinstance(v, dict):
            out[k] = {**v, **{r: v.get(r, 0) + n for r, n in (b.get(k) or {}).items()}}
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v + (b.get(k) or 0)
    return out


def account(d) -> dict[str, Any]:
    """RLDriver `d`'s accounting of every trajectory it dispatched (once the run is over)."""
    # (no rollout controller: the run ended before any dispatch, e.g. a resumed run already complete)
    a = d.rc.finish() if d.rc is not None else {k: 0 for k in UNTRAINED}
    r = d.restarts
    a = merge(r.earlier, a)
    a["filtered"] = len(d.filtered_uids)
    a.update(d.row_failures.totals())
    # a resumed run: this segment's identity holds on its own; these tie it to the earlier ones
    a["trained_before_resume"] = d.trained_before
    a["reissued_at_resume"] = d.reissued_at_resume
    a["trained_total"] = d.trained_before + a["trained"]
    a["respawns"] = d.respawns
    a["reissued_requests"] = d.prompts.reissued_requests
    a["late_rows_dropped"] = d.feed.late_rows
    # trainer restarts: the finished trajectories checkpoints put back (dispatched again in the
    # books, once dropped as trainer_restart), and the groups generated again
    a["trainer_restarts"] = r.count
    a["restored_at_restart"] = r.restored
    a["regenerated_groups_at_restart"] = r.regenerated_groups
    # held-out evaluation samples: apart from the trajectories above (never dispatched to train)
    ev = d.evaluations.counts
    a["eval_requests"], a["eval_samples"] = ev.get("requests", 0), ev.get("samples", 0)
    return a
