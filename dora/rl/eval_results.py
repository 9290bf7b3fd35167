"""Scoring a finished evaluation and writing what it found (dora/rl/evaluation.py starts it).

Scoring runs on a thread of its own per evaluation, off the run controller's thread: a reward
function that is slow or never returns delays only its evaluation, which the driver abandons at its
deadline (the thread is a daemon: it never holds the process). Each sample is scored as the reward
op scores a trajectory (`score_row`: a multi-turn one on its final turn); a failing reward follows
the set's on_error (zero: scored 0 and counted, fail: the evaluation is abandoned naming the uid).
The thread also writes RUN_DIR/checkpoints/best when the result is the best yet by run.keep_best
(a transformers folder of that version's weights, from the held weights file, and best.json).
The control thread then writes the record: eval.jsonl and the loggers (MetricsLog.write_eval),
samples.jsonl, and keeps each set's best per metric for summary.json.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from typing import Any

from dora.graph.eval_check import EVAL_METRICS, LOWER_IS_BETTER
from dora.ops.eval_scores import set_metrics
from dora.ops.reward import final_answer, resolve_reward_fn, score_row

BEST_DIR = "best"


def score_samples(job, s: dict[str, Any]) -> dict[str, Any]:
    """The job's metrics and scored samples; {"error": ...} when on_error is fail and a reward failed."""
    fn = resolve_reward_fn(s["reward"], dict(s["reward_params"]))
    per_prompt: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    errors = 0
    for uid, sample in job.samples.items():
        i, j = (int(x) for x in uid.rsplit(":", 1)[1].split("-"))
        try:
            reward = score_row(fn, sample)
        except Exception as e:   # user or verifier code: the set's on_error decides
            if s["on_error"] == "fail":
                return {"error": f"reward {s['reward']!r} failed on {uid}: {type(e).__name__}: {e}"}
            reward, errors = 0.0, errors + 1
        text = sample.get("final_turn_text") if sample.get("final_turn_text") is not None else sample["response_text"]
        scored = {**sample, "reward": reward, "extracted": final_answer(text or "")}
        per_prompt.setdefault(i, []).append((j, scored))
    prompts = [[x for _, x in sorted(v, key=lambda t: t[0])] for _, v in sorted(per_prompt.items())]
    metrics = set_metrics([[{"reward": x["reward"], "response_tokens": x["response_tokens"],
                             "finish_reason": x["finish_reason"], "answer": x["extracted"]} for x in p] for p in prompts],
                          s["k"], s["correct_at"])
    return {"metrics": metrics, "reward_errors": errors, "samples": [x for p in prompts for x in p]}


def eval_sample(job, x: dict[str, Any]) -> dict[str, Any]:
    """A scored evaluation sample as samples.jsonl holds it."""
    out = {"kind": "eval", "step": job.version, "version": job.version, "set": job.name, "uid": x["uid"],
           "prompt": x.get("prompt"), "response": x["response_text"], "reward": x["reward"],
           "finish_reason": x["finish_reason"], "response_tokens": x["response_tokens"], "answer": x.get("answer"),
           "extracted": x.get("extracted")}
    if x.get("final_turn_text") is not None:
        out["final_turn_text"] = x["final_turn_text"]
    return out


