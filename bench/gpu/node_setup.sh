#!/usr/bin/env bash
# Kept for bench/gpu/ab.sh only, until it goes: node set-up is scripts/gpu_node/node_setup.sh.
# shellcheck source=scripts/gpu_node/node_setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/gpu_node/node_setup.sh"
