#!/usr/bin/env bash
# The runs of `python -m bench rl-step` on one node of any GPU count (every run on all its GPUs), in the order
# WAVES names them (default: the order below):
#   sft    a1_fast ‖ a2_fast: SFT side by side on the node's GPUs (SFT_STEPS steps each; the epoch is extrapolated)
#   floor  the step's generation and update without VERL (python -m bench step-floor; into floor.jsonl): vLLM's
#          offline engine on B1's first BATCH prompts x N at VERL's scheduler sizes (256 / 8,192) and the profile's (1,024 / 32,768),
#          then the update of those samples (the policy alone, packed micro batches, PyTorch's profiler), and
#          then the micro wave
#   micro  python -m bench response-padding and nested-batches --device cuda (the update loss's response slicing, the
#          update's mini and micro batch selection: VERL's per-sample loops against this project's gathers; into floor/)
#   b1     exec_pi2 (π2's executor for C1, decode graphs without torch.compile, started beside B1: its ready
#          time is measured there) and b1_fast: B1 at BATCH x N, the gpu profile
#   exec   exec_pi2 alone, not waited for: C1's executor loads while the waves between it and c1 run
#   c1     c1_fast: C1 at BATCH x N, π2's executor behind a reward API on the same GPUs
#   stock  b1_stock: VERL's own trainer on B1's work (python -m bench.verl_stock)
#   padded b1_padded: B1 with PADDED, the gpu profile on padded micro batches (its setting before packing)
#   workers b1_workers: B1 with WORKERS, twice VERL's agent-loop and reward-loop workers (a step's generation waits
#          on their per-sample path: bench/results/rl_step_packed.md)
#   sched  b1_verlsched: B1 with VERLSCHED, vLLM's scheduler as VERL sizes it (256 sequences, 8,192 batched tokens a
#          step), without asynchronous scheduling and streaming every token: the gpu profile's scheduler
#          settings (1,024 / 32,768, asynchronous, every 16 tokens) against VERL's
#   fused  b1_fused: B1 with FUSED, VERL's fused log-prob and entropy kernels in the update (torch backend)
#   multiproc b1_multiproc: B1 with MULTIPROC, vLLM's model in a worker process of its own (VERL's "mp" executor)
#          instead of the gpu profile's uni executor (the model inside vLLM's EngineCore process: one process start
#          fewer, bench/results/rl_step_trace.md)
#   verlpath b1_verlpath: B1 with VERLPATH, VERL's own per-sample rollout path (trainer/in_verl/agent_loop_speed.py off)
#   verlbatch b1_verlbatch: B1 with TRAINER_SPEEDUPS_OFF=response_padding,nested_batches: VERL's own per-sample slicing
#          and batch selection in the update
#   b2     b2_fast: B2 at BATCH x N
#   pair   b1_pair ‖ b2_pair: B1 and B2 side by side on the same GPUs, PAIR_STEPS steps each, each rollout engine at
#          PAIR_MEMORY of the card, B2 started PAIR_STAGGER s after B1 (two vLLM engines sizing their memory at once on
#          one card can fail); the report averages the steps that overlapped, against b1_fast's and b2_fast's alone.
#          Not a default wave: on one H200 the second engine's memory profiling failed every time the first one's
#          sleep mode released its KV cache (bench/results/rl_step_shared.md)
#   small  b1_small: B1 at SMALL_BATCH x SMALL_N
# π1/π2 for RL are a1_fast's and a2_fast's exports unless PI1/PI2 are given. Run it as a job after node_setup.sh:
#   MODEL_DIR=/tmp/model scripts/gpu_node/job.sh start rl_step -- bash scripts/gpu_node/rl_step.sh
# then `job.sh wait rl_step 540` and `job.sh collect rl /tmp/rl` from later calls; runs.json and gpu_util.csv
# (nvidia-smi every 0.5 s) land in /tmp/rl beside the run folders. A failed run leaves the next ones going.
# PROFILE=b1_fast,c1_fast: py-spy samples each named run's process tree (Ray's workers included) for PROFILE_S
# seconds once it has logged two steps, into NAME/pyspy.txt.gz (py-spy's collapsed stacks; bench/pyspy.py sums them);
# PROFILE_IDLE=1 keeps idle samples too (where a process waits: a GPU sync, a socket, a lock).
# TRACE=b1_uniproc,...: PyTorch's profiler in the named runs' FSDP worker at step TRACE_STEP (VERL's global_profiler,
# CPU operators with their Python stacks, CUDA kernels and runtime calls), summarised on the node into
# NAME/trace_split.json (python -m bench torch-trace: regions, operators, kernels and the host's waits for the card); the
# trace itself stays in /tmp/traces. The report leaves the traced step out of the step means.
set -uo pipefail
J=scripts/gpu_node/job.sh
R=${RL_OUT:-/tmp/rl}
DATA=${RL_DATA:-/tmp/rl_data}
SFT_STEPS=${SFT_STEPS:-100}
RL_STEPS=${RL_STEPS:-6} STOCK_STEPS=${STOCK_STEPS:-${RL_STEPS:-6}}  # VERL's own trainer: ~80 s a step on one H200
BATCH=${BATCH:-64} N=${N:-16} SMALL_BATCH=${SMALL_BATCH:-32} SMALL_N=${SMALL_N:-8}
WAVES=${WAVES:-sft,floor,b1,c1,stock,sched,multiproc,fused,verlpath,verlbatch,padded,workers,b2,small}
PAIR_MEMORY=${PAIR_MEMORY:-0.25} PAIR_STEPS=${PAIR_STEPS:-12} PAIR_STAGGER=${PAIR_STAGGER:-60}
# the floor's scheduler sizes (max_num_seqs/max_num_batched_tokens): VERL's and the gpu profile's
FLOOR_SIZES=${FLOOR_SIZES:-256/8192 1024/32768}
PROFILE=${PROFILE:-} PROFILE_S=${PROFILE_S:-30}
TRACE=${TRACE:-} TRACE_STEP=${TRACE_STEP:-4}
: "${MODEL_DIR:?MODEL_DIR (the base model) must be set}" "${GOLDEN_DIR:?GOLDEN_DIR must be set}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# vLLM's INFO lines split the rollout engine's start (weights, memory profiling, KV cache + graphs: bench/grpo_startup.py);
# VERL sets WARN for its workers unless the launching shell sets a level
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}
NG=$(nvidia-smi -L | wc -l)
GPUS=$(seq -s, 0 $((NG - 1)))
LAST=$((NG - 1))
export CUDA_VISIBLE_DEVICES=$GPUS
mkdir -p "$R"
[[ -f $R/runs.json ]] || echo '{}' > "$R/runs.json"  # a rerun of some waves adds to it
setsid nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
  >> "$R/gpu_util.csv" 2>/dev/null < /dev/null &
