"""Cost model: how long prefill, decode, training, weight transfer and KV migration take.

Rough H800 figures (989 TFLOP/s dense bf16, 3.35 TB/s HBM, ~50 GB/s effective P2P for weights and
KV between nodes) and achievable efficiencies. Two numbers are fitted, both shared by every mode:
the decode step's fixed part and the trainer's cost, against the paper's synchronous step (time
and rollout-only share at 64 and 128 GPUs; docs/benchmarks.md has the validation table). Every
other mode's figure is a prediction.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    params_b: float             # parameters, billions
    layers: int
    kv_heads: int
    head_dim: int
    tp: int                     # GPUs per rollout group (DP rollout instance)
    max_batch: int = 256        # max concurrent sequences per instance (max_num_seqs)

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2                         # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2   # K and V, bf16


MODELS = {
    "qwen2.5-32b": ModelSpec("qwen2.5-32b", 32.8, 64, 8, 128, tp=4),
    "qwen2.5-32b-tp8": ModelSpec("qwen2.5-32b-tp8", 32.8, 64, 8, 128, tp=8),
    "qwen2.5-1.5b": ModelSpec("qwen2.5-1.5b", 1.54, 28, 2, 128, tp=1),
}


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str = "h800"
    flops: float = 989e12       # dense bf16 per GPU
    hbm_bw: float = 3.35e12     # bytes/s per GPU
    hbm_bytes: float = 80e9
    p2p_bw: float = 50e9        # weights / KV between instances, bytes/s per link
    host_bw: float = 25e9       # host <-> GPU (PCIe) for KV parked in host memory, bytes/s per instance
    mfu_prefill: float = 0.45
    mfu_decode: float = 0.50    # decode GEMMs at large batch
    mfu_train: float = 0.33     # fitted to the paper's sync step times (see CostModel)
    mbu_decode: float = 0.70    # fraction of HBM bandwidth decode achieves


class CostModel:
    def __init__(self, model: ModelSpec, hw: Hardware = Hardware()):
        self.model, self.hw = model, hw
        tp = model.tp
        # decode step (roofline): a fixed part (TP all-reduces, kernel launches, sampling: 18 ms,
        # fitted with the dapo-math workload to the paper's sync step and rollout-only share at
        # 64 and 128 GPUs; a lone 30K-token trajectory then takes ~790 s),
        # + per-sequence CPU scheduling, + max(read the weights once, the batch's GEMM FLOPs)
        # (they overlap: small batches are bound by the weight read, large ones by compute),
        # + reading the KV context.
        self.t_fixed = 0.018
        self.t_weights = model.weight_bytes / tp / (hw.hbm_bw * hw.mbu_decode)
        self.t_sched_per_seq = 1e-5
        self.t_flops_per_seq = 2 * model.params_b * 1e9 / (tp * hw.flops * hw.mfu_decode)
        self.t_per_ctx_token = model.kv_bytes_per_token / tp / (hw.hbm_bw * hw.mbu_decode)
        self.prefill_per_token = 2 * model.params_b * 1e9 / (tp * hw.flops * hw.mfu_prefill)
        self.kv_capacity_tokens = int(max(0.0, 0.9 * tp * hw.hbm_bytes - model.weight_bytes) / model.kv_bytes_per_token)
        # training: forward+backward (6N) plus recomputing old/ref log-probs (2 x 2N) per token,
        # plus a per-step cost that does not shrink with GPUs (pipeline fill/drain of the log-prob
        # and update passes, optimizer step, weight gather). Fitted to the paper's sync steps:
        # train time = step x (1 - rollout-only share) = 481 s at 64 GPUs, 328 s at 128, for
        # ~19.5M tokens/step (tok/s x step) -> 1.0e-3 GPU-s/token (10N FLOPs at 33% MFU) + 175 s.
        self.train_flops_per_token = 10 * model.params_b * 1e9
        self.train_fixed_s = 175.0 * model.params_b / 32.8

    # -- rollout ----------------------------------------------------------------------------------
    def decode_step_s(self, batch: int, ctx_tokens: float) -> float:
        """Time of one decode iteration for `batch` running sequences holding ctx_tokens of KV."""
        return (self.t_fixed + self.t_sched_per_seq * batch + max(self.t_weights, self.t_flops_per_seq * batch)
                + self.t_per_ctx_token * ctx_tokens)

    def decode_step_versions_s(self, batches, ctx_tokens: float) -> float:
        """One decode iteration of an instance hosting several versions: each version with running
        requests (`batches`: how many per version) reads its own weights and runs its own GEMMs;
        the fixed part, scheduling and the KV read are shared (one step, one KV pool)."""
        return (self.t_fixed + self.t_sched_per_seq * sum(batches)
                + sum(max(self.t_weights, self.t_flops_per_seq * b) for b in batches)
                + self.t_per_ctx_token * ctx_tokens)

    def weight_tokens(self) -> int:
        """KV tokens one more hosted weight copy displaces on an instance."""
        return int(self.model.weight_bytes / self.model.kv_bytes_per_token)

    def prefill_s(self, new_tokens: int, ctx_before: int = 0) -> float:
        """Prefill of new_tokens after ctx_before cached tokens; attention makes it superlinear."""
        if new_tokens <= 0:
            return 0.0
        mean_ctx = ctx_before + new_tokens / 2
        return new_tokens * self.prefill_per_token * (1.0 + mean_ctx / 16384)

    def weight_load_s(self) -> float:
        return self.model.weight_bytes / self.model.tp / self.hw.p2p_bw + 0.5

    def kv_transfer_s(self, kv_bytes: int) -> float:
        return kv_bytes / self.hw.p2p_bw + 0.002

    def kv_reload_s(self, kv_bytes: int) -> float:
        """Bring a request's KV parked in host memory back into the GPU cache."""
        return kv_bytes / self.hw.host_bw + 0.001

    def versions_problem(self, versions: int, max_len_tokens: int) -> str | None:
        """Why one instance cannot hold `versions` weight copies next to one request of
        max_len_tokens (None when it can): each hosted version's weights come out of the KV room."""
        if versions < 1:
            return f"versions per instance must be >= 1, got {versions}"
        room = 0.9 * self.model.tp * self.hw.hbm_bytes
        weights = versions * self.model.weight_bytes
        need = max_len_tokens * self.model.kv_bytes_per_token
        if weights + need <= room:
            return None
        return (f"{versions} versions of {self.model.name} take {weights / 1e9:.1f} GB of the instance's "
                f"{room / 1e9:.1f} GB ({self.model.tp} GPUs x {self.hw.hbm_bytes / 1e9:.0f} GB x 0.9), leaving "
                f"{max(0.0, room - weights) / 1e9:.1f} GB of KV; one request of {max_len_tokens} tokens needs "
                f"{need / 1e9:.1f} GB")

    # -- training ---------------------------------------------------------------------------------
    def train_s(self, tokens: int, gpus: int) -> float:
        return tokens * self.train_flops_per_token / (gpus * self.hw.flops * self.hw.mfu_train) + self.train_fixed_s

    def publish_s(self) -> float:
        """Trainer -> rollout weight hand-off (gather/reshard to a servable copy)."""
        return self.model.weight_bytes / self.hw.p2p_bw + 1.0

    # -- bounds -----------------------------------------------------------------------------------
    def lone_s(self, prompt: int, response) -> float:
        """Seconds one trajectory takes alone on an instance (batch 1, nothing else running): the
        fastest it can ever be generated. `response` is a length or a Turns plan (tool waits and
        the prefill of tool outputs count; the context is reloaded from host after each tool)."""
        a = self.t_fixed + self.t_sched_per_seq + max(self.t_weights, self.t_flops_per_seq)
        b = self.t_per_ctx_token
        turns = response.outs if hasattr(response, "outs") else (int(response),)
        t, ctx = self.prefill_s(prompt), prompt
        for i, o in enumerate(turns):
            t += o * a + b * (o * ctx + o * (o - 1) / 2)
            ctx += o
            if i < len(turns) - 1:
                tool = response.tools[i]
                t += (response.waits[i] + self.kv_reload_s(ctx * self.model.kv_bytes_per_token)
                      + self.prefill_s(tool, ctx))
                ctx += tool
        return t

    def rollout_gpu_s(self, prompt: float, decoded: float, tool_tokens: float, ctx_per_decoded: float) -> float:
        """GPU-seconds to generate one trajectory at the most efficient batch (mean lengths)."""
        prefill = self.prefill_s(int(prompt)) + self.prefill_s(int(tool_tokens), int(ctx_per_decoded))
        return decoded * self.gpu_s_per_decoded_token(ctx_per_decoded) + prefill * self.model.tp

    def train_gpu_s(self, tokens: float) -> float:
        """GPU-seconds of training work per step for `tokens` (without the fixed per-step part)."""
        return tokens * self.train_flops_per_token / (self.hw.flops * self.hw.mfu_train)

    def gpu_s_per_decoded_token(self, mean_ctx: float) -> float:
        """Decode GPU-seconds per token at a full batch (the most efficient point)."""
        b = self.model.max_batch
        ctx = min(b * mean_ctx, self.kv_capacity_tokens)
        b_eff = min(b, max(1, int(self.kv_capacity_tokens / max(1.0, mean_ctx))))
        return self.decode_step_s(b_eff, ctx) / b_eff * self.model.tp
