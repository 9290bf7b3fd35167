"""Pipeline files <-> Graph.

Loading keeps the file and line of every key (so errors can say `file:line:`), rejects
duplicate keys (PyYAML's plain loaders silently keep the last one), merges `defaults:`
files in order (this file wins), applies `key=value` overrides, then resolves omegaconf
`${...}` interpolation. Shape problems (unknown keys, a node without an op, ...) are
collected as diagnostics; value checks belong to dora.graph.validate.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

import yaml

from dora.graph.diagnostics import Diagnostic, GraphError, error, errors_of
from dora.graph.model import AsyncConfig, Edge, EvalSet, Graph, Node, Pool, RunConfig, SourceLoc, WeightsEdge
from dora.graph.opspec import did_you_mean
from dora.graph.sections import section_specs

TOP_KEYS = ("name", "description", "defaults", "model", "pools", "nodes", "weights", "async", "run", "eval")
NODE_KEYS = ("op", "params", "pool", "replicas", "devices", "memory", "model", "inputs")
EDGE_KEYS = ("from", "group_by", "capacity", "capacity_bytes", "routing")
POOL_KEYS = ("device", "count")
WEIGHTS_KEYS = ("from", "to")
ASYNC_KEYS = tuple(section_specs(AsyncConfig))
RUN_KEYS = tuple(section_specs(RunConfig))
EVAL_KEYS = tuple(section_specs(EvalSet))
COMMAND_LINE = SourceLoc("<command line>", None)
_DOLLAR_BRACE = re.compile(r"(\\*)\$\{")

Locs = dict[str, SourceLoc]


# ---------------------------------------------------------------- YAML text -> data + lines

def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


# An alias re-uses a node: expanding aliases of aliases grows exponentially (an "alias bomb"), and
# an anchor used inside itself never ends. A pipeline is a few hundred values; past this many
# expanded values the file is refused.
MAX_VALUES = 100_000


class _AliasError(Exception):
    def __init__(self, message: str, line: int | None):
        self.line = line
        super().__init__(message)


def _syntax_error(e: yaml.MarkedYAMLError, file: str) -> Diagnostic:
    """Name the line where the unclosed construct opened (context) and where the parser failed (problem)."""
    opened = e.context_mark.line + 1 if e.context_mark is not None else None
    failed = e.problem_mark.line + 1 if e.problem_mark is not None else None
    problem = e.problem or "syntax error"
    if opened is not None and failed is not None and opened != failed:
        what = (e.context or "").removeprefix("while parsing ").removeprefix("while scanning ").removeprefix("a ")
        return error(f"YAML syntax error: the {what} that opens here is not closed: {problem} "
                     f"(the parser failed at line {failed}, column {e.problem_mark.column + 1})",
                     SourceLoc(file, opened), hint="close it on its own line, or fix what the parser stopped at")
    what = " ".join(x for x in (e.context, problem) if x)
    return error(f"YAML syntax error: {what}", SourceLoc(file, failed or opened), hint="fix the YAML syntax at this line")


def compose(text: str, file: str) -> tuple[Any, Locs, list[Diagnostic]]:
    """Parse YAML text into plain data, recording the line of every mapping key and list item."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        return None, {}, [_syntax_error(e, file)]
    except yaml.YAMLError as e:
        return None, {}, [error(f"YAML error: {e}", SourceLoc(file, None))]
    locs: Locs = {}
    diags: list[Diagnostic] = []
    loader = yaml.SafeLoader("")
    active: set[int] = set()   # nodes being expanded now: meeting one again is a recursive anchor
    expanded = [0]

    def walk(node: yaml.Node, path: str) -> Any:
        line = node.start_mark.line + 1
        if id(node) in active:
            raise _AliasError(f"recursive anchor: the value at {path or 'the top level'} contains itself", line)
        expanded[0] += 1
        if expanded[0] > MAX_VALUES:
            raise _AliasError(f"aliases expand to more than {MAX_VALUES:,} values (an alias bomb?)", line)
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_object(node, deep=True)
        active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = []
                for i, item in enumerate(node.value):
                    p = _join(path, i)
                    locs[p] = SourceLoc(file, item.start_mark.line + 1)
                    items.append(walk(item, p))
                return items
            for knode, vnode in node.value:
                merged = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
                if knode.tag == "tag:yaml.org,2002:merge" and any(id(m) in active for m in merged):
                    raise _AliasError(f"recursive anchor: a merge key (<<) at {path or 'the top level'} merges "
                                      "the mapping that contains it", knode.start_mark.line + 1)
            loader.flatten_mapping(node)   # YAML merge keys (<<) first, then check duplicates
            out: dict[Any, Any] = {}
            first_line: dict[Any, int] = {}
            for knode, vnode in node.value:
                line = knode.start_mark.line + 1
                if not isinstance(knode, yaml.ScalarNode):
                    diags.append(error(f"mapping key at {path or 'top level'} is not a scalar", SourceLoc(file, line)))
                    continue
                key = loader.construct_object(knode, deep=True)
                if key in first_line:
                    diags.append(error(
                        f"duplicate key {key!r} in {path or 'the top level'} (first at line {first_line[key]})",
                        SourceLoc(file, line),
                        hint="each key may appear once in a mapping; merge the two entries",
                    ))
                    continue
                first_line[key] = line
                p = _join(path, key)
                locs[p] = SourceLoc(file, line)
                out[key] = walk(vnode, p)
            return out
        finally:
            active.discard(id(node))

    if root is None:
        return None, {}, [error("the pipeline file is empty", SourceLoc(file, 1))]
    try:
        data = walk(root, "")
    except _AliasError as e:
        return None, {}, [error(str(e), SourceLoc(file, e.line), hint="write the value out instead of aliasing it")]
    except RecursionError:   # a merge key (<<) that merges its own mapping loops inside PyYAML
        return None, {}, [error("recursive anchor: a merge key (<<) merges the mapping that contains it",
                                SourceLoc(file, None), hint="write the value out instead of aliasing it")]
    except yaml.YAMLError as e:   # e.g. a merge key whose value is not a mapping
        return None, {}, [_syntax_error(e, file) if isinstance(e, yaml.MarkedYAMLError) else error(f"YAML error: {e}", SourceLoc(file, None))]
    return data, locs, diags


