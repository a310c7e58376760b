#!/usr/bin/env bash
# Device script for the W4A4 Triton kernels (issue 4 item 2) on the H200, through the AOT cubins that
# ship in the wheel (built on the CPU machine with Triton 3.9; the H200 image's Triton 3.6 crashes
# compiling dot_scaled's sm_90 emulation, so nothing here JITs):
#
#   PYTHON=/path/to/python bash ci/build_wheel.sh      # -> dist/
#   bash scripts/h200_w4a4.sh                          # device tool: carry ["dist"]
#
# 1. installs dist/tsct-*.whl (no deps, no index);
# 2. TSCT_TRITON_BACKEND=aot: tests/gpu/test_triton_w4a4_gpu.py (quantizer byte-exact vs the torch
#    recipe, up-projection vs the torch model, padding, b1 smoke, CUDA graph, timing -> $OUT/w4a4_b1.json).
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH
ROOT=$(pwd)
T_TEST=${T_TEST:-300}
whl=$(ls -t dist/tsct-*.whl | head -n 1)
python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
  || { tail -n 20 "$OUT/install.log"; exit 3; }
export TSCT_TRITON_BACKEND=aot OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import triton; print('image triton', triton.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
cd /tmp
timeout "$T_TEST" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -s --rootdir=/tmp \
  "$ROOT/tests/gpu/test_triton_w4a4_gpu.py" >"$OUT/tests_w4a4.log" 2>&1
rc=$?
grep -E "W4A4 b1|passed|failed|error|^FAILED|^ERROR" "$OUT/tests_w4a4.log" | tail -n 30
echo "rc=$rc"
exit $rc
