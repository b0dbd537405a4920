#!/usr/bin/env bash
# `make test`: every test, the light ones in a second pytest process beside the heavy ones; arguments go to
# both runs. scripts/run_tests.py states how the tests are split, and how the exit code and last line are made.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/run_tests.py "$@"