# ---------------------------------------------------------------- defaults, overrides, interpolation

def _deep_merge(base: Any, top: Any) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for k, v in top.items():
            out[k] = _deep_merge(base[k], v) if k in base else v
        return out
    return top


def _load_file(path: str, stack: tuple[str, ...], text: str | None = None, base_dir: str | None = None) -> tuple[Any, Locs, list[Diagnostic]]:
    """Load `path` (or the given text, reported as `path`) with its defaults resolved
    relative to base_dir (default: the file's directory)."""
    if text is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            return None, {}, [error(f"cannot read pipeline file: {e.strerror}", SourceLoc(path, None))]
    if base_dir is None:
        base_dir = os.path.dirname(path)
    data, locs, diags = compose(text, path)
    if not isinstance(data, dict) or "defaults" not in data:
        return data, locs, diags
    defaults = data.pop("defaults")
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        diags.append(error("'defaults' must be a list of file names", locs.get("defaults"), hint="defaults: [base.yaml]"))
        return data, locs, diags
    merged: dict[str, Any] = {}
    merged_locs: Locs = {}
    for i, name in enumerate(defaults):
        sub_path = name if os.path.isabs(name) else os.path.join(base_dir, name)
        if os.path.abspath(sub_path) in stack:
            chain = " -> ".join(os.path.basename(s) for s in stack + (os.path.abspath(sub_path),))
            diags.append(error(f"defaults form a cycle: {chain}", locs.get(f"defaults.{i}", locs.get("defaults"))))
            continue
        if not os.path.exists(sub_path):
            diags.append(error(f"defaults file {name!r} not found (looked for {sub_path})", locs.get(f"defaults.{i}", locs.get("defaults"))))
            continue
        sub, sub_locs, sub_diags = _load_file(sub_path, stack + (os.path.abspath(sub_path),))
        diags.extend(sub_diags)
        if isinstance(sub, dict):
            merged = _deep_merge(merged, sub)
            merged_locs.update(sub_locs)
        elif sub is not None:
            diags.append(error(f"defaults file {name!r} is not a mapping", SourceLoc(sub_path, 1)))
    merged_locs.update(locs)
    return _deep_merge(merged, data), merged_locs, diags


