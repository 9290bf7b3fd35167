"""Rollout orchestration shared by the real runtime and the simulator (one control code, two clocks)."""

from .config import RolloutConfig, RolloutConfigError
from .ledger import Ledger, StepMetrics
from .policies import POLICIES, RolloutPolicy
from .rollout_controller import RolloutController
from .manager import RolloutManager
from .orchestrator import Orchestrator, partition
from .transfer_queue import TransferQueue
from .types import Finished, InstanceStats, Request, RequestState, RolloutInstance, Trajectory

__all__ = ["POLICIES", "RolloutPolicy", "RolloutConfig", "RolloutConfigError", "RolloutController",
           "Ledger", "StepMetrics",
           "RolloutManager", "Orchestrator", "partition", "TransferQueue", "Finished",
           "InstanceStats", "Request", "RequestState", "RolloutInstance", "Trajectory"]
