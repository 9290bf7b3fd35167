"""The Python front door: build the same Graph as a YAML file, by calling.

    p = Pipeline("grpo", model={...}, pools={"rollout": ("cpu", 2), "train": ("cpu", 1)})
    prompts = p.node("prompts", "dataset", size=64)
    rollout = p.node("rollout", "generate", pool="rollout", replicas=2, temperature=1.0)
    reward = p.node("reward", "reward", fn="synthetic")
    adv = p.node("advantage", "advantage", estimator="grpo")
    train = p.node("train", "update", pool="train")
    prompts >> rollout >> reward >> adv.scored.opts(group_by="group_id")
    adv >> train
    train.weights >> rollout.weights          # the weights edge
    p.eval_set("heldout", source="synthetic:quickstart", size=64, every=10)   # a held-out set
    p.to_yaml(); p.graph; p.validate()

`a >> b` joins a's output port `out` to b's only input port; `a.out >> b.port` names them.

Every node, edge, pool and section remembers the Python file:line that made it (`Graph.locs`, as a
YAML file's keys do), so `dora validate`'s errors on a built graph name the user's line. A mistake the
builder itself sees (a typo in a keyword, a node made twice) is a BuildError naming that line.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dora.graph.diagnostics import Diagnostic
from dora.graph.model import AsyncConfig, Edge, EvalSet, Graph, Node, Pool, RunConfig, SourceLoc, WeightsEdge
from dora.graph.op_registry import resolve_op
from dora.graph.opspec import OpError, did_you_mean
from dora.graph.sections import section_specs

WEIGHTS_PORT = "weights"
_DORA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class BuildError(ValueError):
    """A builder call that cannot make what it asks for; the message starts with the caller's file:line."""

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.loc = loc or caller_loc()
        super().__init__(f"{self.loc}: {message}")


def caller_loc() -> SourceLoc:
    """The file:line of the first frame outside the dora package: the user's line that called in."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_DORA_DIR):
        frame = frame.f_back
    return SourceLoc(frame.f_code.co_filename, frame.f_lineno) if frame is not None else SourceLoc("<python>", None)


def _known_keys(given: dict[str, Any], allowed: list[str], what: str) -> None:
    """BuildError naming the first key of `given` that is not in `allowed`, with did-you-mean."""
    for key in given:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed) or f"{what} takes {', '.join(allowed)}"
            raise BuildError(f"unknown {what} key {key!r} ({hint})")


def _section(cls: type, value: Any, what: str) -> Any:
    """An AsyncConfig / RunConfig from itself or a dict whose keys are checked (did-you-mean)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise BuildError(f"{what} must be a dict or {cls.__name__}, got {type(value).__name__}")
    _known_keys(value, list(section_specs(cls)), what)
    return cls(**_plain(value))


def _plain(x: Any) -> Any:
    """Tuples to lists (YAML has only lists), recursively, so built graphs round-trip."""
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


class PortRef:
    """A node's port, optionally with edge options (for the destination side)."""

    def __init__(self, node: "NodeRef", port: str, options: dict[str, Any] | None = None):
        self.node = node
        self.port = port
        self.options = dict(options or {})

    def opts(self, **options: Any) -> "PortRef":
        """This port with edge options for the edge that ends here: group_by, capacity, capacity_bytes,
        routing (as in YAML)."""
        _known_keys(options, ["group_by", "capacity", "capacity_bytes", "routing"], "edge option")
        return PortRef(self.node, self.port, {**self.options, **{k: v for k, v in options.items() if v is not None}})

    def __rshift__(self, other: "PortRef | NodeRef") -> "NodeRef":
        pipe = self.node._pipeline
        if not isinstance(other, (PortRef, NodeRef)):
            raise BuildError(f"{self.node.name}.{self.port} >> {other!r}: the right-hand side must be a node or a port "
                             "(p.node(...) or node.PORT)")
        dst = other if isinstance(other, PortRef) else PortRef(other, other._only_input())
        if (self.port == WEIGHTS_PORT) != (dst.port == WEIGHTS_PORT):
            raise BuildError(f"{self.node.name}.{self.port} >> {dst.node.name}.{dst.port}: a weights port joins only another weights port")
        if self.port == WEIGHTS_PORT:
            pipe.weights(self.node, dst.node)
        else:
            pipe.connect(self.node.name, self.port, dst.node.name, dst.port, **dst.options)
        return dst.node

    def __repr__(self) -> str:
        return f"PortRef({self.node.name}.{self.port})"


class NodeRef:
    """A handle on a node in a Pipeline; attribute access names a port (`rollout.prompts`)."""

    def __init__(self, pipeline: "Pipeline", name: str):
        self._pipeline = pipeline
        self.name = name

    @property
    def node(self) -> Node:
        return self._pipeline.graph.nodes[self.name]

    def port(self, name: str) -> PortRef:
        return PortRef(self, name)

    def __getattr__(self, name: str) -> PortRef:
        if name.startswith("_"):
            raise AttributeError(name)
        return PortRef(self, name)

    def _only_input(self) -> str:
        op = self.node.op
        try:
            ports = [p.name for p in resolve_op(op).inputs]
        except OpError as e:
            raise BuildError(f"node {self.name!r}: cannot pick an input port: {e}; name it, e.g. a >> {self.name}.PORT") from None
        if len(ports) != 1:
            raise BuildError(f"node {self.name!r} (op {op!r}) has input ports {ports}; name one, e.g. a >> {self.name}.{ports[0] if ports else 'PORT'}")
        return ports[0]

    def __rshift__(self, other: "NodeRef | PortRef") -> "NodeRef":
        return PortRef(self, "out") >> other

    def __repr__(self) -> str:
        return f"NodeRef({self.name})"


