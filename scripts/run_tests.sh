#!/usr/bin/env bash
# `make test`: every test, the heavy ones in one pytest process, the light then the medium ones in others beside
# it; arguments go to every run. scripts/run_tests.py states how the tests are split, and how the exit code and last line are made.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/run_tests.py "$@"
