# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU tiers need any torch >= 2.11; below 2.14 the CI image serves a CPU-only wheel from disk.
# The GPU stack itself is pinned in repro/data/stack.toml / uv.lock, not here.
TORCH  ?= torch>=2.11,<2.14

.PHONY: demo test verify bench golden-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## embedded end-to-end DDTree decode on a toy target + drafter (CPU, no download)
	$(VENV)/bin/repro demo

# The suite runs on every core (pytest-xdist); `-m "not slow"` leaves out the minute-long tests.
test: $(STAMP)  ## ruff, then the verify suite: every tier this machine supports, the rest skip with a reason
	$(PY) -m ruff check repro verify
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest verify --benchmark-skip -q -n auto

# Every tier this machine supports (tests, then benchmarks: micro, and live ones when GPUs, SGLang
# and models are there), then the handoff report saying which tiers ran and why others skipped.
# Fails if a test failed; pytest's exit 5 (nothing collected) is not a failure.
VERIFY_OUT ?= build/verify
verify: $(STAMP)  ## all supported tiers + handoff report in $(VERIFY_OUT)/report/report.md
	rm -rf $(VERIFY_OUT) && mkdir -p $(VERIFY_OUT)
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest verify --benchmark-skip -q \
	  --junitxml=$(VERIFY_OUT)/junit-tests.xml; echo $$? > $(VERIFY_OUT)/rc-tests
	REPRO_VERIFY_OUT=$(VERIFY_OUT) $(PY) -m pytest verify/bench --benchmark-only -q \
	  --junitxml=$(VERIFY_OUT)/junit-bench.xml \
	  --benchmark-json=$(VERIFY_OUT)/benchmarks.json; echo $$? > $(VERIFY_OUT)/rc-bench
	$(VENV)/bin/repro report $(VERIFY_OUT) -o $(VERIFY_OUT)/report \
	  --tiers $(VERIFY_OUT)/junit-tests.xml $(VERIFY_OUT)/junit-bench.xml
	@cat $(VERIFY_OUT)/rc-tests $(VERIFY_OUT)/rc-bench | grep -qvx '[05]' \
	  && { echo "make verify: a tier failed (see $(VERIFY_OUT)/report/report.md)"; exit 1; } || true

bench: $(STAMP)  ## the benchmark tier alone: micro-benchmarks, live runs where GPUs, SGLang and models are there
	$(PY) -m pytest verify/bench --benchmark-only -q

golden-check: $(STAMP)
	$(VENV)/bin/repro golden check

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks .ruff_cache
