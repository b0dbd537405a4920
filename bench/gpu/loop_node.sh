#!/usr/bin/env bash
# The whole loop on a GPU node (issue 12), as time-limited commands: the loop runs in the background
# (setsid: it outlives the command that started it) and later commands wait on it and collect what is
# small (metrics, phase results, TensorBoard events, Phase-D scores and predictions, log tails).
# Source node_setup.sh first (or let this do it).
#   bash bench/gpu/loop_node.sh start [LOOP OPTIONS/OVERRIDES...]   # trainer loop --profile gpu, background
#   bash bench/gpu/loop_node.sh wait SECONDS                        # until the loop ends or SECONDS pass
#   bash bench/gpu/loop_node.sh collect                             # $OUT/loop.tar.gz (<= 16 MiB)
# The loop is resumable: `start` again after a lost node goes on from the last finished stage.
# Whole loop in one lease: ~36 min on 2 GPUs, ~29 on 4 (estimates in bench/results/grpo_startup.md), e.g.
#   bash bench/gpu/loop_node.sh start --c2-train-prompts 1024 trainer.total_training_steps=10 \
#     trainer.test_freq=5 data.train_max_samples=1024
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -n "${PYTHONPATH:-}" && -d "${MODEL_DIR:-/nonexistent}" ]] || source bench/gpu/node_setup.sh >/dev/null
source bench/gpu/collect_lib.sh
LOOP=${LOOP:-/tmp/loop}
mkdir -p "$LOOP"

progress() {  # one line per phase: finished or its last logged step
  for d in "$LOOP"/a1 "$LOOP"/a2 "$LOOP"/b1 "$LOOP"/b2 "$LOOP"/c1 "$LOOP"/c2; do
    [[ -d $d ]] || continue
    if [[ -f $d/phase_result.json ]]; then
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r.get('status'), r.get('seconds'), 'best', r.get('best_step'))" \
        "$d/phase_result.json" "${d##*/}"
    else
      step=$(tail -n 1 "$d/metrics.jsonl" 2>/dev/null | python3 -c "import json,sys; print(json.loads(sys.stdin.read() or '{}').get('step'))" 2>/dev/null || true)
      echo "${d##*/} running, last logged step ${step:-none}; $(tail -c 300 "$d/train.log" 2>/dev/null | tr '\r' '\n' | grep -v '^\s*$' | tail -n 1)"
    fi
  done
  [[ -d $LOOP/eval_loop1 ]] && echo "eval_loop1: $(ls "$LOOP/eval_loop1" | tr '\n' ' ')"
  # stage groups' wall times as the loop recorded them (trainer/loop.py: Loop.finished)
  [[ -f $LOOP/loop_manifest.json ]] && python3 -c "import json,sys; m=json.load(open(sys.argv[1])); \
print('stage times:', {k[5:]: v['seconds'] for k, v in m.items() if k.startswith('time:')})" "$LOOP/loop_manifest.json"
  return 0
}

case "${1:-}" in
start)
  shift
  t0=$(date +%s)
  echo "$t0" > "$LOOP.start"
  rm -f "$LOOP.rc"
  # shellcheck disable=SC2145
  setsid bash -c "python3 -m trainer loop --profile gpu --golden $GOLDEN_DIR --out $LOOP --base-model $MODEL_DIR \
    --reward-workers ${REWARD_WORKERS:-8} +ray_kwargs.ray_init._node_ip_address=127.0.0.1 $* >> $LOOP.log 2>&1; \
    echo \$? > $LOOP.rc" < /dev/null > /dev/null 2>&1 &
  echo "loop started at $(date -u +%FT%TZ) (log $LOOP.log): trainer loop --profile gpu ... $*"
  ;;
wait)
  deadline=$(( $(date +%s) + ${2:-540} ))
  while [[ ! -f $LOOP.rc ]] && (( $(date +%s) < deadline )); do sleep 10; done
  progress
  if [[ -f $LOOP.rc ]]; then
    echo "loop exit $(cat "$LOOP.rc") after $(( $(date +%s) - $(cat "$LOOP.start") )) s"; tail -n 25 "$LOOP.log"
  else
    echo "loop still running after $(( $(date +%s) - $(cat "$LOOP.start") )) s"; tail -n 5 "$LOOP.log"
  fi
  ;;
collect)
  o=$LOOP.collected
  rm -rf "$o"; mkdir -p "$o"
  cp "$LOOP/loop_manifest.json" "$LOOP.log" "$o/" 2>/dev/null || true
  [[ -f $LOOP.start ]] && echo "start $(cat "$LOOP.start") now $(date +%s) rc $(cat "$LOOP.rc" 2>/dev/null || echo running)" > "$o/wall.txt"
  for d in "$LOOP"/a1 "$LOOP"/a2 "$LOOP"/b1 "$LOOP"/b2 "$LOOP"/c1 "$LOOP"/c2; do collect_phase "$d" "$o"; done
  for d in "$LOOP"/eval_* "$LOOP"/c2_precompute* "$LOOP"/data; do
    [[ -d $d ]] || continue
    mkdir -p "$o/${d##*/}"
    find "$d" -maxdepth 1 -type f \( -name '*.json' -o -name '*.md' -o -name 'predictions_*.jsonl' \) -size -40M \
      -exec cp {} "$o/${d##*/}/" \;
  done
  mkdir -p "$o/logs"
  for f in "$LOOP"/logs/*.log; do if [[ -f $f ]]; then tail -c 50000 "$f" > "$o/logs/${f##*/}"; fi; done
  collect_node_info "$o"
  tar -czf "${OUT:-$LOOP}/loop.tar.gz" -C "$o" .
  ls -la "${OUT:-$LOOP}/loop.tar.gz"
  ;;
*) echo "usage: loop_node.sh start|wait SECONDS|collect" >&2; exit 2 ;;
esac
