#!/usr/bin/env bash
# Two SFT recipes, chosen on validation and compared on test, on one 4-GPU node (`python -m bench sft-mix`):
# `base` (the train split of BASE_MIX, the golden one where empty, and the SFT overrides BASE_ARGS) against
# the treatment TREATMENT (default `mix`: the train split reweighted by TREATMENT_MIX, default SFT_MIX, with
# TREATMENT_ARGS). E.g. TREATMENT=epochs TREATMENT_MIX= TREATMENT_ARGS="data.train_batch_size=128 ..." compares
# another batch size and epochs chosen on validation (epoch_selection.enabled=true) on the same data.
#   wave 1, SFT, one GPU each:   a1_base a1_$TREATMENT a2_base a2_$TREATMENT  (val loss every SFT_TEST_FREQ
#                                steps, or at every epoch's end with epoch selection: the learning curve)
#   wave 2, validation:          each model served on its GPU; π1 writes schemas for the validation split
#                                (schema F1), π2 fills the gold schemas (aligned cell F1); the choice per
#                                policy is the higher macro mean over sources (bench/sft_mix.py, `choose`)
#   repeat check, beside it:     π1 (a1_base) on the validation split of REPEAT_SOURCE three times per mode,
#                                vLLM's default and VLLM_BATCH_INVARIANT=1: twice at concurrency 256, once at 32
#   wave 3, test:                Phase D end to end, sft (a1_base + a2_base) and $TREATMENT (the chosen π1 + π2),
#                                then both scored together (paired tests per source)
# Run it as a job after node_setup.sh:
#   MODEL_DIR=/tmp/model scripts/gpu_node/job.sh start mix -- bash scripts/gpu_node/sft_mix.sh
# then `job.sh wait mix 560` and `job.sh collect mix /tmp/mix` from later calls. WAVES=sft,val,test picks
# waves (a rerun reuses what earlier waves wrote).
set -uo pipefail
J=scripts/gpu_node/job.sh
R=${MIX_OUT:-/tmp/mix}
TREATMENT=${TREATMENT:-mix}
TREATMENT_MIX=${TREATMENT_MIX-${SFT_MIX:-wikitabletext=2,e2e=2,rotowire_sent=0.45}}
TREATMENT_ARGS=${TREATMENT_ARGS:-}
BASE_MIX=${BASE_MIX:-}
BASE_ARGS=${BASE_ARGS:-}
[[ $TREATMENT =~ ^[a-z0-9]+$ && $TREATMENT != base ]] || { echo "TREATMENT: '$TREATMENT' (lower-case letters and digits, not base)" >&2; exit 2; }
TEST_FREQ=${SFT_TEST_FREQ:-280}
WAVES=${WAVES:-sft,val,test}
REPEAT_SOURCE=${REPEAT_SOURCE:-wikitabletext}
REPEAT_CHECK=${REPEAT_CHECK:-1}  # 0: no repeat check beside the validation wave
MAX_TOKENS=${MAX_TOKENS:-}  # empty: the trainer's one default (GenerationSettings, trainer/evaluation/generation.py)
SFT_SEED=${SFT_SEED:-}  # set: the SFT train rows in an order of this seed (a second SFT seed)
: "${MODEL_DIR:?MODEL_DIR (the base model) must be set}" "${GOLDEN_DIR:?GOLDEN_DIR must be set}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
VAL=$GOLDEN_DIR/common_validation_schemas.jsonl
TEST=$GOLDEN_DIR/common_test_schemas.jsonl
PORT=18600
NAMES=(a1_base "a1_$TREATMENT" a2_base "a2_$TREATMENT")
mkdir -p "$R"
setsid nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 1000 \
  >> "$R/gpu_util.csv" 2>/dev/null < /dev/null &
SMI=$!
trap 'kill "$SMI" 2>/dev/null; python3 -m trainer serve stop --ports "$(seq -s, $PORT $((PORT + 4)))" > /dev/null 2>&1' EXIT
on() { [[ ,$WAVES, == *,$1,* ]]; }
wait_all() { for n in "$@"; do until $J wait "$n" 60 > /dev/null; [[ $? != 3 ]]; do :; done; echo "$n: $($J status | grep "^$n ")"; done; }
stamp() { echo "=== $(date -u +%T) $*"; }
python3 - "$R/run_info.json" "$TREATMENT_MIX" "$TEST_FREQ" "$MAX_TOKENS" "$REPEAT_SOURCE" "$SFT_SEED" \
  "$TREATMENT" "$TREATMENT_ARGS" "$BASE_MIX" "$BASE_ARGS" <<'PY'
