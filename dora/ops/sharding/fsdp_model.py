"""A model as a sharded op computes with it: FSDP2 over a RankGroup, or plain on one rank.

With a group, every transformer block and then the root are wrapped with
torch.distributed.fsdp.fully_shard over a 1-D device mesh of all ranks: each rank keeps 1/N of
every parameter (and so of its gradient and AdamW state); a block's full weights exist only while
it computes. Gradients are SUMMED across ranks (divide factor 1, sum-only collectives, which gloo
supports): each rank's loss already uses the whole batch's denominators, so the sum is the
gradient of the whole batch's loss, as on one rank.

precision "bf16": MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): compute in bf16,
fp32 master weights, optimizer state and gradient reduction; on one rank the same through
torch.autocast. activation_checkpointing: transformers' gradient checkpointing per block
(non-reentrant), set before sharding so recomputation re-gathers the block's weights.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

from dora.ops.sharding.rank_group import RankGroup


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the classes transformers marks as not-to-split,
    else the children of the longest ModuleList."""
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _enable_checkpointing(model: nn.Module) -> None:
    for m in model.modules():
        if hasattr(m, "gradient_checkpointing_enable") and getattr(m, "supports_gradient_checkpointing", False):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return
    raise ValueError(f"activation_checkpointing: {type(model).__name__} has no transformers model inside that "
                     "supports gradient checkpointing")


class ShardedModel:
    def __init__(self, model: nn.Module, group: RankGroup | None, device: str, *, precision: str = "fp32",
                 activation_checkpointing: bool = False):
        self.group, self.device, self.precision = group, device, precision
        model.to(device)
        if activation_checkpointing:
            _enable_checkpointing(model)
        self.module = model
        if group is not None:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh("cuda" if str(device).startswith("cuda") else "cpu", (group.world,))
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if precision == "bf16" else MixedPrecisionPolicy())
            for block in transformer_blocks(model):
                fully_shard(block, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(1.0)
                    m.set_force_sum_reduction_for_comms(True)

    def params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def compute(self):
        """Context for forward passes: bf16 autocast on one rank (FSDP casts by itself)."""
        if self.precision == "bf16" and self.group is None:
            return torch.autocast("cuda" if str(self.device).startswith("cuda") else "cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the whole model's gradient (all ranks' shards) to max_norm; the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.params(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank calls it (it gathers); rank 0 gets the full weights on CPU, the others None."""
        if self.group is None:
            return self.module.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.group.leader:
            return None
        first: dict[int, str] = {}   # tied parameters (lm_head = embedding) stay one tensor, as on one rank
        for name, param in self.module.named_parameters(remove_duplicate=False):
            if id(param) in first and name in full:
                full[name] = full[first[id(param)]]
            first.setdefault(id(param), name)
        return full

    def save_sharded(self, optimizer: torch.optim.Optimizer | None, path: str, with_model: bool = True) -> None:
        """Every rank: model (unless with_model is False: the full weights are stored elsewhere) and
        optimizer state as this rank's shards, with torch.distributed.checkpoint (a later load may use
        any rank count: it reshards)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state: dict[str, Any] = {"model": get_model_state_dict(self.module)} if with_model else {}
        if optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(self.module, optimizer)
        with warnings.catch_warnings():   # one rank: DCP says it assumes a single process, which is the point
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(state, checkpoint_id=path, no_dist=self.group is None)

    def load_full_state_dict(self, full: dict[str, torch.Tensor]) -> None:
        """Every rank, each with the full weights: each keeps its shard (one rank: all of them)."""
        if self.group is None:
            self.module.load_state_dict(full, strict=True)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.module, full, options=StateDictOptions(full_state_dict=True, strict=True))

    def local_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """Bytes this rank holds: parameters (its shards) and optimizer state."""
        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if hasattr(t, "to_local") else t

        params = sum(local(p).numel() * local(p).element_size() for p in self.module.parameters())
        optim = 0
        for st in (optimizer.state.values() if optimizer is not None else ()):
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    optim += local(v).numel() * local(v).element_size()
        return {"param_bytes": int(params), "optimizer_bytes": int(optim)}
