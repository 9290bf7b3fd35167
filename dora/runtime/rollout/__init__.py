"""Rollout orchestration shared by the real runtime and the simulator (one control code, two clocks)."""

from .config import MODES, RolloutConfig, RolloutConfigError
from .ledger import Ledger, StepMetrics
from .policies import POLICIES, RolloutPolicy
from .rollout_controller import RolloutController
from .manager import RolloutManager
from .orchestrator import Orchestrator, partition
from .trace import TraceWriter
from .transfer_queue import TransferQueue
from .types import Finished, InstanceStats, Request, RequestState, RolloutInstance, Trajectory

__all__ = ["MODES", "POLICIES", "RolloutPolicy", "RolloutConfig", "RolloutConfigError", "RolloutController",
           "Ledger", "StepMetrics",
           "RolloutManager", "Orchestrator", "partition", "TraceWriter", "TransferQueue", "Finished",
           "InstanceStats", "Request", "RequestState", "RolloutInstance", "Trajectory"]
