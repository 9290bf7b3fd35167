#!/usr/bin/env bash
# GPU day one: the paged engine's first run on a GPU, checked and measured in one call of ~8 minutes.
#
#   bash benchmarks/gpu_day_one.sh                 # on the GPU machine (../shared/GPU.md), from the checkout
#   bash benchmarks/gpu_day_one.sh --device cpu    # the same steps on CPU (a dry run: every step's CPU path)
#
# The GPU machine reaches no package registry. Before the call, on a machine that does, fetch the two
# wheels dora lacks there into .whl/ (ignored by git; give the device tool `carry: [".whl"]`):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl pyzmq omegaconf
#
# Steps, each under its own timeout (a device call may run 10 minutes at most):
#   1. the wheels installed aside (/tmp/site) and put on PYTHONPATH with the checkout      ~5 s
#   2. what the machine is: GPU, torch / triton / transformers versions                   ~10 s
#   3. benchmarks/engine_gpu.py --budget $BUDGET (300): correctness, nano-vLLM's shape, decode ms,
#      gpu_single.yaml sync and dora, then the rest as the budget allows                  <= BUDGET + 30 s
#   4. the gpu test lane, `pytest -m gpu -k "not single"` (step 3 ran gpu_single)          <= LANE_S (100) s
# Worst case 60 + 60 + 330 + 100 = 550 s, under a device call's 590 s timeout; typically ~7 minutes.
# Everything goes to $OUT (the device tool's output folder) or runs/gpu-day-one-DATE: engine_gpu.json,
# engine_gpu.txt, lane.txt, machine.txt. The exit code is step 3's (0 when it ran), or 2 on bad use.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
case "${1:-}" in
  "") ;;
  --device) DEVICE="${2:?--device needs cuda or cpu}" ;;
  *) echo "gpu_day_one: unknown argument ${1}; use: [--device cuda|cpu]" >&2; exit 2 ;;
esac
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] || { echo "gpu_day_one: --device must be cuda or cpu, got $DEVICE" >&2; exit 2; }
BUDGET="${BUDGET:-300}"
LANE_S="${LANE_S:-100}"
if [[ "$DEVICE" == cpu ]]; then BUDGET="${CPU_BUDGET:-120}"; fi
DEST="${OUT:-runs/gpu-day-one-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$DEST"
PY=python3
SITE=/tmp/site

# 1. the wheels
WHEELS="${WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  timeout 60 "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl \
    || echo "gpu_day_one: the wheels in $WHEELS did not install here (another Python?); going on" >&2
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import zmq" 2>/dev/null || echo "gpu_day_one: pyzmq missing: the single-* sections will fail (see the wheels above)" >&2

# 2. the machine
{
  date
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: none"
  timeout 60 "$PY" - <<'EOF'
import importlib.util, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for m in ("triton", "transformers", "zmq"):
    spec = importlib.util.find_spec(m)
    print(m, __import__(m).__version__ if spec else "missing")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"{p.total_memory / 2**30:.1f} GiB", p.multi_processor_count, "SMs")
EOF
} 2>&1 | tee "$DEST/machine.txt"

# 3. the measurement
timeout $((${BUDGET%.*} + 30)) "$PY" benchmarks/engine_gpu.py --device "$DEVICE" --budget "$BUDGET" \
  --json "$DEST/engine_gpu.json" 2>&1 | tee "$DEST/engine_gpu.txt"
RC=${PIPESTATUS[0]}

# 4. the gpu lane (skips itself without CUDA)
timeout "$LANE_S" "$PY" -m pytest -q -m gpu -k "not single" -p no:cacheprovider tests/test_engine_gpu.py 2>&1 \
  | tail -40 | tee "$DEST/lane.txt"
echo "gpu_day_one: results in $DEST (engine_gpu exit $RC)"
exit "$RC"
