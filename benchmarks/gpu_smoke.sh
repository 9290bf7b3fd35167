#!/usr/bin/env bash
# GPU smoke run: the quickstart on gpu pools with the vllm engine and a sharded NCCL trainer, on
# whatever GPUs this machine has, then a table of what it did. CI never needs it (no GPU there).
#
#   bash benchmarks/gpu_smoke.sh [STEPS]        # default 20 steps; needs vllm importable or DORA_VLLM_PYTHON
#
# GPUs: 1 for rollout, the rest (up to 4) for the trainer's ranks; with 1 GPU the trainer shares
# nothing and runs on CPU ranks instead. The model is the quickstart's tiny llama, widened to
# head_dim 32 (vLLM's attention kernels want it), so the run measures dora's plumbing on GPUs
# (placement, vLLM hand-off, NCCL ranks, weight publication), not model quality.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-20}"
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
if [[ "${GPUS:-0}" -lt 1 ]]; then
  echo "gpu_smoke: no GPU here (nvidia-smi lists none); nothing to do" >&2
  exit 2
fi
RANKS=$(( GPUS - 1 )); (( RANKS > 4 )) && RANKS=4
if (( RANKS >= 1 )); then
  TRAIN=("pools.train.device=gpu" "pools.train.count=$RANKS" "nodes.train.replicas=$RANKS")
else
  RANKS=2
  TRAIN=("pools.train.count=2" "nodes.train.replicas=2")
fi
OUT="${OUT:-runs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}"
echo "gpu_smoke: $GPUS GPU(s): rollout on 1 (vllm), trainer of $RANKS rank(s) -> $OUT" >&2
python3 -m dora.cli run pipelines/quickstart.yaml --out "$OUT" \
  'model={arch: llama, hidden: 128, layers: 2, heads: 4, kv_heads: 2, intermediate: 256, vocab: 0, max_positions: 512, init_std: 0.05, tokenizer: chars}' \
  pools.rollout.device=gpu pools.rollout.count=1 nodes.rollout.replicas=1 nodes.rollout.params.engine=vllm \
  nodes.train.params.steps="$STEPS" "${TRAIN[@]}"
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/summary.json"))
steps = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
last = steps[-1]
print(f"{'steps':<22}{len(steps)}")
print(f"{'train_ranks':<22}{last.get('train_ranks')}")
print(f"{'tokens/s':<22}{s.get('tokens_per_s', 0):.0f}")
print(f"{'wall s':<22}{s.get('wall_s', 0):.1f}")
print(f"{'reward first3/last3':<22}{s.get('reward_first3')} / {s.get('reward_last3')}")
print(f"{'weight loads':<22}{s.get('weight_loads')}")
pub = [m.get("weight_sync_s") for m in steps if m.get("weight_sync_s") is not None]
if pub:
    print(f"{'weight sync s (mean)':<22}{sum(pub) / len(pub):.3f}")
print(f"{'ended':<22}{s.get('ended')}")
EOF
