#!/usr/bin/env bash
# The RFT baseline against SFT, chosen on validation and read once on test (`python -m bench learning`), on one
# GPU node of any size (every job on GPU i % NGPU):
#   wave sft:   data build (the train split reweighted by SFT_MIX when set, e.g.
#               wikitabletext=2,e2e=2,rotowire_sent=0.45: `trainer data build --sft-mix`); A1 ‖ A2 from the base
#               model with the gpu profile and SFT_ARGS (epochs chosen on the validation loss)
#   wave rft:   π1ˢ and π2ˢ served, a reward_api whose executor is π2ˢ; for each reward of RFT_REWARDS,
#               side by side, `trainer rft` samples RFT_K answers per prompt for RFT_PER_SOURCE's training
#               prompts, keeps the best whose reward ≥ RFT_THRESHOLD (an answer cut at the token limit never)
#               and fine-tunes the SFT model on them with the gpu profile and RFT_ARGS (epoch chosen on
#               validation): pipeline (π1, the frozen π2ˢ fills each schema), schema (π1), table (π2)
#   wave test:  Phase D on the test split, every setting in one `trainer evaluate pipeline` (paired tests
#               against sft): sft (π1ˢ, π2ˢ), rft_schema and rft_pipeline (RFT π1, π2ˢ), rft_table (π1ˢ,
#               RFT π2), rft_both (the pipeline RFT π1, the table RFT π2), as far as RFT_REWARDS made them
# Run it as a job after node_setup.sh:
#   MODEL_DIR=/tmp/model scripts/gpu_node/job.sh start rft -- bash scripts/gpu_node/rft.sh
# then `job.sh wait rft 540` and `job.sh collect rft /tmp/rft` from later calls. WAVES=rft,test reuses the SFT
# models an earlier run left in RFT_RUN. PROFILE=cpu-smoke runs the same waves on CPU (no GPU, the CPU shim), to
# rehearse the script before a GPU run: GOLDEN_DIR=trainer/data/sample SFT_ARGS= RFT_ARGS=trainer.total_training_steps=4
# RFT_PER_SOURCE=invoice=2,people=2,product=2 RFT_K=2 RFT_THRESHOLD=-1 CONCURRENCY=8 RFT_CONCURRENCY=1
# RFT_REWARDS=pipeline,table took 21 minutes on 2 cores.
set -uo pipefail
J=scripts/gpu_node/job.sh
R=${RFT_RUN:-/tmp/rft}
WAVES=${WAVES:-sft,rft,test}
PROFILE=${PROFILE:-gpu}
SFT_ARGS=${SFT_ARGS-trainer.total_epochs=2}
SFT_MIX=${SFT_MIX:-}  # empty: the train split as it is
RFT_ARGS=${RFT_ARGS-trainer.total_epochs=2 data.micro_batch_size_per_gpu=32}
RFT_REWARDS=${RFT_REWARDS:-pipeline,schema,table}
RFT_K=${RFT_K:-8}
RFT_THRESHOLD=${RFT_THRESHOLD:-0.5}
RFT_PER_SOURCE=${RFT_PER_SOURCE:-wikitabletext=2000,e2e=500,rotowire_sent=500}
RFT_SEED=${RFT_SEED:-0}
RFT_FLAGS=${RFT_FLAGS:-}  # more `trainer rft` options, e.g. "--beat-greedy --with-gold"
# Empty: the trainer's one default (GenerationSettings, trainer/evaluation/generation.py), no flag given.
MAX_TOKENS=${MAX_TOKENS:-}
CONCURRENCY=${CONCURRENCY:-}  # Phase D's requests in flight
# `trainer rft`'s requests each ask for RFT_K (8) samples: 32 keep 256 sequences in flight, as Phase D's 256
# single answers do (its default of 256 requests would be 2,048 sequences)
RFT_CONCURRENCY=${RFT_CONCURRENCY:-32}
MEM=${SERVE_MEM:-0.08}
PORT=${RFT_PORT:-18700}  # π1ˢ, π2ˢ, reward_api, then the RFT models (pipeline, schema, table)
: "${MODEL_DIR:?MODEL_DIR (the base model) must be set}" "${GOLDEN_DIR:?GOLDEN_DIR must be set}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TEST=${TEST_GOLDEN:-$GOLDEN_DIR/common_test_schemas.jsonl}
if [[ $PROFILE == gpu ]]; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || NGPU=0
  (( NGPU > 0 )) || { echo "PROFILE=gpu but nvidia-smi lists no GPU" >&2; exit 2; }
