#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU, in under 8 minutes, everything into one folder.
#
#   bash scripts/gpu_check.sh [--out DIR] [--dry-run]          # or: make gpu-check
#
# For a machine where numba-cuda (with its CUDA toolkit), PyTorch and CuPy are already installed
# and no package registry is reachable: it installs nothing (pip is told to stay offline). Steps,
# each under its own time budget (`timeout`), each recorded whether it passes or not:
#   1. environment: GPU name, driver, versions, date (nvidia-smi, python)
#   2. the unit tests, on the GPU (ATTENTION_LIB_BACKEND=gpu)
#   3. notebooks 07 and 09 executed at full size (copies in DIR; the committed ones untouched)
#   4. the bench at ANDREA-120M (B 8, H 12, T 1024, d_k 64): JSON, table, roofline PNG
#   5. the kernel report (python -m attention_lib.measure.kernel_report): registers, stack, occupancy
# DIR/summary.json lists every step with its exit status, seconds and budget.
# --dry-run prints the steps and their budgets and runs nothing.
set -u

PYTHON=${PYTHON:-python3}
OUT="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
DRY_RUN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (expected --out DIR or --dry-run)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
export ATTENTION_LIB_BACKEND=gpu          # a GPU or a loud failure, never the simulator
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export MPLBACKEND=Agg
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# name | budget in seconds | command (run with bash -c, from the repository root)
STEPS=(
    "environment|15|nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > \"\$OUT/gpu.csv\"; nvidia-smi > \"\$OUT/nvidia-smi.txt\"; \"\$PYTHON\" scripts/gpu_check_environment.py > \"\$OUT/environment.json\""
    "unit-tests|150|\"\$PYTHON\" -m pytest -q tests --durations=10 --junitxml=\"\$OUT/tests.xml\" > \"\$OUT/tests.txt\" 2>&1"
    "notebooks|140|mkdir -p \"\$OUT/notebooks\" && cd notebooks && \"\$PYTHON\" -m jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=120 --output-dir \"\$OUT/notebooks\" 07_fused_attention.ipynb 09_performance.ipynb > \"\$OUT/notebooks.txt\" 2>&1"
    "bench|130|\"\$PYTHON\" -m attention_lib.measure.bench --batch 8 --heads 12 --T 1024 --d-k 64 --repeats 10 --max-seconds 1 --out \"\$OUT/bench\" > \"\$OUT/bench.txt\" 2>&1"
    "kernel-report|35|\"\$PYTHON\" -m attention_lib.measure.kernel_report --json \"\$OUT/kernel_report.json\" > \"\$OUT/kernel_report.txt\" 2>&1"
)

total=0
for step in "${STEPS[@]}"; do
    IFS='|' read -r name budget command <<< "$step"
    total=$((total + budget))
    if [ "$DRY_RUN" = 1 ]; then
        printf '%-14s %4ss  %s\n' "$name" "$budget" "$command"
    fi
done
if [ "$DRY_RUN" = 1 ]; then
    printf 'total budget: %ss (under 8 minutes: %s)\n' "$total" "$([ "$total" -lt 480 ] && echo yes || echo NO)"
    exit 0
fi

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
    echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi missing or failing); this check needs one" >&2
    exit 1
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OUT PYTHON
echo "writing into $OUT"
: > "$OUT/steps.tsv"
failed=0
for step in "${STEPS[@]}"; do
    IFS='|' read -r name budget command <<< "$step"
    started=$SECONDS
    timeout --kill-after=5 "$budget" bash -c "$command"
    status=$?
    seconds=$((SECONDS - started))
    [ "$status" = 0 ] || failed=$((failed + 1))
    verdict=$([ "$status" = 0 ] && echo ok || { [ "$status" = 124 ] && echo "over budget" || echo "failed ($status)"; })
    printf '%-14s %4ss of %4ss  %s\n' "$name" "$seconds" "$budget" "$verdict"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$budget" >> "$OUT/steps.tsv"
done
"$PYTHON" scripts/gpu_check_environment.py --summary "$OUT" > "$OUT/summary.json"
echo "summary: $OUT/summary.json ($failed step(s) not ok)"
exit $((failed > 0))
