#!/usr/bin/env bash
# The A/B experiments of the RL issue on ONE GPU, each in one 30-minute lease. EXP picks the policy:
#   EXP=pi1 (default): from the same π1ˢ, B1 (local schema reward) and C1 (pipeline reward: π2ˢ frozen in a
#     vLLM executor) train side by side for the same steps; Phase D then scores sft, local (π1ʳ-local + π2ˢ)
#     and pipe (π1ʳ-pipe + π2ˢ) end to end on the whole test split. Not the loop's order (there C1 starts
#     from π1ʳ-local and the executor serves π2ʳ-local): it holds the start policy and π2 fixed, so the only
#     difference between local and pipe is the reward.
#   EXP=pi2: from the same π2ˢ, B2 (Stage-2 prompts on GOLD schemas) and C2 (prompts on schemas π1ˢ wrote,
#     `trainer data precompute-schemas`) train side by side on the table reward; then π2 on gold schemas
#     (`trainer infer stage2` + `evaluate score`: sft, local = B2, pipe = C2) and Phase D end to end with π1ˢ.
# Source node_setup.sh first (or let this do it).
#   bash bench/gpu/ab.sh sft        # data build, then A1 beside A2 (background)
#   bash bench/gpu/ab.sh preflight  # after sft: per source, the informative and improvable shares (best of
#                                   # $PREFLIGHT_N=16 beats greedy), best-of-n - greedy and the invalid share of
#                                   # the RL phases at temperatures $TEMPS (training prompts only)
#   bash bench/gpu/ab.sh control    # after preflight + filter: the first arm's positive control on its
#                                   # improvable prompts (its greedy reward must rise by 0.05)
#   bash bench/gpu/ab.sh c2data     # EXP=pi2, after sft: π1ˢ writes the schemas of C2's prompts
#   bash bench/gpu/ab.sh rl         # after sft (and c2data): the two RL arms side by side (background)
#   bash bench/gpu/ab.sh eval       # after rl: executors of the models the phase results name, then Phase D
#   bash bench/gpu/ab.sh all        # every stage in one background chain, rl at the temperature the sweep chose
#   bash bench/gpu/ab.sh wait NAME SECONDS   # NAME: sft, preflight, c2data, control, rl, eval or all
#   bash bench/gpu/ab.sh collect    # $OUT/ab.tar.gz
#   SFT_PHASES="a1" (default "a1 a2") trains only π1ˢ; PREFLIGHT_PHASES (default "b1 c1" for pi1, "b2" for pi2).
# Every stage's wall time goes to $AB/stages.tsv (name, start, end, seconds).
# RL_TEMPERATURE sets both arms' rollout temperature (default: the gpu profile's); `all` sets it to the lowest
# temperature of TEMPS at which every swept phase has a macro improvable share >= MIN_SHARE (default 0.10)
# (`python -m trainer preflight-choose`; the choice goes to $AB/preflight/choice.json), writes each swept
# phase's improvable prompts at that temperature ($AB/preflight/<phase>_improvable.parquet, `trainer
# preflight-filter`) and runs the positive control: before rl (CONTROL=serial, default), beside it
# (CONTROL=parallel: one lease's time; on CONTROL_GPU, default GPU_A) or not at all (CONTROL=off).
# MIN_SOURCE_SHARE (default 0) keeps only the sources whose improvable share reaches it in those prompt sets. RL_IMPROVABLE=1 trains each arm on its
# phase's improvable prompts where the sweep wrote them. A swept phase below MIN_SHARE has no headroom: the
# chain stops before the control (FORCE_RL=1 goes on). RL_EXTRA: more Hydra overrides for both arms.
# The second arm starts RL_STAGGER_S (default 90) after the first: two vLLM rollout engines that initialise at
# the same moment on one GPU can lose one (vLLM's memory profiling sees the other's allocations move).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -n "${PYTHONPATH:-}" && -d "${MODEL_DIR:-/nonexistent}" ]] || source bench/gpu/node_setup.sh >/dev/null
source bench/gpu/collect_lib.sh
AB=${AB:-/tmp/ab}
EXP=${EXP:-pi1}
case $EXP in
  pi1) ARMS="b1 c1"; RL_PHASES="b1,c1"; DEFAULT_PREFLIGHT="b1 c1" ;;
  pi2) ARMS="b2 c2"; RL_PHASES="b2"; DEFAULT_PREFLIGHT="b2" ;;
  *) echo "EXP must be pi1 or pi2, got $EXP" >&2; exit 2 ;;
