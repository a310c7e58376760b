#!/usr/bin/env bash
# Device run: install the wheel built here (no build on the GPU machine), probe, GPU tests (native
# bit-exactness, Triton grouped GLU), the torch-version-sensitive CPU tests under the image's torch,
# and the b1 benchmark. Usage (device tool, carry ["dist"]): COMMIT=<sha> bash scripts/h200_foundation.sh
set -uo pipefail
REPO=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -m pip install -q --no-deps --no-index --force-reinstall dist/tsct-*.whl 2>&1 | tail -2
cd /tmp   # from here on, `import tsct` is the installed wheel, not the source tree
python3 -c "import tsct, sys; print('tsct from', tsct.__file__, 'python', sys.version.split()[0])"
tsct-probe --verify-artifacts > "$OUT/probe.txt" 2>&1; tail -22 "$OUT/probe.txt"
tsct-probe --json > "$OUT/probe.json" 2>/dev/null
TSCT_GPU_LOG="$OUT/gpu_tests.log" timeout 300 python3 -m pytest -q -s -m gpu "$REPO/tests/gpu" \
    -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1; tail -4 "$OUT/pytest_gpu.txt"
timeout 200 python3 -m pytest -q "$REPO/tests/cpu/test_compile.py" "$REPO/tests/cpu/test_ops_reference.py" \
    "$REPO/tests/cpu/test_quant_api.py" "$REPO/tests/cpu/test_dispatch.py" -p no:cacheprovider \
    > "$OUT/pytest_cpu_on_h200.txt" 2>&1; tail -4 "$OUT/pytest_cpu_on_h200.txt"
TSCT_BENCH_GIT_COMMIT=${COMMIT:-unknown} timeout 300 python3 -m tsct.bench --preset b1 \
    --json "$OUT/b1.json" --plot "$OUT/b1.png" > "$OUT/bench_b1.txt" 2>&1; tail -30 "$OUT/bench_b1.txt"
