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

test: $(STAMP)  ## the verify suite: every tier this machine supports, the rest skip with a reason
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest verify --benchmark-skip -q

golden-check: $(STAMP)
	$(VENV)/bin/repro golden check

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
