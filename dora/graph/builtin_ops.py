"""Declarations of the built-in ops: exactly the table "Built-in op parameters" in
docs/architecture.md (the contract with dora/ops). Implementations are named by import
path only; dora.graph never imports them.
"""

from __future__ import annotations

from dora.graph.opspec import OpSpec, ParamSpec, PortSpec, When

P = ParamSpec


def _params(*specs: ParamSpec) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


DATASET = OpSpec(
    name="dataset",
    doc="Source of prompts: one row per prompt, repeated group_size times per group",
    inputs=(),
    adds=("uid", "group_id", "prompt", "prompt_ids", "answer", "task"),
    params=_params(
        P("source", "str", "synthetic:quickstart", "synthetic:NAME, reasoning_gym:NAME, or a .jsonl/.parquet path"),
        P("size", "int", 256, "number of distinct prompts"),
        P("group_size", "int", 8, "responses per prompt (G)"),
        P("batch_prompts", "int", 4, "prompts per emitted batch"),
        P("shuffle", "bool", True, "shuffle prompts each epoch"),
        P("seed", "int", 0, "shuffle / generation seed"),
        P("epochs", "int", 0, "passes over the data (0 = endless)"),
        P("task_params", "dict", {}, "extra arguments for the task generator"),
        P("chat_template", "str?", None, "chat template (null = the model's default)"),
    ),
    impl="dora.ops.dataset:DatasetOp",
)

GENERATE = OpSpec(
    name="generate",
    doc="Sample responses from the current policy with an inference engine",
    inputs=(PortSpec("prompts", ("prompt_ids",)),),
    adds=("response_ids", "response_text", "behavior_logprobs", "token_versions", "policy_version", "finish_reason"),
    params=_params(
        P("engine", "str", "torch", "inference engine", choices=("torch", "vllm")),
        P("temperature", "float", 1.0, "sampling temperature"),
        P("top_p", "float", 1.0, "nucleus sampling threshold"),
        P("top_k", "int", 0, "top-k sampling (0 = off)"),
        P("max_tokens", "int", 128, "maximum response tokens"),
        P("stop", "list", [], "stop strings"),
        P("max_batch", "int", 64, "maximum concurrent sequences per replica"),
        P("weight_sync", "str", "file", "how new weights arrive: safetensors file, or torch.distributed broadcast from the trainer",
          choices=("file", "broadcast")),
    ),
    impl="dora.ops.generate:GenerateOp",
    is_generate=True,
)

REWARD = OpSpec(
    name="reward",
    doc="Score each trajectory with a verifier or a reward function",
    inputs=(PortSpec("trajectories", ("response_text", "answer")),),
    adds=("reward",),
    params=_params(
        P("fn", "str", "synthetic", "synthetic, math_verify, reasoning_gym, format, or pkg.module:function"),
        P("on_error", "str", "fail", "what a failing reward function does", choices=("fail", "zero")),
        P("params", "dict", {}, "extra arguments for the reward function"),
    ),
    impl="dora.ops.reward:RewardOp",
    when=(When("fn", ("reasoning_gym",), needs=("task",)),),
)

REFERENCE = OpSpec(
    name="reference",
    doc="Log-probabilities of each response under the frozen reference model",
    inputs=(PortSpec("trajectories", ("prompt_ids", "response_ids")),),
    adds=("ref_logprobs",),
    params=_params(P("micro_batch_tokens", "int", 4096, "tokens per forward micro-batch"),
                   P("temperature", "float?", None, "logprob temperature (null = the generate node's)")),
    impl="dora.ops.reference:ReferenceOp",
)

CRITIC = OpSpec(
    name="critic",
    doc="Value model: predicts per-token values and trains on returns",
    inputs=(PortSpec("trajectories", ("prompt_ids", "response_ids", "reward")),),
    adds=("values",),
    params=_params(
        P("lr", "float", 1e-5, "learning rate"),
        P("gamma", "float", 1.0, "discount"),
        P("lam", "float", 1.0, "GAE lambda for the value targets"),
        P("value_clip", "float", 0.2, "value clipping range"),
        P("micro_batch_tokens", "int", 4096, "tokens per forward/backward micro-batch"),
        P("grad_clip", "float", 1.0, "gradient norm clip"),
    ),
    impl="dora.ops.critic:CriticOp",
)

