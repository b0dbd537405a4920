#!/usr/bin/env bash
# π1 A/B on ONE GPU (issue 12, the seed's question at the budget of one 30-minute lease): from the same
# π1ˢ, B1 (local schema reward) and C1 (pipeline reward: π2ˢ frozen in a vLLM executor) train side by
# side for the same steps; Phase D then scores sft, local (π1ʳ-local + π2ˢ) and pipe (π1ʳ-pipe + π2ˢ)
# end to end on the whole test split. This is NOT the loop's order (there C1 starts from π1ʳ-local and
# the executor serves π2ʳ-local): it holds the start policy and π2 fixed, so the only difference between
# local and pipe is the reward. Source node_setup.sh first (or let this do it).
#   bash bench/gpu/pi1_ab.sh sft        # data build, then A1 beside A2 (background)
#   bash bench/gpu/pi1_ab.sh rl         # after sft: π2ˢ executor + two reward_apis, B1 beside C1 (background)
#   bash bench/gpu/pi1_ab.sh preflight  # after sft, before rl: per source, the informative and improvable shares
#                                       # (best of $PREFLIGHT_N=16 beats greedy), best-of-n - greedy and the invalid
#                                       # share for B1 and C1 at temperatures $TEMPS (training prompts only)
#   bash bench/gpu/pi1_ab.sh control    # after preflight + filter: B1's positive control on its improvable prompts
#   SFT_PHASES="a1" (default "a1 a2") trains only π1ˢ; PREFLIGHT_PHASES="b1" (default "b1 c1") sweeps only B1,
#   which needs no π2ˢ executor: the short lease for the preflight alone.
#   bash bench/gpu/pi1_ab.sh eval       # after rl: executors of π1ˢ/π1ʳ-local/π1ʳ-pipe, Phase D (background)
#   bash bench/gpu/pi1_ab.sh all        # sft, preflight, choice + filter, control, rl at the chosen temperature, eval: one background
#                                       # chain (a lease then needs only `all`, `wait all 580` calls and `collect`)
#   bash bench/gpu/pi1_ab.sh wait NAME SECONDS   # NAME: sft, preflight, control, rl, eval or all
#   bash bench/gpu/pi1_ab.sh collect    # $OUT/ab.tar.gz
# Every stage's wall time goes to $AB/stages.tsv (name, start, end, seconds).
# RL_TEMPERATURE sets both arms' rollout temperature (default: the gpu profile's); `all` sets it to the
# lowest temperature of TEMPS at which B1 and C1 each have a macro improvable share >= MIN_SHARE (default
# 0.10) on training prompts (`python -m trainer preflight-choose`; the choice goes to $AB/preflight/choice.json),
# writes each phase's improvable prompts at that temperature ($AB/preflight/<phase>_improvable.parquet,
# `trainer preflight-filter`) and runs B1's positive control on them before rl. RL_IMPROVABLE=1 trains
# rl on those prompt sets instead of the whole train split. A phase below MIN_SHARE has no headroom: the
# chain stops before the control (FORCE_RL=1 goes on).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -n "${PYTHONPATH:-}" && -d "${MODEL_DIR:-/nonexistent}" ]] || source bench/gpu/node_setup.sh >/dev/null
source bench/gpu/collect_lib.sh
AB=${AB:-/tmp/ab}
RL_STEPS=${RL_STEPS:-10}
TEST=$GOLDEN_DIR/common_test_schemas.jsonl
mkdir -p "$AB"
bg() {  # NAME CMD: run CMD in its own session (outlives this command); NAME.rc when done, stage time recorded
  local name=$1; shift
  rm -f "$AB/$name.rc"
  setsid bash -c "s=\$(date +%s); ( $* ) >> $AB/$name.log 2>&1; rc=\$?; echo \$rc > $AB/$name.rc; \
    printf '%s\t%s\t%s\t%s\n' $name \$s \$(date +%s) \$(( \$(date +%s) - s )) >> $AB/stages.tsv" < /dev/null > /dev/null 2>&1 &
}
# RL settings of both arms: the gpu profile's hyper-parameters, RL_STEPS steps, validation every 5, a random
# 2,048-prompt subset of the train split (VERL's seed) so the dataset is not tokenised whole at start,
# eager vLLM rollout (no compile at start), a fifth of the GPU each (two trainers + executors share it),
# Ray on loopback (the node has no network).
RL_ARGS="--profile gpu --data $AB/data --nproc 1 trainer.n_gpus_per_node=1 trainer.total_training_steps=$RL_STEPS \
  trainer.test_freq=5 trainer.save_freq=5 data.train_max_samples=2048 actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.2 +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
  ${RL_TEMPERATURE:+actor_rollout_ref.rollout.temperature=$RL_TEMPERATURE}"
