#!/usr/bin/env bash
# Device script for the CUDA glu_bwd_dz (csrc/glu/dz_bf16.cu) on the lent H200, from the repo root with the
# wheel built here carried in dist/ (device tool: carry ["dist"]). About 8 minutes; logs to $OUT.
#   1. install dist/tsct-*.whl (no deps, no index)
#   2. tests/gpu/test_glu_dz_native_gpu.py: the kernel against fp32 torch (edge shapes, slices, bits)
#   3. tests/gpu/test_triton_glu.py + test_bench_gpu.py on the AOT cubins (the op's backward takes the CUDA dz
#      for bf16 r=64 K-major on sm_90)
#   4. scripts/pass_profile.py sweep: per-kernel device time of the K-major bf16 pass, CUDA dz vs Triton dz
#      (dz_native=0) and its slice counts -> $OUT/sweep.json
#   5. tsct-bench b1 (padded bmm, tsct-triton-* arms; bf16, nvfp4, sign) -> $OUT/bench_b1.json
source "$(dirname "$0")/device_common.sh" || exit 3
STEPS=${STEPS:-"native suite sweep bench"}
[[ " $STEPS " == *" native "* ]] && step native 120 bash -c "pyt '$ROOT/tests/gpu/test_glu_dz_native_gpu.py'"
[[ " $STEPS " == *" suite "* ]] && step suite 180 env TSCT_TRITON_BACKEND=aot bash -c \
  "pyt '$ROOT/tests/gpu/test_triton_glu.py' '$ROOT/tests/gpu/test_bench_gpu.py'"
[[ " $STEPS " == *" sweep "* ]] && step sweep 150 python3 "$ROOT/scripts/pass_profile.py" sweep --arms bf16-kmajor \
  --cfgs "${CFGS:-;dz_native=0;fs_dz_native=1;fs_dz_native=4}" --json "$OUT/sweep.json"
[[ " $STEPS " == *" bench "* ]] && TAIL=40 step bench 170 python3 -m tsct.bench --preset b1 --arms 'padded-bmm,tsct-triton-*' \
  --formats bf16,nvfp4,sign --iters 30 --max-seconds 3 --json "$OUT/bench_b1.json"
exit $rc
