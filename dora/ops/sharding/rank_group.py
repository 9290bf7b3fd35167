"""The process group of a sharded op: rank 0 leads, ranks 1.. follow its commands.

Only rank 0 is wired to the data edges and reports events (weights, train_step, done, the
trained.jsonl ledger), so what the runtime sees of an N-rank trainer is one replica and every
accounting stays exactly-once. The others wait for rank 0's commands and join its collectives.

Rendezvous (bounded at every step): rank 0 binds a listening socket on its host (127.0.0.1
locally, its node's address on Ray), hands it to a torch TCPStore (so nothing listens on other
interfaces), reports {"kind": "rendezvous", "host", "port"} through ctx.report, and waits up to
JOIN_TIMEOUT_S for every other rank's `joined/<rank>` key, naming the ranks that did not come.
The runtime gives ranks 1.. that address in their config; they connect and announce themselves.
Then one default process group: gloo on CPU, "cpu:gloo,cuda:nccl" on GPUs (CPU tensors, such as
commands' payloads and metric sums, still go over gloo).

Commands: rank 0 writes `cmd/<n>` = JSON {kind, header, nbytes} into the store and sends each
follower its payload (bytes, e.g. an Arrow IPC stream of its rows) point to point; a follower's
`next_command(wait_s)` returns None when nothing came within wait_s, so its worker keeps
answering control messages (stop) between polls. A rank whose peer died fails in its next
collective after COLLECTIVE_TIMEOUT_S at most (the runtime notices the dead process sooner).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 300.0        # every rank joined rank 0's store (processes start and import torch)
COLLECTIVE_TIMEOUT_S = 1800.0  # one collective: a rank that waits longer for a peer fails
POLL_S = 0.005                 # a follower's store poll interval while it waits for a command


@dataclasses.dataclass
class Command:
    kind: str
    header: dict[str, Any]
    payload: bytes = b""


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def _listen(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def backend_for(device: str) -> str:
    return "cpu:gloo,cuda:nccl" if str(device).startswith("cuda") else "gloo"


class RankGroup:
    """One process's membership in the group. Use join(ctx); None there means one rank."""

    def __init__(self, store: Any, rank: int, world: int, device: str, label: str):
        self.store, self.rank, self.world, self.device, self.label = store, rank, world, device, label
        self.seq = 0           # next command number
        self.closed = False

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ commands (rank 0 -> others)
    def post(self, kind: str, header: dict[str, Any], payloads: list[bytes] | None = None) -> None:
        """Rank 0: command every follower; payloads[i] goes to rank i + 1 (empty: none)."""
        assert self.leader, "only rank 0 posts commands"
        payloads = list(payloads or [b""] * (self.world - 1))
        if len(payloads) != self.world - 1:
            raise ValueError(f"{self.label}: {len(payloads)} payloads for {self.world - 1} follower ranks")
        self.store.set(f"cmd/{self.seq}", json.dumps({"kind": kind, "header": header,
                                                      "nbytes": [len(p) for p in payloads]}))
        self.seq += 1
        works = [dist.isend(torch.frombuffer(bytearray(p), dtype=torch.uint8), dst=r)
                 for r, p in enumerate(payloads, start=1) if p]
        for w in works:
            w.wait()

    def next_command(self, wait_s: float) -> Command | None:
        """Ranks 1..: rank 0's next command, or None if none came within wait_s."""
        key = f"cmd/{self.seq}"
        deadline = time.monotonic() + wait_s
        while not self.store.check([key]):
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
        msg = json.loads(self.store.get(key))
        self.seq += 1
        n = int(msg["nbytes"][self.rank - 1])
        payload = b""
        if n:
            buf = torch.empty(n, dtype=torch.uint8)
            dist.recv(buf, src=0)
            payload = buf.numpy().tobytes()
        return Command(msg["kind"], msg["header"], payload)

    # ------------------------------------------------------------------ collectives on CPU values
    def gather_bytes(self, mine: bytes) -> list[bytes] | None:
        """Every rank: rank 0 gets every rank's bytes in rank order; the others get None."""
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(mine)], dtype=torch.int64))
        if not self.leader:
            if mine:
                dist.send(torch.frombuffer(bytearray(mine), dtype=torch.uint8), dst=0)
            return None
        out = [mine]
        for r in range(1, self.world):
            n = int(sizes[r])
            buf = torch.empty(n, dtype=torch.uint8)
            if n:
                dist.recv(buf, src=r)
            out.append(buf.numpy().tobytes())
        return out

    def all_gather_rows(self, mine: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        """Every rank: every rank's 1-D float64 rows, in rank order, and where this rank's rows start.
        (Two all_gathers: each rank's [row count, row lengths..., values...] size, then that vector
        padded to the longest rank's.)"""
        flat = torch.cat([torch.tensor([float(len(mine))] + [float(len(r)) for r in mine], dtype=torch.float64), *mine])
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(flat)], dtype=torch.int64))
        width = int(max(int(n) for n in sizes))
        parts = [torch.zeros(width, dtype=torch.float64) for _ in range(self.world)]
        dist.all_gather(parts, torch.nn.functional.pad(flat, (0, width - len(flat))))
        rows: list[torch.Tensor] = []
        offset = 0
        for r, part in enumerate(parts):
            count = int(part[0])
            lengths = [int(n) for n in part[1:1 + count]]
            if r == self.rank:
                offset = len(rows)
            rows.extend(torch.split(part[1 + count:1 + count + sum(lengths)], lengths))
        return rows, offset

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None


def join(ctx: Any, *, join_timeout_s: float = JOIN_TIMEOUT_S,
         collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> RankGroup | None:
    """This process's rank in its node's group (ctx.replica of ctx.replicas), or None for one rank."""
    if ctx.rendezvous is None or ctx.replicas <= 1:
        return None
    rank, world, label = ctx.replica, ctx.replicas, ctx.label
    host = str(ctx.rendezvous["host"])
    if host in ("127.0.0.1", "localhost", "::1") and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # gloo's own sockets stay on loopback too
    if rank == 0:
        sock = _listen(host)
        port = sock.getsockname()[1]
        store = dist.TCPStore(host, port, world, is_master=True, wait_for_workers=False,
                              timeout=_timedelta(collective_timeout_s), master_listen_fd=sock.detach())
        ctx.report({"kind": "rendezvous", "host": host, "port": port})
        keys = [f"joined/{r}" for r in range(1, world)]
        deadline = time.monotonic() + join_timeout_s
        while True:
            missing = [r for r, k in enumerate(keys, start=1) if not store.check([k])]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{label}: rank(s) {missing} of {world} ({', '.join(f'{ctx.node}[{r}]' for r in missing)}) did not "
                    f"join the process group at {host}:{port} within {join_timeout_s:.0f} s")
            time.sleep(0.02)
    else:
        port = int(ctx.rendezvous["port"])
        try:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=_timedelta(join_timeout_s))
        except Exception as e:
            raise TimeoutError(f"{label}: rank {rank} could not reach rank 0 ({ctx.node}[0]) at {host}:{port} "
                               f"within {join_timeout_s:.0f} s: {e}") from e
        store.set_timeout(_timedelta(collective_timeout_s))
        store.set(f"joined/{rank}", "1")
    dist.init_process_group(backend_for(ctx.device), store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
                            timeout=_timedelta(collective_timeout_s))
    return RankGroup(store, rank, world, ctx.device, label)
