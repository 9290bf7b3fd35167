"""Held-out evaluation during a run (the pipeline's `eval:` section): which versions are evaluated on
which sets, their requests, their samples, their deadline. The RL driver calls it at each publish
and tick and hands it the generate replicas' `eval_finished` / `eval_aborted` events.

- When version v is published (v = 0 at the rollout's start: before training), each set due at v
  (every N versions, version 0 with before_training, the final version with at_end) gets a job: its
  prompts x samples requests, tagged with v, handed to the rollout controller's EvalWork
  (dora/rl/rollout/eval_work.py), which places them where training work leaves room. v's weights
  file is held (a hard link the trainer's pruning does not touch) until the job ends, so a later
  placement can still load v: every token of an evaluation of v comes from v (checked per sample).
- A job becomes due (it stops waiting for idle slots) when a newer evaluation starts, when training
  ends, or at once in sync mode (between steps, as verl evaluates). Past `timeout_s` after that it
  is abandoned, named in summary.json: a slow evaluation never holds the run.
- A job whose samples are all in is scored off the control thread (dora/rl/eval_results.py), then
  written to eval.jsonl, the loggers, samples.jsonl and, for run.keep_best, checkpoints/best.
- The run ends once the trainer is done and every job has ended (or timed out); a stop signal does
  not wait. Evaluation samples are counted apart (summary.json `eval`), never in the training books.
"""

from __future__ import annotations

import os
from typing import Any

from dora.rl.eval_results import EvalScorer, best_of
from dora.rl.rollout import Request


class EvalJob:
    """One evaluation: version `version` on set `name`."""

    def __init__(self, version: int, name: str, reqs: list[Request], created: float, published_s: float | None):
        self.version, self.name, self.reqs = version, name, {r.uid: r for r in reqs}
        self.samples: dict[str, dict[str, Any]] = {}
        self.created, self.published_s = created, published_s
        self.due_at: float | None = None        # since when it no longer waits for idle slots
        self.scoring_since: float | None = None
        self.abandoned = False

    @property
    def scoring(self) -> bool:
        return self.scoring_since is not None

    def deadline_from(self) -> float | None:
        return self.due_at if self.due_at is not None else self.scoring_since

    @property
    def key(self) -> str:
        return f"{self.name}@v{self.version}"

    def missing(self) -> list[Request]:
        return [r for u, r in self.reqs.items() if u not in self.samples]


