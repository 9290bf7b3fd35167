"""Shared helpers for the graph tests (no tests here): a small valid pipeline and a way to check variants of it."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from dora.graph.builtin_ops import BUILTIN_OPS
from dora.graph.model import AsyncConfig, Edge, Graph, Node, Pool, RunConfig, WeightsEdge
from dora.rl.rollout import POLICIES

ASYNC_MODES = POLICIES.names()
from dora.graph.validate import check_file

BASE = """\
name: t
pools:
  rollout: {device: cpu, count: 2}
  train: {device: cpu, count: 1}
nodes:
  prompts: {op: dataset, params: {group_size: 4}}
  rollout: {op: generate, pool: rollout, replicas: 2, inputs: {prompts: prompts/out}, params: {max_tokens: 8}}
  reward: {op: reward, inputs: {trajectories: rollout/out}}
  advantage: {op: advantage, inputs: {scored: {from: reward/out, group_by: group_id}}}
  train: {op: update, pool: train, inputs: {batch: advantage/out}}
weights:
  - {from: train, to: rollout}
async: {mode: sync, max_staleness: 1, rollout_batch: 16, train_batch: 16}
"""


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def diagnose(tmp_path: Path, text: str, overrides=()) -> list:
    _, diags = check_file(write(tmp_path, text), overrides)
    return diags


def errors(tmp_path: Path, text: str, overrides=()) -> list:
    return [d for d in diagnose(tmp_path, text, overrides) if d.severity == "error"]


def line_of(text: str, needle: str, nth: int = 0) -> int:
    """1-based line number of the nth line containing needle."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return hits[nth]


# ---------------------------------------------------------------- random graphs (hypothesis)

names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9),
                   st.floats(allow_nan=False, allow_infinity=False), text)
plain = st.recursive(scalar, lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(names, kids, max_size=3)), max_leaves=6)


def value_for(ps) -> st.SearchStrategy:
    base = ps.type.rstrip("?")
    if ps.choices:
        s = st.sampled_from(ps.choices)
    else:
        lo, hi = ps.min, ps.max   # a declared range is part of what makes a value valid
        s = {"int": st.integers(-10**6 if lo is None else int(lo), 10**6 if hi is None else int(hi)),
             "float": st.floats(lo, hi, allow_nan=False, allow_infinity=False),
             "bool": st.booleans(), "str": text, "list": st.lists(plain, max_size=3),
             "dict": st.dictionaries(names, plain, max_size=3)}[base]
    return st.one_of(st.none(), s) if ps.optional else s


@st.composite
def graphs(draw) -> Graph:
    pool_names = draw(st.lists(names, max_size=3, unique=True))
    pools = {p: Pool(p, draw(st.sampled_from(["cpu", "gpu"])), draw(st.integers(1, 16))) for p in pool_names}
    node_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    nodes: dict[str, Node] = {}
    for i, n in enumerate(node_names):
        spec = BUILTIN_OPS[draw(st.sampled_from(sorted(BUILTIN_OPS)))]
        keys = draw(st.lists(st.sampled_from(sorted(spec.params)), max_size=4, unique=True))
        params = {k: draw(value_for(spec.params[k])) for k in keys}
        node = Node(n, spec.name, params, draw(st.one_of(st.none(), st.sampled_from(pool_names))) if pool_names else None,
                    draw(st.integers(1, 4)), devices=draw(st.integers(1, 3)),
                    memory=draw(st.one_of(st.none(), st.floats(0.01, 1.0))))
        for port in spec.inputs:
            if i == 0:
                break
            src = draw(st.sampled_from(node_names[:i]))
            node.inputs[port.name] = Edge(
                src, "out", n, port.name,
                group_by=draw(st.one_of(st.none(), st.sampled_from(["group_id", "uid"]))),
                capacity=draw(st.integers(1, 64)), capacity_bytes=draw(st.sampled_from([64 << 20, 1 << 20])),
                routing=draw(st.sampled_from(["round_robin", "least_loaded", "hash:group_id"])))
        nodes[n] = node
    weights = [WeightsEdge(draw(st.sampled_from(node_names)), draw(st.sampled_from(node_names))) for _ in range(draw(st.integers(0, 2)))]
    run = RunConfig(seed=draw(st.integers(0, 100)), out=draw(st.one_of(st.none(), text)))
    description = draw(st.one_of(st.none(), text))
    return Graph(
        name=draw(text.filter(bool)), nodes=nodes, pools=pools, weights=weights,
        model=draw(st.dictionaries(names, plain, max_size=4)),
        async_=AsyncConfig(draw(st.sampled_from(ASYNC_MODES)), draw(st.integers(0, 8)), draw(st.integers(1, 512)), draw(st.integers(1, 512))),
        run=run, description=description,
    )


