# The two commands of the README. Each creates .venv and installs what it needs.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: run test bench clean

run: $(VENV)/.installed
	$(BIN)/drover plan --cluster examples/clusters/a100-64-stragglers.yaml --model examples/models/gpt-7b.yaml

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed
	$(BIN)/python bench/planner.py
	$(BIN)/python bench/migration.py
	$(BIN)/python bench/runtime.py

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV)
