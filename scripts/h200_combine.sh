#!/usr/bin/env bash
# Device script for the CUDA combine (csrc/glu/combine.cu) on the lent H200, from the repo root with the wheel
# built here carried in dist/ (device tool: carry ["dist"]). About 8 minutes; logs to $OUT.
#   1. install dist/tsct-*.whl (no deps, no index)
#   2. tests/gpu/test_combine_native_gpu.py: bits against the Triton combine, fp64 sums, edge sizes
#   3. the op suites that run it: test_triton_glu.py, the low-bit native and op suites (AOT cubins)
#   4. scripts/pass_profile.py sweep: per-kernel device time of the bf16 K-major, NVFP4 and sign passes, CUDA vs
#      Triton combine (combine_native=0) -> $OUT/sweep.json
#   5. tsct-bench b1 (padded bmm, tsct-triton-* arms; bf16, nvfp4, sign) -> $OUT/bench_b1.json
source "$(dirname "$0")/device_common.sh" || exit 3
STEPS=${STEPS:-"native suite sweep bench"}
[[ " $STEPS " == *" native "* ]] && step native 150 bash -c "pyt '$ROOT/tests/gpu/test_combine_native_gpu.py'"
[[ " $STEPS " == *" suite "* ]] && step suite 300 env TSCT_TRITON_BACKEND=aot bash -c \
  "pyt '$ROOT/tests/gpu/test_triton_glu.py' '$ROOT/tests/gpu/test_glu_lowbit_native_gpu.py' \
   '$ROOT/tests/gpu/test_lowbit_ops_gpu.py'"
[[ " $STEPS " == *" sweep "* ]] && step sweep 200 python3 "$ROOT/scripts/pass_profile.py" sweep \
  --arms bf16-kmajor,nvfp4,sign --cfgs "${CFGS:-;combine_native=0}" --json "$OUT/sweep.json"
[[ " $STEPS " == *" bench "* ]] && TAIL=40 step bench 170 python3 -m tsct.bench --preset b1 --arms 'padded-bmm,tsct-triton-*' \
  --formats bf16,nvfp4,sign --iters 30 --max-seconds 3 --json "$OUT/bench_b1.json"
exit $rc
