#!/usr/bin/env bash
# One job on a GPU node, across connections that each end within minutes: start a command in a session
# of its own (it outlives the connection that started it), wait on it from later connections, bring back
# what is small.
#   scripts/gpu_node/job.sh start NAME -- CMD...   # background; log $JOBS/NAME.log, exit status $JOBS/NAME.rc
#   scripts/gpu_node/job.sh wait NAME SECONDS      # exit 0: done, 1: failed or lost, 3: still running
#   scripts/gpu_node/job.sh collect NAME PATH...   # $OUT/NAME.tar.gz, at most 16 MiB
#   scripts/gpu_node/job.sh status                 # every job: running or its exit status, last log line
# A finished job appends "NAME<TAB>start<TAB>end<TAB>seconds<TAB>exit status" to $JOBS/stages.tsv (what
# bench/learning_gpu.py reads). A command that needs a shell (&&, pipes) is `bash -c '...'`; its
# environment is the caller's, e.g. `CUDA_VISIBLE_DEVICES=1 job.sh start sft_a2 -- python3 -m trainer ...`.
set -euo pipefail
JOBS=${JOBS:-/tmp/jobs}
LOG_TAIL=${LOG_TAIL:-300000}       # bytes of each *.log that come back
MAX_BYTES=${MAX_BYTES:-16777216}   # the archive's cap: transfers of at most 16 MiB
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

die() { echo "job.sh: $*" >&2; exit 2; }
usage() { sed -n '4,7p' "$SELF" | sed 's/^# *//' >&2; exit 2; }
known() { [[ -f $JOBS/$1.start ]] || die "no job $1 in $JOBS"; }
alive() { [[ -f $JOBS/$1.pid ]] && kill -0 "$(cat "$JOBS/$1.pid")" 2>/dev/null; }
seconds() { awk -F'\t' -v n="$1" '$1 == n { s = $4 } END { print s }' "$JOBS/stages.tsv" 2>/dev/null; }

state() {  # NAME: "exit RC after S s", "running for S s" or "lost after S s" (killed before it could say)
  if [[ -f $JOBS/$1.rc ]]; then echo "exit $(cat "$JOBS/$1.rc") after $(seconds "$1") s"
  elif alive "$1"; then echo "running for $(( $(date +%s) - $(cat "$JOBS/$1.start") )) s"
  else echo "lost after $(( $(date +%s) - $(cat "$JOBS/$1.start") )) s: no exit status, no process"
  fi
}

run_job() {  # NAME CMD...: the job itself, in its own session (start runs it through setsid)
  local name=$1 start end rc=0
  shift
  echo $$ > "$JOBS/$name.pid"
  start=$(date +%s)
  echo "=== $(date -u +%FT%TZ) $*" >> "$JOBS/$name.log"
  "$@" >> "$JOBS/$name.log" 2>&1 < /dev/null || rc=$?
  end=$(date +%s)
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$start" "$end" $(( end - start )) "$rc" >> "$JOBS/stages.tsv"
  echo "$rc" > "$JOBS/$name.rc.tmp" && mv "$JOBS/$name.rc.tmp" "$JOBS/$name.rc"  # last: waiters see the row
}

