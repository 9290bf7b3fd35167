"""A worker's start, before its loop: the config from the controller (after hello), the op built
and set up from it, and the inbox bound (tcp on the worker's host, an ipc socket, or a respawned
replica's predecessor's endpoint)."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from typing import Any, Callable

import zmq

from dora.graph.op_registry import resolve_op
from dora.graph.sections import AsyncSettings
from dora.ops.base import OpContext
from dora.runtime import wire
from dora.runtime.channel import Inbox

CONFIG_TIMEOUT_S = 120.0  # from hello to config: the controller may be starting many workers
IPC_PATH_MAX = 100   # sun_path holds 104-108 bytes depending on the OS


def ipc_socket_path(folder: str, node: str, replica: int) -> str:
    """Where a replica's inbox socket lives; names too long for a Unix socket path become a hash."""
    path = os.path.join(folder, f"{node}-{replica}.sock")
    if len(path.encode()) > IPC_PATH_MAX:
        path = os.path.join(folder, hashlib.sha1(f"{node}-{replica}".encode()).hexdigest()[:16] + ".sock")
    if len(path.encode()) > IPC_PATH_MAX:
        raise ValueError(f"ipc socket folder {folder!r} is too long for a Unix socket path "
                         f"({IPC_PATH_MAX} bytes); set TMPDIR shorter or DORA_TRANSPORT=tcp")
    return path


def import_impl(path: str) -> type:
    """The class at "pkg.module:Class"."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ImportError(f"op implementation {path!r} is not of the form 'pkg.module:Class'")
    return getattr(importlib.import_module(module), attr)


def op_class(op: str) -> type:
    """The implementation class of an op, through the graph layer's op declarations."""
    return import_impl(resolve_op(op).impl)


def wait_config(ctrl: zmq.Socket, label: str, control_endpoint: str) -> dict[str, Any]:
    """The controller's config message (a stop first ends the worker)."""
    deadline = time.monotonic() + CONFIG_TIMEOUT_S
    while time.monotonic() < deadline:
        if ctrl.poll(200):
            msg, _ = wire.decode_control(ctrl.recv_multipart(copy=False))
            if msg["kind"] == "config":
                return msg
            if msg["kind"] == "stop":
                raise SystemExit(0)
    raise TimeoutError(f"{label}: no config from the controller at {control_endpoint} within {CONFIG_TIMEOUT_S:.0f} s")


def make_op(cfg: dict[str, Any], node: str, replica: int, report: Callable[[dict], None],
            progress: Callable[[], None]) -> Any:
    """The op of the config, set up. Its params arrive resolved (dora.graph.resolve): filled,
    checked and derived once, by the controller."""
    cls = op_class(cfg["op"])
    if "torch" in sys.modules:  # only pay for torch if the op uses it
        sys.modules["torch"].set_num_threads(max(1, int(cfg.get("threads", 1))))
    op = cls()
    ctx = OpContext(node=node, op=cfg["op"], replica=replica, replicas=cfg["replicas"], params=cfg["params"],
                    model=cfg["model"], device=cfg["device"], threads=cfg["threads"], seed=cfg["seed"],
                    run_dir=cfg["run_dir"], async_=AsyncSettings(**cfg["async"]), restore=cfg["restore"],
                    devices=cfg["devices"], rendezvous=cfg["rendezvous"], report=report, progress=progress)
    op.setup(ctx)
    return op


def bind_inbox(zctx: zmq.Context, cfg: dict[str, Any], host: str, ipc_dir: str | None, node: str, replica: int) -> Inbox:
    if cfg.get("bind"):   # a respawned replica takes its predecessor's endpoint: producers reconnect to it
        return Inbox(zctx, endpoint=cfg["bind"])
    if ipc_dir:
        return Inbox(zctx, transport="ipc", ipc_path=ipc_socket_path(ipc_dir, node, replica))
    return Inbox(zctx, host)