@st.composite
def valid_graphs(draw) -> Graph:
    """Random pipelines that validate: dataset -> generate -> [reference] -> reward -> [critic]
    -> [filter] -> advantage -> update, random names, params, pools, replicas and async."""
    with_ref, with_critic, with_filter = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    ops = ["dataset", "generate"] + (["reference"] if with_ref else []) + ["reward"] + (["critic"] if with_critic else []) \
        + (["filter"] if with_filter else []) + ["advantage", "update"]
    node_names = draw(st.lists(names, min_size=len(ops), max_size=len(ops), unique=True))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    sync = draw(st.sampled_from(["file", "broadcast"]))   # both ends of the weights edge agree; broadcast needs torch
    engine = "torch" if sync == "broadcast" else draw(st.sampled_from(["torch", "vllm"]))
    fixed = {"dataset": {"group_size": group, "task_params": {}},   # (the task's generator checks its own arguments)
             "generate": {"weight_sync": sync, "engine": engine,
                          "dtype": draw(st.sampled_from(["float32", "bfloat16"])),
                          # single-turn, or multi-turn with a tool (whose rules tie these together)
                          **draw(st.sampled_from([{"max_turns": 1, "tools": []},
                                                  {"max_turns": 3, "tools": [{"name": "search", "top_k": 2}],
                                                   "max_tokens": 16, "max_total_tokens": 64,
                                                   "observation_template": "<{observation}>"}]))},
             "reward": {"sources": []},   # a list whose items the op checks (reward_sources.py): one fn here
             "advantage": {"estimator": "gae" if with_critic else draw(st.sampled_from(["grpo", "rloo"])),
                           "kl_coef": draw(st.sampled_from([0.0, 0.01])) if with_ref else 0.0},
             "update": {"kl_coef": draw(st.sampled_from([0.0, 0.05])) if with_ref else 0.0, "weight_sync": sync,
                        "broadcast_to": 0,
                        # a dict whose content the op checks: any of the corrections, never an arbitrary mapping
                        "off_policy": draw(st.sampled_from([{"name": "none"}, {"name": "tis", "cap": 2.0},
                                                            {"name": "m2po", "m2_max": 0.04}, {"name": "ess_lr"},
                                                            {"name": "icepop"}, {"name": "decoupled"}]))}}
    pools = {"gen": Pool("gen", "cpu", 0), "learn": Pool("learn", draw(st.sampled_from(["cpu", "gpu"])), 0)}
    nodes: dict[str, Node] = {}
    for i, (n, op) in enumerate(zip(node_names, ops)):
        spec = BUILTIN_OPS[op]
        # a name from a registry (names_from) is valid only if it names something: keep the default
        free = sorted(k for k, ps in spec.params.items() if k not in fixed.get(op, {}) and ps.names_from is None)
        params = {k: draw(value_for(spec.params[k])) for k in draw(st.lists(st.sampled_from(free), max_size=3, unique=True))}
        params.update(fixed.get(op, {}))
        if op == "generate" and engine != "torch":
            params.pop("kv_cache_gb", None)   # the torch engine's setting: vllm refuses it (generate.check_params)
        # prompts must fit the context (512: the tiny model's) with max_tokens beside them on vllm, and a
        # dataset's max_prompt_tokens within that (dora/graph/prompt_limits.py)
        if op == "generate" and params.get("max_tokens"):
            params["max_tokens"] = min(params["max_tokens"], 448)
        if op == "dataset" and params.get("max_prompt_tokens"):
            params["max_prompt_tokens"] = min(params["max_prompt_tokens"], 64)
        pool = "gen" if op == "generate" else "learn" if op in ("update", "critic", "reference") else None
        # generate: data-parallel replicas, a TP group each on vllm; update/critic/reference: ranks of one group
        devices = draw(st.integers(1, 2)) if op == "generate" and params.get("engine") == "vllm" else 1
        node = Node(n, op, params, pool, draw(st.integers(1, 3)) if op in ("generate", "update", "critic", "reference") else 1,
                    devices=devices)
        if i:
            port = spec.inputs[0].name
            node.inputs[port] = Edge(node_names[i - 1], "out", n, port,
                                     group_by="group_id" if op in ("advantage", "filter") else None,
                                     capacity=draw(st.integers(1, 16)))
        nodes[n] = node
    for p in pools.values():
        p.count = sum(nd.replicas * nd.devices for nd in nodes.values() if nd.pool == p.name) + draw(st.integers(0, 2))
    # async settings the mode can run (sections.resolve_mode): whole groups, K >= 1 when streaming
    mode = draw(st.sampled_from(ASYNC_MODES))
    tbs = 8 * draw(st.integers(1, 8))
    rbs = draw(st.sampled_from([tbs, tbs + 8 * draw(st.integers(1, 4))]))
    return Graph(name=draw(names), nodes=nodes, pools=pools,
                 weights=[WeightsEdge(node_names[-1], node_names[1])],
                 async_=AsyncConfig(mode, draw(st.integers(0 if mode in ("sync", "one_step_off") else 1, 4)), rbs, tbs))
