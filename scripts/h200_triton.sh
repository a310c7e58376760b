#!/usr/bin/env bash
# Device script for the Triton grouped GLU (issue 3). Runs on the lent H200 from the repo root:
#   scripts/h200_triton.sh [tests|bench|all] [extra pytest args]
# GPU tests of python/tsct/kernels/triton_glu, then the b1 timing of the whole expert pass
# (python -m tsct.kernels.triton_glu._bench). Full logs and the JSON go to $OUT; the short table
# is printed last.
set -u -o pipefail
MODE=${1:-all}
shift || true
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONPATH=python PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
rc=0
if [[ $MODE == tests || $MODE == all ]]; then
  t0=$(date +%s)
  python3 -m pytest -q -p no:cacheprovider --tb=short -rfE --durations=8 tests/gpu/test_triton_glu.py "$@" >"$OUT/tests.log" 2>&1
  rc=$?
  echo "== tests (rc=$rc, $(( $(date +%s) - t0 )) s) =="
  grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/tests.log" | tail -n 40
fi
if [[ $MODE == bench || $MODE == all ]]; then
  python3 -m tsct.kernels.triton_glu._bench --json "$OUT/bench_b1.json" ${NO_BASELINE:+--no-baseline} \
    ${BENCH_VARIANTS:+--variants "$BENCH_VARIANTS"} 2>&1 | tee "$OUT/bench.log" | tail -n 40
fi
exit $rc
