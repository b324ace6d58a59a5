#!/usr/bin/env bash
# The GPU checks of heddle in one go, most telling first, in about 10 minutes on one NVIDIA GPU
# (each step has its own time limit; 16 minutes at most):
#   1. a smoke check (heddle imports and differentiates on the GPU), stopping early if it fails;
#   2. the backward-pass rows of benchmarks/bench_gpu.py (section 6: float32 cotangents);
#   3. the GPU tests: pytest -m gpu (tests/test_gpu.py and the GPU test of the cast suite);
#   4. the other GPU benchmarks (sections 2, 1, 4, 3, then 5: the narrow-contraction matrix of
#      benchmarks/bench_contractions.py), each appended to benchmarks/RESULTS-gpu.md as measured;
#   5. the cast tests run on the GPU's own arithmetic (tests/policy/test_casts.py, GPU as default).
#
# Usage, from a checkout on an NVIDIA machine:
#   pip install -e '.[cuda12,test]'
#   bash benchmarks/gpu.sh              # then commit benchmarks/RESULTS-gpu.md
#   bash benchmarks/gpu.sh --dry-run    # on any machine: runs every step on the CPU at toy sizes,
#                                       # writes nothing, checks the scripts themselves
# PYTHON=/path/to/python picks the interpreter (default: python). Exit status: 0 when every step
# passed, 1 when one failed or there is no GPU. Tests run in one process (-n 0): several pytest
# workers on one GPU would each take its memory.

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
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  step "smoke check" 60 "$PY" -c 'import jax, jax.numpy as jnp, heddle
from heddle import autodiff
x = jnp.full((512, 64), 1e-3, jnp.float16)
loss = lambda w: jnp.mean((x @ w.astype(x.dtype)).astype(jnp.float32)) * 1e-6
g = jax.jit(autodiff.grad(heddle.autocast(loss), contractions="scaled"))(jnp.ones((64, 1)))
print("smoke:", g.dtype, float(g[0, 0]), g.devices())'
  if [ "${#FAILED[@]}" -ne 0 ]; then echo "gpu.sh: the smoke check failed; stopping." >&2; exit 1; fi
  OUTMD=benchmarks/RESULTS-gpu.md
  step "GPU benchmarks: backward pass" 200 "$PY" benchmarks/bench_gpu.py --sections 6 --out $OUTMD
  step "GPU tests (pytest -m gpu)" 110 "$PY" -m pytest -m gpu -q -n 0 -p no:cacheprovider \
    tests/test_gpu.py tests/policy/test_casts.py
  step "GPU benchmarks: 2, 1, 4, 3" 200 "$PY" benchmarks/bench_gpu.py --sections 2143 --out $OUTMD --append
  step "GPU benchmarks: 5" 240 "$PY" benchmarks/bench_gpu.py --sections 5 --out $OUTMD --append
  step "cast tests on GPU bits" 60 "$PY" -m pytest tests/policy/test_casts.py -q -n 0 -p no:cacheprovider
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
