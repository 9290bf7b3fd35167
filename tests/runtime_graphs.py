"""Small graphs of tests.runtime_ops for the runtime tests (built with the plain model classes)."""

from __future__ import annotations

import os

import pyarrow as pa

from dora.graph.model import Edge, Graph, Node

OPS = "tests.runtime_ops:"


def edge(src: str, dst: str, port: str = "in", **kw) -> Edge:
    return Edge(src, "out", dst, port, **kw)


def pipeline(rows: int, group_size: int = 4, batch_rows: int = 1000, map_replicas: int = 3, red_replicas: int = 2,
             map_params: dict | None = None) -> Graph:
    """source -> map (N replicas, round robin) -> group_by reducer (M replicas) -> sink."""
    g = Graph("exactly_once")
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": rows, "batch_rows": batch_rows, "group_size": group_size})
    g.nodes["map"] = Node("map", OPS + "Map", map_params or {}, replicas=map_replicas, inputs={"in": edge("src", "map")})
    g.nodes["red"] = Node("red", OPS + "GroupReducer", {"group_size": group_size}, replicas=red_replicas,
                          inputs={"in": edge("map", "red", group_by="group_id")})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {}, inputs={"in": edge("red", "sink")})
    return g


def read_sink(run_dir: str, node: str = "sink", replica: int = 0) -> pa.Table:
    return pa.ipc.open_file(os.path.join(run_dir, f"{node}-{replica}.arrow")).read_all()


def alive(pid: int) -> bool:
    """True if pid is a live (not zombie) process, read from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
