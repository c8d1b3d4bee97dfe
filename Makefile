# tfdist: `make demo` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.tfdist-installed
NP     ?= 2
PYTEST_ARGS ?=
# The in-process tier runs in this many pytest processes, a test file each at a time
# (pytest-xdist --dist loadfile): its simulated ranks share one interpreter's GIL, so one
# process keeps one core busy; the multi-process tier runs its jobs one at a time.
TEST_WORKERS ?= 2
STRESS_JOBS ?= 120
STRESS_ARGS ?=

.PHONY: install demo typecheck test test-fast test-compat test-all bench stress docs docs-serve clean

# TFDIST_WITHOUT_MPI=1: no Open MPI, no mpi4py, Horovod on Gloo only (mpirun jobs unavailable).
WITHOUT_MPI := $(filter 1 yes true,$(TFDIST_WITHOUT_MPI))
export TFDIST_WITHOUT_MPI := $(if $(WITHOUT_MPI),1,)
comma  := ,
EXTRAS := cpu,profile,test,examples,docs,ray$(if $(WITHOUT_MPI),,$(comma)mpi)

$(STAMP): pyproject.toml constraints.txt scripts/install_horovod.sh scripts/install_mpi.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(WITHOUT_MPI),,scripts/install_mpi.sh   # Open MPI (apt-get as root), else a clear message)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	scripts/install_horovod.sh $(BIN)/python   # built once per machine (cmake, g++), then cached
	$(if $(WITHOUT_MPI),,$(BIN)/python -m tfdist.comm.mpi_kernels   # the MPI engine's TensorFlow ops (g++, seconds), cached)
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install tfdist with its dependencies

demo: install  ## train a CNN on the bundled digits data with 2 processes
	$(BIN)/tfdist-run -np $(NP) $(BIN)/python examples/digits.py

typecheck: install  ## mypy on the declared interfaces (pyproject.toml [tool.mypy]), seconds
	$(BIN)/python -m mypy

test-fast: typecheck  ## the type check, then the in-process tier (TEST_WORKERS pytest processes): no process launched, about 3 min
	$(BIN)/python -m pytest -x -n $(TEST_WORKERS) --dist loadfile -m "in_process and not slow" --time-budgets $(PYTEST_ARGS) tests

test: test-fast  ## make test-fast, then the multi-process tests (loopback), about 15 min in all
	$(BIN)/python -m pytest -m "not slow and not in_process" --time-budgets $(PYTEST_ARGS) tests

test-compat:  ## the in-process tier and a 2-process equivalence on the lowest Keras and the pinned development build (constraints-compat.txt), each in its own venv
	PYTHON=$(PYTHON) PYTEST_ARGS="$(PYTEST_ARGS)" TEST_WORKERS=$(TEST_WORKERS) scripts/test_compat.sh

test-all: typecheck  ## every test, including the slow scenarios
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

bench: install  ## benchmarks; JSON (and PNG) results in benchmarks/results/
	$(BIN)/tfdist-bench

stress: install  ## crash/hang/false-alarm hunt: many short jobs on a busy CPU (STRESS_JOBS=120)
	$(BIN)/python -m benchmarks.stress --jobs $(STRESS_JOBS) $(STRESS_ARGS)

docs: install  ## the documentation site, built strictly (no broken link or reference) into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install  ## serve the site at http://127.0.0.1:8000 while you edit docs/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site
