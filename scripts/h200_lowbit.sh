#!/usr/bin/env bash
# Device script for the wired low-bit path (issue 4: "triton-lowbit" through tsct.ops, its AOT cubins)
# on the lent H200. ONE call, about 5 minutes; every stage has its own timeout and log, and a
# failing stage does not stop the next ones.
#
#   here (no GPU):  PYTHON=/work/venv/bin/python bash ci/build_wheel.sh      # -> dist/tsct-*.whl
#   device tool:    bash scripts/h200_lowbit.sh                              # carry: ["dist"]
#
# Stages (logs and JSON in $OUT; a summary is printed last):
#   0 install    dist/tsct-*.whl, no deps, no index; versions; which cubins the wheel holds
#   1 probe      tsct-probe --json (auto's choice per format, self-tests of every runnable path)
#   2 ops        tests/gpu/test_lowbit_ops_gpu.py: auto picks triton-lowbit; tsct.ops.grouped_glu fwd/bwd vs
#                the reference on dequantized factors with STE masters; torch.compile fullgraph; the AOT
#                cubins only (TSCT_TRITON_BACKEND=aot inside the test) and JIT; quantize_master; CUDA graph
#   3 aot        tests/gpu/test_triton_lowbit_gpu.py with TSCT_TRITON_BACKEND=aot (the kernel suite on the
#                cubins built with Triton 3.9, nothing JITs; the b1_pad cases left out for time, b1 runs)
#   5 bench      tsct-bench --preset b1, arms padded-bmm and tsct-triton-*, formats bf16,nvfp4,sign
#                -> $OUT/bench_b1_lowbit.json
#   6 jit        tests/gpu/test_triton_lowbit_gpu.py with TSCT_TRITON_BACKEND=jit on three small cases that
#                take the new host rules (rank block 64 for r 16/24/32, multi-K up for the generic d=40 launch)
#                through the image's Triton (the full suite passed through JIT before those rules)
# Knobs: T_<STAGE> (seconds) override the timeouts; STAGES="ops aot" runs a subset.
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT
unset PYTHONPATH TSCT_TRITON_BACKEND
ROOT=$(pwd)
STAGES=${STAGES:-"install probe ops aot gpu bench perf jit"}
T_INSTALL=${T_INSTALL:-45}; T_PROBE=${T_PROBE:-30}; T_OPS=${T_OPS:-140}; T_AOT=${T_AOT:-130}
T_BENCH=${T_BENCH:-110}; T_JIT=${T_JIT:-60}
T_GPU=${T_GPU:-120}; T_PERF=${T_PERF:-90}   # the defaults sum past 600 s: pick STAGES for one call
declare -A RC
t_start=$(date +%s)

stage() {  # stage NAME TIMEOUT CMD...: run with a timeout, log to $OUT/NAME.log, record rc and seconds
  local name=$1 t=$2; shift 2
  [[ " $STAGES " == *" $name "* ]] || { RC[$name]="skipped"; return 0; }
  local t0=$(date +%s)
  timeout --kill-after=10 "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  RC[$name]="rc=$rc $(( $(date +%s) - t0 ))s$([[ $rc == 124 || $rc == 137 ]] && echo ' TIMEOUT')"
  echo "== $name: ${RC[$name]} =="
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)|error" "$OUT/$name.log" | tail -n 12
  return 0
}

pytest_run() {  # from /tmp so that the installed wheel (not the source tree) is imported
  cd /tmp && python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs --rootdir=/tmp --durations=5 "$@"
}
export -f pytest_run

# 0. install
whl=$(ls -t "$ROOT"/dist/tsct-*.whl 2>/dev/null | head -n 1)
if [[ -z "$whl" ]]; then echo "no dist/tsct-*.whl: build it with ci/build_wheel.sh and carry dist"; exit 3; fi
stage install "$T_INSTALL" python3 -m pip install --no-deps --no-index --force-reinstall "$whl"
[[ "${RC[install]}" == rc=0* ]] || { tail -n 20 "$OUT/install.log"; echo "install failed: stop"; exit 3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/gpu.txt" 2>&1
(cd /tmp && python3 - <<'PY') 2>&1 | tee "$OUT/versions.txt"
import json, sys, torch
import tsct
from tsct.kernels import aot, triton_lowbit
try:
    import triton; tv = triton.__version__
except Exception as e:  # noqa: BLE001
    tv = f"not importable ({e})"
cap = tuple(torch.cuda.get_device_capability())
print("python", sys.version.split()[0], "torch", torch.__version__, "triton (image)", tv, "tsct", tsct.__file__)
print("device", torch.cuda.get_device_name(), cap, "cubins", json.dumps(aot.summary().get(aot.artifact_arch(cap), {})))
print("triton-lowbit status:", {f: triton_lowbit.status(cap, f) for f in ("nvfp4", "sign", "mixed")})
PY

# 1. probe
stage probe "$T_PROBE" bash -c "cd /tmp && python3 -m tsct.probe --json > '$OUT/probe.json'"

# 2. the op through tsct.ops (auto backend: cubins where the table has them, else JIT)
stage ops "$T_OPS" bash -c "pytest_run '$ROOT/tests/gpu/test_lowbit_ops_gpu.py'"

# 3. the kernel suite on the AOT cubins only
stage aot "$T_AOT" env TSCT_TRITON_BACKEND=aot bash -c "pytest_run '$ROOT/tests/gpu/test_triton_lowbit_gpu.py' -k 'not b1_pad'"

# 4b. the rest of the GPU suite on the wheel: bf16 AOT cubins, native quantizers, sm_120 path pieces that run
#     on sm_90 (grouped quantizer, emulated-MMA forward, the child-process first-use self-test machinery)
stage gpu "$T_GPU" bash -c "TSCT_GPU_LOG='$OUT/firstuse.txt' pytest_run '$ROOT/tests/gpu/test_triton_aot_gpu.py' \
  '$ROOT/tests/gpu/test_native_quant.py' '$ROOT/tests/gpu/test_sm120_quant_rows_gpu.py' \
  '$ROOT/tests/gpu/test_sm120_fp4_emulated_gpu.py' '$ROOT/tests/gpu/test_sm120_firstuse_gpu.py'"

# 5. b1 benchmark: bf16 vs nvfp4 vs sign (whole expert pass)
stage bench "$T_BENCH" bash -c "cd /tmp && python3 -m tsct.bench --preset b1 \
  --arms 'padded-bmm,tsct-triton-*,tsct-sm120-*' --formats bf16,nvfp4,sign --iters 30 --max-seconds 3 \
  --json '$OUT/bench_b1_lowbit.json'"
tail -n 40 "$OUT/bench.log"

# 5b. device time per kernel and CUDA-graph replay of the same passes (tsct-bench times the eager pass)
stage perf "$T_PERF" bash -c "cd /tmp && python3 -m tsct.kernels.triton_lowbit._perf --label wheel --fmts bf16,nvfp4,sign \
  --json '$OUT/perf.json'"

# 6. small cases through the image's Triton JIT
stage jit "$T_JIT" env TSCT_TRITON_BACKEND=jit bash -c "pytest_run '$ROOT/tests/gpu/test_triton_lowbit_gpu.py' -k 'f37_empty or one_row_experts or top4_f129'"

echo "== summary ($(( $(date +%s) - t_start )) s) =="
rc=0
for s in install probe ops aot gpu bench perf jit; do
  echo "  $s: ${RC[$s]:-not run}"
  [[ "${RC[$s]:-}" == rc=0* || "${RC[$s]:-}" == skipped ]] || rc=1
done
exit $rc
