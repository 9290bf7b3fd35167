"""Declarations of the built-in ops: the one place each op's params are declared (type, default,
range, doc); `dora ops` prints them. Implementations, name registries and cross-param checks are
named by import path only; dora.graph never imports them until a pipeline is checked.
"""

from __future__ import annotations

from dora.graph.opspec import OpSpec, ParamSpec, PortSpec, When

P = ParamSpec


def _params(*specs: ParamSpec) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


# How a sharded model (update, critic, reference: `replicas` ranks of one FSDP group) computes.
PRECISION = P("precision", "str", "fp32", "fp32, or bf16 compute with fp32 master weights and gradient reduction "
              "(FSDP2 MixedPrecisionPolicy; torch.autocast on one rank)", choices=("fp32", "bf16"))
ACTIVATION_CHECKPOINTING = P("activation_checkpointing", "bool", False,
                             "recompute each transformer block's activations in backward (less memory, ~1/3 more compute)")


# The columns a multi-turn generate (max_turns > 1) adds; types and meaning in dora/graph/columns.py.
# generate replicas: engine counters each `finished` event carries as deltas since the replica's last
# report (tokens prefilled, prompt tokens found in the prefix cache, parked KV dropped for memory and
# the context prefilled again for it), summed into per-step metrics (rl ledger); and gauges it carries
# as they are (KV blocks used and free, decode graphs captured so far), whose latest per replica the
# ledger sums over replicas at each step
ENGINE_COUNTERS = ("prefill_tokens", "prefix_hit_tokens", "parked_dropped", "continuation_reprefill_tokens")
ENGINE_GAUGES = ("kv_blocks_used", "kv_blocks_free", "graph_captures")
MULTITURN_COLUMNS = ("response_mask", "final_turn_text", "turns", "tool_calls", "tool_errors", "tool_wait_s")


DATASET = OpSpec(
    name="dataset",
    doc="Source of prompts: one row per prompt, repeated group_size times per group",
    inputs=(),
    adds=("uid", "group_id", "prompt", "question", "prompt_ids", "answer", "task"),
    params=_params(
        P("source", "str", "synthetic:quickstart", "synthetic:NAME, reasoning_gym:NAME, or a .jsonl/.parquet path",
          names_from="dora.ops.dataset_settings:source_problem"),
        P("size", "int", 256, "number of distinct prompts (0 = every row of a file)", min=0),
        P("group_size", "int", 8, "responses per prompt (G)", min=1),
        P("batch_prompts", "int", 4, "prompts per emitted batch", min=1),
        P("shuffle", "bool", True, "shuffle prompts each epoch"),
        P("seed", "int", 0, "shuffle / generation seed", min=0),
        P("epochs", "int", 0, "passes over the data (0 = endless)", min=0),
        P("task_params", "dict", {}, "extra arguments for the task generator"),
        P("chat_template", "str?", None, "chat template (null = the model's default)"),
        P("max_prompt_tokens", "int?", None, "longest prompt (tokens, chat template applied) a row may have; null = "
          "what the generate node's context takes (derived when the model's context is known: engine torch the "
          "context less 1, vllm less max_tokens). A longer row is bad, as on_error says", min=1),
        P("on_error", "str", "fail", "a row that cannot be used (malformed, or over max_prompt_tokens): fail the "
          "run naming file:line (exit 2), or skip it (skipped rows are counted in summary.json "
          "accounting.dataset_skipped_rows)", choices=("fail", "skip")),
        P("holdout", "float", 0.0, "share of the source's distinct prompts kept out of training, chosen by a hash of "
          "the prompt text (held-out sets with split: holdout evaluate on exactly those)", min=0, max=0.9),
    ),
    check="dora.ops.dataset_settings:check_params",
    impl="dora.ops.dataset:DatasetOp",
)

