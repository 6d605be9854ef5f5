#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU, in under 8 minutes, everything into one folder.
#
#   bash scripts/gpu_check.sh [--out DIR] [--dry-run] [--only STEP,...] [--budget STEP=SECONDS]... [--bundle DIR]
#   bash scripts/gpu_check.sh --simulate [--out DIR] ...    # every step on the simulator, no GPU needed
#   make gpu-check                                            # PYTHON=... picks the interpreter
#
# For a machine where numba-cuda (with its CUDA toolkit), PyTorch and CuPy are installed and no
# package registry is reachable. PYTHON (default python3, that machine's own) runs everything; it
# must be Python 3.11 to 3.13. What its packages lack comes as wheels in gpu-bundle/ (make
# gpu-bundle, where PyPI is reachable). Steps, each under its own time budget (SIGINT when it runs
# out, so that pytest and the notebook runner still write what they have), each recorded whether
# it passes or not, every one run whatever the ones before did:
#   install        the bundle, offline (pip --no-index --no-deps --target), into a folder that is put
#                  on PYTHONPATH beside the interpreter's own packages
#   environment    interpreter, GPU, driver, versions, date; imports everything the later steps
#                  import (one line per missing package); the numba-cuda internals the library
#                  patches that this numba-cuda lacks (one line each)
#   unit-tests     make unit's list (UNIT_TESTS) plus the kernels' tests, on the GPU; JUnit XML
#   kernel-report  registers, stack, spills, occupancy of every kernel (its rows stored for the notebooks)
#   notebook-NN    each notebook of NOTEBOOKS executed at full size in its own call: copy and log
#   bench          every kernel at ANDREA-120M checked and timed; JSON lines written as it goes
# DIR/summary.json lists every step with its exit status, seconds, budget and whether it ran out
# of time. --simulate runs the same steps here on the simulator at small sizes (a short test list,
# the bench at B 1, H 2, T 16, d_k 8); what needs the driver (nvidia-smi) is skipped and the
# record says so; without --bundle it installs nothing and uses the interpreter's own packages.
# --dry-run prints the steps and budgets and runs nothing. Exit status: 0 when every step is ok.
# Variables: GPU_CHECK_NOTEBOOKS (numbers or paths, default "07 08 10"), GPU_CHECK_TESTS (replaces the
# test list), GPU_CHECK_WORKERS (pytest workers: 8 on a GPU, 0 simulated), GPU_CHECK_GRACE (seconds
# between a step's SIGINT and its SIGKILL, default 5), UNIT_TESTS (make's).
set -u

PYTHON=${PYTHON:-python3}
OUT=""
MODE=gpu
DRY_RUN=0
ONLY=""
BUNDLE=""
OVERRIDES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --simulate) MODE=simulate; shift ;;
        --only) ONLY=",$2,"; shift 2 ;;
        --budget) OVERRIDES+=("$2"); shift 2 ;;
        --bundle) BUNDLE="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# --out and --bundle are relative to where the script was started; everything runs from the root.
