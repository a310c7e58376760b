#!/usr/bin/env bash
# Device script: the wheel in dist/ with some of the source tree's Python files laid over the installed
# package (a Python-only change, same cubins and native library, so no wheel rebuild is needed), then
# timings and GPU tests. One call.
#
#   OVERLAY="python/tsct/kernels/launch.py python/tsct/ops/_eager.py ..." STAGES="perf glu ops" \
#     bash scripts/h200_overlay.sh            # device tool, carry ["dist"]
# Stages: perf (tsct.kernels.triton_lowbit._perf on b1: call / queued / host / graph ms per format),
#         hostprof (scripts/pass_profile.py host: cProfile of the host side), glu (tests/gpu/test_triton_glu.py
#         + test_triton_aot_gpu.py), ops (tests/gpu/test_lowbit_ops_gpu.py), lowbit (test_triton_lowbit_gpu.py
#         on the AOT cubins), bench (tsct-bench --preset b1 bf16/nvfp4/sign arms -> $OUT/bench_b1.json).
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH TSCT_TRITON_BACKEND
ROOT=$(pwd)
STAGES=${STAGES:-"perf glu ops"}
python3 -m pip install --no-deps --no-index --force-reinstall "$(ls -t dist/tsct-*.whl | head -n 1)" >"$OUT/install.log" 2>&1 \
  || { tail -n 5 "$OUT/install.log"; exit 3; }
SP=$(cd /tmp && python3 -c "import tsct, os; print(os.path.dirname(tsct.__file__))")
for f in ${OVERLAY:-}; do
  rel=${f#python/tsct/}; mkdir -p "$SP/$(dirname "$rel")"; cp "$ROOT/$f" "$SP/$rel"; echo "overlay $rel"
done
run() {  # run NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  [[ " $STAGES " == *" $name "* ]] || return 0
  local t0=$(date +%s)
  (cd /tmp && timeout --kill-after=10 "$t" "$@") >"$OUT/$name.log" 2>&1
  echo "== $name: rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "^\[|^(FAILED|ERROR)|[0-9]+ (passed|failed)|Error" "$OUT/$name.log" | tail -n 14
}
PYT="python3 -m pytest -q -p no:cacheprovider --tb=short -rfE --rootdir=/tmp"
run perf 200 python3 -m tsct.kernels.triton_lowbit._perf --label overlay --fmts ${FMTS:-bf16,nvfp4,sign} --no-profile --json "$OUT/perf.json"
run hostprof 200 python3 "$ROOT/scripts/pass_profile.py" host --arms ${FMTS:-bf16,nvfp4} --n 30
run glu 200 $PYT ${GLU_TESTS:-"$ROOT/tests/gpu/test_triton_aot_gpu.py"}
run ops 160 $PYT "$ROOT/tests/gpu/test_lowbit_ops_gpu.py"
TSCT_TRITON_BACKEND=aot run lowbit 150 $PYT "$ROOT/tests/gpu/test_triton_lowbit_gpu.py" -k "not b1_pad"
run bench 200 tsct-bench --preset b1 --arms "${ARMS:-padded-bmm,tsct-triton-*}" --formats bf16,nvfp4,sign --iters 30 \
  --max-seconds 3 --quiet --json "$OUT/bench_b1.json"
[[ -f "$OUT/bench.log" ]] && tail -n 30 "$OUT/bench.log"
exit 0
