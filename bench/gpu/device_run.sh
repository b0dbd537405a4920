#!/usr/bin/env bash
# Benchmark 2 (pipeline reward vs executor ceiling vs sequential loop) on a GPU node without network:
# the wheelhouse chunks in $STAGE (docs/airgap.md), then
#   STAGE=/tmp/stage bash bench/gpu/device_run.sh --items 256
# Writes bench/results/gpu_pipeline.{json,md} (copied to $OUT if set).
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/node_setup.sh
PORT=${PORT:-18201}
python3 -m bench.gpu.serve start --model "$MODEL_DIR" --name smollm2-135m-instruct --gpus 0 --port "$PORT" --mem 0.5 --wait
trap 'python3 -m bench.gpu.serve stop --ports $PORT' EXIT
python3 -m bench gpu-pipeline --executor-url "http://127.0.0.1:$PORT" --model smollm2-135m-instruct --golden "$GOLDEN_DIR" "$@"
if [[ -n "${OUT:-}" ]]; then cp bench/results/gpu_pipeline.* "$OUT"/; cp "/tmp/stx-vllm-$PORT.log" "$OUT/vllm.log" || true; fi
