"""One lineage on resume: before `dora run --resume` continues from checkpoint N, the run's files
are cut back to what the weights of step N saw.

    metrics.jsonl, trained.jsonl   keep the lines of steps <= N (each step once, each trained uid once);
    length_trace.jsonl             in a run of several policies, the lines of the policy going back only
    eval.jsonl, samples.jsonl      keep the evaluations of versions <= N and the samples of steps <= N
    checkpoints/best               rolled back too when it holds a version > N (run.keep_best)
    tb/, wandb/                    the logger folders of the earlier segments (they hold steps > N)
    checkpoints/step_M (M > N)     folders --resume did not trust (torn or corrupted)

What is cut goes to RUN_DIR/rolled_back/resume_K/ (K = 1, 2, ... per resume; restart_K/ for a
trainer that restarted itself inside the run, dora/rl/trainer_restart.py), kept for audit with a
rolled_back.json that says how much and from which step. The resumed run's sinks then get steps
1..N again from metrics.jsonl (replay), so TensorBoard and W&B show one lineage, as metrics.jsonl
does. Files are replaced atomically, after the rolled-back copy is complete: a crash during the
cut leaves at worst a second audit copy, never a lost line.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

ROLLED_BACK = "rolled_back"
LEDGERS = ("metrics.jsonl", "trained.jsonl", "length_trace.jsonl", "eval.jsonl", "samples.jsonl")   # (eval, samples: step = version)
POLICY_FILES = ("trained.jsonl", "length_trace.jsonl")   # a policy's own files (RUN_DIR/policies/<it> in a run of several)
LOGGER_DIRS = ("tb", "wandb")
FROM_STEP = {"resume": "resumed_from_step", "restart": "restarted_from_step"}   # rolled_back.json's key, by kind


def segment_dir(run_dir: str, kind: str = "resume") -> str:
    """A new, empty RUN_DIR/rolled_back/<kind>_K/ for this resume (or trainer restart)."""
    root = os.path.join(run_dir, ROLLED_BACK)
    os.makedirs(root, exist_ok=True)
    k = 1
    while os.path.exists(os.path.join(root, f"{kind}_{k}")):
        k += 1
    path = os.path.join(root, f"{kind}_{k}")
    os.makedirs(path)
    return path


def split_lines(path: str, step: int, policy: str | None = None) -> tuple[list[str], list[str]]:
    """(lines kept, lines cut) of a jsonl ledger: cut are the lines of steps > step (of `policy` only,
    in a run of several: its lines say `"policy": policy`; the others' lines are kept) and a torn last
    line (the crash cut it mid-write)."""
    kept, cut = [], []
    if not os.path.isfile(path):
        return kept, cut
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                cut.append(line if line.endswith("\n") else line + "\n")
                continue
            s = rec.get("step") if isinstance(rec, dict) else None
            others = policy is not None and isinstance(rec, dict) and rec.get("policy") != policy
            (kept if others or (isinstance(s, int) and s <= step) else cut).append(line)
    return kept, cut


def _replace(path: str, lines: list[str]) -> None:
    tmp = path + ".rollback"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def roll_back(run_dir: str, step: int, untrusted: list[str] = (), kind: str = "resume", policy: str | None = None,
              files_dir: str | None = None) -> dict[str, Any]:
    """Cut the run's files back to checkpoint `step` (see the module doc); `untrusted`: checkpoint
    folders newer than it that --resume skipped; `kind`: resume, or restart (a trainer restart inside
    the run: rolled_back/restart_K/). In a run of several policies, `policy` is the one going back
    (its lines of metrics.jsonl only) and `files_dir` where its own files are (RUN_DIR/policies/<it>).
    Returns what was moved (also in rolled_back.json)."""
    where = {name: files_dir or run_dir for name in POLICY_FILES}   # (the others are the run's: their lines say their policy)
    # (a policy's own file: every line of it is the policy's)
    splits = {name: split_lines(os.path.join(where.get(name, run_dir), name), step,
                                policy if name not in POLICY_FILES else None) for name in LEDGERS}
    loggers = [d for d in LOGGER_DIRS if os.path.isdir(os.path.join(run_dir, d))]
    untrusted = [p for p in untrusted if os.path.isdir(p)] + _best_after(run_dir, step)
    report: dict[str, Any] = {FROM_STEP[kind]: int(step),
                              "metrics_rows": len(splits["metrics.jsonl"][1]),
                              "trained_rows": len(splits["trained.jsonl"][1]),
                              "trained_trajectories": sum(len(json.loads(x).get("uids", []))
                                                          for x in splits["trained.jsonl"][1] if _is_json(x)),
                              "eval_rows": len(splits["eval.jsonl"][1]),
                              "logger_dirs": loggers, "checkpoints": [os.path.basename(p) for p in untrusted]}
    if policy is not None:
        report["policy"] = policy
    if not (any(cut for _, cut in splits.values()) or loggers or untrusted):
        return report
    seg = segment_dir(run_dir, kind)
    for name, (kept, cut) in splits.items():
        with open(os.path.join(seg, name), "w", encoding="utf-8") as f:
            f.writelines(cut)
    for d in loggers:   # the earlier segments' event files: the new sinks get steps 1..N by replay
        shutil.move(os.path.join(run_dir, d), os.path.join(seg, d))
    if untrusted:
        os.makedirs(os.path.join(seg, "checkpoints"))
        for p in untrusted:
            shutil.move(p, os.path.join(seg, "checkpoints", os.path.basename(p)))
    with open(os.path.join(seg, "rolled_back.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    for name, (kept, cut) in splits.items():
        if cut:
            _replace(os.path.join(where.get(name, run_dir), name), kept)
    report["folder"] = seg
    return report


def _best_after(run_dir: str, step: int) -> list[str]:
    """checkpoints/best when the version it holds is newer than `step` (that lineage is abandoned)."""
    path = os.path.join(run_dir, "checkpoints", "best")
    try:
        with open(os.path.join(path, "best.json"), encoding="utf-8") as f:
            return [path] if int(json.load(f)["version"]) > step else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


def kept_records(run_dir: str) -> list[dict[str, Any]]:
    """metrics.jsonl's records (after roll_back: steps 1..N, each once), for the resumed run's
    summary and for replay into its sinks."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False