# the mappings whose keys are names the pipeline chose (not a schema's): an override may only go
# through a name that exists there (a new entry is given whole: nodes.NAME={op: ...})
NAMED = {("nodes",): "node", ("pools",): "pool"}


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], locs: Locs) -> list[Diagnostic]:
    """Apply `dotted.key=value` overrides in place (values parsed as YAML scalars). Each override's
    location is `<command line: KEY=VALUE>`, recorded for every path it creates, so a mistyped key is
    reported there with did-you-mean; going through a node or pool the pipeline does not have is an
    error here (it would otherwise make an empty node)."""
    diags: list[Diagnostic] = []
    for ov in overrides:
        key, eq, raw = ov.partition("=")
        if not eq or not key.strip():
            diags.append(error(f"override {ov!r} is not key=value", COMMAND_LINE, hint="e.g. nodes.rollout.replicas=4"))
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        problem = _set_path(data, key.strip().split("."), value, ov, locs)
        if problem is not None:
            diags.append(problem)
    return diags


def _set_path(data: dict[str, Any], parts: list[str], value: Any, ov: str, locs: Locs) -> Diagnostic | None:
    """Set data[parts...] = value; the problem (a Diagnostic) if the path cannot be followed."""
    here = SourceLoc(f"<command line: {ov}>", None)
    cur: Any = data
    for i, part in enumerate(parts[:-1]):
        path = ".".join(parts[: i + 1])
        if isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
            continue
        if not isinstance(cur, dict):
            return error(f"override {ov!r}: {path} is not a mapping", here)
        what = NAMED.get(tuple(parts[:i]))
        if what is not None and part not in cur:
            known = [str(k) for k in cur]
            hint = did_you_mean(part, known) or (f"{what}s: {', '.join(known)}." if known else f"the pipeline has no {what}s.")
            return error(f"override {ov!r} names {what} {part!r}, which the pipeline does not have", here,
                         hint=f"{hint} To add a {what}, give it whole: {'.'.join(parts[:i])}.NAME={{...}}")
        if part not in cur:
            locs.setdefault(path, here)   # (a key it creates is reported at the override)
        cur = cur.setdefault(part, {})
    last = parts[-1]
    if isinstance(cur, list) and last.isdigit() and int(last) < len(cur):
        cur[int(last)] = value
    elif isinstance(cur, dict):
        cur[last] = value
    else:
        return error(f"override {ov!r}: {'.'.join(parts[:-1])} is not a mapping", here)
    locs[".".join(parts)] = here
    return None


def _has_interpolation(x: Any) -> bool:
    if isinstance(x, str):
        return "${" in x
    if isinstance(x, dict):
        return any(_has_interpolation(v) for v in x.values())
    if isinstance(x, list):
        return any(_has_interpolation(v) for v in x)
    return False


def interpolate(data: dict[str, Any], locs: Locs, file: str | None) -> tuple[dict[str, Any], list[Diagnostic]]:
    """Resolve omegaconf `${...}` references (only when there are any: omegaconf would
    otherwise still reinterpret values such as '???')."""
    if not _has_interpolation(data):
        return data, []
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True), []
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        loc = locs.get(key, SourceLoc(file, None))
        msg = str(e).splitlines()[0]
        return data, [error(f"interpolation failed at {key or '?'}: {msg}", loc, hint="${a.b} refers to another key of this file")]