case "$OUT" in
    "") OUT="$ROOT/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)" ;;
    /*) ;;
    *) OUT="$PWD/$OUT" ;;
esac
case "$BUNDLE" in /*|"") ;; *) BUNDLE="$PWD/$BUNDLE" ;; esac
cd "$ROOT" || exit 1

# The notebooks executed, by number (notebooks/NN_*.ipynb) or path: one step each.
NOTEBOOKS=${GPU_CHECK_NOTEBOOKS:-"07 08 10"}
# make unit's list, from the Makefile unless the caller (make gpu-check) passes it.
if [ -z "${UNIT_TESTS:-}" ]; then
    UNIT_TESTS=$(awk '/^UNIT_TESTS \?=/ {on = 1} on {print; if ($0 !~ /\\$/) exit}' Makefile \
                 | sed 's/^UNIT_TESTS ?=//; s/\\$//' | tr -s ' \t\n' ' ')
fi
# The tests of the kernels against the references: every stage from 01 on, fused, grouped,
# decoding and backward, on the GPU's block sizes.
KERNEL_TESTS="tests/test_projection.py tests/test_multihead.py tests/test_attention.py tests/test_flash.py \
tests/test_gqa.py tests/test_kv_cache.py tests/test_backward.py"
# The simulator runs a few quick files: the point there is the script, not the kernels.
SIMULATED_TESTS="tests/test_basics.py tests/test_reference.py"

# Each step's budget in seconds is given where the step is added below; SIGINT when it runs
# out, SIGKILL GRACE seconds later. --budget STEP=SECONDS replaces one.
GRACE=${GPU_CHECK_GRACE:-5}
declare -A BUDGET=()
for override in "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; do
    BUDGET[${override%%=*}]=${override#*=}
done

if [ "$MODE" = simulate ]; then
    export ATTENTION_LIB_BACKEND=simulator
    TESTS=${GPU_CHECK_TESTS:-$SIMULATED_TESTS}
    WORKERS=${GPU_CHECK_WORKERS:-0}
    BENCH_SIZES="--batch 1 --heads 2 --T 16 --d-k 8"
else
    export ATTENTION_LIB_BACKEND=gpu          # a GPU or a loud failure, never the simulator
    TESTS=${GPU_CHECK_TESTS:-"$UNIT_TESTS $KERNEL_TESTS"}
    WORKERS=${GPU_CHECK_WORKERS:-8}
    BENCH_SIZES="--batch 8 --heads 12 --T 1024 --d-k 64"
    BUNDLE=${BUNDLE:-$ROOT/gpu-bundle}
fi

# name | budget | command (bash -c, from the repository root; its output goes to DIR/<name>.log)
STEPS=()
ALL_STEPS=" "
add_step() {
    local budget=${BUDGET[$1]:-$2}
    ALL_STEPS+="$1 "
    if [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; then
        STEPS+=("$1|$budget|$3")
    fi
}
# Budgets. Measured on a 2-core machine without a GPU (2026-12-02), the CPU's share only:
# installing the bundle's 31 wheels with pip --target 2-5 s (a Python 3.11 stand-in for the GPU
# machine's 3.12); the environment step 4-6 s on the simulator (a GPU adds the GPU check's
# compile to `import attention_lib`); the kernel report 26 s with nothing stored; the bench's
# inputs, float64 references and result checks at ANDREA-120M (ours and one per PyTorch or CuPy
# baseline) 28-30 s, busy cores up to 47 s. Everything the GPU adds is an ESTIMATE (no GPU has
# run this yet): numba-cuda compiling each kernel once per process (about 1-2 s each, on 8
# workers for the tests); notebooks 07, 08 and 10 at full size (07 and 08 about 12 and 15 s on the
# simulator here without the kernel report, whose rows the kernel-report step stores); the bench's timing at
# --max-seconds 0.5 per kernel and per baseline.
if [ -n "$BUNDLE" ]; then
    add_step install 15 "test -f \"\$BUNDLE/requirements.txt\" || { echo \"no \$BUNDLE/requirements.txt: run make gpu-bundle where PyPI is reachable and bring \$BUNDLE/ along\"; exit 1; }; \"\$PYTHON\" -m pip install --no-index --find-links \"\$BUNDLE/wheels\" --no-deps --target \"\$SITE\" -r \"\$BUNDLE/requirements.txt\" && echo \"installed into \$SITE (on PYTHONPATH): \$(grep -c '==' \"\$BUNDLE/requirements.txt\") packages\""
else
    add_step install 15 "echo \"simulate without --bundle: nothing installed, the interpreter's own packages are used; \$SITE is on PYTHONPATH, empty\"; test -d \"\$SITE\""
fi
add_step environment 25 "\"\$PYTHON\" scripts/gpu_check_environment.py --preflight --mode \"\$MODE\" --out \"\$OUT\""
add_step unit-tests 140 "\"\$PYTHON\" -m pytest -q -n \"\$WORKERS\" --dist loadfile --durations=15 --junitxml=\"\$OUT/unit-tests.xml\" \$TESTS"
add_step kernel-report 35 "\"\$PYTHON\" -m attention_lib.measure.kernel_report --json \"\$OUT/kernel_report.json\""
for notebook in $NOTEBOOKS; do
    if [ -f "$notebook" ]; then
        path=$notebook
    else
        path=$(ls notebooks/"$notebook"_*.ipynb 2>/dev/null | head -n 1)
        path=${path:-"notebooks/$notebook (no such notebook)"}
    fi
    name=$(basename "$path" .ipynb)
    add_step "notebook-${name%%_*}" 40 "\"\$PYTHON\" scripts/gpu_check_notebook.py \"$path\" \"\$OUT/notebooks\" --cell-timeout 600"
done
add_step bench 100 "\"\$PYTHON\" -u -m attention_lib.measure.bench $BENCH_SIZES --repeats 10 --max-seconds 0.5 --out \"\$OUT/bench\""

for override in "${OVERRIDES[@]+"${OVERRIDES[@]}"}"; do
    if [[ "$ALL_STEPS" != *" ${override%%=*} "* ]] || ! [[ "${override#*=}" =~ ^[1-9][0-9]*$ ]]; then
        echo "gpu_check.sh: --budget $override must be STEP=SECONDS (at least 1) with a step of:$ALL_STEPS" >&2
        exit 2
    fi
done
total=0
for step in "${STEPS[@]}"; do
    IFS='|' read -r name budget command <<< "$step"
    total=$((total + budget + GRACE))
done

if ! found=$("$PYTHON" -c 'import sys; print(sys.executable, "%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "gpu_check.sh: PYTHON=$PYTHON does not run; set PYTHON to the GPU machine's python3" >&2
    exit 2
fi
INTERPRETER=${found% *}
VERSION=${found##* }
case "$VERSION" in
    3.11|3.12|3.13) ;;
    *) echo "gpu_check.sh: $INTERPRETER is Python $VERSION; the course needs 3.11 to 3.13 (set PYTHON)" >&2; exit 2 ;;
esac

if [ "$DRY_RUN" = 1 ]; then
    echo "mode $MODE, interpreter $INTERPRETER (Python $VERSION), notebooks: $NOTEBOOKS"
    echo "tests ($WORKERS workers): $TESTS"
    for step in "${STEPS[@]}"; do
        IFS='|' read -r name budget command <<< "$step"
        printf '%-16s %4ss  %s\n' "$name" "$budget" "$command"
    done
    printf 'total budget: %ss with %ss to stop each step (under 8 minutes: %s)\n' \
        "$total" "$GRACE" "$([ "$total" -lt 480 ] && echo yes || echo NO)"
    exit 0
fi

if [ "$MODE" = gpu ] && { ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; }; then
    echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi missing or failing); this check needs one (--simulate runs it on the simulator)" >&2
    exit 1
fi
if ! command -v timeout > /dev/null; then
    echo "gpu_check.sh: the command timeout (GNU coreutils) is missing; the step budgets need it" >&2
    exit 1
fi
mkdir -p "$OUT" || exit 1
OUT="$(cd "$OUT" && pwd)"
# The bundle's packages, the connection files of notebook kernels and IPython's profile go to a
# folder of this run, removed at the end: nothing is written to the home folder or the tree.
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
SITE="$SCRATCH/site"
mkdir -p "$SITE"
# The tree first (attention_lib as it is here), then the bundle, then the interpreter's own packages.
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export OUT PYTHON MODE SITE BUNDLE WORKERS TESTS
# No MPLBACKEND: without a display matplotlib draws with Agg by itself, and the notebooks' kernel
# keeps its inline backend, so the executed copies hold their figures.
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export JUPYTER_PLATFORM_DIRS=1 JUPYTER_RUNTIME_DIR="$SCRATCH/jupyter" IPYTHONDIR="$SCRATCH/ipython"

echo "gpu_check.sh ($MODE): $INTERPRETER (Python $VERSION), writing into $OUT"
printf '%s\n' "$INTERPRETER" "$VERSION" "$MODE" > "$OUT/interpreter.txt"
: > "$OUT/steps.tsv"
failed=0
for step in "${STEPS[@]}"; do
    IFS='|' read -r name budget command <<< "$step"
    started=$SECONDS
    timeout --signal=INT --kill-after="$GRACE" "$budget" bash -c "$command" > "$OUT/$name.log" 2>&1
    status=$?
    seconds=$((SECONDS - started))
    [ "$status" = 0 ] || failed=$((failed + 1))
    case "$status" in
        0) verdict=ok ;;
        124|137) verdict="out of time (budget ${budget}s), see $name.log" ;;
        *) verdict="failed ($status), see $name.log" ;;
    esac
    printf '%-16s %4ss of %4ss  %s\n' "$name" "$seconds" "$budget" "$verdict"
    if [ "$name" = environment ]; then          # what is missing, one line each, here too
        grep -E '^(missing|optional|bundle|attention_lib|numba-cuda|interpreter|Kernels run on)' "$OUT/$name.log" | sed 's/^/    /'
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$budget" >> "$OUT/steps.tsv"
done
"$PYTHON" scripts/gpu_check_environment.py --summary "$OUT" > "$OUT/summary.json"
echo "summary: $OUT/summary.json ($failed step(s) not ok)"
exit $((failed > 0))
