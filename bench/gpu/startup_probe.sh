#!/usr/bin/env bash
# Where a GRPO phase's start-up goes (issue 12): on one H200 a phase spent 4-7 minutes before its first
# step (Ray, dataset, FSDP workers, vLLM rollout server), 3-4 times what its 10 steps took, and four
# phases pay it in turn. This runs B1 for 2 steps from the base model with vLLM's INFO log, a Ray
# timeline, and py-spy stacks of every Ray/vLLM process every few seconds, so that each gap in the log
# has a stack. Source node_setup.sh first (or let this do it); carry a py-spy wheel in .whl/ for stacks.
#   bash bench/gpu/startup_probe.sh start NAME [OVERRIDES...]   # background; NAME: run label
#   bash bench/gpu/startup_probe.sh wait NAME SECONDS
#   bash bench/gpu/startup_probe.sh collect                     # $OUT/probe.tar.gz (every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -n "${PYTHONPATH:-}" && -d "${MODEL_DIR:-/nonexistent}" ]] || source bench/gpu/node_setup.sh >/dev/null
source bench/gpu/collect_lib.sh
ROOT=${PROBE:-/tmp/probe}
PYSPY=${PYSPY:-/tmp/pyspy/bin/py-spy}
mkdir -p "$ROOT"

sampler() {  # DIR: stacks of the phase's Python processes until DIR/run.rc exists
  local d=$1 pid
  while [[ ! -f $d/run.rc ]]; do
    {
      echo "=== $(date +%s.%N)"
      for pid in $(pgrep -f 'ray::|EngineCore|vllm|verl_main|trainer run' || true); do
        echo "--- pid $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
        timeout 10 "$PYSPY" dump --pid "$pid" --nonblocking 2>&1 | head -n 60 || true
      done
    } >> "$d/stacks.txt"
    sleep "${PROBE_EVERY:-4}"
  done
}

case "${1:-}" in
start)
  name=${2:?run label}; shift 2
  d=$ROOT/$name
  rm -rf "$d"; mkdir -p "$d"
  if [[ ! -x $PYSPY ]] && compgen -G ".whl/py_spy-*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl
  fi
  [[ -f $ROOT/data/b1/train.parquet ]] || python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$ROOT/data" --phases b1
  if ! up 18410; then
    REWARD_API_LOG_LEVEL=WARNING setsid python3 -m services.reward_api --host 127.0.0.1 --port 18410 --workers 4 \
      > "$ROOT/reward_api.log" 2>&1 < /dev/null &
    wait_up 90 18410
  fi
  # shellcheck disable=SC2145
  setsid bash -c "date +%s.%N > $d/start; python3 -m trainer run b1 --profile gpu --data $ROOT/data --out $d/b1 \
    --model $MODEL_DIR --reward-url http://127.0.0.1:18410 --nproc 1 trainer.n_gpus_per_node=1 \
    trainer.total_training_steps=2 trainer.test_freq=2 data.train_max_samples=1024 \
    +ray_kwargs.ray_init._node_ip_address=127.0.0.1 +ray_kwargs.ray_init.runtime_env.env_vars.VLLM_LOGGING_LEVEL=INFO \
    ray_kwargs.timeline_json_file=$d/timeline.json $* > $d/run.log 2>&1; echo \$? > $d/run.rc; date +%s.%N > $d/end" \
    < /dev/null > /dev/null 2>&1 &
  if [[ -x $PYSPY ]]; then setsid bash -c "$(declare -f sampler); PYSPY=$PYSPY sampler $d" < /dev/null > /dev/null 2>&1 & fi
  echo "probe $name started: B1, 2 steps, base model; stacks: $([[ -x $PYSPY ]] && echo on || echo off)"
  ;;
wait)
  d=$ROOT/${2:?run label}; deadline=$(( $(date +%s) + ${3:-540} ))
  while [[ ! -f $d/run.rc ]] && (( $(date +%s) < deadline )); do sleep 5; done
  if [[ -f $d/run.rc ]]; then
    echo "probe ${2} exit $(cat "$d/run.rc") after $(python3 -c "print(round($(cat "$d/end") - $(cat "$d/start")))") s"
  else
    echo "probe ${2} still running"
  fi
  grep -a -o "INFO:20[0-9-]* [0-9:]*,[0-9]*:.\{0,70\}\|step:[0-9]* - .\{0,40\}" "$d/b1/train.log" 2>/dev/null | tail -n 12 || true
  ;;
collect)
  o=$ROOT.collected; rm -rf "$o"; mkdir -p "$o"
  for d in "$ROOT"/*/; do
    n=$(basename "$d"); [[ $n == data ]] && continue
    mkdir -p "$o/$n"
    cp "$d"/start "$d"/end "$d"/run.rc "$d"/timeline.json "$o/$n/" 2>/dev/null || true
    tail -c 400000 "$d/b1/train.log" > "$o/$n/train.log" 2>/dev/null || true
    cp "$d"/b1/metrics.jsonl "$o/$n/" 2>/dev/null || true
    [[ -f $d/stacks.txt ]] && gzip -c "$d/stacks.txt" > "$o/$n/stacks.txt.gz"
  done
  collect_node_info "$o"
  tar -czf "${OUT:-$ROOT}/probe.tar.gz" -C "$o" .
  ls -la "${OUT:-$ROOT}/probe.tar.gz"
  ;;
*) echo "usage: startup_probe.sh start NAME [OVERRIDES...]|wait NAME SECONDS|collect" >&2; exit 2 ;;
esac