esac
RL_STEPS=${RL_STEPS:-10}
TEST=$GOLDEN_DIR/common_test_schemas.jsonl
mkdir -p "$AB"
# GPU_A: the first arm's GPU (and the preflight's, the control's, π1's executors); GPU_B: the second arm's (and
# the π2ˢ executor of C1's reward). Both 0 on a one-GPU node; a two-GPU node runs the pi1 and the pi2 chains
# side by side (GPU_A=GPU_B=0 and 1), a four-GPU node gives each arm its own. PORT_OFFSET keeps two chains'
# services apart; SFT_GPUS places A1 and A2; SFT_FROM=<other chain's AB> reuses its data build and SFT.
GPU_A=${GPU_A:-0}
GPU_B=${GPU_B:-$GPU_A}
PO=${PORT_OFFSET:-0}
RAPI_LOCAL=$((18310 + PO)) RAPI_PIPE=$((18311 + PO)) X_PI2=$((18301 + PO)) X_PI1=$((18320 + PO))
X_PI1_LOCAL=$((18321 + PO)) X_PI1_PIPE=$((18322 + PO)) X_PI2_LOCAL=$((18331 + PO)) X_PI2_PIPE=$((18332 + PO))
# The second arm waits RL_STAGGER_S only where it shares the first arm's GPU
STAGGER=0; [[ $GPU_A == "$GPU_B" ]] && STAGGER=${RL_STAGGER_S:-90}
# Eval's executors: those on the other GPU start without waiting for the one before (engines that initialise
# together on ONE GPU can lose one; on two GPUs they cannot); eager, as the rollout (no compile at start)
NOWAIT=--wait; [[ $GPU_A != "$GPU_B" ]] && NOWAIT=""
bg() {  # NAME CMD: run CMD in its own session (outlives this command); NAME.rc when done, stage time recorded
  local name=$1; shift
  rm -f "$AB/$name.rc"
  setsid bash -c "s=\$(date +%s); ( $* ) >> $AB/$name.log 2>&1; rc=\$?; echo \$rc > $AB/$name.rc; \
    printf '%s\t%s\t%s\t%s\n' $name \$s \$(date +%s) \$(( \$(date +%s) - s )) >> $AB/stages.tsv" < /dev/null > /dev/null 2>&1 &
}
# RL settings of both arms: the gpu profile's hyper-parameters, RL_STEPS steps, validation (and a checkpoint)
# every RL_TEST_FREQ (5) steps, a random
# 2,048-prompt subset of the train split (VERL's seed) so the dataset is not tokenised whole at start,
# micro batches of RL_MICRO (32) samples: a mini batch of 8 prompts x 16 is 128 samples on ONE GPU, and the
# profile's 16 (sized for 8 GPUs) made 64 forward/backward passes a step for a 135M model: update_actor took
# 25-35 s of a 43-73 s step and the two log-prob passes 5-8 s each (issue 23's 4-GPU lease) with the GPU
# nearly idle; the same math in fewer, larger passes. One transfer-queue storage unit (the profile's 8 made
# the start-up wait ~20 s for their actors; bench/results/grpo_startup.md). Epochs
# enough that RL_STEPS ends the run (an improvable-prompt set of 152 ran out after 6 steps at grpo_base's 3),
# eager vLLM rollout (no compile at start), a fifth of the GPU each (two trainers + executors share it),
# Ray on loopback (the node has no network).
RL_ARGS="--profile gpu --data $AB/data --nproc 1 trainer.n_gpus_per_node=1 trainer.total_training_steps=$RL_STEPS \
  trainer.test_freq=${RL_TEST_FREQ:-5} trainer.save_freq=${RL_TEST_FREQ:-5} data.train_max_samples=2048 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${RL_MICRO:-32} actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=${RL_MICRO:-32} \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${RL_MICRO:-32} transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
  trainer.total_epochs=100 actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.2 +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
  ${RL_TEMPERATURE:+actor_rollout_ref.rollout.temperature=$RL_TEMPERATURE} ${RL_EXTRA:-}"

