"""Validation: every problem of a Graph at once, each naming where, what, and what would be right.

`validate(graph)` works on any Graph (from YAML or the Python builder). File-level problems
(syntax, duplicate keys, unknown keys) come from dora.graph.yaml_io; `check_file` and
`load_and_validate` run both.
"""

from __future__ import annotations

import re
from typing import Iterable

from dora.graph.device_shares import share_problems, shared_pools
from dora.graph.diagnostics import Diagnostic, GraphError, error, errors_of, warning
from dora.graph.model import ROUTINGS, Graph
from dora.graph.op_registry import builtin_ops
from dora.graph.opspec import OpSpec, did_you_mean, fill_params, import_object, param_problems
from dora.graph.settings_check import settings_problems
from dora.graph.schema import Schemas, propagate, resolve_all

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
DEVICES = ("cpu", "gpu")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def producers_of(column: str) -> list[str]:
    """Built-in ops that can add `column` (for some params)."""
    return [s.name for s in builtin_ops().values() if column in s.adds or any(column in w.adds for w in s.when)]


def validate(g: Graph) -> list[Diagnostic]:
    """All errors and warnings of a graph (empty list: valid)."""
    diags: list[Diagnostic] = []
    specs, op_errors = resolve_all(g)
    _check_name(g, diags)
    _check_pools(g, specs, diags)
    diags += share_problems(g)
    _check_nodes(g, specs, op_errors, diags)
    _check_inputs(g, specs, diags)
    on_cycle = _check_cycles(g, specs, diags)
    _check_reachable(g, specs, on_cycle, diags)
    schemas = propagate(g, specs)
    _check_columns(g, schemas, diags)
    _check_weights(g, specs, diags)
    diags += settings_problems(g, specs)
    return diags


def _check_name(g: Graph, diags: list[Diagnostic]) -> None:
    if not isinstance(g.name, str) or not g.name:
        diags.append(error(f"pipeline 'name' must be a non-empty string, got {g.name!r}", g.loc_of("name")))


def _check_pools(g: Graph, specs: dict[str, OpSpec | None], diags: list[Diagnostic]) -> None:
    for name, p in g.pools.items():
        if p.device not in DEVICES:
            diags.append(error(f"pool {name!r}: device must be one of {list(DEVICES)}, got {p.device!r}", g.loc_of(f"pools.{name}.device")))
        if not _is_int(p.count) or p.count < 1:
            diags.append(error(f"pool {name!r}: count must be a positive int, got {p.count!r}", g.loc_of(f"pools.{name}.count")))
    used: dict[str, list[tuple[str, int, int]]] = {}
    for n, node in g.nodes.items():
        if node.pool is None:
            continue
        loc = g.loc_of(f"nodes.{n}.pool")
        if not isinstance(node.pool, str):
            spec = specs.get(n)
            if spec is not None and spec.sharded and isinstance(node.pool, (list, tuple)):
                diags.append(error(
                    f"the ranks of {spec.name} node {n!r} would span pools {list(node.pool)}: its {node.replicas} ranks "
                    "form one torch.distributed group (FSDP), which lives in one pool", loc, node=n,
                    hint=f"declare one pool with count >= {node.replicas} and name it here"))
            else:
                diags.append(error(f"pool must be the name of one pool, got {node.pool!r}", loc, node=n,
                                   hint=f"defined pools: {', '.join(g.pools) or 'none'}"))
            continue
        if node.pool not in g.pools:
            hint = did_you_mean(str(node.pool), list(g.pools)) or (
                f"defined pools: {', '.join(g.pools)}" if g.pools else f"define it under pools: {{{node.pool}: {{device: cpu, count: 1}}}}")
            diags.append(error(f"pool {node.pool!r} is not defined", loc, node=n, hint=hint))
        elif _is_int(node.replicas) and _is_int(node.devices):
            used.setdefault(node.pool, []).append((n, node.replicas, node.devices))
    shared = shared_pools(g)   # every node declares a memory share: devices shared (dora/graph/device_shares.py)
    for pool, users in used.items():
        count = g.pools[pool].count
        total = sum(r * d for _, r, d in users)
        if _is_int(count) and total > count and pool not in shared:
            who = ", ".join(f"{n} ({r})" if d == 1 else f"{n} ({r} x {d} devices = {r * d})" for n, r, d in users)
            diags.append(error(
                f"pool {pool!r} is oversubscribed: its nodes need {total} devices, replicas x devices ({who}), "
                f"but it has count {count}",
                g.loc_of(f"pools.{pool}"),
                hint=f"raise pools.{pool}.count to {total} or lower the replicas or devices, or share its devices: "
                     "a memory share on each of its nodes (memory: 0.45)",
            ))