ADVANTAGE = OpSpec(
    name="advantage",
    doc="Per-token advantages from rewards (group-relative or GAE)",
    inputs=(PortSpec("scored", ("group_id", "reward", "response_ids")),),
    adds=("advantages",),
    params=_params(
        P("estimator", "str", "grpo", "advantage estimator from dora.algos (grpo, rloo, gae, ...)"),
        P("gamma", "float", 1.0, "discount (gae)"),
        P("lam", "float", 1.0, "GAE lambda"),
        P("whiten", "bool", True, "normalise advantages"),
        P("kl_coef", "float", 0.0, "KL penalty folded into the reward (needs ref_logprobs when > 0)"),
        P("kl_estimator", "str", "k1", "KL estimator for the reward penalty"),
    ),
    impl="dora.ops.advantage:AdvantageOp",
    when=(
        When("estimator", ("gae",), needs=("values",), adds=("returns",)),
        When("kl_coef", (0, 0.0), needs=("ref_logprobs",), negate=True),
    ),
)

FILTER = OpSpec(
    name="filter",
    doc="Drop rows or whole groups (dapo_dynamic: groups whose rewards are all equal)",
    inputs=(PortSpec("scored", ("group_id", "reward")),),
    adds=(),
    params=_params(P("kind", "str", "dapo_dynamic", "filter kind", choices=("dapo_dynamic",))),
    impl="dora.ops.filter:FilterOp",
)

UPDATE = OpSpec(
    name="update",
    doc="Policy-gradient training step; publishes new weights on the weights edge",
    inputs=(
        PortSpec("batch", ("prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version", "group_id")),
    ),
    adds=(),
    params=_params(
        P("loss", "str", "ppo_clip", "policy loss from dora.algos (ppo_clip, dapo, ...)"),
        P("lr", "float", 1e-5, "learning rate"),
        P("weight_decay", "float", 0.0, "AdamW weight decay"),
        P("warmup_steps", "int", 0, "linear warmup steps"),
        P("total_steps", "int", 0, "cosine decay horizon (0 = constant after warmup)"),
        P("min_lr_ratio", "float", 0.1, "final lr as a fraction of lr"),
        P("grad_clip", "float", 1.0, "gradient norm clip"),
        P("micro_batch_tokens", "int", 4096, "tokens per forward/backward micro-batch"),
        P("clip_eps", "float", 0.2, "PPO clip range (low side)"),
        P("clip_eps_high", "float?", None, "PPO clip range high side (null = clip_eps)"),
        P("dual_clip", "float?", None, "dual-clip constant c (null = off)"),
        P("agg", "str", "token_mean", "loss aggregation"),
        P("off_policy", "dict", {"name": "ess_lr", "cap": 2.0, "power": 0.5},
          "off-policy correction of stale tokens: {name: none|tis|icepop|m2po|ess_lr|decoupled, <its params>} (dora/algos/off_policy.py)"),
        P("kl_coef", "float", 0.0, "KL loss coefficient (needs ref_logprobs when > 0)"),
        P("kl_estimator", "str", "k3", "KL estimator for the loss"),
        P("entropy_coef", "float", 0.0, "entropy bonus coefficient"),
        P("ppo_epochs", "int", 1, "passes over each training batch"),
        P("steps", "int", 20, "training steps in the run"),
        P("save_every", "int", 0, "checkpoint every N steps (0 = only at the end)"),
        P("temperature", "float?", None, "logprob temperature (null = the generate node's, so ratios compare like with like)"),
        P("weight_sync", "str", "file", "also broadcast each version to the generate replicas (torch.distributed)",
          choices=("file", "broadcast")),
        P("broadcast_to", "int", 0, "generate replicas that receive the broadcast (weight_sync: broadcast)"),
    ),
    impl="dora.ops.update:UpdateOp",
    is_update=True,
    when=(When("kl_coef", (0, 0.0), needs=("ref_logprobs",), negate=True),),
)

BUILTIN_OPS: dict[str, OpSpec] = {
    s.name: s for s in (DATASET, GENERATE, REWARD, REFERENCE, CRITIC, ADVANTAGE, FILTER, UPDATE)
}