class Evaluations:
    def __init__(self, driver, sets: dict[str, dict[str, Any]], done_before: set[tuple[int, str]] = frozenset()):
        self.d, self.sets = driver, sets
        self.prompts: dict[str, list[dict]] = {}         # set -> its prompts (loaded at first use)
        self.jobs: dict[tuple[int, str], EvalJob] = {}
        self.done = set(done_before)                      # (version, set) already in eval.jsonl
        self.held: dict[int, str] = {}                    # version -> the hard link holding its weights
        self.scorer = EvalScorer(driver)
        self.training_over = False
        self.failed: list[dict[str, Any]] = []
        self.skipped_rows: dict[str, dict[str, Any]] = {}   # set -> its rows that could not be used
        self.counts = {"requests": 0, "samples": 0, "aborted": 0, "version_mismatch": 0}

    @classmethod
    def of(cls, driver, sets: dict[str, dict[str, Any]], metrics) -> "Evaluations":
        """The driver's evaluations (with no set, every call does nothing); those in eval.jsonl
        already (a resumed run's) are not done again."""
        return cls(driver, sets, {(int(r["version"]), str(r["set"])) for r in getattr(metrics, "evals", [])})

    def load(self) -> None:
        """Every set's prompts, read once, at the run's start (dora/rl/execute.py): a row that cannot be
        used (one over the prompt limit included) refuses the run before any work, exit 2 naming it,
        rather than failing it at the first version that evaluates the set; or, where the training
        dataset skips bad rows, is skipped and counted (summary.json eval.skipped_rows)."""
        if not self.sets or self.prompts:
            return
        from dora.ops.eval_data import loaded_prompts
        from dora.ops.models import load_tokenizer
        tokenizer = load_tokenizer(self.d.graph.model)
        for name, s in self.sets.items():
            loaded = loaded_prompts(s, tokenizer)
            self.prompts[name] = loaded.records
            if loaded.skipped:
                self.skipped_rows[name] = {"rows": loaded.skipped, "first": loaded.skipped_where}
                self.d.progress.status(f"held-out set {name!r}: skipped {loaded.skipped} bad row(s), first: "
                                       f"{loaded.skipped_where[0]}")

    # -- schedule -----------------------------------------------------------------------------------
    def due_sets(self, version: int) -> list[str]:
        final = version == self.d.total_steps
        out = []
        for name, s in self.sets.items():
            if (version, name) in self.done or (version, name) in self.jobs:
                continue
            if ((version == 0 and s["before_training"]) or (version > 0 and s["every"] and version % s["every"] == 0)
                    or (final and s["at_end"])):
                out.append(name)
        return out

    def published(self, version: int) -> None:
        """Version `version` is there (its weights file in driver.weight_paths): start its evaluations."""
        names = self.due_sets(version)
        if not names or self.d.rc is None:
            return
        rc, now = self.d.rc, self.d.clock.now()
        self._hold(version)
        sync = getattr(rc.policy, "eval_barrier", False)   # (sync: evaluated between steps, due at once)
        for old in self.jobs.values():   # a newer evaluation starts: the older ones stop yielding
            if old.due_at is None:
                old.due_at = now
        rc.evals.make_due(version - 1)
        for name in names:
            job = EvalJob(version, name, self._requests(version, name), now, now)
            if sync:
                job.due_at = now
            self.jobs[(version, name)] = job
            self.counts["requests"] += len(job.reqs)
            rc.evals.add(version, list(job.reqs.values()), due=sync)

    def rollout_started(self) -> None:
        """The rollout controller (re)started: jobs of a trainer restart's earlier segment go on, the
        initial version's are started."""
        for job in self.jobs.values():
            if not job.scoring:
                self.d.rc.evals.add(job.version, job.missing(), due=job.due_at is not None)
        self.published(self.d.initial_version)

    def training_done(self) -> bool:
        """Training is over (called until this says the evaluations are too): what is still out is
        due, and the rollout gets no more training work; True once no evaluation is left."""
        if not self.training_over and self.sets:
            self.training_over = True
            now = self.d.clock.now()
            for job in self.jobs.values():
                job.due_at = job.due_at if job.due_at is not None else now
            if self.d.rc is not None:
                self.d.rc.evals.make_due()
                self.d.rc.manager.exhausted = True   # rollout drains
        return not self.jobs

    # -- events ---------------------------------------------------------------------------------------
    def on_event(self, ev: dict[str, Any]) -> None:
        """A generate replica's eval_finished (samples), eval_aborted or eval_refused (uids) event; others
        are not ours."""
        if ev.get("kind") == "eval_finished":
            self.on_samples(ev.get("samples") or [])
        elif ev.get("kind") == "eval_aborted":
            self.on_aborted(ev.get("uids") or [])
        elif ev.get("kind") == "eval_refused":   # (placing it again would be refused again)
            for uid in ev.get("uids") or []:
                job = self._job_of(str(uid))
                if job is not None and not job.abandoned:
                    self.abandon(job, f"the engine refused {uid}: {ev.get('reason')}")

    def on_samples(self, samples: list[dict[str, Any]]) -> None:
        rc = self.d.rc
        bad = []
        for s in samples:
            job = self._job_of(str(s["uid"]))
            if job is None or s["uid"] in job.samples:
                continue   # (an abandoned job's late sample)
            if s.get("token_versions") not in ([job.version], []):
                bad.append(s["uid"])   # another version's tokens: never counted, generated again
                self.counts["version_mismatch"] += 1
                continue
            job.samples[s["uid"]] = s
            self.counts["samples"] += 1
        if rc is not None:
            rc.evals.finished([s["uid"] for s in samples if s["uid"] not in bad])
            rc.evals.aborted(bad)
        for job in list(self.jobs.values()):
            if not job.scoring and not job.missing():
                self.scorer.start(job, self.sets[job.name])

    def on_aborted(self, uids: list[str]) -> None:
        self.counts["aborted"] += len(uids)
        if self.d.rc is not None:
            self.d.rc.evals.aborted([str(u) for u in uids])

    def tick(self) -> None:
        if not self.jobs:
            return
        for job, result in self.scorer.results():
            self._end(job)
            if "error" in result:
                self.failed.append({"version": job.version, "set": job.name, "why": result["error"]})
                self.d.progress.status(f"held-out set {job.name!r} at version {job.version}: {result['error']}")
        now = self.d.clock.now()
        for job in list(self.jobs.values()):
            s, since = self.sets[job.name], job.deadline_from()
            if since is not None and now - since > s["timeout_s"]:
                what = "scored" if job.scoring else f"{len(job.samples)} of {len(job.reqs)} samples generated"
                self.abandon(job, f"not finished {s['timeout_s']:g} s after it became due ({what})")

    def abandon(self, job: EvalJob, why: str) -> None:
        rc = self.d.rc
        job.abandoned = True
        if rc is not None:
            for name, uids in rc.evals.cancel({r.uid for r in job.missing()}).items():
                inst = rc.manager.instances.get(name)
                if inst is not None:
                    inst.abort(uids)
        self.failed.append({"version": job.version, "set": job.name, "why": why})
        self.d.progress.status(f"held-out set {job.name!r} at version {job.version} abandoned: {why}")
        self._end(job)

    def rolled_back(self, step: int) -> None:
        """A trainer restart goes back to checkpoint `step`: evaluations of later versions are gone
        (their lines in eval.jsonl were rolled back with the steps)."""
        for job in [j for j in self.jobs.values() if j.version > step]:
            job.abandoned = True
            self._end(job)
        self.done = {(v, n) for v, n in self.done if v <= step}

    def summary(self) -> dict[str, Any]:
        out = {"sets": best_of(self.d.metrics.evals), "failed": self.failed, "skipped_rows": self.skipped_rows,
               **self.counts,
               "claims": self.d.rc.evals.claims if self.d.rc is not None else 0,
               "unfinished": sorted(j.key for j in self.jobs.values())}
        return out

    # -- internals ------------------------------------------------------------------------------------
    def _job_of(self, uid: str) -> EvalJob | None:
        _, name, v, _ = uid.split(":", 3)
        return self.jobs.get((int(v[1:]), name))

    def _requests(self, version: int, name: str) -> list[Request]:
        from dora.ops.eval_data import eval_rows
        s = self.sets[name]
        self.load()
        return [Request(uid=row["uid"], group_id=row["group_id"], version=version, prompt_tokens=len(row["prompt_ids"]),
                        payload=row) for row in eval_rows(name, s, self.prompts[name], version)]

    def _hold(self, version: int) -> None:
        """Keep version `version`'s weights file until its evaluations end (the trainer prunes old ones)."""
        path = self.d.weight_paths.get(version)
        if path is None or version in self.held:
            return
        held = f"{path}.eval"
        if not os.path.isfile(path):
            return   # (nothing to hold: a load of it later fails by itself, naming the file)
        try:
            if os.path.exists(held):
                os.remove(held)
            os.link(path, held)
        except OSError:   # (no hard links here: keep a copy)
            import shutil
            shutil.copyfile(path, held)
        self.held[version] = held
        self.d.weight_paths[version] = held

    def _end(self, job: EvalJob) -> None:
        """The job is over (written, failed or abandoned); its version's weights are let go with the last."""
        self.jobs.pop((job.version, job.name), None)
        self.done.add((job.version, job.name))
        if any(j.version == job.version for j in self.jobs.values()):
            return
        held = self.held.pop(job.version, None)
        if held is None:
            return
        if self.d.weight_paths.get(job.version) == held:
            self.d.weight_paths[job.version] = held.removesuffix(".eval")
        try:   # (a scoring thread writing checkpoints/best from it keeps its open file)
            os.remove(held)
        except FileNotFoundError:
            pass
