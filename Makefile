# Two commands (README): `make demo` installs and replays the example trace;
# `make test` installs with the test extras and runs the whole suite (CI runs it).
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take torch from the pinned CPU build, never a CUDA one.
PIP_INSTALL := $(PY) -m pip install -q -c constraints-cpu.txt

.PHONY: demo test install install-test clean

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

clean:
	rm -rf $(VENV) runs
