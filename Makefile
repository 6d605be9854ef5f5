# The course in two commands: `make lab` and `make test`. Both create .venv when it is missing
# and (re)install the course when pyproject.toml changed since the last install.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# One stamp per set of extras: changing EXTRAS (or the driver's CUDA version) reinstalls.
COMMA := ,
INSTALLED = $(VENV)/.installed-$(subst $(COMMA),-,$(EXTRAS))
# The CUDA major version of this machine's NVIDIA driver (nvidia-smi's "CUDA Version"), empty
# without one. A CUDA 12 driver cannot run the CUDA 13 toolkit, so there the toolkit extra is
# gpu-cu12 (its compiler also serves the compile check); everywhere else the CUDA 13 one.
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\).*/\1/p' | head -n 1)
TOOLKIT_EXTRA := $(if $(filter 12,$(CUDA_MAJOR)),gpu-cu12,compile)
# What `make` installs: the course, JupyterLab, the test tools and the CUDA toolkit matching the driver.
EXTRAS ?= lab,test,$(TOOLKIT_EXTRA)
# Two workers, one per core, for make unit and make mutants. make test runs three pytest workers:
# its slow files wait much of their time (on a JupyterHub, a browser, notebook kernels, a budget
# running out), and a third worker fills the core they leave idle (measured on 2 cores: 483 s of
# pytest with two, 410 s with three). --dist loadfile keeps each notebook's cells on one worker, and
# --no-loadscope-reorder hands the files out in collection order (tests/conftest.py puts the slowest
# first) instead of xdist's default, most tests first, which left the slowest files for last.
WORKERS ?= 2
TEST_WORKERS ?= 3
# Extra flags for JupyterLab, e.g. LAB_FLAGS=--no-browser; as root (containers) it needs --allow-root.
LAB_FLAGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

# `make unit`: the quick loop, about a minute of CPU (README, "Working on the course"): the references, the stage kernels of notebooks 00-05
# against them, the public API and its input errors, the notebooks' structure and the packaging.
# Not in it (`make test` runs them): the other stages, the edge and property tests, the race and
# compile checks, the wheel, the student copies and the notebooks themselves.
UNIT_TESTS ?= tests/test_reference.py tests/test_api.py tests/test_basics.py tests/test_scores.py \
	tests/test_mask.py tests/test_softmax.py tests/test_weighted_sum.py tests/test_diagnoses.py \
	tests/test_grid_limits.py tests/test_environment.py tests/test_notebooks.py tests/test_hosted_setup.py
# `make notebook NB=03`: the notebook whose name starts with NB.
NOTEBOOK = $(wildcard notebooks/$(NB)_*.ipynb)

.PHONY: lab solutions fresh-copy test unit mutants notebook notebooks student book install clean bench

# make lab's folder: your own copies of the notebooks (not committed).
WORK ?= my-notebooks

# pip byte-compiles what it installs one file at a time (about 55 s of a 125 s install on a
# 2-core machine); compileall writes the same .pyc files on every core. They must be written
# here: where PYTHONDONTWRITEBYTECODE is set, an import never writes them itself.
$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --editable ".[$(EXTRAS)]" --no-compile
	$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	touch $@

install: $(INSTALLED)

# JupyterLab on your own copies in $(WORK)/ (solutions cut, outputs cleared): made on the first run,
# never overwritten, so your answers survive git pull and the next make lab; a notebook an update
# adds is copied in beside them.
lab: $(INSTALLED)
	$(BIN)/python scripts/lab.py --folder $(WORK) $(ROOT_FLAG) $(LAB_FLAGS)

# JupyterLab on notebooks/: the notebooks WITH their solutions.
solutions: $(INSTALLED)
	$(BIN)/python scripts/lab.py --solutions --folder $(WORK) $(ROOT_FLAG) $(LAB_FLAGS)

# Start one notebook over: a new copy in $(WORK)/, the old one kept in $(WORK)/backups/.
fresh-copy: $(INSTALLED)
	@test -n "$(NB)" || { echo "usage: make fresh-copy NB=03"; exit 2; }
	$(BIN)/python scripts/student_copies.py --fresh $(NB) $(WORK)

# Notebooks run with the same code paths of the numerical libraries on every x86 machine, so that a
# fresh run prints what the committed notebook shows to the last digit: OpenBLAS's Haswell kernels
# on one thread, NumPy's loops without AVX-512, a fixed hash seed. make test compares every output
# (nbval's strict mode) after the patterns of notebooks/nbval_sanitize.cfg rewrite the volatile parts.
NOTEBOOK_ENV := OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 \
	NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR"
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