fi
mkdir -p "$R"
if [[ $PROFILE == gpu ]]; then
  setsid nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 1000 \
    >> "$R/gpu_util.csv" 2>/dev/null < /dev/null &
  SMI=$!
fi
PORTS=$(seq -s, "$PORT" $((PORT + 5)))
cleanup() {
  [[ -n ${SMI:-} ]] && kill "$SMI" 2>/dev/null
  [[ -n ${API:-} ]] && kill "$API" 2>/dev/null
  python3 -m trainer serve stop --ports "$PORTS" > /dev/null 2>&1
}
trap cleanup EXIT
on() { [[ ,$WAVES, == *,$1,* ]]; }
has() { [[ ,$RFT_REWARDS, == *,$1,* ]]; }
stamp() { echo "=== $(date -u +%T) $*"; }
wave_start=0
wave() {  # NAME: the previous wave's seconds go to waves.tsv
  local now; now=$(date +%s)
  [[ -n ${WAVE:-} ]] && printf '%s\t%s\n' "$WAVE" $(( now - wave_start )) >> "$R/waves.tsv"
  WAVE=$1; wave_start=$now
  [[ $1 == end ]] || stamp "$1"
}
gpu_of() { echo $(( $1 % ${NGPU:-1} )); }
on_gpu() {  # I CMD...: CMD on GPU I % NGPU (the gpu profile), as it is on CPU
  local i=$1; shift
  if [[ $PROFILE == gpu ]]; then CUDA_VISIBLE_DEVICES=$(gpu_of "$i") "$@"; else "$@"; fi
}
placement() {  # the trainer's overrides of one process on one GPU
  [[ $PROFILE == gpu ]] && echo "trainer.n_gpus_per_node=1"
}
serve() {  # I NAME MODEL_DIR: an executor on GPU I % NGPU at PORT + I, up before the next one starts (two vLLM
  # engines profiling one GPU's memory at once fail their start). --eager: `serve start` defaults to CUDA graphs;
  # evaluation executors run eager (GenerationSettings); prefix caching stays on, as the measured runs had it
  local i=$1 name=$2 model=$3 where=()
  [[ $PROFILE == gpu ]] && where=(--gpus "$(gpu_of "$i")" --mem "$MEM" --eager)
  python3 -m trainer serve start --model "$model" --name "$name" --port $((PORT + i)) "${where[@]}" --wait
}
url() { echo "http://127.0.0.1:$((PORT + $1))"; }
wait_jobs() {  # NAME...: until each job ends; its status line, and its log's tail where it failed (exit 1 then)
  local n rc failed=0
  for n in "$@"; do
    until $J wait "$n" 60 > /dev/null; rc=$?; [[ $rc != 3 ]]; do :; done
    echo "$n: $($J status | grep "^$n ")"
    (( rc == 0 )) || { echo "$n failed"; tail -30 "${JOBS:-/tmp/jobs}/$n.log"; failed=1; }
  done
  return "$failed"
}
run_info() {
  python3 - "$R/run_info.json" <<PY
import json, os, subprocess, sys
from trainer.evaluation.generation import GenerationSettings as G  # what an empty MAX_TOKENS / CONCURRENCY means
head = os.environ.get("STX_COMMIT")  # first: a copied tree may carry an older .git
if not head:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        head = None
json.dump({"command": "bash scripts/gpu_node/rft.sh", "commit": head, "profile": "$PROFILE", "waves": "$WAVES",
           "sft_args": "$SFT_ARGS", "sft_mix": "$SFT_MIX", "rft_args": "$RFT_ARGS", "rft_rewards": "$RFT_REWARDS", "rft_k": $RFT_K,
           "rft_threshold": $RFT_THRESHOLD, "rft_per_source": "$RFT_PER_SOURCE", "rft_seed": $RFT_SEED, "rft_flags": "$RFT_FLAGS",
           "max_tokens": ${MAX_TOKENS:-G.max_tokens}, "concurrency": ${CONCURRENCY:-G.concurrency},
           "rft_concurrency": $RFT_CONCURRENCY, "serve_mem": $MEM, "gpus": ${NGPU:-0},
           "test_golden": "$TEST"}, open(sys.argv[1], "w"), indent=1)
PY
}
run_info

if on sft; then
  wave "sft"
  python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$R/data" --phases a1,a2 ${SFT_MIX:+--sft-mix "$SFT_MIX"} \
    > "$R/data_build.log" 2>&1 \
    || { echo "data build failed"; tail -20 "$R/data_build.log"; exit 1; }
  i=0
  for phase in a1 a2; do
    # shellcheck disable=SC2046,SC2086  # the placement and SFT_ARGS split on spaces
    on_gpu $i $J start "sft_$phase" -- python3 -m trainer run "$phase" --profile "$PROFILE" --data "$R/data" \
      --out "$R/$phase" --model "$MODEL_DIR" $(placement) $SFT_ARGS
    i=$((i + 1))
  done
  wait_jobs sft_a1 sft_a2 || exit 1
