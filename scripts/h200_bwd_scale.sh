#!/usr/bin/env bash
# Device script for the backward at scale (docs/decisions/0016), from the repo root on the lent H200, through Triton
# JIT from the source tree (no wheel needed). Carry: build/native (the native library of this tree:
# scripts/build_native.sh; without it the bf16 K-major backward runs the Triton dz) and, for the old schedule,
# build/old_tree (a tree of the commit before the change: `git archive <commit> python | tar -x -C build/old_tree`)
# with, optionally, build/old_native (that commit's native library, its C ABI: the old tree then runs its CUDA dz;
# without it the old tree runs the Triton dz). About 7 minutes with the default stages and shapes; logs and JSON to
# $OUT. SHAPES (the timer's, default b1,b1_zipf12,e256,t65536; also e4096, e16384, b1_zipf15) and T_TIME (seconds
# per timing step, default 200) for the time stage.
#
#   STAGES="tests time" bash scripts/h200_bwd_scale.sh          (the default stages)
#   STAGES="chunks" bash scripts/h200_bwd_scale.sh              (the chunk-size / f-slice sweep, ~4 minutes)
#
# tests   tests/gpu/test_bwd_scale_gpu.py (b1 Zipf 1.2 bf16 K-major / row-major / NVFP4, one expert with 99 % of the
#         rows, E 16384, T 65536: every gradient against the fp32 reference, empty experts' zeros, the same bits
#         twice, two chunk sizes, the hot expert's backward against the same rows spread evenly) and
#         tests/gpu/test_glu_dz_native_gpu.py (the CUDA dz on row tiles; skipped without build/native)
# time    scripts/bwd_scale_timing.py, graph-replay ms of the whole pass (tsct-bench's tsct arm), forward and
#         forward+backward, bf16 K-major and NVFP4, at $SHAPES: "old" (build/old_tree with build/old_native if
#         carried, else no native library: its Triton dz), "new" (this tree with build/native: the CUDA dz on row
#         tiles), "new-tdz" (this tree, dz_native=0: the Triton dz on row tiles, the A/B for the sm_90 dispatch);
#         then a table
# chunks  the same timer at b1 Zipf 1.2 and 1.5 over Config.chunk_bwd (256, 512, 1024, 2048) and fs_dwd (8, 16, 32)
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TSCT_TRITON_BACKEND=jit
unset TSCT_TRITON_GLU_CFG
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STAGES=${STAGES:-"tests time"}
NATIVE=""
[[ -f "$ROOT/build/native/libtsct_kernels.so" ]] && NATIVE="$ROOT/build/native"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
echo "native library: ${NATIVE:-none (the Triton dz)}; old tree: $([[ -d $ROOT/build/old_tree/python ]] && echo yes || echo no)"
rc=0
step() {  # step NAME SECONDS CMD...: run under a timeout, log to $OUT/NAME.log, show the tail
  local name=$1 t=$2; shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" >"$OUT/$name.log" 2>&1
  local r=$?
  echo "== $name: rc=$r $(( $(date +%s) - t0 )) s"
  grep -E "^\[|^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped)|Error" "$OUT/$name.log" | tail -n 30
  [[ $r == 0 ]] || rc=1
}
new_env=(env PYTHONPATH="$ROOT/python:$ROOT/tests")
[[ -n $NATIVE ]] && new_env+=(TSCT_NATIVE_LIB="$NATIVE")
timer="$ROOT/scripts/bwd_scale_timing.py"

if [[ " $STAGES " == *" tests "* ]]; then
  step tests 330 "${new_env[@]}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs --rootdir="$ROOT" \
    "$ROOT/tests/gpu/test_bwd_scale_gpu.py" "$ROOT/tests/gpu/test_glu_dz_native_gpu.py"
fi
if [[ " $STAGES " == *" time "* ]]; then
  SHAPES=${SHAPES:-b1,b1_zipf12,e256,t65536}
  T_TIME=${T_TIME:-200}
  OLD_NATIVE=/nonexistent
  [[ -f "$ROOT/build/old_native/libtsct_kernels.so" ]] && OLD_NATIVE="$ROOT/build/old_native"
  if [[ -d "$ROOT/build/old_tree/python" ]]; then
    step time_old "$T_TIME" env PYTHONPATH="$ROOT/build/old_tree/python" TSCT_NATIVE_LIB="$OLD_NATIVE" python3 \
      "$timer" --label old --shapes "$SHAPES" --json "$OUT/time_old.json"
  fi
  step time_new "$T_TIME" "${new_env[@]}" python3 "$timer" --label new --shapes "$SHAPES" --json "$OUT/time_new.json"
  if [[ -n $NATIVE ]]; then
    step time_new_tdz "$T_TIME" "${new_env[@]}" TSCT_TRITON_GLU_CFG=dz_native=0 python3 "$timer" --label new-tdz \
      --shapes "$SHAPES" --arms bf16-kmajor --json "$OUT/time_new_tdz.json"
  fi
  python3 - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = [json.loads(p.read_text()) for p in sorted(out.glob("time_*.json"))]
rows = {}
for run in runs:
    for r in run["results"]:
        rows.setdefault((r["shape"], r["arm"]), {})[run["label"]] = r
labels = [run["label"] for run in runs]
print("fwd / fwd+bwd ms (CUDA graph)  " + "  ".join(f"{l:>17s}" for l in labels))
for (shape, arm), by in rows.items():
    cells = []
    for l in labels:
        r = by.get(l)
        cells.append(f"{'-':>17s}" if r is None else f"{'error':>17s}" if "error" in r
                     else f"{r['fwd_ms']:7.3f} / {r['fwdbwd_ms']:7.3f}")
    print(f"{shape:10s} {arm:12s}        " + "  ".join(cells))
EOF
fi
if [[ " $STAGES " == *" chunks "* ]]; then
  for cfg in chunk_bwd=256 chunk_bwd=512 chunk_bwd=1024 chunk_bwd=2048 fs_dwd=8 fs_dwd=32; do
    step "chunks_${cfg/=/_}" 60 "${new_env[@]}" TSCT_TRITON_GLU_CFG="$cfg" python3 "$timer" --label "$cfg" \
      --shapes b1_zipf12,b1_zipf15 --json "$OUT/chunks_${cfg/=/_}.json"
  done
fi
exit $rc
