#!/usr/bin/env bash
# Compile csrc/cutlass/grouped_nvfp4_sm120.cu for sm_120a (ONE translation unit, no GPU needed),
# disassemble it and count the block-scaled fp4 MMAs; optionally link a host-check library.
#
#   bash csrc/cutlass/build_check.sh [OUT=build/cutlass] [--lib]
#
# Env: TSCT_CUTLASS_HEADERS  a directory holding include/ and tools/util/include/ of CUTLASS
#                            (default: OUT/headers, fetched from PyPI as headers-requirements.txt pins)
#      PYTHON                interpreter with pip (default python3), NVCC (default nvcc),
#      CUOBJDUMP             (default: on PATH, else the nvidia-cuda-cuobjdump wheel's)
# Writes OUT/grouped_nvfp4_sm120.o, .sass, build.json; with --lib also OUT/libtsct_cutlass_check.so
# (the object + a stub for tsct::fail, loadable by ctypes on a CPU-only machine for the host-only
# entry points). Exit 0 only if the object has sm_120a SASS with OMMA.SF...E2M1.E2M1.UE4M3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="build/cutlass"; LIB=0
for a in "$@"; do case "$a" in --lib) LIB=1 ;; *) OUT="$a" ;; esac; done
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"; NVCC="${NVCC:-nvcc}"
EXPECT_VERSION="4.5.0"

HEADERS="${TSCT_CUTLASS_HEADERS:-$OUT/headers}"
if [ ! -f "$HEADERS/include/cutlass/version.h" ]; then
  echo "fetching CUTLASS headers (flashinfer-python wheel, hash-pinned) into $HEADERS"
  rm -rf "$OUT/wheel" && mkdir -p "$OUT/wheel" "$HEADERS"
  "$PYTHON" -m pip download -q --no-deps --require-hashes -r "$ROOT/csrc/cutlass/headers-requirements.txt" -d "$OUT/wheel"
  "$PYTHON" - "$OUT/wheel" "$HEADERS" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl")); dest = pathlib.Path(sys.argv[2])
pre = "flashinfer/data/cutlass/"; keep = (pre + "include/", pre + "tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    for n in z.namelist():
        if n.startswith(keep) and not n.endswith("/"):
            p = dest / n[len(pre):]; p.parent.mkdir(parents=True, exist_ok=True); p.write_bytes(z.read(n))
PY
  rm -rf "$OUT/wheel"
fi
ver=$(awk '/define CUTLASS_(MAJOR|MINOR|PATCH)/{printf "%s%s", sep, $3; sep="."}' "$HEADERS/include/cutlass/version.h")
[ "$ver" = "$EXPECT_VERSION" ] || { echo "CUTLASS headers are $ver, expected $EXPECT_VERSION" >&2; exit 1; }

CUOBJDUMP="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
if [ -z "$CUOBJDUMP" ]; then
  CUOBJDUMP="$("$PYTHON" -c 'import nvidia, pathlib; print(next(p for d in nvidia.__path__ for p in pathlib.Path(d).glob("cu*/bin/cuobjdump")))' 2>/dev/null || true)"
fi
[ -x "$CUOBJDUMP" ] || { echo "no cuobjdump (pip install nvidia-cuda-cuobjdump)" >&2; exit 1; }

OBJ="$OUT/grouped_nvfp4_sm120.o"
t0=$(date +%s.%N)
"$NVCC" -gencode arch=compute_120a,code=sm_120a -std=c++17 --expt-relaxed-constexpr -O3 \
  -Xcompiler=-fPIC,-fvisibility=hidden -DNDEBUG -DCUTLASS_ENABLE_TENSOR_CORE_MMA=1 \
  -I"$HEADERS/include" -I"$HEADERS/tools/util/include" -I"$ROOT/csrc" -I"$ROOT/csrc/include" \
  -c "$ROOT/csrc/cutlass/grouped_nvfp4_sm120.cu" -o "$OBJ"
t1=$(date +%s.%N)
"$CUOBJDUMP" --dump-sass "$OBJ" > "$OUT/grouped_nvfp4_sm120.sass"
"$CUOBJDUMP" --list-elf "$OBJ" > "$OUT/grouped_nvfp4_sm120.elf.txt"
"$PYTHON" - "$OUT" "$t0" "$t1" "$ver" "$("$NVCC" --version | tail -1)" <<'PY'
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1]); t0, t1 = float(sys.argv[2]), float(sys.argv[3])
sass = (out / "grouped_nvfp4_sm120.sass").read_text()
funcs = {}
for block in re.split(r"\n\s*Function : ", sass)[1:]:
    name = block.split("\n", 1)[0].strip()
    instr = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", block)
    funcs[name] = {"instructions": len(instr),
                   "omma_nvfp4": sum(1 for i in instr if re.search(r"\bOMMA\.SF\.\S*E2M1\.E2M1\.UE4M3", i)),
                   "omma_kinds": sorted({m for i in instr for m in re.findall(r"\bOMMA\S*", i)})}
arches = sorted(set(re.findall(r"code for (sm_\w+)", sass)))
info = {"cutlass_headers": sys.argv[4], "nvcc": sys.argv[5], "compile_s": round(t1 - t0, 1),
        "object_bytes": (out / "grouped_nvfp4_sm120.o").stat().st_size, "arches": arches, "functions": funcs}
(out / "build.json").write_text(json.dumps(info, indent=1) + "\n")
gemm = [n for n, f in funcs.items() if f["omma_nvfp4"]]
print(json.dumps({k: v for k, v in info.items() if k != "functions"}))
for n, f in funcs.items():
    print(f"  {f['instructions']:6d} instr  {f['omma_nvfp4']:4d} OMMA nvfp4  {f['omma_kinds']}  {n[:90]}")
ok = arches == ["sm_120a"] and len(gemm) == 1
print("PASS" if ok else "FAIL", "(sm_120a only, exactly one GEMM kernel with OMMA.SF...E2M1.E2M1.UE4M3)")
sys.exit(0 if ok else 1)
PY

if [ "$LIB" = 1 ]; then
  cat > "$OUT/stub_host.cpp" <<'CPP'
// Stand-ins for csrc/api.cpp's error helpers, for the standalone check library only.
#include <stdarg.h>
#include <stdio.h>
namespace tsct {
static thread_local char g_detail[512];
void clear_error_detail() { g_detail[0] = 0; }
int fail(int code, const char* fmt, ...) { va_list ap; va_start(ap, fmt); vsnprintf(g_detail, sizeof g_detail, fmt, ap); va_end(ap); return code; }
int check_launch(const char*) { return 0; }
}
extern "C" const char* tsct_cutlass_check_detail() { return tsct::g_detail; }
CPP
  "$NVCC" -shared -Xcompiler=-fPIC "$OBJ" "$OUT/stub_host.cpp" -o "$OUT/libtsct_cutlass_check.so" -Xlinker --export-dynamic
  echo "host-check library: $OUT/libtsct_cutlass_check.so"
fi