import json, os, subprocess, sys
path, mix, freq, max_tokens, repeat, seed, treatment, treatment_args, base_mix, base_args = sys.argv[1:]
if not max_tokens:
    from trainer.evaluation.generation import GenerationSettings
    max_tokens = GenerationSettings.max_tokens
# STX_COMMIT first: a copied tree may carry a .git of an earlier commit
head = os.environ.get("STX_COMMIT")
if not head:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        head = None
json.dump({"sft_mix": mix, "treatment": treatment, "treatment_mix": mix or None, "treatment_args": treatment_args or None,
           "base_mix": base_mix or None, "base_args": base_args or None, "sft_test_freq": int(freq), "max_tokens": int(max_tokens), "repeat_source": repeat, "sft_seed": seed or None,
           "commit": head, "command": "bash scripts/gpu_node/sft_mix.sh"}, open(path, "w"), indent=1)
PY

if on sft; then
  stamp "data build"
  build() {  # NAME MIX: the a1/a2 data of NAME, the golden train split reweighted by MIX (none: as it is)
    python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$R/data_$1" --phases a1,a2 ${2:+--sft-mix "$2"} \
      > "$R/data_$1.log" 2>&1
  }
  build base "$BASE_MIX" &
  base=$!
  build "$TREATMENT" "$TREATMENT_MIX" &
  treat=$!
  wait "$base" && wait "$treat" || { echo "data build failed"; tail -5 "$R"/data_*.log; exit 1; }
  cp "$R/data_$TREATMENT/manifest.json" "$R/data_${TREATMENT}_manifest.json"
  if [[ -n ${SFT_SEED:-} ]]; then  # another SFT seed: VERL's SFT sampler is seeded with 0, so shuffle the rows
    python3 - "$SFT_SEED" "$R"/data_{base,"$TREATMENT"}/a{1,2}/train.parquet <<'PY'
import sys, numpy as np, pyarrow.parquet as pq
seed, paths = int(sys.argv[1]), sys.argv[2:]
for path in paths:
    t = pq.read_table(path)
    pq.write_table(t.take(np.random.default_rng(seed).permutation(t.num_rows)), path)
print(f"SFT train rows shuffled with seed {seed}: {len(paths)} files")
PY
  fi
  stamp "SFT"
  for i in 0 1 2 3; do
    name=${NAMES[$i]}; phase=${name%_*}; data=data_${name#*_}; args=$TREATMENT_ARGS
    [[ $name == *_base ]] && args=$BASE_ARGS
    # shellcheck disable=SC2086  # the arm's overrides, split on spaces
    CUDA_VISIBLE_DEVICES=$i $J start "$name" -- python3 -m trainer run "$phase" --profile gpu --data "$R/$data" \
      --out "$R/$name" --model "$MODEL_DIR" trainer.n_gpus_per_node=1 "trainer.test_freq=$TEST_FREQ" $args
  done
  # Where a VERL SFT step's time goes (~0.33 s where the GPU is busy ~17% of it): 30 s of a1_base's process tree.
  ( sleep 150; timeout 90 "$(command -v py-spy || echo "${SITE:-/tmp/site}/bin/py-spy")" record --subprocesses \
      --nonblocking --rate 50 --duration 30 --format raw --output "$R/pyspy_a1_base.txt" \
      --pid "$(cat "${JOBS:-/tmp/jobs}/a1_base.pid")" ) > "$R/pyspy.log" 2>&1 &
  wait_all "${NAMES[@]}"
fi

serve() {  # I NAME [ENV...]: NAME's export on GPU I at PORT+I (PORT+4: the batch-invariant π1)
  # --eager: `serve start` defaults to CUDA graphs; evaluation executors run eager (GenerationSettings). Prefix
  # caching stays on, as in the measured runs (bench/results/sft_mix.md) that showed it breaks repeats.
  local i=$1 name=$2 port=$((PORT + $1)); shift 2
  env "$@" python3 -m trainer serve start --model "$R/${name%_bi}/hf" --name "$name" --gpus "$(( i % 4 ))" \
    --port "$port" --mem 0.15 --eager
}
url() { echo "http://127.0.0.1:$((PORT + $1))"; }
repeat_check() {  # π1 (a1_base) on REPEAT_SOURCE's validation documents, three runs per mode, beside the waves
  mkdir -p "$R/repeat"
  grep "\"id\": \"$REPEAT_SOURCE-" "$VAL" > "$R/val/repeat_golden.jsonl"
  serve 4 a1_base_bi VLLM_BATCH_INVARIANT=1 && python3 -m trainer serve wait --ports $((PORT + 4)) \
    || echo "the batch-invariant executor did not start"
  for mode in default:0:a1_base batch_invariant:4:a1_base_bi; do
    IFS=: read -r m i name <<< "$mode"
    for run in c256_1:256 c256_2:256 c32:32; do
      # each run's concurrency spelled out: the check compares runs at 256 (the default) with one at 32
      python3 -m trainer infer stage1 --executor-url "$(url "$i")" --model "$name" --golden "$R/val/repeat_golden.jsonl" \
        --out "$R/repeat/${m}_${run%:*}.jsonl" ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} --concurrency "${run#*:}" \
        || echo "repeat $m ${run%:*} failed"
    done
  done
  python3 -m trainer serve stop --ports $((PORT + 4))
}
if on val || on test; then
  stamp "executors"
  for i in 0 1 2 3; do serve "$i" "${NAMES[$i]}"; done
  python3 -m trainer serve wait --ports "$(seq -s, $PORT $((PORT + 3)))" || exit 1
