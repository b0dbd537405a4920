#!/usr/bin/env bash
# Does an evaluation repeat exactly? One π1 on N validation documents of one source, three runs per executor
# setting (twice at concurrency 256, once at 16), each setting on its own GPU, all started together:
#   bi_eager_prefix      VLLM_BATCH_INVARIANT=1, eager, prefix caching on (as scripts/gpu_node/sft_mix.sh ran it)
#   bi_eager_noprefix    VLLM_BATCH_INVARIANT=1, eager, no prefix caching
#   bi_graphs_noprefix   VLLM_BATCH_INVARIANT=1, CUDA graphs, no prefix caching
#   default_eager_noprefix  vLLM's default (no batch invariance), eager, no prefix caching: the control
# Answers go to $R/repeat/<setting>_<run>.jsonl (`python -m bench sft-mix report` reads them), each executor's
# log to $R/executor_<setting>.log. After node_setup.sh:
#   MODEL=/tmp/model scripts/gpu_node/job.sh start repeat -- bash scripts/gpu_node/repeat_check.sh
set -uo pipefail
: "${MODEL:?MODEL (an HF model folder) must be set}" "${GOLDEN_DIR:?GOLDEN_DIR must be set}"
R=${REPEAT_OUT:-/tmp/repeat_check}
N=${N:-256}
SOURCE=${REPEAT_SOURCE:-wikitabletext}
# below the evaluation's 384 (GenerationSettings) on purpose: answers are compared as they are, cut or not, so a
# shorter limit only saves device time (the measured check ran at 128: bench/results/sft_mix.md)
MAX_TOKENS=${MAX_TOKENS:-128}
PORT=18700
SETTINGS=(bi_eager_prefix bi_eager_noprefix bi_graphs_noprefix default_eager_noprefix)
mkdir -p "$R/repeat" "$R/val"
trap 'python3 -m trainer serve stop --ports "$(seq -s, $PORT $((PORT + 3)))" > /dev/null 2>&1' EXIT
grep "\"id\": \"$SOURCE-" "$GOLDEN_DIR/common_validation_schemas.jsonl" | head -n "$N" > "$R/val/repeat_golden.jsonl"
python3 - "$R/run_info.json" "$N" "$SOURCE" "$MAX_TOKENS" "$MODEL" <<'PY'
import json, os, sys
path, n, source, max_tokens, model = sys.argv[1:]
json.dump({"check": "repeat", "documents": int(n), "repeat_source": source, "max_tokens": int(max_tokens),
           "model": model, "commit": os.environ.get("STX_COMMIT"), "command": "bash scripts/gpu_node/repeat_check.sh"},
          open(path, "w"), indent=1)
PY
for i in 0 1 2 3; do
  s=${SETTINGS[$i]}; env=(); flags=(--mem 0.2)
  [[ $s == bi_* ]] && env=(VLLM_BATCH_INVARIANT=1)
  [[ $s == *_eager_* ]] && flags+=(--eager)
  [[ $s == *_noprefix ]] && flags+=(--no-prefix-cache)
  env "${env[@]}" python3 -m trainer serve start --model "$MODEL" --name "$s" --gpus "$i" --port $((PORT + i)) "${flags[@]}"
done
python3 -m trainer serve wait --ports "$(seq -s, $PORT $((PORT + 3)))" || echo "an executor did not start"
pids=()
for i in 0 1 2 3; do
  s=${SETTINGS[$i]}
  # each run's concurrency spelled out: the check compares runs at 256 (the default) with one at 16
  (for run in c256_1:256 c256_2:256 c16:16; do
     python3 -m trainer infer stage1 --executor-url "http://127.0.0.1:$((PORT + i))" --model "$s" \
       --golden "$R/val/repeat_golden.jsonl" --out "$R/repeat/${s}_${run%:*}.jsonl" --max-tokens "$MAX_TOKENS" \
       --concurrency "${run#*:}" > /dev/null 2>&1 || echo "$s ${run%:*} failed"
   done) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for i in 0 1 2 3; do tail -c 200000 "${STX_VLLM_RUN_DIR:-/tmp}/stx-vllm-$((PORT + i)).log" > "$R/executor_${SETTINGS[$i]}.log"; done
grep -il "batch.invarian" "$R"/executor_*.log || echo "no executor log names batch invariance"
echo "repeat check: $(ls "$R/repeat" | wc -l) answer files in $R/repeat"