def _check_nodes(g: Graph, specs: dict[str, OpSpec | None], op_errors: dict[str, str], diags: list[Diagnostic]) -> None:
    for n, node in g.nodes.items():
        if not NAME_RE.match(n):
            diags.append(error("node names must start with a letter or '_' and hold only letters, digits, '_' and '-'", node.loc, node=n))
        if not _is_int(node.replicas) or node.replicas < 1:
            diags.append(error(f"replicas must be a positive int, got {node.replicas!r}", g.loc_of(f"nodes.{n}.replicas"), node=n))
        if not _is_int(node.devices) or node.devices < 1:
            diags.append(error(f"devices must be a positive int (devices per replica), got {node.devices!r}",
                               g.loc_of(f"nodes.{n}.devices"), node=n))
        if n in op_errors:
            diags.append(error(op_errors[n], g.loc_of(f"nodes.{n}.op"), node=n, hint="`dora ops` lists the built-in ops"))
        spec = specs.get(n)
        if spec is None:
            continue
        if not isinstance(node.params, dict):
            diags.append(error(f"params must be a mapping, got {node.params!r}", g.loc_of(f"nodes.{n}.params"), node=n))
            continue
        problems = param_problems(spec, node.params)
        for p in problems:
            diags.append(error(p.message, g.loc_of(f"nodes.{n}.params.{p.key}"), node=n, hint=p.hint))
        if not problems and spec.host_check is not None:
            for key, severity, message in import_object(spec.host_check)(fill_params(spec, node.params, checked=True)):
                diags.append((error if severity == "error" else warning)(message, g.loc_of(f"nodes.{n}.params.{key}"), node=n))
        if not problems and _is_int(node.devices) and node.devices > 1:
            _check_devices(g, n, spec, diags)
        if spec.is_source and node.replicas not in (1,) and _is_int(node.replicas):
            diags.append(warning(f"source op {spec.name!r} with {node.replicas} replicas emits the data {node.replicas} times", node.loc, node=n))


def _check_devices(g: Graph, n: str, spec: OpSpec, diags: list[Diagnostic]) -> None:
    """devices > 1: a sharded op's ranks hold one device each; other ops only if they declare how
    they use several (generate: a tensor-parallel group, on engines that can)."""
    node, loc = g.nodes[n], g.loc_of(f"nodes.{n}.devices")
    if spec.sharded:
        diags.append(error(
            f"devices: {node.devices} on {spec.name} node: each rank of its process group holds one device",
            loc, node=n, hint=f"replicas: {node.replicas * node.devices} gives one group of that many ranks"))
    elif spec.devices_check is None:
        diags.append(error(f"devices: {node.devices}: op {spec.name!r} runs each replica on one device", loc, node=n,
                           hint="use replicas for more copies"))
    else:
        problem = import_object(spec.devices_check)(fill_params(spec, node.params, checked=True), node.devices)
        if problem:
            diags.append(error(problem, loc, node=n))


def _check_inputs(g: Graph, specs: dict[str, OpSpec | None], diags: list[Diagnostic]) -> None:
    for n, node in g.nodes.items():
        spec = specs.get(n)
        for port, e in node.inputs.items():
            loc = g.loc_of(f"nodes.{n}.inputs.{port}")
            if spec is not None and spec.port(port) is None:
                ports = [p.name for p in spec.inputs]
                hint = did_you_mean(port, ports) or (f"op {spec.name!r} has input ports {ports}" if ports else f"op {spec.name!r} is a source and takes no inputs")
                diags.append(error(f"op {spec.name!r} has no input port {port!r}", loc, node=n, hint=hint))
            if e.src not in g.nodes:
                hint = did_you_mean(e.src, list(g.nodes)) or f"nodes: {', '.join(g.nodes)}"
                diags.append(error(f"input {port!r} names unknown node {e.src!r}", loc, node=n, hint=hint))
            else:
                src_spec = specs.get(e.src)
                if src_spec is not None and e.src_port not in src_spec.outputs:
                    hint = did_you_mean(e.src_port, list(src_spec.outputs)) or f"{e.src!r} has output ports {list(src_spec.outputs)}"
                    diags.append(error(f"input {port!r} names unknown port {e.src_port!r} of node {e.src!r}", loc, node=n, hint=hint))
            if not _is_int(e.capacity) or e.capacity < 1:
                diags.append(error(f"capacity must be a positive int, got {e.capacity!r}", loc, edge=e.label))
            if not _is_int(e.capacity_bytes) or e.capacity_bytes < 1:
                diags.append(error(f"capacity_bytes must be a positive int, got {e.capacity_bytes!r}", loc, edge=e.label))
            if not isinstance(e.routing, str) or not (e.routing in ROUTINGS or (e.routing.startswith("hash:") and len(e.routing) > 5)):
                diags.append(error(f"unknown routing {e.routing!r}", loc, edge=e.label, hint="round_robin, least_loaded or hash:COLUMN"))
            if e.group_by is not None and not isinstance(e.group_by, str):
                diags.append(error(f"group_by must be a column name, got {e.group_by!r}", loc, edge=e.label))
        if spec is not None:
            for p in spec.inputs:
                if p.name not in node.inputs:
                    diags.append(error(
                        f"op {spec.name!r} needs an input on port {p.name!r} but none is given",
                        node.loc, node=n, hint=f"inputs: {{{p.name}: NODE/out}}",
                    ))


