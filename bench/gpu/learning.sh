#!/usr/bin/env bash
# A first real-scale learning step on a GPU node (issue 12; not the whole loop): A1 and A2 SFT side by
# side on their own GPUs, then Phase D of base and sft on the whole golden test split, each setting's
# π1 and π2 served by vLLM executors on their own GPUs. Source node_setup.sh first (or let this do it).
#   bash bench/gpu/learning.sh sft-start [GPU_A1 GPU_A2]     # background (setsid): outlives the command
#   bash bench/gpu/learning.sh wait-sft SECONDS
#   bash bench/gpu/learning.sh eval NAME PI1_PORT PI2_PORT   # executors already serving π1/π2 there
#   bash bench/gpu/learning.sh serve-sft GPU_A1 GPU_A2 PORT  # π1ˢ on PORT, π2ˢ on PORT+1
#   bash bench/gpu/learning.sh c1-step GPU_TRAIN GPU_EXEC     # issue 14.2: a few C1 steps, 64 prompts × n 8,
#                                                            # π1 from A1 SFT, executor serving A2 SFT
#   bash bench/gpu/learning.sh collect                       # Phase-D table of every eval, files to $OUT
# Every stage's wall time goes to $LEARN/stages.tsv (name, start, end, seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -n "${PYTHONPATH:-}" && -d "${MODEL_DIR:-/nonexistent}" ]] || source bench/gpu/node_setup.sh >/dev/null
LEARN=${LEARN:-/tmp/learn}
LR=${LR:-1e-4}
EPOCHS=${EPOCHS:-1}
MICRO=${MICRO:-32}
EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-384}
TEST=$GOLDEN_DIR/common_test_schemas.jsonl
mkdir -p "$LEARN"
served_model() {  # the model name an executor serves (no curl needed on the node)
  python3 -c "import json,urllib.request as u; print(json.load(u.urlopen('http://127.0.0.1:$1/v1/models'))['data'][0]['id'])"
}
stage() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" $(( $3 - $2 )) >> "$LEARN/stages.tsv"; }

case "$1" in
sft-start)
  t0=$(date +%s)
  python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$LEARN/data" --phases a1,a2
  stage data_build "$t0" "$(date +%s)"
  gpus=("${2:-0}" "${3:-1}")
  i=0
  for ph in a1 a2; do
    # lr 1e-4 and one epoch as the plain HF SFT baseline (issue 12); VERL has no linear decay, cosine
    # to 0 is the nearest; micro batch = batch (32): a 135M model fits, no accumulation needed.
    # VERL's SFT engine asks for flash_attention_2 by default, which is not carried: sdpa.
    CUDA_VISIBLE_DEVICES=${gpus[$i]} setsid bash -c "s=\$(date +%s); python3 -m trainer run $ph --profile gpu \
      --data $LEARN/data --out $LEARN/$ph --model $MODEL_DIR --nproc 1 trainer.n_gpus_per_node=1 \
      optim.lr=$LR optim.lr_scheduler_type=cosine trainer.total_epochs=$EPOCHS \
      data.micro_batch_size_per_gpu=$MICRO ++model.override_config.attn_implementation=sdpa \
      ${SFT_OVERRIDES:-} > $LEARN/$ph.log 2>&1; echo \$? > $LEARN/$ph.rc; \
      printf 'sft_%s\t%s\t%s\t%s\n' $ph \$s \$(date +%s) \$(( \$(date +%s) - s )) >> $LEARN/stages.tsv" \
      < /dev/null > /dev/null 2>&1 &
    echo "started SFT $ph on GPU ${gpus[$i]} (log $LEARN/$ph.log)"
    i=$((i + 1))
  done
  ;;
wait-sft)
  deadline=$(( $(date +%s) + ${2:-540} ))
  while [[ ! -f $LEARN/a1.rc || ! -f $LEARN/a2.rc ]]; do
    if (( $(date +%s) > deadline )); then echo "SFT still running"; tail -n 3 "$LEARN"/a?.log; exit 3; fi
    sleep 5
  done
  echo "SFT exit codes: a1 $(cat "$LEARN/a1.rc"), a2 $(cat "$LEARN/a2.rc")"
  tail -n 5 "$LEARN/a1.log" "$LEARN/a2.log"
  [[ $(cat "$LEARN/a1.rc") == 0 && $(cat "$LEARN/a2.rc") == 0 ]]
  ;;