test: $(INSTALLED)
	$(NOTEBOOK_ENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(NBVAL) tests notebooks

unit: $(INSTALLED)
	$(BIN)/python -m pytest -q -n $(WORKERS) $(UNIT_TESTS)

# Prove every exercise's check by the mutants of its solution (scripts/mutants.py): each mutant killed, or
# listed as equivalent in tests/equivalent_mutants/ with its reason. EX=04_row_softmax for one exercise.
# make test runs a fixed sample of them (tests/test_mutants.py); CI runs them all after make test.
mutants: $(INSTALLED)
	ATTENTION_LIB_BACKEND=simulator $(BIN)/python scripts/mutants.py --workers $(WORKERS) $(EX)

# Re-execute one notebook in place from a clean kernel, on the simulator: the way notebooks are committed.
notebook: $(INSTALLED)
	@test -n "$(NB)" -a -n "$(NOTEBOOK)" || { echo "usage: make notebook NB=03 (no notebooks/$(NB)_*.ipynb)"; exit 2; }
	cd notebooks && $(NOTEBOOK_ENV) ATTENTION_LIB_BACKEND=simulator $(abspath $(BIN))/jupyter nbconvert --to notebook --execute --inplace $(notdir $(NOTEBOOK))

# Re-execute every notebook in place, two at a time, the way they are committed: after any change
# to attention_lib, before committing.
NOTEBOOKS_JOBS ?= 2
notebooks: $(INSTALLED)
	cd notebooks && ls [0-9][0-9]*_*.ipynb | $(NOTEBOOK_ENV) ATTENTION_LIB_BACKEND=simulator xargs -P $(NOTEBOOKS_JOBS) -I{} \
		$(abspath $(BIN))/jupyter nbconvert --to notebook --execute --inplace --log-level WARN {}

# Student copies of every notebook under release/ (solutions cut by nbgrader, outputs cleared);
# GRADED=1: the copies of a graded class, without the cells that reveal the library's version.
student: $(INSTALLED)
	$(BIN)/python scripts/student_copies.py$(if $(GRADED), --graded) release

# The course as a static book in build/book/ (scripts/book.py): the committed notebooks as a student
# meets them, without solutions; no notebook runs. BOOK_REPO: the repository on GitHub that the pages'
# launch links open (default: the git remote origin; none, no launch links).
BOOK_REPO ?=
book: $(INSTALLED)
	$(BIN)/python scripts/book.py --out build/book$(if $(BOOK_REPO), --repo $(BOOK_REPO))

# Grading with nbgrader (nbgrader_config.py; course directory grading/), one assignment per
# notebook: NB=00 (or several, NB="00 03"). release-assignment: the graded copy (no reveal cells,
# hidden tests) generated and released into the exchange, DUE="2026-12-20 17:00 UTC" its due date;
# collect: the submissions from the exchange; grade: what changed since the last run (FORCE=1: all),
# each submission rebuilt from the course's cells and its allowed answers and run on the simulator
# in a bubblewrap sandbox of its own (Debian's bubblewrap: grade.py names it when it is missing),
# points from its checks' verdicts (grading/grades.csv, grading/exercises.csv with each diagnosis,
# flag and report), of the collected submissions or of SUBMITTED=folder
# (STUDENT/ASSIGNMENT/NOTEBOOK.ipynb); feedback: generate and release it.
.PHONY: release-assignment collect grade feedback hub
release-assignment collect grade feedback: $(INSTALLED)
	@test -n "$(NB)" || { echo "usage: make $@ NB=00 (a notebook's number, or several: NB=\"00 03\")"; exit 2; }
	ATTENTION_LIB_BACKEND=simulator $(BIN)/python scripts/grade.py $(subst release-assignment,release,$@) $(NB)$(if \
		$(SUBMITTED), --submitted $(SUBMITTED))$(if $(DUE), --due "$(DUE)")$(if $(FORCE), --force)

# A class on one machine: JupyterHub with the course's single-user environment and nbgrader's
# exchange (classroom/README.md).
hub: $(INSTALLED)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyterhub -f classroom/jupyterhub_config.py

clean:
	rm -rf $(VENV) release build *.egg-info

# Time every kernel version (on a GPU), or count threads and memory traffic (on the simulator).
bench: $(INSTALLED)
	$(BIN)/python -m attention_lib.measure.bench

# The prepared GPU run, for a machine with a GPU where numba-cuda, PyTorch and CuPy are already
# installed and no package registry is reachable: the unit tests and the kernels' tests on the
# GPU, the kernel report, notebooks 07 and 09 at full size and the bench at ANDREA-120M, into one
# folder, in under 8 minutes. It runs with PYTHON (python3: that machine's own, never .venv), which
# it names first; what that Python lacks comes from gpu-bundle/, made here by `make gpu-bundle`
# (wheels for the GPU machine's Python 3.12) and brought along. GPU_CHECK_FLAGS=--dry-run lists
# the steps; --simulate runs them on the simulator (PYTHON=$(BIN)/python).
.PHONY: gpu-check gpu-bundle
gpu-check:
	@echo "gpu-check with PYTHON=$(PYTHON): $$($(PYTHON) -c 'import sys; print(sys.executable)')"
	PYTHON="$(PYTHON)" UNIT_TESTS="$(UNIT_TESTS)" bash scripts/gpu_check.sh $(GPU_CHECK_FLAGS)

gpu-bundle: $(INSTALLED)
	$(BIN)/python scripts/gpu_bundle.py gpu-bundle

# What the compiler makes of every kernel at GPU block sizes (registers, local memory, shared
# memory, warps per SM on an H200, the hot loop's instructions), without a GPU. Fails when a
# kernel declared FAST breaks its floors. E.g. make kernel-report REPORT_FLAGS="--json report.json"
.PHONY: kernel-report
kernel-report: $(INSTALLED)
	$(BIN)/python -m attention_lib.measure.kernel_report $(REPORT_FLAGS)