GENERATE = OpSpec(
    name="generate",
    doc="Sample responses from the current policy with an inference engine",
    inputs=(PortSpec("prompts", ("prompt_ids",)),),
    adds=("response_ids", "response_text", "behavior_logprobs", "token_versions", "policy_version", "finish_reason"),
    params=_params(
        P("engine", "str", "torch", "inference engine", choices=("torch", "vllm")),
        P("temperature", "float", 1.0, "sampling temperature (0 = greedy)", min=0),
        P("top_p", "float", 1.0, "nucleus sampling threshold", min=1e-6, max=1.0),
        P("top_k", "int", 0, "top-k sampling (0 = off)", min=0),
        P("max_tokens", "int", 128, "maximum response tokens", min=1),
        P("stop", "list", [], "stop strings"),
        P("max_batch", "int", 64, "maximum concurrent sequences per replica", min=1),
        P("weight_sync", "str", "file", "how new weights arrive: safetensors file, or torch.distributed broadcast from the trainer",
          choices=("file", "broadcast")),
        P("dtype", "str", "float32", "weights, KV cache and compute dtype (bfloat16 on GPUs)",
          choices=("float32", "bfloat16", "float16")),
        P("kv_cache_gb", "float?", None, "torch engine: GiB of KV cache per replica (null: on a GPU 0.9 of its memory "
          "less weights and workspace; on CPU room for max_batch requests of the model's context)", min=0.001),
        # multi-turn rollouts with tools (dora/ops/multiturn, dora/ops/tools); max_turns 1 = single-turn
        P("max_turns", "int", 1, "model turns per trajectory (> 1 needs tools: each turn that calls a tool gets its "
          "observation and another turn); max_tokens then bounds each turn", min=1),
        P("max_total_tokens", "int", 2048, "multi-turn: response tokens of a trajectory, turns and observations "
          "together (past it the trajectory ends with finish_reason length)", min=2),
        P("tools", "list", [], "tools the model may call: [{name: NAME, kind: python|search (default NAME), <settings>}] "
          "(each kind's settings are declared on its class: dora/ops/tools/python_tool.py, search_tool.py)"),
        P("tool_parser", "str", "hermes", "how a turn calls a tool: hermes (<tool_call>{json}</tool_call>), tag "
          "(<NAME>argument</NAME>) or stop (a turn ending on a `stop` string calls the one tool with its text)", names_from="dora.ops.tools.tool_parsers:PARSERS"),
        P("observation_template", "str", "\n<tool_response>\n{observation}\n</tool_response>\n",
          "text appended after a turn that called tools, {observation} = their output (chat models: close the turn "
          "and open the next assistant turn here)"),
        P("max_tool_calls", "int", 4, "tool calls run per turn (more are answered with an error)", min=1),
        P("tool_workers", "int", 4, "threads running tool calls per replica", min=1),
        P("park_kv", "bool", True, "multi-turn, torch engine: keep a trajectory's KV across its tool waits (parked, "
          "counted against the KV pool; dropped oldest first when the pool runs short, then prefilled again) so "
          "the next turn prefills only the observation; false: every turn prefills its whole context"),
    ),
    impl="dora.ops.generate:GenerateOp",
    check="dora.ops.generate_settings:check_params",
    host_check="dora.ops.tools.sandbox_check:generate_host_problems",
    is_generate=True,
    devices_check="dora.ops.generate_settings:devices_problem",
    when=(When("max_turns", (1,), adds=MULTITURN_COLUMNS, negate=True),),
)

REWARD = OpSpec(
    name="reward",
    doc="Score each trajectory with a verifier or a reward function, or sum weighted sources",
    inputs=(PortSpec("trajectories", ("response_text", "answer")),),
    adds=("reward",),
    params=_params(
        P("fn", "str", "synthetic", "synthetic, math_verify, reasoning_gym, format, code_exec, or pkg.module:function "
          "fn(response_text, answer, row, **params) -> float, sync or async (docs/reward_functions.md)",
          names_from="dora.ops.reward:fn_problem"),
        P("on_error", "str", "fail", "what a failing reward function does", choices=("fail", "zero")),
        P("params", "dict", {}, "extra arguments for the reward function"),
        P("sources", "list", [], "instead of fn: [{name, fn | column, weight, params}]; reward = sum of weight x "
          "value, each kept as column reward/<name> and metric reward/<name> (dora/ops/reward_sources.py)"),
    ),
    impl="dora.ops.reward:RewardOp",
    check="dora.ops.reward:check_params",
    columns="dora.ops.reward_sources:reward_columns",
    when=(When("fn", ("reasoning_gym",), needs=("task",)),),
    host_check="dora.ops.tools.sandbox_check:reward_host_problems",
)

# The output column of a model that scores (reward_model, judge): `reward`, or reward/<name> for a reward
# node's sources.
SCORE_COLUMN = P("column", "str", "reward", "the score's column: reward (feeds advantage) or reward/<name> (a "
                 "source of a reward node)", names_from="dora.ops.reward_sources:column_problem")
