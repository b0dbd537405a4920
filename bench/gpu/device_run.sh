#!/usr/bin/env bash
# Benchmark 2 (pipeline reward vs executor ceiling vs sequential loop) on a GPU machine that has
# torch 2.11 + CUDA 13 but no network: vLLM 0.24.0 (VERL 0.9.1's pin) and its pure-Python
# dependencies arrive as wheels, the default model as its GGUF (both split into chunks; see
# docs/benchmarks.md). Expects in $W: vllm.part*, gguf.part*; in the repo: .whl/deps/*.whl and a
# golden folder in $GOLDEN_DIR. Writes bench/results/gpu_pipeline.{json,md} (copied to $OUT if set).
set -euo pipefail
W=${W:-/tmp/w}
cd "$(dirname "$0")/../.."
cat "$W"/vllm.part* > "$W/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
cat "$W"/gguf.part* > "$W/SmolLM2-135M-Instruct.Q4_1.gguf"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$W/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl" .whl/deps/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# No flashinfer wheel is carried (its kernels are 450 MB): use the built-in FlashAttention and torch sampling.
export VLLM_USE_FLASHINFER_SAMPLER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The project's own conversion: with the GGUF already in its cache it needs no network (sha256-checked).
export STX_CACHE_DIR=/tmp/stx-cache
mkdir -p "$STX_CACHE_DIR/gguf"
mv "$W/SmolLM2-135M-Instruct.Q4_1.gguf" "$STX_CACHE_DIR/gguf/"
python3 -m services.executor_vllm.default_model --out /tmp/model
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m vllm.entrypoints.openai.api_server --model /tmp/model --served-model-name smollm2-135m-instruct \
  --host 127.0.0.1 --port 8001 --dtype bfloat16 --gpu-memory-utilization 0.5 --seed 0 > /tmp/vllm.log 2>&1 &
VLLM_PID=$!
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request,sys; sys.exit(0 if b'smollm2' in urllib.request.urlopen('http://127.0.0.1:8001/v1/models', timeout=2).read() else 1)" 2>/dev/null; then break; fi
  kill -0 $VLLM_PID 2>/dev/null || { tail -60 /tmp/vllm.log; exit 1; }
  sleep 2
done
echo "vLLM ready"
python3 -m bench gpu-pipeline --executor-url http://127.0.0.1:8001 --model smollm2-135m-instruct --golden "$GOLDEN_DIR" "$@" || { tail -40 /tmp/vllm.log; kill $VLLM_PID; exit 1; }
kill $VLLM_PID; wait $VLLM_PID 2>/dev/null || true
if [[ -n "${OUT:-}" ]]; then cp bench/results/gpu_pipeline.* /tmp/vllm.log "$OUT"/ 2>/dev/null || true; cat /tmp/stx-reward-api-*.log > "$OUT/reward_api.log" 2>/dev/null || true; fi