fi

RFT_DIRS=()  # reward:served name:port offset:π of each RFT model
has pipeline && RFT_DIRS+=("pipeline:rft_pipeline:3:1")
has schema && RFT_DIRS+=("schema:rft_schema:4:1")
has table && RFT_DIRS+=("table:rft_table:5:2")

if on rft || on test; then
  wave "serve"
  serve 0 a1 "$R/a1/hf" && serve 1 a2 "$R/a2/hf" || exit 1
fi

if on rft; then
  wave "rft"
  REWARD_API_EXECUTOR_URLS=$(url 1) REWARD_API_EXECUTOR_MODEL=a2 \
    setsid python3 -m services.reward_api --host 127.0.0.1 --port $((PORT + 2)) --workers 4 \
    > "$R/reward_api.log" 2>&1 < /dev/null &
  API=$!
  for _ in $(seq 120); do curl -sf "$(url 2)/healthz" > /dev/null && break; sleep 1; done
  curl -sf "$(url 2)/healthz" > /dev/null || { echo "reward_api did not start"; tail -20 "$R/reward_api.log"; exit 1; }
  names=()
  for d in "${RFT_DIRS[@]}"; do
    IFS=: read -r reward name i pi <<< "$d"
    policy=(--policy-url "$(url 0)" --policy-model a1 --start-model "$R/a1/hf")
    [[ $pi == 2 ]] && policy=(--policy-url "$(url 1)" --policy-model a2 --start-model "$R/a2/hf")
    # shellcheck disable=SC2046,SC2086
    on_gpu "$i" $J start "$name" -- python3 -m trainer rft --golden "$GOLDEN_DIR" --reward "$reward" "${policy[@]}" \
      --reward-url "$(url 2)" --out "$R/$name" --k "$RFT_K" --threshold "$RFT_THRESHOLD" \
      ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} --per-source "$RFT_PER_SOURCE" --concurrency "$RFT_CONCURRENCY" \
      --seed "$RFT_SEED" $RFT_FLAGS --profile "$PROFILE" $(placement) $RFT_ARGS
    names+=("$name")
  done
  wait_jobs "${names[@]}" || echo "an RFT run failed: the test wave evaluates the others"
  kill "$API" 2>/dev/null; API=
fi

if on test; then
  wave "test"
  settings=("sft=$(url 0),a1,$(url 1),a2")
  declare -A MADE=()
  for d in "${RFT_DIRS[@]}"; do
    IFS=: read -r reward name i pi <<< "$d"
    if [[ -d $R/$name/sft/hf ]]; then
      if serve "$i" "$name" "$R/$name/sft/hf"; then MADE[$reward]=$i; else echo "$name did not start: left out"; fi
    else
      echo "no RFT model for $reward: its settings are left out"
    fi
  done
  [[ -n ${MADE[schema]:-} ]] && settings+=("rft_schema=$(url "${MADE[schema]}"),rft_schema,$(url 1),a2")
  [[ -n ${MADE[pipeline]:-} ]] && settings+=("rft_pipeline=$(url "${MADE[pipeline]}"),rft_pipeline,$(url 1),a2")
  [[ -n ${MADE[table]:-} ]] && settings+=("rft_table=$(url 0),a1,$(url "${MADE[table]}"),rft_table")
  [[ -n ${MADE[pipeline]:-} && -n ${MADE[table]:-} ]] \
    && settings+=("rft_both=$(url "${MADE[pipeline]}"),rft_pipeline,$(url "${MADE[table]}"),rft_table")
  args=()
  for s in "${settings[@]}"; do args+=(--setting "$s"); done
  python3 -m trainer evaluate pipeline --golden "$TEST" "${args[@]}" --out "$R/test" --max-truncated-share 1 \
    ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} ${CONCURRENCY:+--concurrency "$CONCURRENCY"} > "$R/test.log" 2>&1 \
    || { echo "Phase D failed"; tail -20 "$R/test.log"; exit 1; }
  # the answers under names job.sh collect keeps (it leaves predictions_* out): the report pools seeds from them
  for f in "$R"/test/predictions_*.jsonl; do gzip -c "$f" > "$R/test_rows_$(basename "$f" .jsonl | sed 's/^predictions_//').jsonl.gz"; done
fi
wave end
stamp "done"
