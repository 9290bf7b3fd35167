"""Elastic trainer devices in the simulator (`SimConfig.elastic`, the pipeline's `async.elastic`).

While the trainer waits for a batch, its GPUs serve rollout as SimInstances of the newest version
(RolloutController.lend); when the batch is ready they are reclaimed, their requests moved with
their KV to other instances, and training starts once the devices are back. What it costs, and
who pays:
- lending: each lent instance first offloads its trainer state (fp32 master weights, Adam moments,
  bf16 gradients: 14 bytes per parameter, sharded over the trainer's GPUs) to host memory at the
  PCIe rate, then loads the inference weights like any weight load (both stall that instance);
  its KV cache is what is left after the inference weights and the bf16 parameter shard the
  trainer keeps on the GPU;
- reclaiming: the trainer starts only after the slowest lent instance has sent its requests' KV
  (bytes / P2P bandwidth) and reloaded its trainer state; the instances that import the requests
  pay the KV transfer as any migration.
Colocated sync has no separate trainer devices: there is nothing to lend.
"""

from __future__ import annotations

from dora.rl.rollout import RolloutController

from .virtual_clock import VirtualClock
from .costmodel import CostModel
from .sim_instance import SimInstance

TRAINER_STATE_BYTES_PER_PARAM = 14     # fp32 master (4) + Adam m, v (8) + bf16 gradients (2)


class ElasticDevices:
    def __init__(self, ctl: RolloutController, cost: CostModel, clock: VirtualClock, train_gpus: int,
                 instances: list[SimInstance]):
        self.ctl, self.cost, self.clock = ctl, cost, clock
        m, hw, tp = cost.model, cost.hw, cost.model.tp
        self.instances = instances
        shard = m.params_b * 1e9 / train_gpus                   # parameters per trainer GPU
        self.state_move_s = shard * TRAINER_STATE_BYTES_PER_PARAM / hw.host_bw
        kept = tp * shard * 2                                   # bf16 parameter shards kept on the instance's GPUs
        for i in instances:
            i.kv_capacity = max(1, int((0.9 * tp * hw.hbm_bytes - m.weight_bytes - kept) / m.kv_bytes_per_token))
        self.lent = False
        self.back_at: float | None = None                      # hand-back in progress until then
        self.lends = 0
        self.handback_s = 0.0

    def blocked(self) -> bool:
        """The trainer may not start: its devices are lent or still coming back."""
        return self.lent or (self.back_at is not None and self.clock.now() < self.back_at)

    def step(self, trainer_idle: bool) -> None:
        """After every event: lend while the trainer waits, reclaim once its batch is ready."""
        if not self.instances:
            return
        ready = self.ctl.trainer_ready()
        if self.lent and ready:
            moved = self.ctl.reclaim()
            self.lent = False
            kv_s = max((self.cost.kv_transfer_s(kv) for _, kv in moved.values() if kv), default=0.0)
            delay = kv_s + self.state_move_s
            self.handback_s += delay
            self.back_at = self.clock.now() + delay
            self.clock.call_at(self.back_at, lambda: None)     # wake the loop when the devices are back
        elif not self.lent and trainer_idle and not ready and not self.blocked():
            for i in self.instances:
                i.switch(self.state_move_s)
            self.ctl.lend(self.instances)
            self.lent = True
            self.lends += 1