# The positive control's own settings (trainer/phases/positive_control.py) with this node's placement and the
# chosen temperature: not RL_ARGS, whose steps and validation schedule would override the control's.
CONTROL_ARGS="--profile gpu trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.enforce_eager=true \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.2 +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
  ${RL_TEMPERATURE:+actor_rollout_ref.rollout.temperature=$RL_TEMPERATURE}"
CONTROL_PHASE=${ARMS%% *}
rl_data() {  # PHASE: RL_IMPROVABLE=1 trains on the phase's improvable prompts (`trainer preflight-filter`) where
  # they fill a batch of 64 (issue 23's 4-GPU lease: B2's 49 could not; verl_main now refuses such a set by name)
  local f=$AB/preflight/$1_improvable.parquet
  if [[ ${RL_IMPROVABLE:-0} == 1 && -f $f ]]; then
    if (( $(python3 -c "import sys; from trainer.phases.train_set import count_prompts; print(count_prompts(sys.argv[1]))" "$f") >= 64 )); then
      echo "data.train_files=$f"
    else
      echo "$1: fewer than 64 improvable prompts in $f; training on the train split" >&2
    fi
  fi
}

phase_d_in_parallel() {  # "NAME:π1PORT:π1MODEL:π2PORT:π2MODEL ...": the shell text of one `evaluate pipeline` per
  # setting, all at once (one 135M model does not fill the GPU: three settings one after the other took
  # ~160 s each on an H200), then `evaluate score` over their predictions: the same report, paired tests
  # included, as one `evaluate pipeline` with every setting
  local spec out="pids=(); " preds=""
  for spec in $1; do
    IFS=: read -r n p1 m1 p2 m2 <<< "$spec"
    out+="python3 -m trainer evaluate pipeline --golden $TEST --out $AB/phase_d_$n --max-tokens 384 --concurrency 256 \
      --timeout 600 --setting $n=http://127.0.0.1:$p1,$m1,http://127.0.0.1:$p2,$m2 > $AB/eval_$n.log 2>&1 & pids+=(\$!); "
    preds+=" --predictions $n=$AB/phase_d_$n/predictions_$n.jsonl"
  done
  echo "$out for q in \${pids[@]}; do wait \$q || exit 1; done; python3 -m trainer evaluate score --golden $TEST --out $AB/phase_d$preds"
}

keep_or_start() {  # PORT NAME SERVE_START_ARGS...: an executor already serving NAME on PORT (started by an earlier
  # stage: the preflight's policy, c2data's π1ˢ, the pipeline reward's π2ˢ) is kept; else one is started
  local port=$1 name=$2; shift 2
  if serves "$port" "$name"; then echo "kept $name on port $port"; return 0; fi
  python3 -m bench.gpu.serve start --name "$name" --port "$port" "$@"
}

serves() {  # PORT NAME: the vLLM server on 127.0.0.1:PORT lists the model NAME
  python3 -c "import httpx, sys; r = httpx.get(f'http://127.0.0.1:{sys.argv[1]}/v1/models', timeout=2); \
sys.exit(0 if sys.argv[2] in [m['id'] for m in r.json()['data']] else 1)" "$1" "$2" 2>/dev/null
}
export -f keep_or_start serves  # bg's stages run them in a shell of their own

hf_of() {  # PHASE_DIR: the model a phase produced (its phase_result's hf_dir: the input model when early
           # stopping kept step 0, so eval never asks for an export that does not exist)
  python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/phase_result.json'))['hf_dir'])" "$1"
}

