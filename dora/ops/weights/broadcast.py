"""Weight hand-off by torch.distributed broadcast: the trainer is rank 0, generate replicas 1..N.

Opt-in (update param `weight_sync: broadcast` with `broadcast_to: N`, generate param
`weight_sync: broadcast`); the safetensors file hand-off of dora/ops/weights/versions.py still runs
beside it, so any version can always be loaded from its file.

    WeightBroadcaster(run_dir, receivers, device="cpu")      trainer side
        .broadcast(version, state_dict) -> (seconds, bytes);  .close()
    WeightReceiver(run_dir, rank, device="cpu")               replica side (rank 1..N)
        .get(version, timeout_s) -> state dict | None;  .close()

Rendezvous: a torch.distributed FileStore in run_dir (no listening socket for the rendezvous);
the trainer removes any stale files, creates `weight_sync-<nonce>.store`, then writes
`weight_sync.json` {store, world_size, backend, created} atomically. Receivers poll for that
file (ignoring one older than their own start minus STALE_S), open the store, announce
`joined/<rank>`; the trainer waits for all of them, with a deadline, before the first collective.
The process group is a standalone ProcessGroupGloo on 127.0.0.1 (device cpu) or ProcessGroupNCCL
(device cuda), not the global default group, so it cannot clash with other torch.distributed use.

Wire, per version: an int64 header [version, nbytes] then one uint8 buffer holding every
tensor's bytes back to back in the layout's order. The layout (names, dtypes, shapes, tied
aliases) is fixed for the run and published once in the store as JSON. Version -1 = the trainer
closed. A receiver keeps the newest `keep` versions in host memory; a background thread receives.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
import uuid

import torch
import torch.distributed as dist

from dora.ops.weights.versions import _dedupe

SYNC_FILE = "weight_sync.json"
RENDEZVOUS_TIMEOUT_S = 120.0     # all ranks joined, and the receiver finding the trainer's file
COLLECTIVE_TIMEOUT_S = 3600.0    # a receiver waits this long between two versions (a long train step)
STALE_S = 300.0                  # a sync file older than the receiver's start minus this is a previous run's
_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                               torch.int32, torch.int8, torch.uint8, torch.bool)}


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(seconds))


def _process_group(store, rank: int, world: int, backend: str, timeout_s: float):
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = _timedelta(timeout_s)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        return dist.ProcessGroupGloo(store, rank, world, opts)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("weight broadcast: device is cuda but this torch build has no NCCL")
        return dist.ProcessGroupNCCL(store, rank, world)
    raise ValueError(f"weight broadcast: unknown backend {backend!r}")


def _backend(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


class WeightBroadcaster:
    """Rank 0. Construction blocks until all `receivers` replicas joined (or raises after timeout_s)."""

    def __init__(self, run_dir: str, receivers: int, device: str = "cpu", *,
                 timeout_s: float = RENDEZVOUS_TIMEOUT_S, collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
                 label: str = "update"):
        if not isinstance(receivers, int) or isinstance(receivers, bool) or receivers < 1:
            raise ValueError(f"{label}: weight broadcast needs broadcast_to >= 1 (the generate replicas), got {receivers!r}")
        self.label, self.device, self.world = label, device, receivers + 1
        self.backend = _backend(device)
        os.makedirs(run_dir, exist_ok=True)
        for f in os.listdir(run_dir):   # a previous run's rendezvous in a reused folder
            if f == SYNC_FILE or (f.startswith("weight_sync-") and f.endswith(".store")):
                os.remove(os.path.join(run_dir, f))
        store_path = os.path.join(run_dir, f"weight_sync-{uuid.uuid4().hex[:12]}.store")
        self.store = dist.FileStore(store_path, self.world)
        self.store.set_timeout(_timedelta(timeout_s))
        info = {"store": os.path.basename(store_path), "world_size": self.world, "backend": self.backend,
                "created": time.time()}
        tmp = os.path.join(run_dir, f"{SYNC_FILE}.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(info, f)
        os.replace(tmp, os.path.join(run_dir, SYNC_FILE))
        keys = [f"joined/{r}" for r in range(1, self.world)]
        try:
            self.store.wait(keys, _timedelta(timeout_s))
        except Exception as e:   # DistStoreError: name who is missing
            missing = [k for k in keys if not self.store.check([k])]
            raise TimeoutError(f"{label}: weight broadcast: {len(missing)} of {receivers} generate replicas did not join "
                               f"within {timeout_s:.0f} s (missing ranks {[k.split('/')[1] for k in missing]}; "
                               f"do they have weight_sync: broadcast, and is broadcast_to their replica count?)") from e
        self.pg = _process_group(self.store, 0, self.world, self.backend, collective_timeout_s)
        self.layout: list | None = None
        self.closed = False
        self.sync_file = os.path.join(run_dir, SYNC_FILE)

    def _layout_of(self, tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> list:
        return [[name, str(t.dtype), list(t.shape)] for name, t in tensors.items()] + [["=alias", aliases]]

    @torch.no_grad()
    def broadcast(self, version: int, state_dict: dict[str, torch.Tensor]) -> tuple[float, int]:
        """Send one version to every receiver; returns (seconds, payload bytes)."""
        if self.closed:
            raise RuntimeError(f"{self.label}: weight broadcast after close()")
        t0 = time.perf_counter()
        tensors, aliases = _dedupe(state_dict)
        layout = self._layout_of(tensors, aliases)
        if self.layout is None:
            bad = [n for n, t in tensors.items() if str(t.dtype) not in _DTYPES]
            if bad:
                raise ValueError(f"{self.label}: weight broadcast cannot send dtype of {bad[:5]}")
            self.store.set("layout", json.dumps(layout))
            self.layout = layout
        elif layout != self.layout:
            raise ValueError(f"{self.label}: weight broadcast: the state dict's names/shapes/dtypes changed since version 0")
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()]) if tensors else torch.empty(0, dtype=torch.uint8)
        flat = flat.to(self.device)
        header = torch.tensor([int(version), flat.numel()], dtype=torch.int64, device=self.device)
        self.pg.broadcast(header, 0).wait()
        self.pg.broadcast(flat, 0).wait()
        return time.perf_counter() - t0, int(flat.numel())

    def close(self) -> None:
        """Tell receivers the stream ended (version -1). Best effort: a gone receiver is not an error here."""
        if self.closed:
            return
        self.closed = True
        try:
            self.pg.broadcast(torch.tensor([-1, 0], dtype=torch.int64, device=self.device), 0).wait()
        except Exception:
            pass
        try:   # every receiver joined long ago; a later run in this folder must not find it
            os.remove(self.sync_file)
        except FileNotFoundError:
            pass


class WeightReceiver:
    """Rank 1..N. A daemon thread joins the group and receives every version into host memory."""

    def __init__(self, run_dir: str, rank: int, device: str = "cpu", *, keep: int = 3,
                 timeout_s: float = RENDEZVOUS_TIMEOUT_S, collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
                 label: str = "generate"):
        if rank < 1:
            raise ValueError(f"{label}: weight receiver rank must be >= 1 (rank 0 is the trainer), got {rank}")
        self.run_dir, self.rank, self.device, self.keep, self.label = run_dir, rank, device, max(1, int(keep)), label
        self.timeout_s, self.collective_timeout_s = timeout_s, collective_timeout_s
        self.started = time.time()
        self.versions: dict[int, dict[str, torch.Tensor]] = {}
        self.error: BaseException | None = None
        self.ended = False
        self.received_bytes = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"weight-receiver-{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ background thread
    def _find_sync_file(self) -> dict:
        path = os.path.join(self.run_dir, SYNC_FILE)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if os.path.getmtime(path) >= self.started - STALE_S:
                    with open(path, encoding="utf-8") as f:
                        return json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.label}: weight broadcast: no {path} from the trainer within {self.timeout_s:.0f} s "
                                   "(does the update node have weight_sync: broadcast?)")
            time.sleep(0.05)

    def _run(self) -> None:
        try:
            info = self._find_sync_file()
            world = int(info["world_size"])
            if self.rank >= world:
                raise ValueError(f"{self.label}: weight broadcast: rank {self.rank} but the trainer expects "
                                 f"{world - 1} receivers (broadcast_to); set it to the generate replica count")
            store = dist.FileStore(os.path.join(self.run_dir, info["store"]), world)
            store.set_timeout(_timedelta(self.timeout_s))
            store.set(f"joined/{self.rank}", "1")
            pg = _process_group(store, self.rank, world, info["backend"], self.collective_timeout_s)
            layout = None
            while True:
                header = torch.empty(2, dtype=torch.int64, device=self.device)
                pg.broadcast(header, 0).wait()
                version, nbytes = (int(x) for x in header.tolist())
                if version < 0:
                    break
                flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                pg.broadcast(flat, 0).wait()
                if layout is None:
                    layout = json.loads(store.get("layout").decode())
                self._store(version, _unflatten(flat.cpu(), layout))
                self.received_bytes += nbytes
        except BaseException as e:   # kept for get(), which raises it in the caller's thread
            self.error = e
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def _store(self, version: int, state: dict[str, torch.Tensor]) -> None:
        with self._cond:
            self.versions[version] = state
            for v in sorted(self.versions)[:-self.keep]:
                del self.versions[v]
            self._cond.notify_all()

    # ------------------------------------------------------------------ caller side
    def get(self, version: int, timeout_s: float) -> dict[str, torch.Tensor]:
        """The state dict of `version`, waiting up to timeout_s for it to arrive; raises TimeoutError or
        the receiver's own error (with its cause) if it cannot."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while version not in self.versions:
                if self.ended:
                    if self.error is not None:
                        raise RuntimeError(f"{self.label}: weight receiver failed before version {version}: {self.error}") from self.error
                    raise RuntimeError(f"{self.label}: the trainer closed the weight broadcast before version {version}")
                left = deadline - time.monotonic()
                if left <= 0:
                    have = sorted(self.versions)
                    raise TimeoutError(f"{self.label}: weight version {version} did not arrive by broadcast within "
                                       f"{timeout_s:.1f} s (held: {have})")
                self._cond.wait(left)
            return self.versions[version]

    def has(self, version: int) -> bool:
        with self._cond:
            return version in self.versions

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait briefly for the trainer's end marker; the thread is a daemon, so a trainer that is gone
        does not hold the process."""
        self._thread.join(timeout_s)


def _unflatten(flat: torch.Tensor, layout: list) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    offset = 0
    aliases: dict[str, str] = {}
    for entry in layout:
        if entry[0] == "=alias":
            aliases = entry[1]
            continue
        name, dtype, shape = entry[0], _DTYPES[entry[1]], entry[2]
        n = 1
        for s in shape:
            n *= int(s)
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        # clone first: a slice at an unaligned offset cannot be viewed as a wider dtype
        out[name] = flat[offset:offset + nbytes].clone().view(dtype).reshape(shape)
        offset += nbytes
    if offset != flat.numel():
        raise ValueError(f"weight broadcast: {flat.numel()} bytes received, the layout describes {offset}")
    for alias, name in aliases.items():
        out[alias] = out[name]
    return out