# ---------------------------------------------------------------- data -> Graph

def _check_keys(d: dict[str, Any], allowed: tuple[str, ...], what: str, path: str, locs: Locs, file: str | None, node: str | None = None) -> list[Diagnostic]:
    out = []
    for k in d:
        if k not in allowed:
            hint = did_you_mean(str(k), list(allowed)) or f"allowed keys: {', '.join(allowed)}"
            out.append(error(f"unknown key {k!r} in {what}", locs.get(_join(path, k), SourceLoc(file, None)), node=node, hint=hint))
    return out


def _parse_input(node: str, port: str, spec: Any, path: str, locs: Locs, file: str | None) -> tuple[Edge | None, list[Diagnostic]]:
    loc = locs.get(path, SourceLoc(file, None))
    opts: dict[str, Any] = {}
    if isinstance(spec, dict):
        diags = _check_keys(spec, EDGE_KEYS, f"input {port!r}", path, locs, file, node)
        if "from" not in spec:
            return None, diags + [error(f"input {port!r} has no 'from'", loc, node=node, hint="inputs: {port: {from: NODE/out, group_by: group_id}}")]
        src = spec["from"]
        opts = {k: v for k, v in spec.items() if k in EDGE_KEYS and k != "from"}
    else:
        diags = []
        src = spec
    if not isinstance(src, str) or not src:
        return None, diags + [error(f"input {port!r} must be 'NODE/PORT' or a mapping with 'from', got {src!r}", loc, node=node)]
    src_node, _, src_port = src.partition("/")
    edge = Edge(src=src_node, src_port=src_port or "out", dst=node, dst_port=str(port), loc=loc, **opts)
    return edge, diags