services_up() {  # reward_api local (port 18310 + PORT_OFFSET); with PIPE=1 (default) also the π2ˢ executor (the
                 # pipeline reward's frozen π2) and reward_api pipeline (18311 + PORT_OFFSET)
  local pipe=${PIPE:-1} ports=${RAPI_LOCAL}
  if ! up ${RAPI_LOCAL}; then
    REWARD_API_LOG_LEVEL=WARNING setsid python3 -m services.reward_api --host 127.0.0.1 --port ${RAPI_LOCAL} --workers 4 \
      > "$AB/reward_api_local.log" 2>&1 < /dev/null &
  fi
  if [[ $pipe == 1 ]] && ! up ${RAPI_PIPE}; then
    ports="${RAPI_LOCAL} ${RAPI_PIPE}"
    python3 -m bench.gpu.serve start --model "$AB/a2/hf" --name pi2-sft --gpus $GPU_B --port ${X_PI2} --mem 0.08 --eager
    python3 -m bench.gpu.serve wait --ports ${X_PI2}
    REWARD_API_EXECUTOR_URLS=http://127.0.0.1:${X_PI2} REWARD_API_EXECUTOR_MODEL=pi2-sft REWARD_API_LOG_LEVEL=WARNING \
      setsid python3 -m services.reward_api --host 127.0.0.1 --port ${RAPI_PIPE} --workers 8 \
      > "$AB/reward_api_pipe.log" 2>&1 < /dev/null &
  fi
  # shellcheck disable=SC2086
  wait_up 90 $ports
}

case "${1:-}" in
sft)
  sft_args="--profile gpu --data $AB/data --model $MODEL_DIR --nproc 1 trainer.n_gpus_per_node=1"
  runs=""; read -r -a sft_gpus <<< "${SFT_GPUS:-$GPU_A $GPU_B}"; i=0
  for ph in ${SFT_PHASES:-a1 a2}; do
    runs+="CUDA_VISIBLE_DEVICES=${sft_gpus[$i]:-$GPU_A} python3 -m trainer run $ph $sft_args --out $AB/$ph > $AB/$ph.log 2>&1 & pids+=(\$!); "
    i=$((i + 1))
  done
  bg sft "python3 -m trainer data build --golden $GOLDEN_DIR --out $AB/data --phases ${DATA_PHASES:-a1,a2,$RL_PHASES} || exit 1; \
    pids=(); $runs failed=0; for p in \${pids[@]}; do wait \$p || failed=1; done; \
    echo sft phases ${SFT_PHASES:-a1 a2} failed=\$failed; exit \$failed"
  echo "sft started: ${SFT_PHASES:-a1 a2}"
  ;;
preflight)
  # The RL phases' start policy sampled on training prompts per temperature; each group's rewards through
  # the reward API its phase uses. Chooses rl's temperature without the test split.
  phases=${PREFLIGHT_PHASES:-$DEFAULT_PREFLIGHT}
  PIPE=0; [[ " $phases " == *" c1 "* ]] && PIPE=1
  # eager (no CUDA graphs / compile): the sweep is short, the start is what costs (on a fresh H200 node the
  # compiled start ran past 90 s, and a preflight that had 100 s left never sampled). The policy's executor
  # starts beside the π2ˢ one where they have GPUs of their own (the 4-GPU lease lost ~170 s starting them
  # one after the other), and stays up: eval serves the same model under the same name and port.
  if [[ $EXP == pi1 ]]; then policy=pi1-sft; pport=${X_PI1}; pmodel=$AB/a1/hf; else policy=pi2-sft; pport=${X_PI2}; pmodel=$AB/a2/hf; fi
  start_policy() { keep_or_start $pport $policy --model "$pmodel" --gpus $GPU_A --mem 0.08 --eager; }
  [[ -z $NOWAIT ]] && start_policy  # its own GPU: start it now, beside the π2ˢ executor of services_up
  PIPE=$PIPE services_up
  [[ -n $NOWAIT ]] && start_policy  # a shared GPU: only once services_up's engine is up
  python3 -m bench.gpu.serve wait --ports $pport
  mkdir -p "$AB/preflight"
  # the phases' sweeps run at once (one executor serves both; the 4-GPU lease ran B1's and C1's one after
  # the other: 212 s)
  sweeps=""
  for ph in $phases; do
    case $ph in b1|b2|c2) url=http://127.0.0.1:${RAPI_LOCAL} ;; c1) url=http://127.0.0.1:${RAPI_PIPE} ;; *) echo "no preflight for $ph" >&2; exit 2 ;; esac
    sweeps+="python3 -m trainer preflight --golden $GOLDEN_DIR --phase $ph --policy-url http://127.0.0.1:$pport \
      --policy-model $policy --reward-url $url --prompts ${PREFLIGHT_PROMPTS:-64} --n ${PREFLIGHT_N:-16} \
      --temperature \$t --max-tokens 384 --min-informative 0 --min-improvable 0 \
      --out $AB/preflight/${ph}_t\$t.json ${PREFLIGHT_EXTRA:-} > /dev/null & pids+=(\$!); "
  done
  bg preflight "for t in ${TEMPS:-1.0 1.3 1.6}; do pids=(); $sweeps for q in \${pids[@]}; do wait \$q || exit 1; done; done"
  echo "preflight started: $phases at temperatures ${TEMPS:-1.0 1.3 1.6}"
  ;;
