"""The `eval:` section: held-out sets, checked the way `dora validate` checks every setting, and
resolved into the settings a run (or `dora eval`) uses.

    eval:
      heldout: {source: "synthetic:quickstart", split: holdout, size: 64, every: 10}

Each set's settings are declared once, on `EvalSet` (dora/graph/model.py). What a set leaves null
comes from the pipeline's nodes: the reward function (with its params and on_error) from the reward
node, max_tokens from the generate node, task_params, chat_template and seed from the training
dataset (the seed: the dataset's + 1 on the dataset's own source, so a set is never the training
stream by default). `run.keep_best` names a metric one of the sets produces: eval/<set>/<metric>.
Imports nothing above dora.graph: sources and reward names are checked through the declarations'
import paths (the ops' own checks), as op params are.
"""

from __future__ import annotations

import os
import re
from typing import Any

from dora.graph.diagnostics import Diagnostic, error, warning
from dora.graph.model import EvalSet, Graph, SOURCE_CHECK, SourceLoc
from dora.graph.opspec import OpSpec, did_you_mean, import_object
from dora.graph.prompt_limits import CONTEXT_OF, NAMED_ROWS, ROOM_OF, TOKENIZER_OF
from dora.graph.sections import section_specs

# eval.jsonl's metrics per (version, set): also eval/<set>/<metric> in every logger
EVAL_METRICS = ("mean_reward", "pass@1", "pass@k", "maj@k", "mean_response_tokens", "truncated_share")
LOWER_IS_BETTER = ("mean_response_tokens", "truncated_share")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
SCAN = "dora.ops.prompt_rows:scan_file"        # a file source's first rows, parsed as a run reads them
FIRST_ROWS = "dora.ops.data_files:FIRST_ROWS"


def _nodes(specs: dict[str, OpSpec | None], op: str) -> list[str]:
    return [n for n, s in specs.items() if s is not None and s.name == op]


def eval_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """Every problem of the `eval:` section and of `run.keep_best` (`params`: the nodes whose params
    checked out, filled)."""
    diags: list[Diagnostic] = []
    for name, e in g.evals.items():
        diags += _set_problems(g, name, e, specs, params)
    diags += _keep_best_problems(g)
    return diags


def _set_problems(g: Graph, name: str, e: EvalSet, specs, params) -> list[Diagnostic]:
    at = lambda key=None: g.loc_of(f"eval.{name}.{key}" if key else f"eval.{name}")   # noqa: E731
    diags = []
    if not NAME.match(name):
        diags.append(error(f"held-out set name {name!r}: use letters, digits, '_' and '-' (it names metrics "
                           f"eval/<set>/<metric>)", at()))
    for key, ps in section_specs(EvalSet).items():
        value, err = ps.check(getattr(e, key))
        problem = err or ps.check_name(value)
        if problem:
            diags.append(error(f"held-out set {name!r}: {key} {problem}" if err else
                               f"held-out set {name!r}: {key}: {problem}", at(key), hint=ps.doc))
    if diags:
        return diags
    if e.source is None:
        return [error(f"held-out set {name!r} has no source", at(), hint="source: synthetic:NAME, reasoning_gym:NAME or a "
                      ".jsonl / .parquet file")]
    if e.source.endswith((".jsonl", ".json", ".parquet")) and os.path.isfile(e.source):
        diags += _file_rows_problems(g, name, e, specs, params)
    if e.k is not None and e.k > e.samples:
        diags.append(error(f"held-out set {name!r}: pass@k with k {e.k} needs at least k samples per prompt, but "
                           f"samples is {e.samples}", at("k"), hint=f"raise samples to {e.k} or lower k"))
    gens = _nodes(specs, "generate")
    if len(gens) != 1:   # (several policies: each has its own generate node; evaluation per policy is not built)
        diags.append(error(f"held-out set {name!r}: evaluation runs on the generate node's replicas, and this pipeline "
                           f"has {len(gens)} generate nodes ({', '.join(gens)}): held-out sets are evaluated in "
                           "pipelines with one policy only", at(),
                           hint="evaluate a policy's saved checkpoint instead: dora eval CHECKPOINT_DIR --data SOURCE "
                                "--reward FN"))
    if e.reward is None and len(_nodes(specs, "reward")) != 1:
        diags.append(error(f"held-out set {name!r} names no reward and the pipeline has "
                           f"{len(_nodes(specs, 'reward'))} reward nodes to take it from", at(),
                           hint="reward: synthetic | math_verify | reasoning_gym | format | pkg.module:function"))
    weighted = [n for n in _nodes(specs, "reward") if n in params and params[n].get("sources")]
    if e.reward is None and weighted:
        diags.append(error(f"held-out set {name!r} names no reward, and reward node {weighted[0]!r} scores by weighted "
                           "sources: a held-out set scores with one reward function", at(),
                           hint="reward: synthetic | math_verify | reasoning_gym | format | pkg.module:function"))
    diags += _training_overlap(g, name, e, specs, params)
    return diags


def _training_overlap(g: Graph, name: str, e: EvalSet, specs, params) -> list[Diagnostic]:
    """split: holdout needs a dataset that holds prompts out of the same source; a set that reads
    the training stream itself (same file, or same source and seed, all of it) is worth a warning."""
    data = [params[n] for n in _nodes(specs, "dataset") if n in params]
    same = [d for d in data if d["source"] == e.source]
    if e.split == "holdout":
        if not same or not any(d.get("holdout", 0) > 0 for d in same):
            return [error(f"held-out set {name!r}: split holdout takes the prompts a training dataset on {e.source!r} "
                          "holds out, and none does", g.loc_of(f"eval.{name}.split"),
                          hint="give the dataset node `holdout: 0.1` (the share of prompts kept out of training)")]
        return []
    for d in same:
        generated = not e.source.endswith((".jsonl", ".json", ".parquet"))
        seed = resolved_seed(e, d)
        if not generated or (seed == d["seed"] and (e.task_params is None or e.task_params == d["task_params"])):
            how = "the same file" if not generated else f"the same source and seed ({seed})"
            return [warning(f"held-out set {name!r} is the training source itself ({how}): its prompts are trained on",
                            g.loc_of(f"eval.{name}.source"),
                            hint="use another seed or file, or split: holdout with the dataset's `holdout` share")]
    return []


