#!/usr/bin/env bash
# Source this on a GPU node without network, from the repo root, after the wheelhouse chunks
# (scripts/gpu_node/build_wheelhouse.py) were copied under $STAGE (docs/airgap.md):
#   STAGE=/tmp/stage source scripts/gpu_node/node_setup.sh
# It installs the carried wheels into $SITE (idempotent: a second run only verifies), byte-compiles
# them in the background, converts the default model to $MODEL_DIR from the carried GGUF, unpacks a
# carried golden folder to $GOLDEN_DIR and exports what the services, vLLM and VERL need there.
# Jobs then run through scripts/gpu_node/job.sh.
set -euo pipefail
STAGE=${STAGE:-/tmp/stage}
SITE=${SITE:-/tmp/site}
MODEL_DIR=${MODEL_DIR:-/tmp/model}
export STX_CACHE_DIR=${STX_CACHE_DIR:-/tmp/stx-cache}
# NVLink multicast off (shared hosts); no flashinfer carried: FlashAttention + torch sampling.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
t0=$(date +%s)
python3 scripts/gpu_node/install.py --staging "$STAGE" --target "$SITE"
export PYTHONPATH=$SITE:$PWD
# The wheels go in with --no-compile: without this, a node's first processes spent ~50 s compiling
# modules. In a session of its own, so it outlives the connection; a second run only checks mtimes.
# STX_COMPILE=off leaves it out (a measurement of import times without bytecode runs it itself).
if [[ ${STX_COMPILE:-background} != off ]]; then
  setsid python3 -m compileall -q -j 16 "$SITE" < /dev/null > /tmp/stx-compileall.log 2>&1 &
fi
python3 -m services.executor_vllm.default_model --out "$MODEL_DIR"
if [[ -f $STAGE/files/golden.tar.xz && ! -d /tmp/golden ]]; then tar -xJf "$STAGE/files/golden.tar.xz" -C /tmp; fi
export GOLDEN_DIR=${GOLDEN_DIR:-/tmp/golden}
echo "node setup: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