fi

if on val; then
  stamp "validation"
  mkdir -p "$R/val"
  pids=()
  for i in 0 1 2 3; do
    name=${NAMES[$i]}; stage=stage1; [[ $name == a2_* ]] && stage=stage2
    python3 -m trainer infer "$stage" --executor-url "$(url $i)" --model "$name" --golden "$VAL" \
      --out "$R/val/$name.jsonl" ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} > "$R/val/$name.log" 2>&1 &
    pids+=($!)
  done
  if [[ $REPEAT_CHECK == 1 ]]; then
    repeat_check > "$R/repeat.log" 2>&1 &
    REPEAT=$!
  fi
  for pid in "${pids[@]}"; do wait "$pid" || { echo "a validation inference failed"; tail -5 "$R"/val/*.log; exit 1; }; done
  for p in 1 2; do
    python3 -m trainer evaluate score --golden "$VAL" --predictions base="$R/val/a${p}_base.jsonl" \
      --predictions "$TREATMENT=$R/val/a${p}_$TREATMENT.jsonl" --out "$R/val_pi$p" --max-truncated-share 1 \
      > "$R/val_pi$p.log" 2>&1
  done
  python3 -m bench sft-mix choose "$R" || exit 1
fi

if on test; then
  stamp "test: Phase D"
  read -r PI1 PI2 < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c['pi1']['chosen'], c['pi2']['chosen'])" "$R/choice.json")
  index() { for i in 0 1 2 3; do [[ ${NAMES[$i]} == "$1" ]] && echo "$i"; done; }
  pids=()
  settings=("sft:a1_base:a2_base")
  [[ $PI1 == base && $PI2 == base ]] || settings+=("$TREATMENT:a1_$PI1:a2_$PI2")
  for s in "${settings[@]}"; do
    IFS=: read -r name p1 p2 <<< "$s"
    python3 -m trainer evaluate pipeline --golden "$TEST" \
      --setting "$name=$(url "$(index "$p1")"),$p1,$(url "$(index "$p2")"),$p2" --out "$R/test_$name" \
      ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} --max-truncated-share 1 > "$R/test_$name.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "a test evaluation failed"; tail -5 "$R"/test_*.log; exit 1; }; done
  preds=()
  for s in "${settings[@]}"; do preds+=(--predictions "${s%%:*}=$R/test_${s%%:*}/predictions_${s%%:*}.jsonl"); done
  python3 -m trainer evaluate score --golden "$TEST" "${preds[@]}" --out "$R/test" --max-truncated-share 1 \
    > "$R/test_score.log" 2>&1 || { echo "test scoring failed"; tail -5 "$R/test_score.log"; exit 1; }
  # each setting's answers, under a name job.sh collect keeps (it leaves predictions_* out): the report pools
  # seeds document by document from them
  for s in "${settings[@]}"; do gzip -c "$R/test_${s%%:*}/predictions_${s%%:*}.jsonl" > "$R/test_rows_${s%%:*}.jsonl.gz"; done
fi
if [[ -n ${REPEAT:-} ]]; then stamp "repeat check"; wait "$REPEAT" || echo "repeat check failed"; fi
stamp "done"