# The positive control's own settings (trainer/phases/positive_control.py) with this node's placement and the
# chosen temperature: not RL_ARGS, whose steps and validation schedule would override the control's.
CONTROL_ARGS="--profile gpu trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.2 +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
  ${RL_TEMPERATURE:+actor_rollout_ref.rollout.temperature=$RL_TEMPERATURE}"
rl_data() {  # PHASE: RL_IMPROVABLE=1 trains on the phase's improvable prompts (`trainer preflight-filter`)
  [[ ${RL_IMPROVABLE:-0} == 1 ]] && echo "data.train_files=$AB/preflight/$1_improvable.parquet" || true
}

services_up() {  # reward_api local (18310); with PIPE=1 (default) also the π2ˢ executor (the pipeline reward's
                 # frozen π2) and reward_api pipeline (18311)
  local pipe=${PIPE:-1} ports=18310
  if ! up 18310; then
    REWARD_API_LOG_LEVEL=WARNING setsid python3 -m services.reward_api --host 127.0.0.1 --port 18310 --workers 4 \
      > "$AB/reward_api_local.log" 2>&1 < /dev/null &
  fi
  if [[ $pipe == 1 ]] && ! up 18311; then
    ports="18310 18311"
    python3 -m bench.gpu.serve start --model "$AB/a2/hf" --name pi2-sft --gpus 0 --port 18301 --mem 0.08 --eager
    python3 -m bench.gpu.serve wait --ports 18301
    REWARD_API_EXECUTOR_URLS=http://127.0.0.1:18301 REWARD_API_EXECUTOR_MODEL=pi2-sft REWARD_API_LOG_LEVEL=WARNING \
      setsid python3 -m services.reward_api --host 127.0.0.1 --port 18311 --workers 8 \
      > "$AB/reward_api_pipe.log" 2>&1 < /dev/null &
  fi
  # shellcheck disable=SC2086
  wait_up 90 $ports
}

case "${1:-}" in
sft)
  sft_args="--profile gpu --data $AB/data --model $MODEL_DIR --nproc 1 trainer.n_gpus_per_node=1"
  runs=""
  for ph in ${SFT_PHASES:-a1 a2}; do
    runs+="python3 -m trainer run $ph $sft_args --out $AB/$ph > $AB/$ph.log 2>&1 & pids+=(\$!); "
  done
  bg sft "python3 -m trainer data build --golden $GOLDEN_DIR --out $AB/data --phases a1,a2,b1,c1 || exit 1; \
    pids=(); $runs failed=0; for p in \${pids[@]}; do wait \$p || failed=1; done; \
    echo sft phases ${SFT_PHASES:-a1 a2} failed=\$failed; exit \$failed"
  echo "sft started: ${SFT_PHASES:-a1 a2}"
  ;;