SCORER_DTYPE = P("dtype", "str", "float32", "weights and compute dtype (bfloat16 on GPUs)",
                 choices=("float32", "bfloat16", "float16"))

REWARD_MODEL = OpSpec(
    name="reward_model",
    doc="Score prompt + response with a reward model (a sequence classifier with one label)",
    inputs=(PortSpec("trajectories", ("response_text",)),),
    adds=(),
    params=_params(
        P("model", "dict?", None, "the reward model: {path: DIR} (AutoModelForSequenceClassification, num_labels 1) "
          "or a tiny seeded one {arch: llama, hidden: ..., tokenizer: chars} (dora/ops/classifier_models.py)"),
        P("template", "str", "{prompt}{response}", "the scored text: {prompt} {response} {answer} filled from the row, "
          "tokenized by the reward model's tokenizer"),
        SCORE_COLUMN,
        P("token_budget", "int", 8192, "padded tokens per forward pass (rows x longest row)", min=1),
        P("max_length", "int?", None, "longest input in tokens (null: the model's positions); a longer one keeps "
          "its last max_length tokens (counted as truncated)", min=1),
        SCORER_DTYPE,
    ),
    impl="dora.ops.reward_model:RewardModelOp",
    check="dora.ops.reward_model:check_params",
    columns="dora.ops.reward_sources:scorer_columns",
)

# A judge's failures by kind: its `judge_errors` events carry these counts, the RL driver sums them per step
# into metrics judge_<kind> (and over the run into summary.json's accounting).
JUDGE_ERRORS = ("parse_errors", "timeouts", "server_errors")

JUDGE = OpSpec(
    name="judge",
    doc="Score each trajectory with an LLM judge: a rubric in, a parsed verdict out",
    inputs=(PortSpec("trajectories", ("uid", "response_text")),),
    adds=(),
    params=_params(
        P("engine", "str", "torch", "who judges: the torch or vllm engine here (the judge's own model), or http "
          "(a server speaking the OpenAI API, e.g. vllm serve)", choices=("torch", "vllm", "http")),
        P("model", "dict?", None, "torch/vllm: the judge's model section (as the pipeline's model:; null = the "
          "pipeline's, frozen at its initial weights)"),
        P("rubric", "str", "Rate the response to the question from 0 (wrong or useless) to 10 (correct and clear). "
          "Reply with the number only.\n\nQuestion:\n{prompt}\n\nResponse:\n{response}\n\nScore:", "the judge's prompt: {prompt} {response} and optionally {answer} "
          "filled from the row (other braces are literal); the part before the first placeholder is prefilled "
          "once per batch (prefix cache)"),
        P("chat", "bool", True, "wrap the rubric as the user message of the judge tokenizer's chat template (when "
          "it has one); http: api chat does this on the server"),
        P("parser", "str", "number", "verdict -> score in [0, 1]: number (in range), yes_no, letter (A B C D F) or "
          "regex (pattern's first group)", names_from="dora.ops.judge.verdicts:PARSERS"),
        P("pattern", "str?", None, "parser regex: the regex whose first group is the verdict"),
        P("range", "list", [0, 10], "[lo, hi] of a numeric verdict (outside: a parse error); score = (x - lo) / (hi - lo)"),
        P("values", "dict", {}, "verdict word -> score (yes_no and letter have defaults; regex: words instead of numbers)"),
        SCORE_COLUMN,
        P("on_error", "str", "zero", "an unparseable verdict, a timeout, a server error: fail the run, score 0, or "
          "skip (drop the whole group: C2)", choices=("fail", "zero", "skip")),
        P("temperature", "float", 0.0, "the judge's sampling temperature (0 = greedy)", min=0),
        P("top_p", "float", 1.0, "nucleus sampling threshold", min=1e-6, max=1.0),
        P("top_k", "int", 0, "top-k sampling (0 = off)", min=0),
        P("max_tokens", "int", 16, "longest verdict in tokens", min=1),
        P("max_batch", "int", 64, "torch/vllm: concurrent sequences per replica", min=1),
        P("max_in_flight", "int", 64, "rows a replica holds under judgement; past it the input edge back-pressures", min=1),
        SCORER_DTYPE,
        P("kv_cache_gb", "float?", None, "torch engine: GiB of KV cache per replica (null: as generate derives it)", min=0.001),
        P("url", "str?", None, "http: the API's base URL, e.g. http://127.0.0.1:8000/v1"),
        P("served_model", "str?", None, "http: the model name to ask for (null: the first the server lists)"),
        P("api", "str", "completions", "http: completions (the rubric as the prompt) or chat (as the user message)",
          choices=("completions", "chat")),
        P("concurrency", "int", 8, "http: requests open at once per replica", min=1),
        P("timeout_s", "float", 60.0, "http: the longest wait for one answer", min=0.001),
        P("retries", "int", 2, "http: tries after a timeout, a refused connection, 429 or 5xx", min=0),
        P("start_timeout_s", "float", 60.0, "http: how long start-up waits for the server to answer GET /models "
          "before the run fails naming it", min=0),
    ),
    impl="dora.ops.judge:JudgeOp",
    check="dora.ops.judge.judge_checks:check_params",
    columns="dora.ops.reward_sources:scorer_columns",
    devices_check="dora.ops.judge.judge_checks:devices_problem",
)

