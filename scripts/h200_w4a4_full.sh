#!/usr/bin/env bash
# The whole W4A4 pass (issue 4 item 2: W4A4 down + quantize z + W4A4 up + combine, STE backward on the
# low-bit kernels) on the lent H200, from THIS source tree, without a new wheel:
#
#   here (no GPU):  bash scripts/h200_w4a4_full.sh prepare      # -> build/w4a4_aot (about 20 MB)
#   device tool:    bash scripts/h200_w4a4_full.sh              # carry: ["build/w4a4_aot"]
#
# prepare (CPU machine, Triton 3.9; PYTHON, default /work/venv/bin/python; JOBS, default 2):
#   1. triton_w4a4/aot_build.py --out build/w4a4_aot.new --check-sass (the W4A4 family: quantizer, down, up;
#      sm_90a + sm_120f); the down cubins' OMMA / HGMMA is checked by tests/cpu/test_triton_w4a4.py;
#   2. build/w4a4_aot/sm_90a = the W4A4 cubins + the glu and lowbit families' sm_90a cubins of an AOT build of
#      the same kernel sources ($GLU_AOT, default build/py3-none-linux_x86_64/triton_aot, read only: the
#      backward and the combine are theirs), one merged index.json;
#   3. build/w4a4_aot/_lib = libtsct_kernels.so + manifest.json out of dist/tsct-*.whl (read only): the C launcher.
# device (Python 3.12, torch 2.11, Triton 3.6 which cannot compile the sm_90 dot_scaled emulation: nothing JITs):
#   PYTHONPATH=<tree>/python, TSCT_AOT_DIR=build/w4a4_aot, TSCT_NATIVE_LIB=build/w4a4_aot/_lib,
#   TSCT_TRITON_BACKEND=aot; tests/gpu/test_triton_w4a4_gpu.py (quantizer, up, down, whole pass fwd/bwd, b1
#   timing -> $OUT/w4a4_b1_full.json). T_TEST (seconds, default 420) bounds the pytest run.
set -u -o pipefail
ROOT=$(pwd)
AOT="$ROOT/build/w4a4_aot"

if [[ "${1:-}" == "prepare" ]]; then
  PY=${PYTHON:-/work/venv/bin/python}
  GLU_AOT=${GLU_AOT:-$ROOT/build/py3-none-linux_x86_64/triton_aot}
  rm -rf "$AOT.new" "$AOT"
  "$PY" python/tsct/kernels/triton_w4a4/aot_build.py --out "$AOT.new" --jobs "${JOBS:-2}" --check-sass \
    --cache-dir "${CACHE:-/tmp/w4a4_aot.cache}" | grep -v "^  " || exit 1
  mkdir -p "$AOT/sm_90a" "$AOT/_lib"
  "$PY" - "$AOT.new" "$GLU_AOT" "$AOT" <<'PY' || exit 1
import json, shutil, sys
from pathlib import Path
new, glu, out = (Path(p) for p in sys.argv[1:4])
a = "sm_90a"
mine = json.loads((new / a / "index.json").read_text())
theirs = json.loads((glu / a / "index.json").read_text())
if theirs["triton_version"] != mine["triton_version"]:
    sys.exit(f"Triton {theirs['triton_version']} in {glu}, {mine['triton_version']} here")
kern = {k: e for k, e in theirs["kernels"].items() if e.get("family") != "w4a4"}
for k, e in kern.items():
    shutil.copy2(glu / a / e["file"], out / a / e["file"])
for k, e in mine["kernels"].items():
    shutil.copy2(new / a / e["file"], out / a / e["file"])
kern.update(mine["kernels"])
fams = {f: v for f, v in theirs["families"].items() if f != "w4a4"}
fams["w4a4"] = mine["families"]["w4a4"]
idx = dict(theirs, families=fams, kernels=kern)
(out / a / "index.json").write_text(json.dumps(idx, indent=1, sort_keys=True) + "\n")
(out / "index.json").write_text(json.dumps({"triton_version": mine["triton_version"], "archs": {a: {
    "variants": len(kern)}}}, indent=1) + "\n")
print(f"{out}/{a}: {len(kern)} cubins", {f: v["variants"] for f, v in sorted(fams.items())})
PY
  whl=$(ls -t "$ROOT"/dist/tsct-*.whl | head -n 1)
  (cd "$AOT/_lib" && unzip -o -j -q "$whl" tsct/_lib/libtsct_kernels.so tsct/_lib/manifest.json) || exit 1
  rm -rf "$AOT.new"
  du -sh "$AOT"
  exit 0
fi

OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT
export PYTHONPATH="$ROOT/python" TSCT_AOT_DIR="$AOT" TSCT_NATIVE_LIB="$AOT/_lib" TSCT_TRITON_BACKEND=aot
[[ -f "$AOT/sm_90a/index.json" ]] || { echo "no $AOT/sm_90a/index.json: run 'prepare' here and carry build/w4a4_aot"; exit 3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import sys, torch, tsct; print('python', sys.version.split()[0], 'torch', torch.__version__, 'tsct', tsct.__file__)" \
  2>&1 | tee -a "$OUT/gpu.txt"
cd /tmp
timeout --kill-after=10 "${T_TEST:-420}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -s --rootdir=/tmp \
  --durations=8 "$ROOT/tests/gpu/test_triton_w4a4_gpu.py" ${PYTEST_ARGS:-} >"$OUT/tests_w4a4_full.log" 2>&1
rc=$?
grep -E "W4A4 b1|W4A4 full|passed|failed|error|^FAILED|^ERROR|s call" "$OUT/tests_w4a4_full.log" | tail -n 40
echo "rc=$rc"
exit $rc