preflight)
  # B1's and C1's start policy (π1ˢ) sampled n=8 on 64 training prompts per temperature; each group's
  # rewards through the reward API its phase uses. Chooses rl's temperature without the test split.
  phases=${PREFLIGHT_PHASES:-b1 c1}
  PIPE=0; [[ " $phases " == *" c1 "* ]] && PIPE=1
  PIPE=$PIPE services_up
  # eager (no CUDA graphs / compile): the sweep is short, the start is what costs (on a fresh H200 node the
  # compiled start ran past 90 s, and a preflight that had 100 s left never sampled)
  python3 -m bench.gpu.serve start --model "$AB/a1/hf" --name pi1-sft --gpus 0 --port 18320 --mem 0.08 --eager --wait
  mkdir -p "$AB/preflight"
  sweeps=""
  for ph in $phases; do
    case $ph in b1) url=http://127.0.0.1:18310 ;; c1) url=http://127.0.0.1:18311 ;; *) echo "no preflight for $ph" >&2; exit 2 ;; esac
    sweeps+="python3 -m trainer preflight --golden $GOLDEN_DIR --phase $ph --policy-url http://127.0.0.1:18320 \
      --policy-model pi1-sft --reward-url $url --prompts ${PREFLIGHT_PROMPTS:-64} --n ${PREFLIGHT_N:-16} \
      --temperature \$t --max-tokens 256 --min-informative 0 --min-improvable 0 \
      --out $AB/preflight/${ph}_t\$t.json > /dev/null; "
  done
  bg preflight "for t in ${TEMPS:-1.0 1.3 1.6}; do $sweeps done; \
    python3 -m bench.gpu.serve stop --ports 18320"  # eval starts its own π1ˢ executor on that port
  echo "preflight started: $phases at temperatures ${TEMPS:-1.0 1.3 1.6}"
  ;;
control)
  # B1's positive control: the rl arm's own recipe on 16 of its improvable prompts, trained and validated on
  # them; its greedy reward must rise by 0.05 (trainer/phases/positive_control.py), else the wiring is at fault
  PIPE=0 services_up
  bg control "python3 -m trainer positive-control b1 --prompts $AB/preflight/b1_improvable.parquet \
    --out $AB/b1_control --model $AB/a1/hf --reward-url http://127.0.0.1:18310 $CONTROL_ARGS"
  echo "control started: B1 on $AB/preflight/b1_improvable.parquet"
  ;;
rl)
  services_up
  bg rl "python3 -m trainer run b1 $RL_ARGS $(rl_data b1) --out $AB/b1 --model $AB/a1/hf --reward-url http://127.0.0.1:18310 > $AB/b1.log 2>&1 & p1=\$!; \
    python3 -m trainer run c1 $RL_ARGS $(rl_data c1) --out $AB/c1 --model $AB/a1/hf --reward-url http://127.0.0.1:18311 > $AB/c1.log 2>&1 & p2=\$!; \
    wait \$p1; a=\$?; wait \$p2; b=\$?; echo b1 \$a c1 \$b; [[ \$a == 0 && \$b == 0 ]]"
  echo "rl started: B1 and C1 from $AB/a1/hf, $RL_STEPS steps each"
  ;;
eval)
  # One at a time: three vLLM engines that started at the same moment on one GPU lost one of them
  # (engine core initialisation failed on the H200 run); the executors' own wait is in `serve wait`.
  bg eval "python3 -m bench.gpu.serve start --model $AB/a1/hf --name pi1-sft --gpus 0 --port 18320 --mem 0.08 --wait && \
    python3 -m bench.gpu.serve start --model $AB/b1/hf --name pi1-local --gpus 0 --port 18321 --mem 0.08 --wait && \
    python3 -m bench.gpu.serve start --model $AB/c1/hf --name pi1-pipe --gpus 0 --port 18322 --mem 0.08 --wait && \
    python3 -m bench.gpu.serve wait --ports 18301,18320,18321,18322 && \
    python3 -m trainer evaluate pipeline --golden $TEST --out $AB/phase_d --max-tokens 384 --concurrency 256 --timeout 600 \
      --setting sft=http://127.0.0.1:18320,pi1-sft,http://127.0.0.1:18301,pi2-sft \
      --setting local=http://127.0.0.1:18321,pi1-local,http://127.0.0.1:18301,pi2-sft \
      --setting pipe=http://127.0.0.1:18322,pi1-pipe,http://127.0.0.1:18301,pi2-sft"
  echo "eval started"
  ;;
all)
  bg all "bash bench/gpu/pi1_ab.sh _chain"
  echo "all started: sft, preflight (${TEMPS:-1.0 1.3 1.6}), rl ($RL_STEPS steps), eval"
  ;;
