#!/usr/bin/env bash
# Executor scale-out (python -m bench gpu-scaling) on a GPU node without network: one vLLM executor per
# GPU (all started once), reward_api restarted per configuration. Wheelhouse chunks in $STAGE first.
#   STAGE=/tmp/stage NGPU=4 [CLIENTS=32] bash bench/gpu/scaling.sh [extra gpu-scaling options, e.g. --workers 1,8,16 --api-replicas 1,2]
# CLIENTS x 16 items is the most in flight: 32 keeps one H200 executor below overload (64 overloaded it:
# bench/results/gpu_scaling.overload_64_clients.md).
# Leaves the executors running (setsid) for the next command; writes bench/results/gpu_scaling.* and
# copies them and the logs to $OUT if set.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/node_setup.sh
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
PORT=${PORT:-18201}
GPUS=$(seq -s, 0 $((NGPU - 1)))
t0=$(date +%s)
python3 -m bench.gpu.serve start --model "$MODEL_DIR" --name smollm2-135m-instruct --gpus "$GPUS" --port "$PORT" --mem 0.3 --no-prefix-cache --wait
echo "executors ready: $(( $(date +%s) - t0 )) s"
URLS=(); for i in $(seq 0 $((NGPU - 1))); do URLS+=(--executor-url "http://127.0.0.1:$((PORT + i))"); done
REPLICAS=1; [[ $NGPU -ge 2 ]] && REPLICAS=1,2; [[ $NGPU -ge 4 ]] && REPLICAS=1,2,4
python3 -m bench gpu-scaling "${URLS[@]}" --model smollm2-135m-instruct --golden "$GOLDEN_DIR" \
  --tokenizer "$MODEL_DIR" --replicas "$REPLICAS" --clients "${CLIENTS:-32}" --batch 16 "$@" || status=$?
echo "scaling bench: $(( $(date +%s) - t0 )) s"
if [[ -n "${OUT:-}" ]]; then
  cp bench/results/gpu_scaling.* "$OUT"/ 2>/dev/null || true
  tail -c 200000 "/tmp/stx-vllm-$PORT.log" > "$OUT/vllm0.log" || true
  cat /tmp/stx-reward-api-*.log 2>/dev/null | tail -c 200000 > "$OUT/reward_api.log" || true
fi
exit "${status:-0}"