def _file_rows_problems(g: Graph, name: str, e: EvalSet, specs, params) -> list[Diagnostic]:
    """The first rows of a set's file as the run reads them: parsed, rendered with the model's tokenizer
    where it can be had, and held to the set's prompt limit; each bad one named at file:N, an error
    where the training dataset's on_error fails the run on it, a warning where it skips it."""
    gens, data = _nodes(specs, "generate"), _nodes(specs, "dataset")
    gen = params.get(gens[0]) if len(gens) == 1 else None
    own = next((params[d] for d in data if d in params and params[d]["source"] == e.source), None)
    dataset = own or next((params[d] for d in data if d in params), {})
    tokenizer = import_object(TOKENIZER_OF)(g.model) if gen is not None and isinstance(g.model, dict) else None
    most, why = set_prompt_limit(g, gen, e.max_tokens or gen["max_tokens"]) if gen is not None else (None, "")
    chat = e.chat_template if e.chat_template is not None else dataset.get("chat_template")
    _, bad = import_object(SCAN)(e.source, tokenizer, chat, most, rows=import_object(FIRST_ROWS), limit_why=why)
    make = warning if dataset.get("on_error") == "skip" else error
    hint = ("the training dataset's on_error: skip: the run skips and counts it" if make is warning else
            "fix or remove the row; the training dataset's on_error: skip skips such rows, here too")
    diags = [make(f"held-out set {name!r}: {msg}", SourceLoc(file, line), hint=hint) for file, line, msg in bad[:NAMED_ROWS]]
    if len(bad) > NAMED_ROWS:
        diags.append(make(f"held-out set {name!r}: {len(bad) - NAMED_ROWS} more bad row(s) in {e.source}",
                          g.loc_of(f"eval.{name}.source"), hint=hint))
    return diags


def resolved_seed(e: EvalSet, dataset: dict[str, Any] | None) -> int:
    if e.seed is not None:
        return e.seed
    return dataset["seed"] + 1 if dataset is not None and dataset["source"] == e.source else 0


def _keep_best_problems(g: Graph) -> list[Diagnostic]:
    metric = g.run.keep_best
    if not isinstance(metric, str):
        return []
    names = [f"eval/{s}/{m}" for s in g.evals for m in EVAL_METRICS]
    if metric in names:
        return []
    hint = did_you_mean(metric, names) or (f"one of {', '.join(names[:6])}, ..." if names else
                                           "declare a held-out set under eval: first")
    return [error(f"run.keep_best: no held-out set produces {metric!r}", g.loc_of("run.keep_best"), hint=hint)]


def resolve_evals(g: Graph, specs: dict[str, OpSpec], params: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each set's settings as a run uses them (a valid graph): nulls filled from the pipeline's nodes."""
    datasets = {params[n]["source"]: params[n] for n in _nodes(specs, "dataset")}
    first_data = next(iter(datasets.values()), None)
    rewards = [params[n] for n in _nodes(specs, "reward")]
    gens = [params[n] for n in _nodes(specs, "generate")]
    out = {}
    for name, e in g.evals.items():
        s = {k: getattr(e, k) for k in section_specs(EvalSet)}
        own = datasets.get(e.source)
        s["seed"] = resolved_seed(e, own)
        s["task_params"] = dict(e.task_params if e.task_params is not None else own["task_params"] if own else {})
        s["chat_template"] = e.chat_template if e.chat_template is not None else (
            (own or first_data or {}).get("chat_template"))
        s["holdout"] = float(own.get("holdout", 0.0)) if own else 0.0
        if e.reward is None and rewards:
            s["reward"], s["reward_params"] = rewards[0]["fn"], dict(rewards[0]["params"])
        s["on_error"] = e.on_error or (rewards[0]["on_error"] if rewards and e.reward is None else "zero")
        s["on_error"] = "zero" if s["on_error"] == "zero" else "fail"
        s["max_tokens"] = e.max_tokens or (gens[0]["max_tokens"] if gens else 128)
        s["max_prompt_tokens"], s["limit_why"] = set_prompt_limit(g, gens[0] if gens else None, s["max_tokens"])
        s["bad_rows"] = (own or first_data or {}).get("on_error", "fail")
        s["k"] = e.k or e.samples
        s["name"] = name
        out[name] = s
    return out


def set_prompt_limit(g: Graph, gen: dict[str, Any] | None, max_tokens: int) -> tuple[int | None, str]:
    """(the longest prompt of a held-out set the generate node (`gen`: its params) takes when it
    answers in up to `max_tokens` (the set's), why), or (None, "") when the model's context is not known
    before loading it: the training dataset's rule (dora/graph/prompt_limits.py) with the set's
    max_tokens."""
    context = import_object(CONTEXT_OF)(g.model) if gen is not None and isinstance(g.model, dict) else None
    if context is None:
        return None, ""
    most, why = import_object(ROOM_OF)({**gen, "max_tokens": max_tokens}, context)
    return most, f"the longest prompt the generate node takes: {why}"


def source_problem(source: str) -> str | None:
    """The dataset op's own check of a source (for `dora eval --data FILE`)."""
    return import_object(SOURCE_CHECK)(source)
