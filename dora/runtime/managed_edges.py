"""The edges a driver manages: they run through the controller instead of straight from producer
to consumer. Producers send to the controller's own inbox; the driver sees each batch in
`on_batch(src_node, batch)` (while `wants(src_node)`, else the batch and its credit are held, so the
producer stops once its edge capacity is held here) and feeds the consumer with `send(node, replica,
port, batch)`; it ends the consumer's stream with `close(node, port)`."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable

import pyarrow as pa
import zmq

from dora.runtime.channel import Delivery, Inbox, OutEdge

CONTROLLER = "controller"  # the sender label of batches the controller forwards on managed edges


class ManagedEdges:
    def __init__(self, graph, driver: Any):
        self.graph, self.driver = graph, driver
        pairs = list(driver.managed_edges()) if driver is not None and hasattr(driver, "managed_edges") else []
        self.edges: dict[str, Any] = {}    # edge label -> Edge
        for src, dst in pairs:
            found = [e for e in graph.edges if e.src == src and e.dst == dst]
            if not found:
                raise ValueError(f"driver manages edge {src} -> {dst}, but the graph has no data edge from {src!r} to {dst!r}")
            for e in found:
                self.edges[e.label] = e
        self.inbox: Inbox | None = None
        self.outs: dict[tuple[str, str], OutEdge] = {}
        self.held: dict[str, collections.deque] = {}   # src node -> batches (and end-of-stream marks) not yet taken

    def __contains__(self, label: str) -> bool:
        return label in self.edges

    def open_inbox(self, zctx: zmq.Context, host: str, plan) -> None:
        """Bind the controller's inbox for the managed edges (before workers start: they connect to it)."""
        if not self.edges:
            return
        self.inbox = Inbox(zctx, host)
        for e in self.edges.values():
            self.inbox.expect(e.label, e.src, [f"{e.src}[{r}]" for r in range(plan.data_replicas(e.src))],
                              e.capacity, e.capacity_bytes)

    def connect_outs(self, zctx: zmq.Context, plan, endpoint_of: Callable[[str], str]) -> None:
        """Connect to each managed edge's consumers (once every worker is ready and bound)."""
        for e in self.edges.values():
            eps = [endpoint_of(f"{e.dst}[{r}]") for r in range(plan.data_replicas(e.dst))]
            self.outs[(e.dst, e.dst_port)] = OutEdge(zctx, e.label, eps, CONTROLLER, "round_robin", None, e.capacity,
                                                     e.capacity_bytes)

    # ------------------------------------------------------------ the driver's side
    def send(self, node: str, replica: int, port: str, batch: pa.RecordBatch, timeout: float, wait: Callable[[], None]) -> None:
        out = self._out(node, port)
        out.put(batch, target=replica)
        self._flush(out, timeout, wait)

    def close(self, node: str, port: str, timeout: float, wait: Callable[[], None]) -> None:
        out = self._out(node, port)
        self._flush(out, timeout, wait)
        out.send_eos()

    def _out(self, node: str, port: str) -> OutEdge:
        out = self.outs.get((node, port))
        if out is None:
            raise ValueError(f"{node}.{port} is not fed by a managed edge (managed: {sorted(self.outs)})")
        return out

    def _flush(self, out: OutEdge, timeout: float, wait: Callable[[], None]) -> None:
        """Send what `out` holds; `wait()` (the controller pumping its control traffic and checking
        health) runs between tries, up to `timeout`."""
        deadline = time.monotonic() + timeout
        while not out.flush():
            if time.monotonic() > deadline:
                raise TimeoutError(f"edge {out.edge!r}: no credit from its consumer within {timeout} s")
            for i, s in enumerate(out.socks):
                if s.poll(0):
                    out.drain_credits(i)
            wait()

    # ------------------------------------------------------------ every loop iteration
    def pump(self) -> None:
        """Deliver what arrived and flush what the driver sent."""
        if self.inbox is not None:
            self._input()
        for out in self.outs.values():
            for i, s in enumerate(out.socks):
                if s.poll(0):
                    out.drain_credits(i)
            out.flush()

    def _input(self) -> None:
        """Batches on managed edges go to driver.on_batch in arrival order per source node, but only
        while driver.wants(src) (if it has that method): a held batch keeps its credit, so the
        producer stops once its edge capacity is held here."""
        d = self.driver
        while (got := self.inbox.recv()) is not None:
            if isinstance(got, Delivery):
                self.held.setdefault(got.port, collections.deque()).append(got)  # port holds the src node
            elif isinstance(got, tuple):
                self.held.setdefault(self.edges[got[1]].src, collections.deque()).append(got[1])
        for src, queue in self.held.items():
            while queue and (not isinstance(queue[0], Delivery) or not hasattr(d, "wants") or d.wants(src)):
                item = queue.popleft()
                if isinstance(item, Delivery):
                    d.on_batch(src, item.batch)
                    self.inbox.ack(item)
                else:
                    self._eos(item)
        self.inbox.flush_credits()

    def _eos(self, edge: str) -> None:
        """All producers of a managed edge ended: tell the driver (on_eos), or close it for them."""
        if not all((s, edge) in self.inbox.eos for s in self.inbox.senders[edge]):
            return
        e = self.edges[edge]
        if hasattr(self.driver, "on_eos"):
            self.driver.on_eos(e.src, e.dst)

    # ------------------------------------------------------------ a respawned replica, the end
    def replica_respawned(self, label: str, node: str, replica: int) -> None:
        if self.inbox is not None:
            self.inbox.reset_sender(label)
        for (dst, _), out in self.outs.items():
            if dst == node and replica < len(out.socks):   # (ranks 1.. of a process group take no edges)
                out.reset_consumer(replica)
                # what the driver queued for the dead one and not yet sent is the dead one's too
                out.queue = collections.deque(q for q in out.queue if q[0] != replica)

    def close_all(self) -> None:
        for out in self.outs.values():
            out.close()
        if self.inbox is not None:
            self.inbox.close()
