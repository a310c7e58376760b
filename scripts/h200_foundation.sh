#!/usr/bin/env bash
# Device run for the foundation issue: install the wheel built here (no build on the GPU machine),
# probe, GPU tests (native bit-exactness), CPU tests against the installed package, b1 benchmark.
# Usage (device tool, carry ["dist"]): COMMIT=<sha> bash scripts/h200_foundation.sh
set -uo pipefail
REPO=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m pip install -q --no-deps --no-index --force-reinstall dist/tsct-*.whl 2>&1 | tail -2
cd /tmp   # from here on, `import tsct` is the installed wheel, not the source tree
python3 -c "import tsct, sys; print('tsct from', tsct.__file__, 'python', sys.version.split()[0])"
tsct-probe --verify-artifacts 2>&1 | tee "$OUT/probe.txt" | tail -60
tsct-probe --json > "$OUT/probe.json" 2>/dev/null
TSCT_GPU_LOG="$OUT/gpu_native_quant.log" python3 -m pytest -q -s -m gpu "$REPO/tests/gpu/test_native_quant.py" \
    -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/pytest_gpu.txt"
python3 -m pytest -q -x "$REPO/tests/cpu" -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/pytest_cpu_on_h200.txt"
TSCT_BENCH_GIT_COMMIT=${COMMIT:-unknown} timeout 420 python3 -m tsct.bench --preset b1 \
    --json "$OUT/b1.json" --plot "$OUT/b1.png" 2>&1 | tail -40