SMI=$!
trap 'kill "$SMI" 2>/dev/null; python3 -m trainer serve stop --ports 18500 > /dev/null 2>&1' EXIT

note() {  # NAME: the run's GPUs, for the busy share
  python3 - "$R/runs.json" "$1" "$GPUS" <<'PY'
import json, sys
path, name, gpus = sys.argv[1:]
d = json.load(open(path)); d[name] = {"gpus": gpus}; json.dump(d, open(path, "w"), indent=1)
PY
}
wait_all() { for n in "$@"; do until $J wait "$n" 60 > /dev/null; [[ $? != 3 ]]; do :; done; echo "$n: $($J status | grep "^$n ")"; done; }
# The gpu profile on padded micro batches, its setting before packing (checked by tests/trainer/phases/test_gpu_profile.py).
PADDED=(
  actor_rollout_ref.model.use_remove_padding=false actor_rollout_ref.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.actor.use_dynamic_bsz=false
)
WORKERS=(actor_rollout_ref.rollout.agent.num_workers=16 reward.num_workers=8)
VERLSCHED=(actor_rollout_ref.rollout.max_num_seqs=256 actor_rollout_ref.rollout.max_num_batched_tokens=8192
           actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=false
           actor_rollout_ref.rollout.engine_kwargs.vllm.stream_interval=1)
MULTIPROC=(actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=mp)
FUSED=(actor_rollout_ref.model.use_fused_kernels=true actor_rollout_ref.model.fused_kernel_options.impl_backend=torch)
VERLPATH=(agent_loop_speed.reuse_single_turn=false agent_loop_speed.reward_in_process=false
          agent_loop_speed.token_only_outputs=false)
