# The two commands of the README: `make demo` (the main job) and `make test` (every test).
# Both create .venv/ first if needed (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python
PYTEST_ARGS ?=
# .venv is installed without bytecode (pip --no-compile): every target lets Python write it on first import, as
# make test's runner and .ci/run do (scripts/run_tests.py lane_env has the measurement)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup model demo test test-quick lint ci grpo-smoke smoke-loop

setup:
	bash scripts/bootstrap.sh

model: setup
	$(PY) -m services.executor_vllm.default_model

# `make demo RETRAIN=1` trains A1/A2 again; otherwise models in demo_out/runs are reused.
demo: model
	$(PY) -m trainer demo $(if $(RETRAIN),--retrain,) $(DEMO_ARGS)

# Two lanes at once: the heavy tests in one, the light then the medium ones in the other (scripts/run_tests.py
# says how); PYTEST_ARGS (a path, -k, -x, -m ...) go to every run.
test: model
	bash scripts/run_tests.sh $(PYTEST_ARGS)

test-quick: setup
	$(PY) -m pytest -m "not vllm and not verl and not docker and not slow" $(PYTEST_ARGS)

# What CI's lint step runs (.ci/run calls `make lint`): ruff over the whole tree, mypy over every package.
lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy shared services trainer bench scripts

ci:
	bash .ci/run

# One complete GRPO phase on CPU (A1 SFT, then C1 through reward_api + executor). Not in CI: pi1-ab's CPU test
# runs the same phases in `make test`.
grpo-smoke: model
	bash .ci/grpo_smoke.sh

# Every phase at toy scale on the bundled sample, then the Phase-D report (about an hour on 2 cores).
smoke-loop: model
	bash scripts/smoke_loop.sh