start() {
  local name=${1:-}
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "start: NAME of letters, digits, '.', '_' and '-' expected"
  shift
  [[ ${1:-} == -- ]] && shift
  (( $# )) || die "start $name: no command (job.sh start NAME -- CMD...)"
  mkdir -p "$JOBS"
  if [[ ! -f $JOBS/$name.rc ]] && alive "$name"; then die "$name is running (pid $(cat "$JOBS/$name.pid"))"; fi
  rm -f "$JOBS/$name.rc"
  date +%s > "$JOBS/$name.start"
  setsid bash "$SELF" _run "$name" "$@" < /dev/null > /dev/null 2>&1 &
  echo $! > "$JOBS/$name.pid"  # the same PID: setsid need not fork here (run_job writes it again)
  echo "started $name (log $JOBS/$name.log): $*"
}

wait_job() {
  local name=${1:-} deadline
  [[ -n $name && ${2:-} =~ ^[0-9]+$ ]] || die "wait NAME SECONDS"
  known "$name"
  deadline=$(( $(date +%s%N) + $2 * 1000000000 ))  # in nanoseconds: whole seconds would cut a wait short by up to one
  while [[ ! -f $JOBS/$name.rc ]] && alive "$name" && (( $(date +%s%N) < deadline )); do sleep 1; done
  tail -n "${TAIL_LINES:-20}" "$JOBS/$name.log" 2>/dev/null || true
  echo "$name: $(state "$name")"
  if [[ -f $JOBS/$name.rc ]]; then
    if [[ $(cat "$JOBS/$name.rc") == 0 ]]; then return 0; fi
    return 1
  fi
  if alive "$name"; then return 3; fi
  return 1
}

status() {
  local f name
  for f in "$JOBS"/*.start; do
    [[ -e $f ]] || { echo "no jobs in $JOBS"; return 0; }
    name=$(basename "$f" .start)
    printf '%-20s %-32s %s\n' "$name" "$(state "$name")" \
      "$(tail -c 2000 "$JOBS/$name.log" 2>/dev/null | tr '\r' '\n' | grep -v '^\s*$' | tail -n 1 | cut -c1-100)"
  done
}

take() {  # SRC DEST: one file; a log's tail only
  mkdir -p "$(dirname "$2")"
  if [[ $1 == *.log ]]; then tail -c "$LOG_TAIL" "$1" > "$2"; else cp "$1" "$2"; fi
}

take_dir() {  # SRC DEST: a run folder's small files (results, metrics, log tails, events), no models or data
  local f
  while IFS= read -r -d '' f; do take "$f" "$2/${f#"$1"/}"; done < <(
    find -H "$1" -type d \( -name hf -o -name 'global_step_*' -o -name huggingface -o -name '__pycache__' \) -prune \
      -o -type f ! -name 'predictions_*' \( -name '*.log' -o -size -40M \) \
      \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.tsv' -o -name '*.txt' -o -name '*.log' \
      -o -name '*.rc' -o -name '*.sh' -o -name '*.yaml' -o -name '*.csv' -o -name '*.png' -o -name '*.gz' \
      -o -name 'events.out.tfevents*' \) -print0)
}

node_info() {  # DIR: the card (nvidia-smi) and the versions that matter, beside the numbers
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$1/card.txt" 2>/dev/null \
    || echo "no nvidia-smi" > "$1/card.txt"
  # node_setup.sh's install ($SITE) is on the path even where the collecting call did not source it
  PYTHONPATH="${SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}" python3 - "$1/versions.json" <<'PY'
import importlib.metadata as md, json, platform, sys
v = {"python": platform.python_version()}
for d in ("torch", "transformers", "vllm", "verl", "ray"):
    try:
        v[d] = md.version(d)
    except md.PackageNotFoundError:
        v[d] = None
json.dump(v, open(sys.argv[1], "w"))
PY
}

collect() {
  local name=${1:-} out=${OUT:-${JOBS}} p f stage archive biggest
  [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "collect NAME PATH..."
  shift
  stage=$JOBS/.collect-$name
  archive=$out/$name.tar.gz
  rm -rf "$stage"
  mkdir -p "$stage/jobs" "$out"
  for p in "$@"; do
    if [[ -d $p ]]; then take_dir "${p%/}" "$stage/$(basename "$p")"
    elif [[ -f $p && $(basename "$p") != predictions_* ]]; then
      f=$stage/$(basename "$p")
      [[ -e $f ]] && f=$stage/$(basename "$(dirname "$p")")_$(basename "$p")  # a1/train.log beside a2/train.log
      take "$p" "$f"
    else echo "collect: $p: not there (or a predictions file), left out" | tee -a "$stage/left_out.txt" >&2
    fi
  done
  for f in "$JOBS"/*.log "$JOBS"/*.rc "$JOBS"/stages.tsv; do
    if [[ -f $f ]]; then take "$f" "$stage/jobs/$(basename "$f")"; fi
  done
  node_info "$stage"
  while tar -czf "$archive" -C "$stage" . && (( $(stat -c %s "$archive") > MAX_BYTES )); do
    biggest=$(find "$stage" -type f ! -name left_out.txt -printf '%s %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
    [[ -n $biggest ]] || break
    echo "collect: ${biggest#"$stage"/} left out (archive over $MAX_BYTES bytes)" | tee -a "$stage/left_out.txt" >&2
    rm -f "$biggest"
  done
  rm -rf "$stage"
  echo "$archive: $(stat -c %s "$archive") bytes"
}

case "${1:-}" in
start) shift; start "$@" ;;
wait) shift; wait_job "$@" ;;
collect) shift; collect "$@" ;;
status) status ;;
node-info) node_info "${2:?node-info DIR}" ;;
_run) shift; run_job "$@" ;;
*) usage ;;
esac