serve-sft)
  t0=$(date +%s)
  python3 -m bench.gpu.serve start --model "$LEARN/a1/hf" --name pi1-sft --gpus "$2" --port "$4" --mem 0.5
  python3 -m bench.gpu.serve start --model "$LEARN/a2/hf" --name pi2-sft --gpus "$3" --port $(( $4 + 1 )) --mem 0.5
  python3 -m bench.gpu.serve wait --ports "$4,$(( $4 + 1 ))"
  stage serve_sft "$t0" "$(date +%s)"
  ;;
eval)
  name=$2
  m1=$(served_model "$3")
  m2=$(served_model "$4")
  t0=$(date +%s)
  python3 -m trainer evaluate pipeline --golden "$TEST" --out "$LEARN/eval_$name" \
    --setting "$name=http://127.0.0.1:$3,$m1,http://127.0.0.1:$4,$m2" \
    --max-tokens "$EVAL_MAX_TOKENS" --concurrency 256 --timeout 600
  stage "phase_d_$name" "$t0" "$(date +%s)"
  ;;
c1-step)
  t0=$(date +%s)
  python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$LEARN/data_c1" --phases c1
  python3 -m bench.gpu.serve start --model "$LEARN/a2/hf" --name pi2-sft --gpus "$3" --port 18221 --mem 0.3 --wait
  REWARD_API_EXECUTOR_URLS=http://127.0.0.1:18221 REWARD_API_EXECUTOR_MODEL=pi2-sft REWARD_API_LOG_LEVEL=WARNING \
    setsid python3 -m services.reward_api --host 127.0.0.1 --port 18230 --workers 4 > "$LEARN/reward_api_c1.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:18230/healthz')" 2>/dev/null && break; sleep 1; done
  CUDA_VISIBLE_DEVICES=$2 python3 -m trainer run c1 --profile gpu --data "$LEARN/data_c1" --out "$LEARN/c1" \
    --model "$LEARN/a1/hf" --reward-url http://127.0.0.1:18230 --no-export trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=${C1_STEPS:-3} trainer.test_freq=-1 trainer.val_before_train=false \
    data.train_batch_size=64 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 data.max_response_length=256 \
    ray_kwargs.ray_init.num_cpus=32 +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
    +ray_kwargs.ray_init.include_dashboard=false > "$LEARN/c1.log" 2>&1 || echo "c1 exit $?"
  stage c1_step "$t0" "$(date +%s)"
  tail -20 "$LEARN/c1.log"
  ;;
collect)
  args=()
  for d in "$LEARN"/eval_*; do n=${d##*/eval_}; args+=(--predictions "$n=$d/predictions_$n.jsonl"); done
  python3 -m trainer evaluate score --golden "$TEST" --out "$LEARN/phase_d" "${args[@]}" || true
  # At most 8 files come back from a device run: one archive.
  o=$LEARN/collected; rm -rf "$o"; mkdir -p "$o"
  cp "$LEARN/stages.tsv" "$o/" 2>/dev/null || true
  cp -r "$LEARN/phase_d" "$o/" 2>/dev/null || true
  for d in "$LEARN"/eval_*; do mkdir -p "$o/${d##*/}"; cp "$d/metrics.json" "$d/report.md" "$o/${d##*/}/" 2>/dev/null || true; done
  rm -f "$o"/phase_d/predictions_*.jsonl
  cp "$LEARN/c1/metrics.jsonl" "$o/c1_metrics.jsonl" 2>/dev/null || true
  tail -c 100000 "$LEARN/c1.log" > "$o/c1.log" 2>/dev/null || true
  for ph in a1 a2; do
    tail -c 100000 "$LEARN/$ph.log" > "$o/$ph.log" 2>/dev/null || true
    cp "$LEARN/$ph/phase_result.json" "$o/${ph}_phase_result.json" 2>/dev/null || true
    cp "$LEARN/$ph/metrics.jsonl" "$o/${ph}_metrics.jsonl" 2>/dev/null || true
  done
  tar -czf "${OUT:-$LEARN}/learn.tar.gz" -C "$o" .
  ls -la "${OUT:-$LEARN}/learn.tar.gz"
  ;;
*) echo "unknown step $1" >&2; exit 2 ;;
esac
