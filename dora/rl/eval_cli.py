"""`dora eval PATH [k=v ...] [--pipeline P.yaml] [--set NAME] [--data SOURCE --reward FN] [--json F]`:
held-out evaluation with no training, of a saved checkpoint or of a pipeline's base model.

PATH is a checkpoint (a transformers folder: RUN_DIR/checkpoints/step_N, checkpoints/best, or any
folder with config.json and its weights) or a pipeline file (its `model:`, untrained). The sets are
the pipeline's `eval:` section (the pipeline: --pipeline, else PATH itself, else the pipeline.yaml of
the run the checkpoint belongs to), or one source given with --data (a .jsonl / .parquet file in
verl's row format, synthetic:NAME or reasoning_gym:NAME), scored by --reward (default: the
pipeline's reward node).

The requests go through the generate op itself, in this process (the pipeline's generate params:
engine, dtype, stop strings, tools and turns), and are scored as in a run (dora/rl/eval_results.py),
so at temperature 0 the numbers are those the run's own evaluation of that version wrote to
eval.jsonl. Prints a table and writes the numbers as JSON. Exit codes: 0 ok, 1 the evaluation
failed, 2 bad input (a folder that is not a checkpoint, naming what is missing; a bad pipeline).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from typing import Any

from dora.graph.diagnostics import BadInput

EXAMPLE = """examples:
  dora eval runs/q/checkpoints/step_40                     # the run's own held-out sets (runs/q/pipeline.yaml)
  dora eval pipelines/quickstart.yaml                      # the untrained base model
  dora eval runs/q/checkpoints/best --data heldout.jsonl --reward math_verify --json best.json
"""
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class BadEvalInput(ValueError):
    """What `dora eval` was given cannot be evaluated (exit 2)."""


def checkpoint_problem(path: str) -> str | None:
    """Why `path` is not a checkpoint folder dora eval can load (None: it is)."""
    if not os.path.isdir(path):
        return f"{path} is neither a pipeline file nor a checkpoint folder"
    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    if not any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES):
        missing.append(f"weights ({' or '.join(WEIGHT_FILES)})")
    if missing:
        return f"{path} is not a checkpoint folder: it lacks {' and '.join(missing)}"
    return None


def find_run_pipeline(path: str) -> str | None:
    """The pipeline.yaml of the run a checkpoint folder sits in (RUN_DIR/checkpoints/X), if any."""
    d = os.path.abspath(path)
    for _ in range(3):
        d = os.path.dirname(d)
        if os.path.isfile(os.path.join(d, "pipeline.yaml")):
            return os.path.join(d, "pipeline.yaml")
    return None


def plan(args: argparse.Namespace):
    """(resolved pipeline or None, model section, {set: settings}) for the arguments; BadEvalInput."""
    from dora.graph.eval_check import resolve_evals
    from dora.graph.model import EvalSet
    from dora.graph.resolve import resolve
    from dora.rl.launch import load_graph

    is_pipeline = args.path.endswith((".yaml", ".yml")) and os.path.isfile(args.path)
    if not is_pipeline and checkpoint_problem(args.path):
        raise BadEvalInput(checkpoint_problem(args.path))
    source = args.pipeline or (args.path if is_pipeline else find_run_pipeline(args.path))
    if source is None and not args.data:
        raise BadEvalInput(f"no held-out set for {args.path}: give --pipeline P.yaml (its eval: section) or --data SOURCE")
    resolved = None
    if source is not None:
        graph = load_graph(source, args.overrides)
        if graph is None:
            raise BadEvalInput(f"{source}: not a valid pipeline (see above)")
        if args.data:
            graph.evals = {"data": EvalSet(source=args.data, size=args.size, reward=args.reward)}
            graph.run.keep_best = None   # (it named one of the pipeline's own sets)
            _check_data_set(graph)
        resolved = resolve(graph)
    model = dict(resolved.graph.model) if resolved is not None else {}
    if not is_pipeline:
        model = {"path": os.path.abspath(args.path)}
    if resolved is None:   # --data with no pipeline: a bare set, scored by --reward
        if not args.reward:
            raise BadEvalInput("--data without a pipeline needs --reward (e.g. math_verify)")
        g = types.SimpleNamespace(evals={"data": EvalSet(source=args.data, size=args.size, reward=args.reward)})
        sets = resolve_evals(g, {}, {})
    else:
        sets = resolved.evals
    if args.set:
        unknown = [n for n in args.set if n not in sets]
        if unknown:
            raise BadEvalInput(f"no held-out set {', '.join(map(repr, unknown))} (sets: {', '.join(sets) or 'none'})")
        sets = {n: sets[n] for n in args.set}
    if not sets:
        raise BadEvalInput(f"{source}: declares no held-out set (an eval: section), and no --data was given")
    return resolved, model, sets


def _check_data_set(graph) -> None:
    """The --data set, validated as a pipeline's own set would be."""
    from dora.graph.diagnostics import errors_of
    from dora.graph.validate import validate
    errs = [d for d in errors_of(validate(graph))]
    if errs:
        raise BadEvalInput("--data: " + "; ".join(d.message for d in errs))