def _check_cycles(g: Graph, specs: dict[str, OpSpec | None], diags: list[Diagnostic]) -> set[str]:
    if len(g.acyclic_prefix()) == len(g.nodes):
        return set()   # no cycle: networkx (0.3 s to import) is needed only to name one
    import networkx as nx

    dg = nx.DiGraph()
    dg.add_nodes_from(g.nodes)
    dg.add_edges_from((e.src, e.dst) for e in g.edges if e.src in g.nodes)
    on_cycle: set[str] = set()
    order = {n: i for i, n in enumerate(g.nodes)}
    for comp in sorted(nx.strongly_connected_components(dg), key=lambda c: min(order[n] for n in c)):
        if len(comp) == 1 and not dg.has_edge(next(iter(comp)), next(iter(comp))):
            continue
        on_cycle |= comp
        start = min(comp, key=order.__getitem__)
        cycle = [u for u, _ in nx.find_cycle(dg.subgraph(comp), source=start)]
        path = " -> ".join(cycle + [cycle[0]])
        back = next(((u, v) for u, v in zip(cycle, cycle[1:] + cycle[:1])
                     if (specs.get(u) and specs[u].is_update) and (specs.get(v) and specs[v].is_generate)), None)
        gens = [c for c in cycle if specs.get(c) is not None and specs[c].is_generate]
        if back is not None:
            hint = f"data edges must form a DAG; feed weights back with a weights edge instead: weights: [{{from: {back[0]}, to: {back[1]}}}]"
        elif len(gens) >= 2:
            hint = "data edges must form a DAG: feed one of these policies its prompts from a dataset"
        else:
            hint = "data edges must form a DAG; the one feedback edge an RL graph needs is a weights edge (update -> generate)"
        closing = g.nodes[cycle[0]].inputs
        loc = next((g.loc_of(f"nodes.{cycle[0]}.inputs.{p}") for p, e in closing.items() if e.src == cycle[-1]), g.nodes[cycle[0]].loc)
        what = (f"a cycle of data between the policies of generate nodes {', '.join(repr(x) for x in gens)}: {path} "
                "(each one's prompts wait for another's output, and no dataset starts it)" if len(gens) >= 2 and back is None
                else f"data edges form a cycle through {', '.join(repr(c) for c in cycle)}: {path}")
        diags.append(error(what, loc, node=cycle[0], hint=hint))
    return on_cycle


def _check_reachable(g: Graph, specs: dict[str, OpSpec | None], on_cycle: set[str], diags: list[Diagnostic]) -> None:
    # a source is a node that takes no inputs (a known source op, or an unknown op given none)
    sources = [n for n, node in g.nodes.items() if not node.inputs and (specs.get(n) is None or specs[n].is_source)]
    # an input from an unknown node is reported already; do not also call everything below it unreachable
    sources += [n for n, node in g.nodes.items() if any(e.src not in g.nodes for e in node.inputs.values())]
    seen = set(sources)
    todo = list(sources)
    while todo:
        for e in g.consumers(todo.pop()):
            if e.dst not in seen:
                seen.add(e.dst)
                todo.append(e.dst)
    for n, node in g.nodes.items():
        if n in seen or n in on_cycle or not node.inputs:
            continue  # nothing new to say: those already have their own error
        srcs = ", ".join(dict.fromkeys(e.src for e in node.inputs.values()))
        diags.append(error(
            f"node is unreachable from any source: its data comes only from {srcs}, which no source feeds",
            node.loc, node=n, hint="connect it downstream of a dataset (source) node",
        ))