class EvalScorer:
    def __init__(self, driver):
        self.d = driver
        self.finished: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.kept_best: dict[str, Any] | None = None   # what checkpoints/best holds (read at first use: a resume's)
        self._best_read = False
        self._policy = None                                       # (model, tokenizer) to write it with

    def start(self, job, s: dict[str, Any]) -> None:
        job.scoring_since = self.d.clock.now()
        threading.Thread(target=self._run, args=(job, s), name=f"eval-{job.key}", daemon=True).start()

    def _run(self, job, s: dict[str, Any]) -> None:
        try:
            result = score_samples(job, s)
            if "metrics" in result:
                self._maybe_keep_best(job, result["metrics"])
        except Exception as e:   # a bug, or a disk error writing the best checkpoint: this evaluation fails
            result = {"error": f"{type(e).__name__}: {e}"}
        self.finished.put((job, result))

    def results(self) -> list[tuple[Any, dict[str, Any]]]:
        """Finished jobs and their results, the successful ones written (on the control thread)."""
        out = []
        while True:
            try:
                job, result = self.finished.get_nowait()
            except queue.Empty:
                return out
            if job.abandoned:
                continue
            if "metrics" in result:
                self._write(job, result)
            out.append((job, result))

    def _write(self, job, result: dict[str, Any]) -> None:
        d, m = self.d, result["metrics"]
        record = {"version": job.version, "step": job.version, "set": job.name, **m,
                  "reward_errors": result["reward_errors"], "samples": len(result["samples"]),
                  "published_s": job.published_s, "seconds": d.clock.now() - job.created}
        d.metrics.write_eval(record)
        d.metrics.write_samples([eval_sample(job, x) for x in result["samples"]])   # beside its scores

    # -- run.keep_best ---------------------------------------------------------------------------------
    def _maybe_keep_best(self, job, metrics: dict[str, Any]) -> None:
        keep = self.d.run_cfg.keep_best
        if not keep:
            return
        _, name, metric = keep.split("/", 2)
        value = metrics.get(metric)
        if name != job.name or value is None:
            return
        with self.lock:   # (two evaluations may finish together: one writes at a time)
            if not self._best_read:
                self.kept_best, self._best_read = read_best(self.d.ctrl.run_dir), True
            held = self.kept_best if self.kept_best is not None and self.kept_best.get("metric") == keep else None
            if held is not None and not _better(metric, value, held["value"]):
                return
            self._write_best(job.version, self.d.weight_paths[job.version],
                             {"metric": keep, "value": value, "version": job.version, "step": job.version})
            self.kept_best = {"metric": keep, "value": value, "version": job.version}

    def _write_best(self, version: int, weights: str, info: dict[str, Any]) -> None:
        from dora.ops.models import load_policy
        from dora.ops.weights.versions import load_version

        if self._policy is None:
            self._policy = load_policy(self.d.graph.model, "cpu")   # (every weight is then loaded)
        model, tok = self._policy
        load_version(model, weights)
        try:   # (transformers' progress bar would print into the run's output)
            from transformers.utils import logging as hf_logging
            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        root = os.path.join(self.d.ctrl.run_dir, "checkpoints")
        tmp, final = os.path.join(root, f"{BEST_DIR}.partial"), os.path.join(root, BEST_DIR)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        model.save_pretrained(tmp)
        if hasattr(tok, "save_pretrained"):
            tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "best.json"), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
        old = os.path.join(root, f"{BEST_DIR}.old")
        shutil.rmtree(old, ignore_errors=True)
        if os.path.isdir(final):
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)


def best_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set, from eval.jsonl's records (the run's whole lineage): how many evaluations, the last,
    and per metric the best version and its value (the earliest on a tie)."""
    out: dict[str, Any] = {}
    for r in sorted(records, key=lambda r: r["version"]):
        s = out.setdefault(r["set"], {"evaluations": 0, "best": {}, "last": None})
        s["evaluations"] += 1
        s["last"] = r
        for metric in EVAL_METRICS:
            value, best = r.get(metric), s["best"].get(metric)
            if value is not None and (best is None or _better(metric, value, best["value"])):
                s["best"][metric] = {"version": r["version"], "value": value}
    return out


def read_best(run_dir: str) -> dict[str, Any] | None:
    """What checkpoints/best holds (its best.json), or None."""
    try:
        with open(os.path.join(run_dir, "checkpoints", BEST_DIR, "best.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _better(metric: str, value: float, than: float) -> bool:
    return value < than if metric in LOWER_IS_BETTER else value > than