c2data)
  # C2's prompts: π1ˢ writes the schema (greedy) of a seeded C2_TRAIN_SAMPLE (4,096) train documents, of which
  # rl draws 2,048, and of every validation document (early stopping's split); invalid ones are skipped.
  # Its π1ˢ executor stays up for eval (Phase D's π1 there).
  bg c2data "keep_or_start ${X_PI1} pi1-sft --model $AB/a1/hf --gpus $GPU_B --mem 0.08 --eager --wait && \
    python3 -m trainer data precompute-schemas --golden $GOLDEN_DIR --out $AB/data --executor-url http://127.0.0.1:${X_PI1} \
      --model pi1-sft --on-invalid skip --max-tokens 256 --concurrency 256 --timeout 600 --train-sample ${C2_TRAIN_SAMPLE:-4096}"
  echo "c2data started: π1ˢ schemas for C2"
  ;;
control)
  # The first arm's positive control: its own recipe on 16 of its improvable prompts, trained and validated on
  # them; its greedy reward must rise by 0.05 (trainer/phases/positive_control.py), else the wiring is at fault
  PIPE=0 services_up
  model=$AB/a1/hf; [[ $EXP == pi2 ]] && model=$AB/a2/hf
  bg control "CUDA_VISIBLE_DEVICES=${CONTROL_GPU:-$GPU_A} python3 -m trainer positive-control $CONTROL_PHASE --prompts $AB/preflight/${CONTROL_PHASE}_improvable.parquet \
    --out $AB/${CONTROL_PHASE}_control --model $model --reward-url http://127.0.0.1:${RAPI_LOCAL} $CONTROL_ARGS"
  echo "control started: $CONTROL_PHASE on $AB/preflight/${CONTROL_PHASE}_improvable.parquet"
  ;;
rl)
  if [[ $EXP == pi1 ]]; then
    services_up
    bg rl "CUDA_VISIBLE_DEVICES=$GPU_A python3 -m trainer run b1 $RL_ARGS $(rl_data b1) --out $AB/b1 --model $AB/a1/hf --reward-url http://127.0.0.1:${RAPI_LOCAL} > $AB/b1.log 2>&1 & p1=\$!; \
      sleep $STAGGER; CUDA_VISIBLE_DEVICES=$GPU_B python3 -m trainer run c1 $RL_ARGS $(rl_data c1) --out $AB/c1 --model $AB/a1/hf --reward-url http://127.0.0.1:${RAPI_PIPE} > $AB/c1.log 2>&1 & p2=\$!; \
      wait \$p1; a=\$?; wait \$p2; b=\$?; echo b1 \$a c1 \$b; [[ \$a == 0 && \$b == 0 ]]"
    echo "rl started: B1 and C1 from $AB/a1/hf, $RL_STEPS steps each"
  else
    PIPE=0 services_up  # both arms use the table reward: no executor inside the reward
    bg rl "CUDA_VISIBLE_DEVICES=$GPU_A python3 -m trainer run b2 $RL_ARGS $(rl_data b2) --out $AB/b2 --model $AB/a2/hf --reward-url http://127.0.0.1:${RAPI_LOCAL} > $AB/b2.log 2>&1 & p1=\$!; \
      sleep $STAGGER; CUDA_VISIBLE_DEVICES=$GPU_B python3 -m trainer run c2 $RL_ARGS $(rl_data c2) --out $AB/c2 --model $AB/a2/hf --reward-url http://127.0.0.1:${RAPI_LOCAL} > $AB/c2.log 2>&1 & p2=\$!; \
      wait \$p1; a=\$?; wait \$p2; b=\$?; echo b2 \$a c2 \$b; [[ \$a == 0 && \$b == 0 ]]"
    echo "rl started: B2 and C2 from $AB/a2/hf, $RL_STEPS steps each"
  fi
  ;;
