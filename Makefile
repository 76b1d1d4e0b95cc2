# Two commands (README): `make demo` installs and replays the example trace;
# `make test` installs with the test extras and runs the whole suite (CI runs it).
# `make test-fast`: the inner loop, every test not marked slow; `make test-deep`: the whole suite
# with the hypothesis properties at their full example counts (tests/hypothesis_profiles.py).
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take torch from the pinned CPU build, never a CUDA one.
PIP_INSTALL := $(PY) -m pip install -q -c constraints-cpu.txt

# `make conformance`: SGLang's and vLLM's own schedulers as the oracles (conformance/), each in its
# own venv, with the same arguments; conformance/both.py prints one line per oracle and the total.
CONF_VENV ?= .conformance-venv
CONF_PY := $(CONF_VENV)/bin/python
CONF_VLLM_VENV ?= .conformance-vllm-venv
CONF_VLLM_PY := $(CONF_VLLM_VENV)/bin/python
CONFORMANCE_ARGS ?= --seed 0 --scenarios 500

# Two xdist workers; a file's tests on one worker (its module fixtures built once), the files that take
# the most memory one after another (tests/conftest.py). TEST_WORKERS=0: one process. PYTEST_ARGS: more.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test test-fast test-deep lint install install-test install-dev clean conformance

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP_INSTALL) -e .

install-test: $(PY)
	$(PIP_INSTALL) -e '.[test]'

install-dev: $(PY)
	$(PIP_INSTALL) -e '.[dev]'

demo: install
	$(VENV)/bin/testbed replay traces/a.json --mode sim

test: install-test
	$(PYTEST) $(PYTEST_ARGS)

test-fast: install-test
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

test-deep: install-test
	$(PYTEST) --hypothesis-profile=deep $(PYTEST_ARGS)

# ruff (ruff.toml): lint, and the format every file must already have.
lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

$(CONF_VENV)/.installed: conformance/requirements.txt constraints-cpu.txt
	test -x $(CONF_PY) || python3 -m venv $(CONF_VENV)
	$(CONF_PY) -m pip install -q --no-deps -c constraints-cpu.txt -r conformance/requirements.txt
	touch $@

$(CONF_VLLM_VENV)/.installed: conformance/vllm_requirements.txt conformance/vllm_recipe.sh constraints-cpu.txt
	bash conformance/vllm_recipe.sh $(CONF_VLLM_VENV)

conformance: $(CONF_VENV)/.installed $(CONF_VLLM_VENV)/.installed
	python3 -m conformance.both --sglang-python $(CONF_PY) --vllm-python $(CONF_VLLM_PY) -- $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) $(CONF_VENV) $(CONF_VLLM_VENV) runs
