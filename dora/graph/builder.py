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
"""

from __future__ import annotations

from typing import Any

from dora.graph.diagnostics import Diagnostic
from dora.graph.model import AsyncConfig, Edge, EvalSet, Graph, Node, Pool, RunConfig, WeightsEdge
from dora.graph.op_registry import resolve_op
from dora.graph.opspec import OpError

WEIGHTS_PORT = "weights"


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

    def opts(self, group_by: str | None = None, capacity: int | None = None,
             capacity_bytes: int | None = None, routing: str | None = None) -> "PortRef":
        """This port with edge options for the edge that ends here."""
        given = {"group_by": group_by, "capacity": capacity, "capacity_bytes": capacity_bytes, "routing": routing}
        return PortRef(self.node, self.port, {**self.options, **{k: v for k, v in given.items() if v is not None}})

    def __rshift__(self, other: "PortRef | NodeRef") -> "NodeRef":
        pipe = self.node._pipeline
        dst = other if isinstance(other, PortRef) else PortRef(other, other._only_input())
        if (self.port == WEIGHTS_PORT) != (dst.port == WEIGHTS_PORT):
            raise ValueError(f"{self.node.name}.{self.port} >> {dst.node.name}.{dst.port}: a weights port joins only another weights port")
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
            raise ValueError(f"node {self.name!r}: cannot pick an input port: {e}; name it, e.g. a >> {self.name}.PORT") from None
        if len(ports) != 1:
            raise ValueError(f"node {self.name!r} (op {op!r}) has input ports {ports}; name one, e.g. a >> {self.name}.{ports[0] if ports else 'PORT'}")
        return ports[0]

    def __rshift__(self, other: "NodeRef | PortRef") -> "NodeRef":
        return PortRef(self, "out") >> other

    def __repr__(self) -> str:
        return f"NodeRef({self.name})"


class Pipeline:
    """Builds a dora.graph.model.Graph. `pools` values are Pool, (device, count) or {device, count}."""

    def __init__(self, name: str, model: dict[str, Any] | None = None,
                 pools: dict[str, Any] | None = None, async_: AsyncConfig | dict[str, Any] | None = None,
                 run: RunConfig | dict[str, Any] | None = None, description: str | None = None):
        run = run if isinstance(run, RunConfig) else RunConfig(**_plain(dict(run or {})))
        self.graph = Graph(name=name, model=_plain(dict(model or {})), run=run, description=description)
        for pname, p in (pools or {}).items():
            self.pool(pname, p)
        if async_ is not None:
            self.set_async(async_)

    def pool(self, name: str, spec: Any = ("cpu", 1)) -> Pool:
        if isinstance(spec, Pool):
            pool = Pool(name=name, device=spec.device, count=spec.count)
        elif isinstance(spec, dict):
            pool = Pool(name=name, **spec)
        else:
            device, count = spec
            pool = Pool(name=name, device=device, count=count)
        self.graph.pools[name] = pool
        return pool

    def set_async(self, cfg: AsyncConfig | dict[str, Any] | None = None, **kw: Any) -> AsyncConfig:
        if isinstance(cfg, AsyncConfig):
            self.graph.async_ = cfg
        else:
            self.graph.async_ = AsyncConfig(**{**(cfg or {}), **kw})
        return self.graph.async_

    def node(self, name: str, op: str, *, pool: str | None = None, replicas: int = 1, devices: int = 1,
             memory: float | None = None, params: dict[str, Any] | None = None, **kw_params: Any) -> NodeRef:
        """Add a node; params come as `params=` and/or keyword arguments. `devices` is per replica;
        `memory` the fraction of each of its devices' memory a replica holds (sharing a pool's devices)."""
        if name in self.graph.nodes:
            raise ValueError(f"node {name!r} already exists")
        self.graph.nodes[name] = Node(name=name, op=op, params=_plain({**(params or {}), **kw_params}), pool=pool,
                                      replicas=replicas, devices=devices, memory=memory)
        return NodeRef(self, name)

    def eval_set(self, name: str, **settings: Any) -> EvalSet:
        """A held-out set of the `eval:` section (settings as in YAML: source=, size=, every=, ...)."""
        self.graph.evals[name] = EvalSet(**_plain(settings))
        return self.graph.evals[name]

    def connect(self, src: str, src_port: str, dst: str, dst_port: str, **options: Any) -> Edge:
        if dst not in self.graph.nodes:
            raise ValueError(f"unknown node {dst!r}")
        edge = Edge(src=src, src_port=src_port, dst=dst, dst_port=dst_port, **options)
        self.graph.nodes[dst].inputs[dst_port] = edge
        return edge

    def weights(self, src: NodeRef | str, dst: NodeRef | str) -> WeightsEdge:
        w = WeightsEdge(src=getattr(src, "name", src), dst=getattr(dst, "name", dst))
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
