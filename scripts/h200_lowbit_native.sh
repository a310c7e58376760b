#!/usr/bin/env bash
# Device script for the CUDA low-bit projections (csrc/glu/down_nvfp4.cu, up_nvfp4.cu) on the lent H200, from
# the repo root with the wheel built here carried in dist/ (device tool: carry ["dist"]). About 8 minutes; logs
# to $OUT. CFG (default: empty, the arch table) is exported as TSCT_TRITON_GLU_CFG for the test and bench steps
# (e.g. CFG=down_native_lb=1,up_native_lb=1 runs the kernels where the table has them off).
#   1. install dist/tsct-*.whl (no deps, no index)
#   2. tests/gpu/test_glu_lowbit_native_gpu.py: the kernels against fp64 torch and the Triton kernels
#   3. tests/gpu/test_triton_lowbit_gpu.py (b1_pad left out for time) + test_lowbit_ops_gpu.py: the whole
#      low-bit path with the CUDA kernels (NVFP4 and sign)
#   4. scripts/pass_profile.py sweep: per-kernel device time of the nvfp4 / sign passes, Triton vs CUDA
#      projections -> $OUT/sweep.json
#   5. tsct-bench b1 (padded bmm, tsct-triton-* arms; bf16, nvfp4, sign) -> $OUT/bench_b1.json
#   glu (not by default): tests/gpu/test_triton_glu.py -k "$GLU_K" on the AOT cubins
#   host (not by default): scripts/pass_profile.py host: host issue time per eager call, cProfile tables
source "$(dirname "$0")/device_common.sh" || exit 3
CFG=${CFG-}
STEPS=${STEPS:-"native suite sweep bench"}
[[ " $STEPS " == *" native "* ]] && step native 120 env TSCT_TRITON_GLU_CFG="$CFG" bash -c \
  "pyt '$ROOT/tests/gpu/test_glu_lowbit_native_gpu.py'"
[[ " $STEPS " == *" glu "* ]] && step glu 240 env TSCT_TRITON_BACKEND=aot TSCT_TRITON_GLU_CFG="$CFG" bash -c \
  "pyt '$ROOT/tests/gpu/test_triton_glu.py' -k '${GLU_K:-one_index or op_saves}'"
[[ " $STEPS " == *" suite "* ]] && step suite 320 env TSCT_TRITON_GLU_CFG="$CFG" bash -c \
  "pyt '$ROOT/tests/gpu/test_triton_lowbit_gpu.py' -k 'not b1_pad' && pyt '$ROOT/tests/gpu/test_lowbit_ops_gpu.py'"
[[ " $STEPS " == *" sweep "* ]] && step sweep 150 python3 "$ROOT/scripts/pass_profile.py" sweep --arms nvfp4,sign \
  --cfgs "${CFGS:-down_native_lb=0,up_native_lb=0;}" --json "$OUT/sweep.json"
[[ " $STEPS " == *" bench "* ]] && TAIL=40 step bench 170 env TSCT_TRITON_GLU_CFG="$CFG" python3 -m tsct.bench \
  --preset b1 --arms 'padded-bmm,tsct-triton-*' --formats bf16,nvfp4,sign --iters 30 --max-seconds 3 \
  --json "$OUT/bench_b1.json"
[[ " $STEPS " == *" host "* ]] && TAIL=8 step host 150 python3 "$ROOT/scripts/pass_profile.py" host \
  --arms nvfp4,sign,bf16-kmajor --n 30 --top 40
exit $rc
