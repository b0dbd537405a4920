#!/usr/bin/env bash
# Kept for bench/gpu/ab.sh only, until it goes (other jobs use scripts/gpu_node/job.sh): what small
# files of a phase and of the node come back from a device run, and whether a local service answers.
# Source it; it defines functions only.

# up PORT: the service on 127.0.0.1:PORT answers /healthz.
up() { python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/healthz')" 2>/dev/null; }

# wait_up TRIES PORT...: for each port, until it is up or TRIES tries one second apart have failed.
wait_up() {
  local tries=$1 port; shift
  for port in "$@"; do
    for _ in $(seq "$tries"); do up "$port" && break; sleep 1; done
  done
}

# collect_phase PHASE_DIR DEST: phase result, VERL metrics, command, early-stopping state, the log's
# last 300 kB and the TensorBoard events (one archive), under DEST/<phase>.
collect_phase() {
  local d=$1 dest=$2/${1##*/}
  [[ -d $d ]] || return 0
  mkdir -p "$dest"
  cp "$d"/phase_result.json "$d"/metrics.jsonl "$d"/command.sh "$dest/" 2>/dev/null || true
  cp "$d"/checkpoints/early_stopping.json "$dest/" 2>/dev/null || true
  tail -c 300000 "$d/train.log" > "$dest/train.log" 2>/dev/null || true
  if [[ -d $d/tensorboard ]]; then tar -czf "$dest/tensorboard.tar.gz" -C "$d" tensorboard; fi
}

# collect_node_info DEST: the card and the versions that matter (job.sh's node-info).
collect_node_info() { bash "$(dirname "${BASH_SOURCE[0]}")/../../scripts/gpu_node/job.sh" node-info "$1"; }