eval)
  if [[ $EXP == pi2 ]]; then
    # π2ˢ, π2ʳ-B2 and π2ʳ-C2 on GOLD schemas (the B2 target), then end to end with π1ˢ writing the schemas.
    # π1ˢ (c2data's) and π2ˢ (the preflight's) executors are kept where up; the two trained models start
    # at once on GPUs of their own (one after the other on a one-GPU node)
    bg eval "keep_or_start ${X_PI1} pi1-sft --model $AB/a1/hf --gpus $GPU_A --mem 0.08 --eager --wait && \
      keep_or_start ${X_PI2} pi2-sft --model $AB/a2/hf --gpus $GPU_A --mem 0.08 --eager --wait && \
      python3 -m bench.gpu.serve start --model \$(bash bench/gpu/ab.sh _hf b2) --name pi2-local --gpus $GPU_A --port ${X_PI2_LOCAL} --mem 0.08 --eager $NOWAIT && \
      python3 -m bench.gpu.serve start --model \$(bash bench/gpu/ab.sh _hf c2) --name pi2-pipe --gpus $GPU_B --port ${X_PI2_PIPE} --mem 0.08 --eager $NOWAIT && \
      python3 -m bench.gpu.serve wait --ports ${X_PI1},${X_PI2},${X_PI2_LOCAL},${X_PI2_PIPE} && \
      mkdir -p $AB/gold_schema && gold=() && \
      for s in sft:${X_PI2}:pi2-sft local:${X_PI2_LOCAL}:pi2-local pipe:${X_PI2_PIPE}:pi2-pipe; do IFS=: read n p m <<< \$s; \
        python3 -m trainer infer stage2 --executor-url http://127.0.0.1:\$p --model \$m --golden $TEST \
          --out $AB/gold_schema/\$n.jsonl --max-tokens 384 --concurrency 256 --timeout 600 > $AB/gold_\$n.log 2>&1 & gold+=(\$!); done; \
      ( $(phase_d_in_parallel "sft:${X_PI1}:pi1-sft:${X_PI2}:pi2-sft local:${X_PI1}:pi1-sft:${X_PI2_LOCAL}:pi2-local pipe:${X_PI1}:pi1-sft:${X_PI2_PIPE}:pi2-pipe") ); d=\$?; \
      for q in \${gold[@]}; do wait \$q || exit 1; done; \
      python3 -m trainer evaluate score --golden $TEST --out $AB/gold_schema_eval --predictions sft=$AB/gold_schema/sft.jsonl \
        --predictions local=$AB/gold_schema/local.jsonl --predictions pipe=$AB/gold_schema/pipe.jsonl && exit \$d"
    echo "eval started"
    exit 0
  fi
  # π1ˢ (the preflight's) and π2ˢ (the pipeline reward's) executors are kept where up; the two trained models
  # start at once on GPUs of their own. On ONE GPU one at a time: three vLLM engines that started at the same
  # moment on one GPU lost one of them (engine core initialisation failed on the H200 run).
  bg eval "keep_or_start ${X_PI1} pi1-sft --model $AB/a1/hf --gpus $GPU_A --mem 0.08 --eager --wait && \
    keep_or_start ${X_PI2} pi2-sft --model $AB/a2/hf --gpus $GPU_B --mem 0.08 --eager --wait && \
    python3 -m bench.gpu.serve start --model \$(bash bench/gpu/ab.sh _hf b1) --name pi1-local --gpus $GPU_A --port ${X_PI1_LOCAL} --mem 0.08 --eager $NOWAIT && \
    python3 -m bench.gpu.serve start --model \$(bash bench/gpu/ab.sh _hf c1) --name pi1-pipe --gpus $GPU_B --port ${X_PI1_PIPE} --mem 0.08 --eager $NOWAIT && \
    python3 -m bench.gpu.serve wait --ports ${X_PI2},${X_PI1},${X_PI1_LOCAL},${X_PI1_PIPE} && \
    $(phase_d_in_parallel "sft:${X_PI1}:pi1-sft:${X_PI2}:pi2-sft local:${X_PI1_LOCAL}:pi1-local:${X_PI2}:pi2-sft pipe:${X_PI1_PIPE}:pi1-pipe:${X_PI2}:pi2-sft")"
  echo "eval started"
  ;;
