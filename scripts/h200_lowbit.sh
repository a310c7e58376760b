#!/usr/bin/env bash
# Device script for the Triton low-bit grouped GLU (issue 4, path "triton-lowbit"). On the lent H200:
#   scripts/h200_lowbit.sh [tests|bench|all] [extra pytest args]
# 1. compile check + GPU tests of python/tsct/kernels/triton_lowbit (Triton JIT; needs Triton 3.9 for
#    the same code as the CPU checks; 3.6 in the image is tried as is and its version recorded);
# 2. b1 timing of the whole expert pass, bf16 vs nvfp4 vs sign, through tsct.bench. The bench arms
#    tsct-triton-lowbit-{nvfp4,sign} report "unavailable" until dispatch wires the path (bench/notes.md,
#    "Low-bit", wiring). Logs and JSON to $OUT; short tables printed last.
set -u -o pipefail
MODE=${1:-all}
shift || true
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONPATH=python PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
rc=0
if [[ $MODE == tests || $MODE == all ]]; then
  python3 -m tsct.kernels.triton_lowbit._compile_check --arch 90 --fmts nvfp4,sign,dense >"$OUT/compile_check.log" 2>&1
  echo "== compile check (rc=$?) =="; grep -E "^(ok|FAIL)" "$OUT/compile_check.log" | sed 's/Function [^:]*://' | cut -c1-150
  t0=$(date +%s)
  python3 -m pytest -q -p no:cacheprovider --tb=short -rfE --durations=8 tests/gpu/test_triton_lowbit_gpu.py "$@" >"$OUT/tests.log" 2>&1
  rc=$?
  echo "== tests (rc=$rc, $(( $(date +%s) - t0 )) s) =="
  grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/tests.log" | tail -n 40
fi
if [[ $MODE == bench || $MODE == all ]]; then
  python3 -m tsct.bench --preset b1 --arms 'padded-bmm,tsct-triton-*' --formats bf16,nvfp4,sign \
    --json "$OUT/bench_lowbit_b1.json" 2>&1 | tee "$OUT/bench.log" | tail -n 40
fi
exit $rc