class Pipeline:
    """Builds a dora.graph.model.Graph. `pools` values are Pool, (device, count) or {device, count};
    `async_` and `run` are dicts of the YAML sections' keys (or AsyncConfig / RunConfig)."""

    ARGS = ("model", "pools", "async_", "run", "description")

    def __init__(self, name: str, model: dict[str, Any] | None = None, pools: dict[str, Any] | None = None,
                 async_: AsyncConfig | dict[str, Any] | None = None, run: RunConfig | dict[str, Any] | None = None,
                 description: str | None = None, **unknown: Any):
        if "async" in unknown:   # Pipeline(name, **yaml_dict): the YAML key, which Python cannot spell
            async_ = unknown.pop("async")
        _known_keys(unknown, list(self.ARGS), "Pipeline()")
        loc = caller_loc()
        self.graph = Graph(name=name, model=_plain(dict(model or {})), run=_section(RunConfig, run or {}, "run"),
                           description=description, source_file=loc.file)
        self.graph.run.loc = loc
        self.graph.locs.update({key: loc for key in ("name", "model", "run", "description", "async")})
        for pname, p in (pools or {}).items():
            self.pool(pname, p)
        if async_ is not None:
            self.set_async(async_)

    def pool(self, name: str, spec: Any = ("cpu", 1)) -> Pool:
        loc = caller_loc()
        if isinstance(spec, Pool):
            pool = Pool(name=name, device=spec.device, count=spec.count, loc=loc)
        elif isinstance(spec, dict):
            _known_keys(spec, ["device", "count"], f"pool {name!r}")
            pool = Pool(name=name, loc=loc, **spec)
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            device, count = spec
            pool = Pool(name=name, device=device, count=count, loc=loc)
        else:
            raise BuildError(f"pool {name!r} must be (device, count), {{device, count}} or a Pool, got {spec!r}")
        self.graph.pools[name] = pool
        self.graph.locs[f"pools.{name}"] = loc
        return pool

    def set_async(self, cfg: AsyncConfig | dict[str, Any] | None = None, **kw: Any) -> AsyncConfig:
        loc = caller_loc()
        if isinstance(cfg, AsyncConfig) and not kw:
            self.graph.async_ = cfg
        else:
            self.graph.async_ = _section(AsyncConfig, {**(cfg or {}), **kw}, "async")
        self.graph.async_.loc = loc
        self.graph.locs["async"] = loc
        return self.graph.async_

    def node(self, name: str, op: str, *, pool: str | None = None, replicas: int = 1, devices: int = 1,
             memory: float | None = None, model: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
             **kw_params: Any) -> NodeRef:
        """Add a node; params come as `params=` and/or keyword arguments. `devices` is per replica;
        `memory` the fraction of each of its devices' memory a replica holds (sharing a pool's devices);
        `model` this node's model, merged over the pipeline's (a policy of its own size)."""
        loc = caller_loc()
        if name in self.graph.nodes:
            raise BuildError(f"node {name!r} already exists (made at {self.graph.nodes[name].loc})", loc)
        self.graph.nodes[name] = Node(name=name, op=op, params=_plain({**(params or {}), **kw_params}), pool=pool,
                                      replicas=replicas, devices=devices, memory=memory,
                                      model=_plain(dict(model)) if model is not None else None, loc=loc)
        self.graph.locs[f"nodes.{name}"] = loc
        return NodeRef(self, name)

    def eval_set(self, name: str, **settings: Any) -> EvalSet:
        """A held-out set of the `eval:` section (settings as in YAML: source=, size=, every=, ...)."""
        self.graph.evals[name] = EvalSet(**_plain(settings))
        return self.graph.evals[name]

    def connect(self, src: str, src_port: str, dst: str, dst_port: str, **options: Any) -> Edge:
        loc = caller_loc()
        for end in (src, dst):
            if end not in self.graph.nodes:
                raise BuildError(f"unknown node {end!r} ({did_you_mean(end, list(self.graph.nodes)) or 'nodes: ' + ', '.join(self.graph.nodes)})", loc)
        edge = Edge(src=src, src_port=src_port, dst=dst, dst_port=dst_port, loc=loc, **options)
        self.graph.nodes[dst].inputs[dst_port] = edge
        self.graph.locs[f"nodes.{dst}.inputs.{dst_port}"] = loc
        return edge

    def weights(self, src: NodeRef | str, dst: NodeRef | str) -> WeightsEdge:
        loc = caller_loc()
        w = WeightsEdge(src=getattr(src, "name", src), dst=getattr(dst, "name", dst), loc=loc)
        self.graph.locs[f"weights.{len(self.graph.weights)}"] = loc
        self.graph.weights.append(w)
        return w

    def __getitem__(self, name: str) -> NodeRef:
        if name not in self.graph.nodes:
            raise KeyError(name)
        return NodeRef(self, name)

    def validate(self) -> list[Diagnostic]:
        from dora.graph.validate import validate

        return validate(self.graph)

    def to_yaml(self) -> str:
        from dora.graph.yaml_io import to_yaml

        return to_yaml(self.graph)

    def print(self, params: bool | str = False, file: Any = None) -> None:
        """print(graph) with each node's params: True as given, "all" with every default filled in."""
        self.graph.print(params=params, file=file)

    def __str__(self) -> str:
        return str(self.graph)