all)
  bg all "bash bench/gpu/ab.sh _chain"
  echo "all started ($EXP): sft, preflight (${TEMPS:-1.0 1.3 1.6}), rl ($RL_STEPS steps), eval"
  ;;
_hf) hf_of "$AB/$2" ;;
_chain)  # what `all` runs in the background: each stage in turn, stopping at the first that fails
  stage() {
    bash bench/gpu/ab.sh "$1" || return 1
    while [[ ! -f $AB/$1.rc ]]; do sleep 5; done
    [[ $(cat "$AB/$1.rc") == 0 ]] || { echo "stage $1 failed: $(tail -n 3 "$AB/$1.log")"; return 1; }
  }
  if [[ -n ${SFT_FROM:-} ]]; then  # another chain's data build and SFT (it must build this chain's phases too)
    while [[ ! -f $SFT_FROM/sft.rc ]]; do sleep 5; done
    [[ $(cat "$SFT_FROM/sft.rc") == 0 ]] || { echo "sft of $SFT_FROM failed"; exit 1; }
    for d in data a1 a2; do ln -sfn "$SFT_FROM/$d" "$AB/$d"; done
  else
    stage sft || exit 1
  fi
  if [[ $EXP == pi2 ]]; then
    # c2data beside the preflight. On one GPU its π1ˢ engine starts once the preflight's engine is up
    # (`preflight` returns then), never at the same moment; on two (c2data's executor on GPU_B, the
    # preflight's on GPU_A) c2data, the longer of the two, starts first.
    if [[ -z $NOWAIT ]]; then
      bash bench/gpu/ab.sh c2data && bash bench/gpu/ab.sh preflight || exit 1
    else
      bash bench/gpu/ab.sh preflight && bash bench/gpu/ab.sh c2data || exit 1
    fi
    for s in preflight c2data; do
      while [[ ! -f $AB/$s.rc ]]; do sleep 5; done
      [[ $(cat "$AB/$s.rc") == 0 ]] || { echo "stage $s failed: $(tail -n 3 "$AB/$s.log")"; exit 1; }
    done
  else
    stage preflight || exit 1
  fi
  phases=${PREFLIGHT_PHASES:-$DEFAULT_PREFLIGHT}
  t=$(python3 -m trainer preflight-choose --dir "$AB/preflight" --phases "${phases// /,}" --min-share "${MIN_SHARE:-0.10}" \
    --out "$AB/preflight/choice.json") || exit 1
  echo "rl temperature: $t"
  # a phase below MIN_SHARE improvable prompts has no headroom: stop here rather than run it blind (FORCE_RL=1 runs it)
  none=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['no_headroom']))" "$AB/preflight/choice.json")
  if [[ -n $none && ${FORCE_RL:-0} != 1 ]]; then echo "no headroom: $none (MIN_SHARE ${MIN_SHARE:-0.10}); not running rl"; exit 1; fi
  for ph in $phases; do
    python3 -m trainer preflight-filter --report "$AB/preflight/${ph}_t$t.json" --train "$AB/data/$ph/train.parquet" \
      --out "$AB/preflight/${ph}_improvable.parquet" --min-source-share "${MIN_SOURCE_SHARE:-0}" || exit 1
  done
  case ${CONTROL:-serial} in
    serial) RL_TEMPERATURE=$t stage control || exit 1 ;;
    # judged from its file; rl does not wait for it, but starts PARALLEL_STAGGER_S later: three vLLM rollout
    # engines that start at once on one GPU lost one (issue 23's second lease: B1's "Engine core
    # initialization failed" while the control and C1 came up)
    parallel) RL_TEMPERATURE=$t bash bench/gpu/ab.sh control; sleep "${PARALLEL_STAGGER_S:-150}" ;;
    off) ;;
    *) echo "CONTROL must be serial, parallel or off" >&2; exit 2 ;;
  esac
  RL_TEMPERATURE=$t stage rl && stage eval
  ;;
