# The two commands of the README. Each creates .venv and installs what it needs.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: run test bench clean planner-ext

run: planner-ext
	$(BIN)/drover up --nodes 2 --devices-per-node 2 --job examples/jobs/tiny.yaml --straggle node-1/0=3@10 --out out/up

test: planner-ext
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n auto

bench: planner-ext
	$(BIN)/python bench/planner.py
	$(BIN)/python bench/migration.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/network.py
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/fuzz.py

# The planner's search compiled by Cython (scripts/build_planner_ext.py): about 20 s after a change
# to its modules, nothing otherwise; without a C compiler the planner runs as Python.
planner-ext: $(VENV)/.installed
	$(BIN)/python scripts/build_planner_ext.py

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, the CPU build: pyproject allows a range, and pip would pick a CUDA build.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,compiled]'
	touch $@

clean:
	rm -rf $(VENV)