REFERENCE = OpSpec(
    name="reference",
    doc="Log-probabilities of each response under the frozen reference model",
    inputs=(PortSpec("trajectories", ("prompt_ids", "response_ids")),),
    adds=("ref_logprobs",),
    params=_params(P("micro_batch_tokens", "int", 4096, "tokens per forward micro-batch", min=1),
                   P("temperature", "float?", None, "logprob temperature (null = the generate node's)", min=0),
                   PRECISION),
    impl="dora.ops.reference:ReferenceOp",
    sharded=True,
)

CRITIC = OpSpec(
    name="critic",
    doc="Value model: predicts per-token values and trains on returns",
    inputs=(PortSpec("trajectories", ("prompt_ids", "response_ids", "reward")),),
    adds=("values",),
    params=_params(
        P("lr", "float", 1e-5, "learning rate", min=0),
        P("gamma", "float", 1.0, "discount", min=0, max=1),
        P("lam", "float", 1.0, "GAE lambda for the value targets", min=0, max=1),
        P("value_clip", "float", 0.2, "value clipping range", min=0),
        P("micro_batch_tokens", "int", 4096, "tokens per forward/backward micro-batch", min=1),
        P("grad_clip", "float", 1.0, "gradient norm clip", min=0),
        PRECISION, ACTIVATION_CHECKPOINTING,
    ),
    impl="dora.ops.critic:CriticOp",
    sharded=True,
)

ADVANTAGE = OpSpec(
    name="advantage",
    doc="Per-token advantages from rewards (group-relative or GAE)",
    inputs=(PortSpec("scored", ("group_id", "reward", "response_ids")),),
    adds=("advantages",),
    params=_params(
        P("estimator", "str", "grpo", "advantage estimator from dora.algos (grpo, rloo, gae, ...)",
          names_from="dora.algos.advantages:ADVANTAGE_ESTIMATORS"),
        P("gamma", "float", 1.0, "discount (gae)", min=0, max=1),
        P("lam", "float", 1.0, "GAE lambda", min=0, max=1),
        P("whiten", "bool", True, "normalise advantages"),
        P("kl_coef", "float", 0.0, "KL penalty folded into the reward (needs ref_logprobs when > 0)", min=0),
        P("kl_estimator", "str", "k1", "KL estimator for the reward penalty", names_from="dora.algos.kl:KL_ESTIMATORS"),
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
        P("loss", "str", "ppo_clip", "policy loss from dora.algos (ppo_clip, dapo, ...)", names_from="dora.algos.losses:LOSSES"),
        P("lr", "float", 1e-5, "learning rate", min=0),
        P("weight_decay", "float", 0.0, "AdamW weight decay", min=0),
        P("warmup_steps", "int", 0, "linear warmup steps", min=0),
        P("total_steps", "int", 0, "cosine decay horizon (0 = constant after warmup)", min=0),
        P("min_lr_ratio", "float", 0.1, "final lr as a fraction of lr", min=0, max=1),
        P("grad_clip", "float", 1.0, "gradient norm clip", min=0),
        P("micro_batch_tokens", "int", 4096, "tokens per forward/backward micro-batch", min=1),
        P("clip_eps", "float", 0.2, "PPO clip range (low side)", min=0, max=1),
        P("clip_eps_high", "float?", None, "PPO clip range high side (null = clip_eps)", min=0),
        P("dual_clip", "float?", None, "dual-clip constant c > 1 (null = off)", min=1.000001),
        P("agg", "str", "token_mean", "loss aggregation", names_from="dora.algos.losses:AGGS"),
        P("off_policy", "dict", {"name": "ess_lr", "cap": 2.0, "power": 0.5},
          "off-policy correction of stale tokens: {name: none|tis|icepop|m2po|ess_lr|decoupled, <its params>} (dora/algos/off_policy.py)"),
        P("kl_coef", "float", 0.0, "KL loss coefficient (needs ref_logprobs when > 0)", min=0),
        P("kl_estimator", "str", "k3", "KL estimator for the loss", names_from="dora.algos.kl:KL_ESTIMATORS"),
        P("entropy_coef", "float", 0.0, "entropy bonus coefficient", min=0),
        P("ppo_epochs", "int", 1, "passes over each training batch", min=1),
        P("steps", "int", 20, "training steps in the run", min=1),
        P("temperature", "float?", None, "logprob temperature (null = the generate node's, so ratios compare like with like)", min=0),
        P("weight_sync", "str", "file", "also broadcast each version to the generate replicas (torch.distributed)",
          choices=("file", "broadcast")),
        P("broadcast_to", "int", 0, "generate replicas that receive the broadcast (0 = the generate node's replicas)", min=0),
        PRECISION, ACTIVATION_CHECKPOINTING,
    ),
    impl="dora.ops.update:UpdateOp",
    check="dora.ops.training.update_settings:check_params",
    is_update=True,
    sharded=True,
    when=(When("kl_coef", (0, 0.0), needs=("ref_logprobs",), negate=True),),
)