def generate_op(resolved, model: dict[str, Any], seed: int, events: list):
    """A generate op in this process, with the pipeline's generate params (defaults without one)."""
    from dora.graph.op_registry import resolve_op
    from dora.graph.opspec import fill_params
    from dora.ops.base import OpContext
    from dora.ops.generate import GenerateOp

    if resolved is not None:
        node = next(n for n in resolved.graph.nodes if resolved.op_of(n) == "generate")
        params = dict(resolved.params[node])
    else:
        node, params = "generate", fill_params(resolve_op("generate"), {})
    params["weight_sync"] = "file"
    op = GenerateOp()
    op.setup(OpContext(node=node, op="generate", replica=0, replicas=1, params=params, model=model, seed=seed,
                       report=events.append))
    return op


def run_sets(op, sets: dict[str, dict[str, Any]], events: list, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Generate and score every set; set -> its eval.jsonl record (or {"error": ...})."""
    import pyarrow as pa
    from dora.ops.eval_data import eval_prompts, eval_rows
    from dora.rl.eval_results import score_samples

    out = {}
    for name, s in sets.items():
        rows = eval_rows(name, s, eval_prompts(s, op.tokenizer), op.engine.version)
        op.process(pa.RecordBatch.from_pylist(rows), "prompts")
        job = types.SimpleNamespace(samples={})
        t0, deadline = time.monotonic(), time.monotonic() + timeout_s
        while len(job.samples) < len(rows):
            if time.monotonic() > deadline:
                raise TimeoutError(f"held-out set {name!r}: {len(job.samples)} of {len(rows)} samples after {timeout_s:g} s")
            op.poll()
            for ev in events:
                if ev.get("kind") == "eval_finished":
                    job.samples.update({x["uid"]: x for x in ev["samples"]})
                elif ev.get("kind") == "eval_aborted":
                    raise RuntimeError(f"held-out set {name!r}: requests aborted ({ev.get('reason')})")
            events.clear()
        result = score_samples(job, s)
        out[name] = result if "error" in result else {"set": name, **result["metrics"],
                                                      "reward_errors": result["reward_errors"],
                                                      "samples": len(result["samples"]), "seconds": time.monotonic() - t0}
    return out


def table(path: str, results: dict[str, dict[str, Any]]) -> str:
    from dora.graph.eval_check import EVAL_METRICS
    head = ["set", "n_prompts", "k", *EVAL_METRICS]
    rows = [[name] + [("-" if r.get(k) is None else f"{r[k]:.4f}" if isinstance(r.get(k), float) else str(r[k]))
                      for k in head[1:]] if "error" not in r else [name, r["error"]] for name, r in results.items()]
    widths = [max(len(str(x[i])) for x in [head] + [r for r in rows if len(r) == len(head)]) for i in range(len(head))]
    lines = [f"dora eval {path}", "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) if len(r) == len(head) else "  ".join(r) for r in rows]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dora eval", description="Evaluate a checkpoint or a pipeline's base model on "
                                "held-out sets, with no training.", epilog=EXAMPLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a checkpoint folder (transformers), or a pipeline file (its base model)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the pipeline (eval.NAME.samples=4, ...)")
    p.add_argument("--pipeline", help="the pipeline whose eval: sets and generate params to use (default: PATH "
                   "itself, else the pipeline.yaml of the run the checkpoint is in)")
    p.add_argument("--set", action="append", help="only this held-out set (repeatable)")
    p.add_argument("--data", help="evaluate on this source instead: a .jsonl / .parquet file, synthetic:NAME, reasoning_gym:NAME")
    p.add_argument("--reward", help="with --data: the reward function (default: the pipeline's reward node's)")
    p.add_argument("--size", type=int, default=0, help="with --data: prompts to take (0: every row of a file)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the pipeline's run.seed)")
    p.add_argument("--json", default=None, help="write the numbers here (default eval-<name>.json)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a set may take (default 3600)")
    return p


def eval_main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_intermixed_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    try:
        resolved, model, sets = plan(args)
        from dora.ops.models import model_problems
        problems = model_problems(model)
        if problems:
            raise BadEvalInput(f"{args.path}: {'; '.join(m for _, m in problems)}")
    except BadEvalInput as e:
        print(f"dora eval: {e}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else (resolved.run.seed if resolved is not None else 0)
    try:   # (transformers' progress bar while the checkpoint loads: noise in a table's output)
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    events: list = []
    op = generate_op(resolved, model, seed, events)
    try:
        results = run_sets(op, sets, events, args.timeout)
    except BadInput as e:   # a set's row that cannot be used (a prompt over the context), named
        print(f"dora eval: bad input: {e}", file=sys.stderr)
        return 2
    except Exception as e:   # a timeout, an engine error: named, exit 1
        print(f"dora eval: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        op.teardown()
    print(table(args.path, results))
    out = args.json or f"eval-{os.path.basename(os.path.normpath(args.path)).removesuffix('.yaml')}.json"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"path": os.path.abspath(args.path), "model": model, "sets": results}, f, indent=2, sort_keys=True)
    print(f"wrote {out}")
    return 1 if any("error" in r for r in results.values()) else 0
