# Two commands (README): `make demo` installs and replays the example trace;
# `make test` installs with the test extras and runs the whole suite (CI runs it).
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take torch from the pinned CPU build, never a CUDA one.
PIP_INSTALL := $(PY) -m pip install -q -c constraints-cpu.txt

# `make conformance`: SGLang's own scheduler as the oracle (conformance/), in its own venv.
CONF_VENV ?= .conformance-venv
CONF_PY := $(CONF_VENV)/bin/python
CONFORMANCE_ARGS ?= --seed 0 --scenarios 500

.PHONY: demo test install install-test clean conformance

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP_INSTALL) -e .

install-test: $(PY)
	$(PIP_INSTALL) -e '.[test]'

demo: install
	$(VENV)/bin/testbed replay traces/a.json --mode sim

test: install-test
	$(PY) -m pytest

$(CONF_VENV)/.installed: conformance/requirements.txt constraints-cpu.txt
	test -x $(CONF_PY) || python3 -m venv $(CONF_VENV)
	$(CONF_PY) -m pip install -q --no-deps -c constraints-cpu.txt -r conformance/requirements.txt
	touch $@

conformance: $(CONF_VENV)/.installed
	$(CONF_PY) -m conformance $(CONFORMANCE_ARGS)

clean:
	rm -rf $(VENV) $(CONF_VENV) runs