profile() {  # NAME: py-spy over the run's process tree once two steps are logged
  local name=$1 m=$R/$1/metrics.jsonl spy
  spy=$(command -v py-spy || echo "${SITE:-/tmp/site}/bin/py-spy")
  for _ in $(seq 900); do
    [[ -f $m ]] && (( $(wc -l < "$m") >= 2 )) && break
    [[ -f ${JOBS:-/tmp/jobs}/$name.rc ]] && return  # ended before its second step: nothing to profile
    sleep 1
  done
  timeout $((PROFILE_S + 60)) "$spy" record --subprocesses --nonblocking ${PROFILE_IDLE:+--idle} --rate 50 \
    --duration "$PROFILE_S" --format raw \
    --output "$R/$name/pyspy.txt" --pid "$(cat "${JOBS:-/tmp/jobs}/$name.pid")" > "$R/$name/pyspy.log" 2>&1
  gzip -f "$R/$name/pyspy.txt"  # ~20 MB of stacks for 30 s of a phase's tree; ~0.7 MB compressed
}
RL=(--profile gpu --data "$DATA" --no-export "trainer.n_gpus_per_node=$NG" "trainer.total_training_steps=$RL_STEPS"
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 early_stopping.enabled=false
    +ray_kwargs.ray_init._node_ip_address=127.0.0.1)
rl_start() {  # NAME PHASE URL MODEL BATCH N [OVERRIDE...]: the run started as a job, not waited for
  local name=$1 phase=$2 url=$3 model=$4 batch=$5 n=$6
  shift 6
  note "$name"
  $J start "$name" -- python3 -m trainer run "$phase" --out "$R/$name" --reward-url "$url" --model "$model" \
    "${RL[@]}" "data.train_batch_size=$batch" "actor_rollout_ref.rollout.n=$n" "$@"
}
trace_split() {  # NAME: the run's torch trace (one step, the actor) summarised beside it; the trace out of the collected folder
  local name=$1 f
  f=$(ls -t "$R/$name"/trace/*.json.gz 2> /dev/null | head -1)
  [[ -n $f ]] && python3 -m bench torch-trace "$f" --out "$R/$name/trace_split.json" > "$R/$name/trace_split.log" 2>&1
  [[ -d $R/$name/trace ]] && mkdir -p /tmp/traces && mv "$R/$name/trace" "/tmp/traces/$name"
  return 0
}
rl() {  # NAME PHASE URL MODEL BATCH N [OVERRIDE...]: rl_start, py-spy where PROFILE names it, then its end
  local name=$1 spy="" traced=()
  if [[ ,$TRACE, == *,$name,* ]]; then
    traced=(global_profiler.tool=torch "global_profiler.steps=[$TRACE_STEP]" "global_profiler.save_path=$R/$name/trace"
            actor_rollout_ref.actor.profiler.enable=true "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda,stack]")
  fi
  rl_start "$@" "${traced[@]}"
  if [[ ,$PROFILE, == *,$name,* ]]; then profile "$name" & spy=$!; fi
  wait_all "$name"
  # the profiler only: a bare `wait` would also wait for nvidia-smi's sampler, a child of this script until its end
  if [[ -n $spy ]]; then wait "$spy"; fi
  if (( ${#traced[@]} )); then trace_split "$name"; fi
}

wave_sft() {
  for phase in a1 a2; do
    note "${phase}_fast"
    $J start "${phase}_fast" -- python3 -m trainer run "$phase" --profile gpu --data "$DATA" --out "$R/${phase}_fast" \
      --model "$MODEL_DIR" "trainer.n_gpus_per_node=$NG" "trainer.total_training_steps=$SFT_STEPS" \
      epoch_selection.enabled=false
  done
  wait_all a1_fast a2_fast
}

wave_floor() {
  for size in $FLOOR_SIZES; do
    $J start "floor_gen_${size%%/*}" -- python3 -m bench step-floor gen --model "$PI1" --data "$DATA/b1/train.parquet" \
      --out "$R/floor/floor.jsonl" --prompts "$BATCH" --n "$N" --max-num-seqs "${size%%/*}" --max-num-batched-tokens "${size##*/}"
    wait_all "floor_gen_${size%%/*}"
  done
  $J start floor_update -- python3 -m bench step-floor update --model "$PI1" --responses "$R/floor/floor.responses.json" \
    --out "$R/floor/floor.jsonl"
  wait_all floor_update
  wave_micro
}
wave_micro() {  # VERL's per-sample loops against this project's gathers, on the card (into the collected folder)
  BENCH_RESULTS_DIR=$R/floor $J start floor_padding -- python3 -m bench response-padding --device cuda
  wait_all floor_padding
  BENCH_RESULTS_DIR=$R/floor $J start floor_batches -- python3 -m bench nested-batches --device cuda
  wait_all floor_batches
}

