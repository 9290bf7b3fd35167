"""Channels: the producer side of an edge (OutEdge) and the consumer side of a replica (Inbox).

Topology: every consumer replica binds ONE zmq ROUTER (its inbox) for all its input edges;
each producer replica connects one DEALER per (out edge, consumer replica). Batches flow
DEALER -> ROUTER; credits flow back ROUTER -> DEALER on the same connection, so a credit
always returns to the socket that spent it.

Flow control: a producer replica may have at most `capacity` batches AND `capacity_bytes`
bytes unacknowledged on an edge, summed over the edge's consumer replicas (one batch larger
than capacity_bytes may go alone when nothing is in flight, or it could never be sent).
The consumer acknowledges a batch after op.process returned, so the bytes a slow consumer
makes its producers hold are bounded by capacity_bytes per producer replica. Credits are
coalesced: returned once half an edge's capacity (batches or bytes) is owed, or whenever the
consumer runs out of input (flush_credits before it waits), so a busy pipeline sends one credit
message per several batches while an idle consumer never sits on credits. zmq's own high
water marks are turned off: credits are the only bound, and they never block a socket.

Ordering: messages on one (producer replica, edge, consumer replica) connection arrive in
send order; nothing is promised across producer replicas or across edges.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pyarrow as pa
import zmq

from dora.runtime import routing, security, wire
from dora.runtime.errors import WireError


def bind_router(ctx: zmq.Context, host: str = "127.0.0.1", transport: str = "tcp", ipc_path: str | None = None,
                endpoint: str | None = None) -> tuple[zmq.Socket, str]:
    """A ROUTER bound to a random TCP port on `host` (or an ipc:// path, or exactly `endpoint`: a
    respawned replica takes its predecessor's); returns (socket, endpoint)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES + (1 << 16))
    # a respawned worker connects under its predecessor's identity (node[r]) before the dead
    # connection is noticed: the new one must take the identity over, or its messages go unnamed
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    security.server(sock)   # CURVE when the run's sockets leave the machine (no-op otherwise)
    if endpoint is not None:
        sock.bind(endpoint)
    elif transport == "ipc":
        sock.bind(f"ipc://{ipc_path}")
    else:
        sock.bind(f"tcp://{host}:0")
    return sock, sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def connect_dealer(ctx: zmq.Context, endpoint: str, identity: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    security.client(sock)
    sock.connect(endpoint)
    return sock


class OutEdge:
    """One edge as seen by one producer replica: routing, credits and a queue of encoded batches."""

    def __init__(self, ctx: zmq.Context, edge: str, endpoints: list[str], sender: str, routing_: str = "round_robin",
                 group_by: str | None = None, capacity: int = 8, capacity_bytes: int = 64 << 20):
        if capacity < 1 or capacity_bytes < 1:
            raise ValueError(f"edge {edge!r}: capacity ({capacity}) and capacity_bytes ({capacity_bytes}) must be >= 1")
        self.edge, self.sender = edge, sender
        self.mode, self.column = routing.parse(routing_, group_by)
        self.capacity, self.capacity_bytes = capacity, capacity_bytes
        self.ctx, self.endpoints = ctx, list(endpoints)
        self.socks = [connect_dealer(ctx, ep) for ep in endpoints]
        n = len(self.socks)
        self.inflight_n, self.inflight_b, self.seq = [0] * n, [0] * n, [0] * n
        self.queue: collections.deque[tuple[int, pa.RecordBatch, wire.Body]] = collections.deque()
        self.rr = 0
        self.closed = False
        self.stats = {"batches": 0, "rows": 0, "bytes": 0, "max_inflight_bytes": 0, "max_inflight_batches": 0}

    # -- producer API

    def put(self, batch: pa.RecordBatch, target: int | None = None) -> None:
        """Queue a batch (split by hash when routed so); `target` forces a replica (managed edges)."""
        if self.closed:
            raise ValueError(f"edge {self.edge!r} is closed (end-of-stream was sent); no batch may follow")
        if batch.num_rows == 0:
            return
        if target is not None:
            if not 0 <= target < len(self.socks):
                raise ValueError(f"edge {self.edge!r} has {len(self.socks)} consumer replica(s); no replica {target}")
            self._enqueue(target, batch)
        elif self.mode == "hash":
            for r, sub in routing.split_by_hash(batch, self.column, len(self.socks)):
                self._enqueue(r, sub)
        else:
            self._enqueue(-1, batch)

    def _enqueue(self, target: int, batch: pa.RecordBatch) -> None:
        self.queue.append((target, batch, wire.encode_body(batch)))

    def flush(self) -> bool:
        """Send queued batches while credits allow; True when the queue is empty."""
        queue, st = self.queue, self.stats
        while queue:
            r, batch, body = queue[0]
            size = body.nbytes
            n, b = sum(self.inflight_n), sum(self.inflight_b)
            if n >= self.capacity or (n > 0 and b + size > self.capacity_bytes):
                return False
            if r < 0:
                r = self._choose()
            sock = self.socks[r]
            frames = body.frames  # (none at all for a buffer body of null columns only)
            sock.send(wire.encode_header(batch, body, self.edge, self.seq[r], self.sender), zmq.SNDMORE if frames else 0)
            # copy=False: zmq sends straight from Arrow's (immutable) buffers and keeps them
            # referenced until sent; pyzmq copies frames under zmq.COPY_THRESHOLD itself,
            # which is cheaper than tracking them
            for f in frames[:-1]:
                sock.send(f, zmq.SNDMORE, copy=False)
            if frames:
                sock.send(frames[-1], 0, copy=False)
            self.seq[r] += 1
            self.inflight_n[r] += 1
            self.inflight_b[r] += size
            queue.popleft()
            st["batches"] += 1
            st["rows"] += batch.num_rows
            st["bytes"] += size
            if b + size > st["max_inflight_bytes"]:
                st["max_inflight_bytes"] = b + size
            if n + 1 > st["max_inflight_batches"]:
                st["max_inflight_batches"] = n + 1
        return True

    def _choose(self) -> int:
        if self.mode == "least_loaded":
            return min(range(len(self.socks)), key=lambda i: (self.inflight_n[i], i))
        r = self.rr
        self.rr = (r + 1) % len(self.socks)
        return r

    def has_credit(self) -> bool:
        """Room for one more batch (sources pull only then: one batch per credit)."""
        return not self.queue and sum(self.inflight_n) < self.capacity and sum(self.inflight_b) < self.capacity_bytes

    def on_credit(self, r: int, n: int, nbytes: int) -> None:
        self.inflight_n[r] = max(0, self.inflight_n[r] - n)
        self.inflight_b[r] = max(0, self.inflight_b[r] - nbytes)

    def drain_credits(self, sock_index: int) -> None:
        """Read every credit waiting on one consumer connection."""
        sock = self.socks[sock_index]
        while True:
            try:
                raw = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                edge, n, nbytes = wire.decode_credit(raw)
            except WireError:
                continue  # only the consumer writes here; a bad credit is dropped, not trusted
            if edge == self.edge:
                self.on_credit(sock_index, n, nbytes)

    def reset_consumer(self, r: int) -> None:
        """Consumer replica r was respawned: what was sent to the dead one and not acknowledged is gone
        (the run reissues it), so its credits come back and numbering starts again on a new connection."""
        self.socks[r].close(0)            # drops what zmq still queued for the dead peer
        self.socks[r] = connect_dealer(self.ctx, self.endpoints[r])
        self.inflight_n[r] = self.inflight_b[r] = self.seq[r] = 0
        if self.closed:                   # this side had ended: the new consumer must hear it too
            self.socks[r].send_multipart(wire.encode_eos(self.edge, 0, self.sender))
            self.seq[r] = 1

    def send_eos(self) -> None:
        if self.closed:
            return
        self.closed = True
        for r, sock in enumerate(self.socks):
            sock.send_multipart(wire.encode_eos(self.edge, self.seq[r], self.sender))
            self.seq[r] += 1

    def close(self) -> None:
        for s in self.socks:
            s.close(0)


@dataclasses.dataclass
class Delivery:
    """One accepted batch, to be acknowledged (credit returned) once processed."""

    port: str
    edge: str
    sender: str
    batch: pa.RecordBatch
    ident: bytes
    nbytes: int


class Inbox:
    """The consumer side of one replica: all its input edges on one ROUTER, every message checked."""

    def __init__(self, ctx: zmq.Context, host: str = "127.0.0.1", transport: str = "tcp", ipc_path: str | None = None,
                 endpoint: str | None = None):
        self.sock, self.endpoint = bind_router(ctx, host, transport, ipc_path, endpoint)
        self.ports: dict[str, str] = {}            # edge -> port
        self.senders: dict[str, set[str]] = {}     # edge -> producer labels expected
        self.next_seq: dict[tuple[str, str], int] = {}
        self.eos: set[tuple[str, str]] = set()
        self.rejected = 0
        self.reject_samples: list[str] = []
        self.stats = {"batches": 0, "rows": 0, "bytes": 0}
        self.limits: dict[str, tuple[int, int]] = {}                 # edge -> when to return credits (n, bytes)
        self.owed: dict[tuple[bytes, str], list[int]] = {}          # (connection, edge) -> [n, bytes] not yet returned

    def expect(self, edge: str, port: str, senders: list[str], capacity: int = 1, capacity_bytes: int = 1) -> None:
        self.ports[edge] = port
        self.senders[edge] = set(senders)
        self.limits[edge] = (max(1, capacity // 2), max(1, capacity_bytes // 2))
        for s in senders:
            self.next_seq[(s, edge)] = 0

    def reset_sender(self, sender: str) -> None:
        """Producer replica `sender` was respawned: its numbering starts again; what it owed is void."""
        for key in self.next_seq:
            if key[0] == sender:
                self.next_seq[key] = 0
                self.eos.discard(key)

    def all_eos(self) -> bool:
        return len(self.eos) == len(self.next_seq)

    def recv(self) -> Delivery | WireError | tuple[str, str] | None:
        """One message if waiting: a Delivery, ("eos", edge) for an end-of-stream, a WireError
        for a rejected message (already counted), or None when nothing is waiting."""
        recv = self.sock.recv
        try:
            f = recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        frames = [f]
        # the rest of the message is already here (zmq delivers multipart messages whole);
        # Frame.more instead of recv_multipart's getsockopt(RCVMORE) per frame saves ~2 us a message
        while f.more:
            f = recv(zmq.NOBLOCK, copy=False)
            frames.append(f)
        ident = frames[0].bytes
        try:
            return self._check(ident, frames[1:])
        except WireError as e:
            self.rejected += 1
            if len(self.reject_samples) < 5:
                self.reject_samples.append(str(e))
            return e

    def _check(self, ident: bytes, frames: list[Any]) -> Delivery | tuple[str, str]:
        h = wire.decode_header(frames)
        if h.edge not in self.ports:
            raise WireError(f"unknown edge (this replica's inputs: {sorted(self.ports)})", h.edge, h.sender)
        if h.sender not in self.senders[h.edge]:
            raise WireError(f"sender is not a producer of this edge ({sorted(self.senders[h.edge])})", h.edge, h.sender)
        key = (h.sender, h.edge)
        if key in self.eos:
            raise WireError("message after end-of-stream", h.edge, h.sender)
        if h.seq != self.next_seq[key]:
            raise WireError(f"sequence number {h.seq}, expected {self.next_seq[key]} (replayed or lost message)", h.edge, h.sender)
        if h.kind == "eos":
            self.next_seq[key] += 1
            self.eos.add(key)
            return ("eos", h.edge)
        batch = wire.decode_body(h, frames[1:])
        self.next_seq[key] += 1
        self.stats["batches"] += 1
        self.stats["rows"] += batch.num_rows
        self.stats["bytes"] += h.nbytes
        return Delivery(self.ports[h.edge], h.edge, h.sender, batch, ident, h.nbytes)

    def ack(self, d: Delivery) -> None:
        """Owe the credit for a processed batch to the connection it came on; send it once
        half the edge's capacity is owed (flush_credits sends the rest)."""
        key = (d.ident, d.edge)
        owed = self.owed.setdefault(key, [0, 0])
        owed[0] += 1
        owed[1] += d.nbytes
        lim_n, lim_b = self.limits[d.edge]
        if owed[0] >= lim_n or owed[1] >= lim_b:
            self.sock.send_multipart([d.ident, wire.encode_credit(d.edge, owed[0], owed[1])])
            del self.owed[key]

    def flush_credits(self) -> None:
        """Return every owed credit (call before waiting for input)."""
        for (ident, edge), (n, nbytes) in self.owed.items():
            self.sock.send_multipart([ident, wire.encode_credit(edge, n, nbytes)])
        self.owed.clear()

    def close(self) -> None:
        self.sock.close(0)