def graph_from_data(data: Any, locs: Locs, file: str | None) -> tuple[Graph | None, list[Diagnostic]]:
    """Build a Graph from loaded data; shape problems become diagnostics (values are checked by validate)."""
    if not isinstance(data, dict):
        return None, [error(f"a pipeline file must be a mapping (name, pools, nodes, ...), got {type(data).__name__}", SourceLoc(file, 1))]
    diags = _check_keys(data, TOP_KEYS, "the pipeline (top level)", "", locs, file)

    def section(key: str, kind: type, default: Any) -> Any:
        v = data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, kind):
            diags.append(error(f"'{key}' must be a {'mapping' if kind is dict else 'list'}, got {type(v).__name__}", locs.get(key, SourceLoc(file, None))))
            return default
        return v

    default_name = os.path.splitext(os.path.basename(file))[0] if file else "pipeline"
    g = Graph(name=data.get("name", default_name), source_file=file, locs=dict(locs))
    g.model = section("model", dict, {})
    for pname, p in section("pools", dict, {}).items():
        path = f"pools.{pname}"
        if not isinstance(p, dict):
            diags.append(error(f"pool {pname!r} must be a mapping {{device, count}}", locs.get(path)))
            continue
        diags += _check_keys(p, POOL_KEYS, f"pool {pname!r}", path, locs, file)
        g.pools[str(pname)] = Pool(name=str(pname), loc=locs.get(path, SourceLoc(file, None)), **{k: v for k, v in p.items() if k in POOL_KEYS})
    for name, n in section("nodes", dict, {}).items():
        path = f"nodes.{name}"
        loc = locs.get(path, SourceLoc(file, None))
        if not isinstance(n, dict):
            diags.append(error("a node must be a mapping with at least 'op'", loc, node=str(name)))
            continue
        diags += _check_keys(n, NODE_KEYS, f"node {name!r}", path, locs, file, node=str(name))
        if "op" not in n:
            diags.append(error("node has no 'op'", loc, node=str(name), hint="e.g. op: generate (see `dora ops`)"))
            continue
        params = n.get("params") or {}
        if not isinstance(params, dict):
            diags.append(error("'params' must be a mapping", locs.get(f"{path}.params", loc), node=str(name)))
            params = {}
        node = Node(name=str(name), op=n["op"], params=params, pool=n.get("pool"), replicas=n.get("replicas", 1),
                    devices=n.get("devices", 1), memory=n.get("memory"), model=n.get("model"), loc=loc)
        inputs = n.get("inputs") or {}
        if not isinstance(inputs, dict):
            diags.append(error("'inputs' must be a mapping of port -> NODE/PORT", locs.get(f"{path}.inputs", loc), node=str(name), hint="inputs: {prompts: prompts/out}"))
            inputs = {}
        for port, spec in inputs.items():
            edge, d = _parse_input(str(name), str(port), spec, f"{path}.inputs.{port}", locs, file)
            diags += d
            if edge is not None:
                node.inputs[str(port)] = edge
        g.nodes[str(name)] = node
    for i, w in enumerate(section("weights", list, [])):
        path = f"weights.{i}"
        loc = locs.get(path, SourceLoc(file, None))
        if not isinstance(w, dict) or "from" not in w or "to" not in w:
            diags.append(error(f"weights entry {i} must be {{from: UPDATE_NODE, to: GENERATE_NODE}}, got {w!r}", loc))
            continue
        diags += _check_keys(w, WEIGHTS_KEYS, f"weights entry {i}", path, locs, file)
        g.weights.append(WeightsEdge(src=w["from"], dst=w["to"], loc=loc))
    a = section("async", dict, {})
    diags += _check_keys(a, ASYNC_KEYS, "async", "async", locs, file)
    g.async_ = AsyncConfig(loc=locs.get("async", SourceLoc(file, None)), **{k: v for k, v in a.items() if k in ASYNC_KEYS})
    r = section("run", dict, {})
    diags += _check_keys(r, RUN_KEYS, "run", "run", locs, file)
    g.run = RunConfig(loc=locs.get("run", SourceLoc(file, None)), **{k: v for k, v in r.items() if k in RUN_KEYS})
    for name, e in section("eval", dict, {}).items():
        path = f"eval.{name}"
        if not isinstance(e, dict):
            diags.append(error(f"held-out set {name!r} must be a mapping (source, size, ...)", locs.get(path, SourceLoc(file, None)),
                               hint="eval: {heldout: {source: 'synthetic:quickstart', seed: 1, size: 64}}"))
            continue
        diags += _check_keys(e, EVAL_KEYS, f"held-out set {name!r}", path, locs, file)
        g.evals[str(name)] = EvalSet(loc=locs.get(path, SourceLoc(file, None)), **{k: v for k, v in e.items() if k in EVAL_KEYS})
    if "description" in data:
        g.description = data["description"]
    return g, diags


# ---------------------------------------------------------------- public entry points

def load_text(text: str, file: str = "<string>", overrides: Iterable[str] = (), base_dir: str = ".") -> tuple[Graph | None, list[Diagnostic]]:
    """Load a pipeline from YAML text; `defaults:` files are looked up in base_dir."""
    data, locs, diags = _load_file(file, (), text=text, base_dir=base_dir)
    return _finish(data, locs, diags, file, overrides)


def load_file(path: str, overrides: Iterable[str] = ()) -> tuple[Graph | None, list[Diagnostic]]:
    """Load a pipeline file with its defaults and overrides. Returns (graph or None, diagnostics)."""
    data, locs, diags = _load_file(path, (os.path.abspath(path),))
    return _finish(data, locs, diags, path, overrides)


def _finish(data: Any, locs: Locs, diags: list[Diagnostic], file: str, overrides: Iterable[str]) -> tuple[Graph | None, list[Diagnostic]]:
    if data is None or errors_of(diags):
        return None, diags
    if isinstance(data, dict):
        data.pop("defaults", None)
        diags += apply_overrides(data, list(overrides), locs)
        data, d = interpolate(data, locs, file)
        diags += d
    g, d = graph_from_data(data, locs, file)
    return g, diags + d