wave_b1() {
  # C1's executor starts beside B1, as the loop starts it beside C1's trainer: its ready time is a row
  wave_exec
  rl b1_fast b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N"
}
wave_exec() {  # π2's executor for C1, started and not waited for (the next waves run while it loads)
  # (not `status | grep -q`: under pipefail grep's early exit fails the pipe and a second executor would start)
  [[ -f ${JOBS:-/tmp/jobs}/exec_pi2.start ]] || $J start exec_pi2 -- python3 -m trainer serve start --model "$PI2" --name pi2 \
    --gpus "$LAST" --port 18500 --mem 0.12 --graphs-only --wait
}
c1_run() {  # NAME [OVERRIDE...]: C1 behind a reward API in front of π2's executor (both stay up for the next C1 row)
  wave_exec
  wait_all exec_pi2
  [[ -f ${JOBS:-/tmp/jobs}/api_c1.start ]] || {
    REWARD_API_EXECUTOR_URLS=http://127.0.0.1:18500 REWARD_API_EXECUTOR_MODEL=pi2 \
      $J start api_c1 -- python3 -m services.reward_api --host 127.0.0.1 --port 18420 --workers 4
    sleep 3
  }
  rl "$1" c1 http://127.0.0.1:18420 "$PI1" "$BATCH" "$N" "${@:2}"
}
wave_c1() { c1_run c1_fast; }
wave_stock() {
  note b1_stock
  $J start b1_stock -- python3 -m bench.verl_stock --data "$DATA" --model "$PI1" --out "$R/b1_stock" \
    --steps "$STOCK_STEPS" --batch "$BATCH" --n "$N" --gpus "$NG"
  wait_all b1_stock
}
wave_padded() { rl b1_padded b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${PADDED[@]}"; }
wave_sched() { rl b1_verlsched b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${VERLSCHED[@]}"; }
wave_multiproc() { rl b1_multiproc b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${MULTIPROC[@]}"; }
wave_fused() { rl b1_fused b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${FUSED[@]}"; }
wave_verlbatch() {
  TRAINER_SPEEDUPS_OFF=response_padding,nested_batches rl b1_verlbatch b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N"
}
wave_verlpath() { rl b1_verlpath b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${VERLPATH[@]}"; }
wave_workers() { rl b1_workers b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${WORKERS[@]}"; }
wave_b2() { rl b2_fast b2 http://127.0.0.1:18410 "$PI2" "$BATCH" "$N"; }
wave_pair() {
  local shared=("actor_rollout_ref.rollout.gpu_memory_utilization=$PAIR_MEMORY" "trainer.total_training_steps=$PAIR_STEPS")
  rl_start b1_pair b1 http://127.0.0.1:18410 "$PI1" "$BATCH" "$N" "${shared[@]}"
  sleep "$PAIR_STAGGER"
  rl_start b2_pair b2 http://127.0.0.1:18410 "$PI2" "$BATCH" "$N" "${shared[@]}"
  wait_all b1_pair b2_pair
}
wave_small() { rl b1_small b1 http://127.0.0.1:18410 "$PI1" "$SMALL_BATCH" "$SMALL_N"; }

for wave in ${WAVES//,/ }; do  # in the order WAVES names them; an unknown name stops before anything runs
  declare -F "wave_$wave" > /dev/null || { echo "rl_step: no wave $wave (waves: $(declare -F | sed -n 's/.*wave_//p' | tr '\n' ' '))"; exit 2; }
done
[[ -d $DATA/b1 ]] || python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$DATA" --phases a1,a2,b1,b2,c1 \
  > "$R/data_build.log" 2>&1 || { echo "data build failed"; tail -20 "$R/data_build.log"; exit 1; }
PI1=${PI1:-$R/a1_fast/hf}
PI2=${PI2:-$R/a2_fast/hf}
$J start api_local -- python3 -m services.reward_api --host 127.0.0.1 --port 18410 --workers 4
sleep 3
for wave in ${WAVES//,/ }; do "wave_$wave"; done
echo "rl_step: done"