_chain)  # what `all` runs in the background: each stage in turn, stopping at the first that fails
  stage() {
    bash bench/gpu/pi1_ab.sh "$1" || return 1
    while [[ ! -f $AB/$1.rc ]]; do sleep 5; done
    [[ $(cat "$AB/$1.rc") == 0 ]] || { echo "stage $1 failed: $(tail -n 3 "$AB/$1.log")"; return 1; }
  }
  stage sft && stage preflight || exit 1
  phases=${PREFLIGHT_PHASES:-b1 c1}
  t=$(python3 -m trainer preflight-choose --dir "$AB/preflight" --phases "${phases// /,}" --min-share "${MIN_SHARE:-0.10}" \
    --out "$AB/preflight/choice.json") || exit 1
  echo "rl temperature: $t"
  # a phase below MIN_SHARE improvable prompts has no headroom: stop here rather than run it blind (FORCE_RL=1 runs it)
  none=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['no_headroom']))" "$AB/preflight/choice.json")
  if [[ -n $none && ${FORCE_RL:-0} != 1 ]]; then echo "no headroom: $none (MIN_SHARE ${MIN_SHARE:-0.10}); not running rl"; exit 1; fi
  for ph in $phases; do
    python3 -m trainer preflight-filter --report "$AB/preflight/${ph}_t$t.json" --train "$AB/data/$ph/train.parquet" \
      --out "$AB/preflight/${ph}_improvable.parquet" || exit 1
  done
  RL_TEMPERATURE=$t stage control && RL_TEMPERATURE=$t stage rl && stage eval
  ;;
wait)
  name=$2; deadline=$(( $(date +%s) + ${3:-540} ))
  while [[ ! -f $AB/$name.rc ]] && (( $(date +%s) < deadline )); do sleep 5; done
  for ph in a1 a2 b1 c1; do
    [[ -f $AB/$ph.log ]] && echo "$ph: $(tail -c 400 "$AB/$ph.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -n 1 | cut -c1-200)"
  done
  if [[ -f $AB/$name.rc ]]; then echo "$name exit $(cat "$AB/$name.rc")"; tail -n 5 "$AB/$name.log"; else echo "$name still running"; fi
  for f in "$AB"/preflight/*_t*.json; do
    if [[ -f $f ]]; then python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
print(sys.argv[1].rsplit('/', 1)[-1], 'informative', r['informative_share'], 'improvable', r.get('improvable_share'), \
'best-greedy', r.get('best_minus_greedy'), 'invalid', r.get('invalid_share'), 'mean', round(r['mean_reward'], 3), \
{s: v['improvable_share'] for s, v in r.get('per_source', {}).items()})" "$f"; fi
  done
  [[ -f $AB/b1_control/positive_control.json ]] && python3 -c "import json,sys; \
print(json.load(open(sys.argv[1]))['verdict']['reason'])" "$AB/b1_control/positive_control.json"
  [[ -f $AB/preflight/choice.json ]] && python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
print('chosen temperature', c['temperature'], '(reached)' if c['reached'] else '(NOT reached)', '-', c['reason'])" \
    "$AB/preflight/choice.json"
  cat "$AB/stages.tsv" 2>/dev/null || true
  ;;
collect)
  o=$AB.collected; rm -rf "$o"; mkdir -p "$o"
  cp "$AB/stages.tsv" "$AB/data/manifest.json" "$o/" 2>/dev/null || true
  for ph in a1 a2 b1 c1; do collect_phase "$AB/$ph" "$o"; done
  [[ -d $AB/b1_control ]] && mkdir -p "$o/b1_control" && { cp "$AB"/b1_control/{positive_control.json,phase_result.json,metrics.jsonl} "$o/b1_control/" 2>/dev/null || true; }
  [[ -d $AB/phase_d ]] && cp -r "$AB/phase_d" "$o/"
  [[ -d $AB/preflight ]] && cp -r "$AB/preflight" "$o/"
  for f in "$AB"/*.log; do if [[ -f $f ]]; then tail -c 20000 "$f" > "$o/${f##*/}"; fi; done
  collect_node_info "$o"
  tar -czf "${OUT:-$AB}/ab.tar.gz" -C "$o" .
  ls -la "${OUT:-$AB}/ab.tar.gz"
  ;;
*) echo "usage: pi1_ab.sh sft|preflight|control|rl|eval|all|wait NAME SECONDS|collect" >&2; exit 2 ;;
esac
