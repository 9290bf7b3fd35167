"""What a backend needs to start one worker: its replica, where its controller listens, its placement."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Launch:
    node: str
    replica: int
    control: str              # controller endpoint the worker connects to
    env: dict[str, str]       # placement env (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ...)
    pool: str
    kind: str                 # cpu | gpu
    slot: int
    log_path: str | None = None
    keys: dict[str, str] | None = None   # the run's CURVE keys when its sockets are secured (security.py)
    devices: int = 1          # devices this replica holds (one Ray bundle of that many, on one node)

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"
