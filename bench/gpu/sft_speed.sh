#!/usr/bin/env bash
# VERL SFT speed on one GPU: the gpu profile (sdpa, padded micro batches) against sequence packing
# (use_remove_padding + dynamic batches, the setting that ran ~1.5 s/step on the 4 x H200 node).
# Same GPU, same data, same steps, one after the other. Run after the chunks are in $STAGE:
#   bash bench/gpu/sft_speed.sh [STEPS]        # writes $OUT/sft_speed.json and the two train logs
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/node_setup.sh >/dev/null
STEPS=${1:-40}
W=/tmp/sft_speed
mkdir -p "$W"
[[ -f $W/data/a1/train.parquet ]] || python3 -m trainer data build --golden "$GOLDEN_DIR" --out "$W/data" --phases a1 >/dev/null
run() {  # name, extra overrides...
  local name=$1; shift
  local s; s=$(date +%s.%N)
  python3 -m trainer run a1 --profile gpu --data "$W/data" --out "$W/$name" --model "$MODEL_DIR" --nproc 1 \
    --no-export trainer.n_gpus_per_node=1 trainer.total_training_steps="$STEPS" "$@" > "$W/$name.log" 2>&1 || {
    tail -30 "$W/$name.log"; return 1; }
  python3 - "$name" "$s" "$W/$name/metrics.jsonl" <<'PY' >> "$W/results.jsonl"
import json, sys, time
name, start, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(path) if l.strip()]
keys = sorted({k for r in rows for k in r.get("data", {}) if "time" in k or "mfu" in k.lower()})
last = rows[-1]["data"] if rows else {}
print(json.dumps({"name": name, "wall_s": round(time.time() - start, 1), "steps": len(rows),
                  "last_step": {k: last.get(k) for k in keys}}))
PY
  tail -1 "$W/results.jsonl"
}
rm -f "$W/results.jsonl"
run padded_sdpa
run packed_sdpa model.use_remove_padding=true data.use_dynamic_bsz=true model.enable_gradient_checkpointing=true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$W/card.txt"
if [[ -n "${OUT:-}" ]]; then cp "$W/results.jsonl" "$W/card.txt" "$OUT/"; tail -200 "$W/padded_sdpa.log" > "$OUT/padded_sdpa.log"; tail -200 "$W/packed_sdpa.log" > "$OUT/packed_sdpa.log"
  for n in padded_sdpa packed_sdpa; do tail -300 "$W/$n/train.log" > "$OUT/${n}_train.log"; done; fi