wait)
  name=$2; deadline=$(( $(date +%s) + ${3:-540} ))
  while [[ ! -f $AB/$name.rc ]] && (( $(date +%s) < deadline )); do sleep 5; done
  for ph in a1 a2 $ARMS; do
    [[ -f $AB/$ph.log ]] && echo "$ph: $(tail -c 400 "$AB/$ph.log" | tr '\r' '\n' | grep -v '^\s*$' | tail -n 1 | cut -c1-200)"
  done
  if [[ -f $AB/$name.rc ]]; then echo "$name exit $(cat "$AB/$name.rc")"; tail -n 5 "$AB/$name.log"; else echo "$name still running"; fi
  for f in "$AB"/preflight/*_t*.json; do
    if [[ -f $f ]]; then python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
print(sys.argv[1].rsplit('/', 1)[-1], 'informative', r['informative_share'], 'improvable', r.get('improvable_share'), \
'best-greedy', r.get('best_minus_greedy'), 'invalid', r.get('invalid_share'), 'mean', round(r['mean_reward'], 3), \
{s: v['improvable_share'] for s, v in r.get('per_source', {}).items()})" "$f"; fi
  done
  for f in "$AB"/*_control/positive_control.json; do
    [[ -f $f ]] && python3 -c "import json,sys; print('control:', json.load(open(sys.argv[1]))['verdict']['reason'])" "$f"
  done
  [[ -f $AB/preflight/choice.json ]] && python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
print('chosen temperature', c['temperature'], '(reached)' if c['reached'] else '(NOT reached)', '-', c['reason'])" \
    "$AB/preflight/choice.json"
  cat "$AB/stages.tsv" 2>/dev/null || true
  ;;
collect)
  o=$AB.collected; rm -rf "$o"; mkdir -p "$o"
  cp "$AB/stages.tsv" "$AB/data/manifest.json" "$o/" 2>/dev/null || true
  for ph in a1 a2 b1 c1 b2 c2; do collect_phase "$AB/$ph" "$o"; done
  for d in "$AB"/*_control; do
    [[ -d $d ]] && mkdir -p "$o/${d##*/}" && { cp "$d"/{positive_control.json,phase_result.json,metrics.jsonl} "$o/${d##*/}/" 2>/dev/null || true; }
  done
  for d in phase_d gold_schema_eval; do [[ -d $AB/$d ]] && cp -r "$AB/$d" "$o/"; done
  rm -f "$o"/phase_d/predictions_*.jsonl "$o"/gold_schema_eval/predictions_*.jsonl  # large; metrics.json has the numbers
  [[ -d $AB/preflight ]] && cp -r "$AB/preflight" "$o/"
  for f in "$AB"/*.log; do if [[ -f $f ]]; then tail -c 20000 "$f" > "$o/${f##*/}"; fi; done
  collect_node_info "$o"
  tar -czf "${OUT:-$AB}/${COLLECT_NAME:-ab.tar.gz}" -C "$o" .
  ls -la "${OUT:-$AB}/${COLLECT_NAME:-ab.tar.gz}"
  ;;
*) echo "usage: [EXP=pi1|pi2] ab.sh sft|preflight|c2data|control|rl|eval|all|wait NAME SECONDS|collect" >&2; exit 2 ;;
esac