def _check_columns(g: Graph, sch: Schemas, diags: list[Diagnostic]) -> None:
    for n, node in g.nodes.items():
        spec = sch.specs.get(n)
        params = sch.params.get(n) or ({k: p.default for k, p in spec.params.items()} if spec else {})
        for port, e in node.inputs.items():
            cols = sch.on_edge(e)
            if cols is None:
                continue
            loc = g.loc_of(f"nodes.{n}.inputs.{port}")
            if spec is not None and spec.port(port) is not None:
                for col in spec.needs(port, params):
                    if col in cols:
                        continue
                    ops = producers_of(col)
                    hint = (f"ops that add {col!r}: {', '.join(ops)}; put one upstream of {n!r}" if ops
                            else f"no built-in op adds {col!r}; a dataset task column or a user op must")
                    diags.append(error(
                        f"needs column {col!r} on input {port!r}, but no node upstream produces it "
                        f"(edge {e.src}/{e.src_port} carries: {', '.join(sorted(cols)) or 'nothing'})",
                        loc, node=n, hint=hint,
                    ))
            keyed = [("group_by", e.group_by)] if isinstance(e.group_by, str) else []
            if isinstance(e.routing, str) and e.routing.startswith("hash:"):
                keyed.append(("routing hash", e.routing[5:]))
            for what, col in keyed:
                if col not in cols:
                    hint = did_you_mean(col, sorted(cols)) or f"columns on this edge: {', '.join(sorted(cols))}"
                    diags.append(error(f"{what} column {col!r} does not flow on this edge", loc, edge=e.label, hint=hint))


def _check_weights(g: Graph, specs: dict[str, OpSpec | None], diags: list[Diagnostic]) -> None:
    seen: set[tuple[str, str]] = set()
    for i, w in enumerate(g.weights):
        label = f"weights {w.src} -> {w.dst}"
        loc = w.loc if w.loc.file is not None else g.loc_of(f"weights.{i}")
        for end, name, want in (("from", w.src, "update"), ("to", w.dst, "generate")):
            if name not in g.nodes:
                hint = did_you_mean(str(name), list(g.nodes)) or f"nodes: {', '.join(g.nodes)}"
                diags.append(error(f"weights edge '{end}' names unknown node {name!r}", loc, edge=label, hint=hint))
                continue
            spec = specs.get(name)
            ok = spec is not None and (spec.is_update if want == "update" else spec.is_generate)
            if spec is not None and not ok:
                cands = [n for n, s in specs.items() if s is not None and (s.is_update if want == "update" else s.is_generate)]
                diags.append(error(
                    f"a weights edge goes from an update op to a generate op, but {end} {name!r} is op {spec.name!r}",
                    loc, edge=label, hint=f"{want} nodes here: {', '.join(cands) or 'none'}",
                ))
        if (w.src, w.dst) in seen:
            diags.append(warning("duplicate weights edge", loc, edge=label))
        seen.add((w.src, w.dst))
    has_update = any(s is not None and s.is_update for s in specs.values())
    fed = {w.dst for w in g.weights}
    updates = [n for n, s in specs.items() if s is not None and s.is_update]
    for n, s in specs.items():
        if has_update and s is not None and s.is_generate and n not in fed:
            diags.append(warning(
                "generate node has no weights edge, so it samples from the initial policy for the whole run",
                g.nodes[n].loc, node=n, hint=f"weights: [{{from: {updates[0]}, to: {n}}}]",
            ))


def check_file(path: str, overrides: Iterable[str] = ()) -> tuple[Graph | None, list[Diagnostic]]:
    """Load and validate a pipeline file: (graph or None if it could not be built, all diagnostics)."""
    from dora.graph.yaml_io import load_file

    importable_folders(path)
    g, diags = load_file(path, overrides)
    if g is not None:
        diags = diags + validate(g)
    return g, diags


FOLDER_NOTE = "# pipeline folder: "   # a run's copy of its pipeline (RUN_DIR/pipeline.yaml) names the original's


def importable_folders(path: str) -> None:
    """Put the pipeline file's folder on sys.path (first), so a reward function or op in a module beside
    it imports without PYTHONPATH, in validation, in the run and in its workers (which inherit sys.path).
    A run's copy (--resume) names the original's folder on its first line (FOLDER_NOTE)."""
    import os
    import sys

    folders = [os.path.dirname(os.path.abspath(path))]
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        first = ""
    if first.startswith(FOLDER_NOTE):
        folders.insert(0, first[len(FOLDER_NOTE):].strip())
    for folder in reversed(folders):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)


def load_and_validate(path: str, overrides: Iterable[str] = ()) -> Graph:
    """Load and validate a pipeline file; raise GraphError listing every error (warnings pass)."""
    g, diags = check_file(path, overrides)
    if g is None or errors_of(diags):
        raise GraphError(diags)
    return g


def check(g: Graph) -> Graph:
    """Validate a graph built in Python; raise GraphError if it has errors."""
    diags = validate(g)
    if errors_of(diags):
        raise GraphError(diags)
    return g
