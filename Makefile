# The course in two commands: `make lab` and `make test`. Both create .venv when it is missing
# and (re)install the course when pyproject.toml changed since the last install.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# What `make` installs: the course, JupyterLab, the test tools and the CUDA compiler of the compile
# check. On a GPU with a CUDA 12 driver: make test EXTRAS=lab,test,gpu-cu12 (skips nothing: the
# cu12 toolkit compiles too).
EXTRAS ?= lab,test,compile
# Two pytest workers (one per core); --dist loadfile keeps each notebook's cells on one worker.
WORKERS ?= 2
# Extra flags for JupyterLab, e.g. LAB_FLAGS=--no-browser; as root (containers) it needs --allow-root.
LAB_FLAGS ?=
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

.PHONY: lab test student install clean bench

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --editable ".[$(EXTRAS)]"
	touch $@

install: $(INSTALLED)

lab: $(INSTALLED)
	cd notebooks && ../$(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_FLAGS) 00_gpu_basics.ipynb

test: $(INSTALLED)
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile --nbval-lax --nbval-current-env tests notebooks

# Student copies of every notebook under release/ (solutions cut by nbgrader, outputs cleared).
student: $(INSTALLED)
	$(BIN)/python scripts/student_copies.py release

clean:
	rm -rf $(VENV) release build *.egg-info

# Time every kernel version (on a GPU), or count threads and memory traffic (on the simulator).
bench: $(INSTALLED)
	$(BIN)/python -m attention_lib.bench

# What the compiler makes of every kernel at GPU block sizes (registers, local memory, shared
# memory, warps per SM on an H200, the hot loop's instructions), without a GPU. Fails when a
# kernel declared FAST breaks its floors. E.g. make kernel-report REPORT_FLAGS="--json report.json"
.PHONY: kernel-report
kernel-report: $(INSTALLED)
	$(BIN)/python -m attention_lib.kernel_report $(REPORT_FLAGS)
