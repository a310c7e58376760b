#!/usr/bin/env bash
# Build the tsct wheel (with its ahead-of-time compiled CUDA kernels) on a machine with no GPU.
#
#   bash ci/build_wheel.sh            # -> dist/tsct-<version>-py3-none-linux_x86_64.whl
#
# Needs: Python >= 3.10 with pip, nvcc >= 12.9 on PATH (or CUDACXX=/path/to/nvcc), a host C++
# compiler. CMake >= 3.26 and scikit-build-core are fetched from PyPI by pip's build isolation.
# Knobs (environment):
#   PYTHON=python3                    the interpreter whose pip builds the wheel
#   TSCT_CUDA_GENCODES="sm_90a;..."   override the CUDA targets (CMakeLists.txt has the default)
#   TSCT_BUILD_CUDA=OFF               a wheel with no native library (pure-Python fallback)
#   TSCT_CUTEDSL_PYTHON=/path/python  an interpreter with nvidia-cutlass-dsl==4.8.1 (+ nvidia-cuda-cuobjdump): the
#                                     CuTeDSL sm_120 kernels are exported and linked (docs/decisions/0009); the
#                                     release wheel is built this way. Unset: TSCT_CUTEDSL=AUTO looks in the build
#                                     env only (which has no DSL), so the wheel has no CuTeDSL kernels (said below).
#   TSCT_CUTEDSL=ON|OFF|AUTO          override (default: ON when TSCT_CUTEDSL_PYTHON is set, else AUTO)
# The build directory build/<wheel tag> persists, so a rebuild only recompiles what changed (a build
# with an override above uses a temporary one, so the override never sticks).
# After the build it prints the wheel's manifest.json: which targets (cubins, PTX) and kernels it holds.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
args=(wheel . --no-deps -w dist -v)
if [[ -n "${TSCT_CUDA_GENCODES:-}${TSCT_BUILD_CUDA:-}" ]]; then
  # Overrides would stick in the persistent build dir's CMake cache: build them in a throwaway one.
  custom_build=$(mktemp -d)
  trap 'rm -rf "$custom_build"' EXIT
  args+=(-C "build-dir=$custom_build")
  [[ -n "${TSCT_CUDA_GENCODES:-}" ]] && args+=(-C "cmake.define.TSCT_CUDA_GENCODES=${TSCT_CUDA_GENCODES}")
  [[ -n "${TSCT_BUILD_CUDA:-}" ]] && args+=(-C "cmake.define.TSCT_BUILD_CUDA=${TSCT_BUILD_CUDA}")
fi

if [[ -n "${TSCT_CUTEDSL_PYTHON:-}" ]]; then
  export TSCT_CUTEDSL_PYTHON TSCT_CUTEDSL="${TSCT_CUTEDSL:-ON}"
else
  export TSCT_CUTEDSL="${TSCT_CUTEDSL:-AUTO}"
fi
echo "ci/build_wheel.sh: TSCT_CUTEDSL=$TSCT_CUTEDSL TSCT_CUTEDSL_PYTHON=${TSCT_CUTEDSL_PYTHON:-<unset>}"

mkdir -p dist
start=$(date +%s)
"$PYTHON" -m pip "${args[@]}"
echo "ci/build_wheel.sh: built in $(( $(date +%s) - start )) s"

version=$("$PYTHON" - <<'PY'
import re, pathlib
print(re.search(r'^version = "([^"]+)"', pathlib.Path("pyproject.toml").read_text(), re.M).group(1))
PY
)
wheel=$(ls -t dist/tsct-"${version}"-*.whl | head -n 1)
echo "wheel: $wheel"
"$PYTHON" - "$wheel" <<'PY'
import json, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = z.namelist()
    for n in names:
        if n.startswith("tsct/_lib/"):
            print(f"  {n}  ({z.getinfo(n).file_size} bytes)")
    if "tsct/_lib/manifest.json" not in names:
        print("  no native library in this wheel (TSCT_BUILD_CUDA=OFF?)")
        sys.exit(0)
    m = json.loads(z.read("tsct/_lib/manifest.json"))
print(f"manifest: tsct {m['version']}, nvcc {m['nvcc_version']}, built {m['built_at']}")
for g in m["gencodes"]:
    kind = "SASS (cubin)" if g.startswith("sm_") else "PTX (JIT fallback)"
    print(f"  {g:<12} {kind:<19} {len(m['kernels'].get(g, []))} kernels")
print("kernels: " + ", ".join(sorted(set().union(*map(set, m["kernels"].values())))))
aot = m.get("triton_aot")
if aot:
    n = sum(1 for x in names if x.startswith("tsct/_aot/") and x.endswith(".cubin"))
    print(f"triton AOT (Triton {aot['triton_version']}): {n} cubins in tsct/_aot/: "
          + ", ".join(f"{a} {v['variants']}" for a, v in aot["archs"].items()))
else:
    print("triton AOT: none (TSCT_TRITON_AOT=OFF): the Triton path needs Triton JIT")
cd = m.get("cutedsl")
if cd:
    print(f"CuTeDSL sm_120 kernels linked ({cd['dsl']['dist']} {cd['dsl']['version']}, "
          f"{', '.join(cd.get('archs', [cd['arch']]))}): "
          + ", ".join(k["name"] for k in cd["kernels"]))
else:
    print("CuTeDSL sm_120 kernels: NOT in this wheel (set TSCT_CUTEDSL_PYTHON to a venv with nvidia-cutlass-dsl==4.8.1)")
PY
