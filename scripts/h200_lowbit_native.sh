#!/usr/bin/env bash
# Device script for the CUDA low-bit projections (csrc/glu/down_nvfp4.cu, up_nvfp4.cu) on the lent H200, from
# the repo root with the wheel built here carried in dist/ (device tool: carry ["dist"]). About 8 minutes; logs
# to $OUT. CFG (default: empty, the arch table) is exported as TSCT_TRITON_GLU_CFG for the test and bench steps
# (e.g. CFG=down_native_lb=1,up_native_lb=1 runs the kernels where the table has them off).
#   1. install dist/tsct-*.whl (no deps, no index)
#   2. tests/gpu/test_glu_lowbit_native_gpu.py: the kernels against fp64 torch and the Triton kernels
#   3. tests/gpu/test_triton_lowbit_gpu.py (b1_pad left out for time) + test_lowbit_ops_gpu.py: the whole
#      low-bit path with the CUDA kernels for NVFP4
#   4. scripts/pass_profile.py sweep: per-kernel device time of the nvfp4 / sign passes, Triton vs CUDA
#      projections -> $OUT/sweep.json
#   5. tsct-bench b1 (padded bmm, tsct-triton-* arms; bf16, nvfp4, sign) -> $OUT/bench_b1.json
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH TSCT_TRITON_BACKEND TSCT_TRITON_GLU_CFG
ROOT=$(pwd)
CFG=${CFG-}
rc=0
step() {  # step NAME SECONDS CMD...
  local name=$1 t=$2; shift 2
  echo "== $name ($(date +%T))"
  (cd /tmp && timeout --kill-after=10 "$t" "$@") 2>&1 | tee "$OUT/$name.log" | tail -n "${TAIL:-25}"
  local r=${PIPESTATUS[0]}
  echo "== $name: rc=$r"
  [[ $r == 0 ]] || rc=1
}
pyt() { python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs --rootdir=/tmp "$@"; }
export -f pyt
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
whl=$(ls -t "$ROOT"/dist/tsct-*.whl | head -n 1)
python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
  || { tail -n 20 "$OUT/install.log"; exit 3; }
STEPS=${STEPS:-"native suite sweep bench"}
[[ " $STEPS " == *" native "* ]] && step native 120 env TSCT_TRITON_GLU_CFG="$CFG" bash -c \
  "pyt '$ROOT/tests/gpu/test_glu_lowbit_native_gpu.py'"
[[ " $STEPS " == *" suite "* ]] && step suite 320 env TSCT_TRITON_GLU_CFG="$CFG" bash -c \
  "pyt '$ROOT/tests/gpu/test_triton_lowbit_gpu.py' -k 'not b1_pad' && pyt '$ROOT/tests/gpu/test_lowbit_ops_gpu.py'"
[[ " $STEPS " == *" sweep "* ]] && step sweep 150 python3 "$ROOT/scripts/pass_profile.py" sweep --arms nvfp4,sign \
  --cfgs "${CFGS:-down_native_lb=0,up_native_lb=0;}" --json "$OUT/sweep.json"
[[ " $STEPS " == *" bench "* ]] && TAIL=40 step bench 170 env TSCT_TRITON_GLU_CFG="$CFG" python3 -m tsct.bench \
  --preset b1 --arms 'padded-bmm,tsct-triton-*' --formats bf16,nvfp4,sign --iters 30 --max-seconds 3 \
  --json "$OUT/bench_b1.json"
exit $rc