# Data across policies (docs/architecture.md, "Several policies")
TO_PROMPTS = OpSpec(
    name="to_prompts",
    doc="Another policy's prompts from this policy's trajectories: each trajectory becomes one prompt group "
        "(a challenger's proposal becomes a solver's problem)",
    inputs=(PortSpec("trajectories", ("uid", "response_text", "policy_version")),),
    adds=("uid", "group_id", "prompt", "prompt_ids", "answer", "task", "source_uid"),
    params=_params(
        P("task", "str", "synthetic:quickstart", "the synthetic task whose propose rule turns a response into a problem "
          "and whose scorer grades the answers", names_from="dora.ops.to_prompts:propose_problem"),
        P("task_params", "dict", {}, "extra arguments for the task's propose rule"),
        P("group_size", "int", 8, "responses per problem (G of the policy it feeds)", min=1),
        P("chat_template", "str?", None, "chat template (null = the model's default)"),
        P("version_column", "str?", None, "the column recording the proposing policy's version (null = "
          "<its update node>_version)"),
    ),
    impl="dora.ops.to_prompts:ToPromptsOp",
    carries=(),
)

FRONTIER = OpSpec(
    name="frontier",
    doc="Score a policy's trajectories by another policy's answers to them: reward 1 at the answers' target "
        "success rate (R-Zero's uncertainty reward at target 0.5), falling to 0 where they always or never succeed",
    inputs=(PortSpec("trajectories", ("uid", "group_id")),
            PortSpec("solved", ("source_uid", "group_id", "reward", "policy_version"))),
    adds=("reward", "answers_reward_mean"),
    params=_params(
        P("answers", "int?", None, "answers per trajectory (null = the group size of the policy that answers)", min=1),
        P("target", "float", 0.5, "the answers' mean reward (or success rate) that scores 1", min=0.0, max=1.0),
        P("success", "float?", None, "an answer whose reward reaches this solves the problem, and the trajectory is "
          "scored on the share of answers that do (null: on their mean reward)"),
        P("repetition", "float", 0.0, "R-Zero's repetition penalty: the reward less this x the share of the "
          "trajectory's group that poses the same problem", min=0.0),
        P("version_column", "str?", None, "the column recording the answering policy's newest version among the "
          "answers (null = <its update node>_version)"),
    ),
    impl="dora.ops.frontier:FrontierOp",
    carries=("trajectories",),
)

BUILTIN_OPS: dict[str, OpSpec] = {
    s.name: s for s in (DATASET, GENERATE, REWARD, REWARD_MODEL, JUDGE, REFERENCE, CRITIC, ADVANTAGE, FILTER, UPDATE,
                        TO_PROMPTS, FRONTIER)
}
