#!/usr/bin/env bash
# The runs of `python -m bench rl-step` on one 4-GPU node, before and after the speed settings, side by side:
#   wave 1, SFT, one GPU each:      a1_after a2_after  (SFT_STEPS steps each; the epoch is extrapolated)
#   wave 2, B1, two GPUs each:      b1_before (0,1)  b1_after (2,3)        (RL_STEPS steps, no validation)
#   wave 3, C1, two GPUs each:      c1_before (0,1)  c1_after (2,3), each with its own π2 executor + reward API
#   wave 4, B2, two GPUs each:      b2_before (0,1)  b2_after (2,3)
# "before" is the gpu profile as it was (BEFORE puts every setting back); "after" is the profile.
# π1/π2 for RL are a1_after's and a2_after's exports. Run it as a job after node_setup.sh:
#   MODEL_DIR=/tmp/model scripts/gpu_node/job.sh start rl_step -- bash scripts/gpu_node/rl_step.sh
# then `job.sh wait rl_step 560` and `job.sh collect rl /tmp/rl` from later calls; runs.json and gpu_util.csv
# (nvidia-smi every 0.5 s) land in /tmp/rl beside the run folders. A failed run leaves its wave's others going.
set -uo pipefail
J=scripts/gpu_node/job.sh
R=${RL_OUT:-/tmp/rl}
DATA=${RL_DATA:-/tmp/rl_data}
SFT_STEPS=${SFT_STEPS:-300}
RL_STEPS=${RL_STEPS:-5}
WAVES=${WAVES:-sft,b1,c1,b2}
: "${MODEL_DIR:?MODEL_DIR (the base model) must be set}" "${GOLDEN_DIR:?GOLDEN_DIR must be set}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$R"
[[ -f $R/runs.json ]] || echo '{}' > "$R/runs.json"  # a rerun of some waves adds to it
setsid nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
  >> "$R/gpu_util.csv" 2>/dev/null < /dev/null &
SMI=$!
trap 'kill "$SMI" 2>/dev/null' EXIT

note() {  # NAME GPUS: the run's GPUs, for the busy share
  python3 - "$R/runs.json" "$1" "$2" <<'PY'
import json, sys
path, name, gpus = sys.argv[1:]
d = json.load(open(path)); d[name] = {"gpus": gpus}; json.dump(d, open(path, "w"), indent=1)
PY
}
wait_all() { for n in "$@"; do until $J wait "$n" 60 > /dev/null; [[ $? != 3 ]]; do :; done; echo "$n: $($J status | grep "^$n ")"; done; }
on() { [[ ,$WAVES, == *,$1,* ]]; }

# The gpu profile before the speed settings, setting by setting (SFT: the sft profile is unchanged).
BEFORE=(
  actor_rollout_ref.actor.use_kl_loss=true algorithm.rollout_correction.bypass_mode=false
  actor_rollout_ref.actor.calculate_entropy=false replay_buffer.poll_s=2.0 prompt_filter.enabled=false
  sizing.auto=false actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
)
RL=(--profile gpu --data "$DATA" --no-export trainer.n_gpus_per_node=2 "trainer.total_training_steps=$RL_STEPS"
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 early_stopping.enabled=false
    +ray_kwargs.ray_init._node_ip_address=127.0.0.1)

[[ -d $DATA/b1 ]] || python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$DATA" --phases a1,a2,b1,b2,c1 \
  > "$R/data_build.log" 2>&1 || { echo "data build failed"; tail -20 "$R/data_build.log"; exit 1; }

if on sft; then
  for s in a1_after:0 a2_after:1; do
    name=${s%:*}; gpu=${s#*:}; phase=${name%_*}
    note "$name" "$gpu"
    CUDA_VISIBLE_DEVICES=$gpu $J start "$name" -- python3 -m trainer run "$phase" --profile gpu --data "$DATA" \
      --out "$R/$name" --model "$MODEL_DIR" trainer.n_gpus_per_node=1 "trainer.total_training_steps=$SFT_STEPS"
  done
  wait_all a1_after a2_after
fi
PI1=${PI1:-$R/a1_after/hf}
PI2=${PI2:-$R/a2_after/hf}

$J start api_local -- python3 -m services.reward_api --host 127.0.0.1 --port 18410 --workers 4
pair() {  # PHASE URL_BEFORE URL_AFTER MODEL: the phase before on GPUs 0,1 and after on GPUs 2,3, then wait
  note "$1_before" 0,1; note "$1_after" 2,3
  CUDA_VISIBLE_DEVICES=0,1 $J start "$1_before" -- python3 -m trainer run "$1" --out "$R/$1_before" --reward-url "$2" \
    --model "$4" "${RL[@]}" "${BEFORE[@]}"
  CUDA_VISIBLE_DEVICES=2,3 $J start "$1_after" -- python3 -m trainer run "$1" --out "$R/$1_after" --reward-url "$3" \
    --model "$4" "${RL[@]}"
  wait_all "$1_before" "$1_after"
}
sleep 5
on b1 && pair b1 http://127.0.0.1:18410 http://127.0.0.1:18410 "$PI1"
if on c1; then
  # One π2 executor per arm, on the arm's second GPU (a small share of it), each behind its own reward API.
  # They start beside the trainers, as the loop starts C1's: a trainer waits for its reward API (and the
  # API's executor) before its first rollout (reward_ready), and the executors take their memory first.
  $J start exec_before -- python3 -m trainer serve start --model "$PI2" --name pi2 --gpus 1 --port 18500 --mem 0.12 --eager --wait
  $J start exec_after -- python3 -m trainer serve start --model "$PI2" --name pi2 --gpus 3 --port 18510 --mem 0.12 --eager --wait
  (
    wait_all exec_before exec_after > /dev/null
    REWARD_API_EXECUTOR_URLS=http://127.0.0.1:18500 REWARD_API_EXECUTOR_MODEL=pi2 \
      $J start api_c1_before -- python3 -m services.reward_api --host 127.0.0.1 --port 18420 --workers 4
    REWARD_API_EXECUTOR_URLS=http://127.0.0.1:18510 REWARD_API_EXECUTOR_MODEL=pi2 \
      $J start api_c1_after -- python3 -m services.reward_api --host 127.0.0.1 --port 18421 --workers 4
  ) &
  apis=$!
  sleep 20
  pair c1 http://127.0.0.1:18420 http://127.0.0.1:18421 "$PI1"
  wait "$apis"  # this one only: the GPU sampler is a child too
  python3 -m trainer serve stop --ports 18500,18510 || true
fi
on b2 && pair b2 http://127.0.0.1:18410 http://127.0.0.1:18410 "$PI2"
echo "rl_step: done"