def override_graph(g: Graph, overrides: Iterable[str]) -> tuple[Graph | None, list[Diagnostic]]:
    """A Graph (from YAML or the Python builder) with `key=value` overrides applied as the command line
    applies them to a file: the same paths, checks and did-you-mean. Keys keep their locations."""
    overrides = list(overrides)
    if not overrides:
        return g, []
    locs = dict(g.locs)
    return _finish(graph_to_data(g), locs, [], g.source_file or "<python>", overrides)


def load_graph(path: str, overrides: Iterable[str] = ()) -> Graph:
    """Load a pipeline file; raise GraphError if it cannot be loaded (no validation)."""
    g, diags = load_file(path, overrides)
    if g is None or errors_of(diags):
        raise GraphError(diags)
    return g


# ---------------------------------------------------------------- Graph -> YAML

def _escape(x: Any) -> Any:
    """Escape literal '${' so that interpolation on reload gives the same string back."""
    if isinstance(x, str):
        # omegaconf reads "\${" as a literal "${", and halves backslashes right before "${"
        return _DOLLAR_BRACE.sub(lambda m: m.group(1) * 2 + "\\${", x)
    if isinstance(x, dict):
        return {k: _escape(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_escape(v) for v in x]
    return x


def graph_to_data(g: Graph) -> dict[str, Any]:
    """The plain-data form of a Graph (what to_yaml writes)."""
    defaults = Edge("", "", "", "")
    d: dict[str, Any] = {"name": g.name}
    if g.description is not None:
        d["description"] = g.description
    if g.model:
        d["model"] = dict(g.model)
    if g.pools:
        d["pools"] = {n: {"device": p.device, "count": p.count} for n, p in g.pools.items()}
    nodes: dict[str, Any] = {}
    for name, n in g.nodes.items():
        nd: dict[str, Any] = {"op": n.op}
        if n.pool is not None:
            nd["pool"] = n.pool
        if n.replicas != 1:
            nd["replicas"] = n.replicas
        if n.devices != 1:
            nd["devices"] = n.devices
        if n.memory is not None:
            nd["memory"] = n.memory
        if n.model is not None:
            nd["model"] = n.model
        if n.inputs:
            ins: dict[str, Any] = {}
            for port, e in n.inputs.items():
                ref = f"{e.src}/{e.src_port}"
                opts = {k: getattr(e, k) for k in EDGE_KEYS[1:] if getattr(e, k) != getattr(defaults, k)}
                ins[port] = {"from": ref, **opts} if opts else ref
            nd["inputs"] = ins
        if n.params:
            nd["params"] = dict(n.params)
        nodes[name] = nd
    d["nodes"] = nodes
    if g.weights:
        d["weights"] = [{"from": w.src, "to": w.dst} for w in g.weights]
    # (policies only where set: a single-policy pipeline's pipeline.yaml reads as it always did)
    d["async"] = {k: getattr(g.async_, k) for k in ASYNC_KEYS if k != "policies" or g.async_.policies}
    run = {k: getattr(g.run, k) for k in RUN_KEYS if getattr(g.run, k) != section_specs(RunConfig)[k].default}
    if run:
        d["run"] = run
    if g.evals:
        defaults = section_specs(EvalSet)
        d["eval"] = {n: {k: getattr(e, k) for k in EVAL_KEYS if getattr(e, k) != defaults[k].default}
                     for n, e in g.evals.items()}
    return _escape(d)


class _Dumper(yaml.SafeDumper):
    pass


def _flow_small(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    # short leaf mappings (pools, edge options, weights) read best on one line
    flow = len(data) <= 4 and all(not isinstance(v, (dict, list, tuple)) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


_Dumper.add_representer(dict, _flow_small)
_Dumper.add_representer(tuple, lambda d, t: d.represent_list(list(t)))


def to_yaml(g: Graph) -> str:
    """YAML text for a Graph; loading it gives an equal Graph."""
    return yaml.dump(graph_to_data(g), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
