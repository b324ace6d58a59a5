#!/usr/bin/env bash
# The GPU checks of heddle, in one go, in under 11 minutes on one NVIDIA GPU:
#   1. the GPU tests: pytest -m gpu (tests/test_gpu.py and the GPU test of the cast suite);
#   2. the cast tests run on the GPU's own arithmetic (tests/policy/test_casts.py, GPU as default device);
#   3. the GPU benchmarks (benchmarks/bench_gpu.py, with the narrow-contraction matrix of
#      benchmarks/bench_contractions.py), written to benchmarks/RESULTS-gpu.md.
#
# Usage, from a checkout on an NVIDIA machine:
#   pip install -e '.[cuda12,test]'
#   bash benchmarks/gpu.sh              # then commit benchmarks/RESULTS-gpu.md
#   bash benchmarks/gpu.sh --dry-run    # on any machine: runs every step on the CPU at toy sizes,
#                                       # writes nothing, checks the scripts themselves
# PYTHON=/path/to/python picks the interpreter (default: python). Exit status: 0 when every step
# passed, 1 when one failed or there is no GPU.

set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
  *) echo "gpu.sh: unknown option '$1'. Use: bash benchmarks/gpu.sh [--dry-run]" >&2; exit 2 ;;
esac

START=$SECONDS
FAILED=()
step() {  # step NAME TIMEOUT_S COMMAND...: runs one step under a time limit, records a failure
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "-- $name: exit $rc after $((SECONDS - t0))s"
  if [ "$rc" -ne 0 ]; then FAILED+=("$name (exit $rc)"); fi
}

if [ "$DRY" -eq 0 ]; then
  if ! "$PY" -c 'import jax, sys; sys.exit(0 if any(d.platform == "gpu" for d in jax.devices()) else 1)' 2>/dev/null; then
    echo "gpu.sh: no NVIDIA GPU visible to JAX, so there is nothing to measure." >&2
    echo "Install the CUDA build with pip install -e '.[cuda12,test]' on an NVIDIA machine," >&2
    echo "or check the scripts on this machine with: bash benchmarks/gpu.sh --dry-run" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
  "$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
  step "GPU tests (pytest -m gpu)" 170 "$PY" -m pytest -m gpu -q -p no:cacheprovider
  step "cast tests on GPU bits" 120 "$PY" -m pytest tests/policy/test_casts.py -q -p no:cacheprovider
  step "GPU benchmarks" 360 "$PY" benchmarks/bench_gpu.py
else
  echo "gpu.sh --dry-run: every step on the CPU at toy sizes; nothing is recorded"
  export JAX_PLATFORMS=cpu
  step "GPU tests on CPU (HEDDLE_GPU_TESTS_ON_CPU=1 pytest -m gpu tests/test_gpu.py)" 300 \
    env HEDDLE_GPU_TESTS_ON_CPU=1 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py
  step "cast tests (collected only)" 120 \
    "$PY" -m pytest tests/policy/test_casts.py -qq -p no:cacheprovider --collect-only
  step "GPU benchmarks at toy sizes" 300 \
    "$PY" benchmarks/bench_gpu.py --dry-run --out "${TMPDIR:-/tmp}/heddle-gpu-dry-run.md"
fi

echo
echo "gpu.sh: $((SECONDS - START))s in all"
if [ "${#FAILED[@]}" -ne 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "all steps passed"
