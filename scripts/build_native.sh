#!/usr/bin/env bash
# Build the native library alone (no wheel, no Triton AOT cubins) into build/native, for the device scripts that run
# the source tree through Triton JIT with TSCT_NATIVE_LIB=build/native (e.g. `scripts/gpu_suite.sh bwd-ab`): the CUDA
# kernels of csrc/ for the targets in TSCT_CUDA_GENCODES (default sm_90a, the H200; the wheel builds more), with
# libtsct_kernels.so and manifest.json side by side. Needs nvcc and CMake >= 3.26 (CMAKE=/path/to/cmake, e.g. from
# `pip install cmake` in a venv of your own). About 10 minutes on 2 cores for sm_90a.
set -euo pipefail
cd "$(dirname "$0")/.."
CMAKE=${CMAKE:-cmake}
BUILD=${BUILD:-build/native-cmake}
"$CMAKE" -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTSCT_TRITON_AOT=OFF \
  "-DTSCT_CUDA_GENCODES=${TSCT_CUDA_GENCODES:-sm_90a}" "-DPython3_EXECUTABLE=${PYTHON:-$(command -v python3)}"
"$CMAKE" --build "$BUILD"
mkdir -p build/native
cp "$BUILD/libtsct_kernels.so" "$BUILD/manifest.json" build/native/
echo "build/native: $(ls build/native | tr '\n' ' ')"
