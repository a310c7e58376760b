#!/usr/bin/env bash
# Device script for the ahead-of-time Triton cubins (issue 3 item 3; docs/decisions/0005).
# Runs on the lent H200 from the repo root, with the wheel built on the CPU machine carried in dist/:
#
#   bash scripts/h200_aot.sh            # device tool: carry ["dist"]
#
# 1. installs dist/tsct-*.whl into the image's python (no deps, no index: torch is the image's);
# 2. checks that the installed tsct (not python/ of the checkout) has cubins for this GPU and loads them;
# 3. the AOT GPU tests (tests/gpu/test_triton_aot_gpu.py), then the whole Triton GLU suite
#    (tests/gpu/test_triton_glu.py) with TSCT_TRITON_BACKEND=aot: reference tolerances, determinism,
#    CUDA graphs, M*f past 2^31, all through the cubins;
# 4. with KBENCH=1: the kernel harness (per-kernel profile, graph replay, host time) -> $OUT/kbench_b1.json;
# 5. times b1 (padded bmm vs the tsct Triton arm on the cubins; ARMS= narrows) -> $OUT/b1_aot.json.
# Each stage has a time limit (seconds, environment: T_AOT, T_SUITE, T_BENCH) so the whole run fits
# about 8 minutes; logs go to $OUT. Exit status: the first failing stage's.
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH  # the installed wheel, never python/ of the checkout
T_AOT=${T_AOT:-120} T_SUITE=${T_SUITE:-240} T_BENCH=${T_BENCH:-150}
rc=0
note() { echo "== $* ($(date +%T))"; }

note "install"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
whl=$(ls -t dist/tsct-*.whl | head -n 1)
python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
  || { tail -n 20 "$OUT/install.log"; exit 3; }
cd /tmp  # import tsct from site-packages
python3 - <<'PY' 2>&1 | tee "$OUT/aot_smoke.txt"
import importlib.util, os, torch, tsct
from tsct import native
from tsct.kernels import aot
from tsct.kernels.triton_glu import status
cap = torch.cuda.get_device_capability()
print("tsct", tsct.__file__, "| torch", torch.__version__, "| triton",
      (importlib.util.find_spec("triton") and __import__("triton").__version__), "| capability", cap)
print("native:", native.available(), native.load_error() or "", "| abi", native.build_info()["abi_version"])
print("AOT arch:", aot.artifact_arch(cap), "| status:", status(cap, "bf16"))
print("shipped:", aot.summary())
idx = aot.index(aot.artifact_arch(cap))
k = aot.kernel(aot.artifact_arch(cap), next(iter(idx["kernels"])))
print("first cubin on this GPU:", k.entry["kernel"], k.info())
PY
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "AOT smoke failed: the cubins do not load here"; exit 4; }
cd - >/dev/null

note "AOT GPU tests"
TSCT_TRITON_BACKEND=aot timeout "$T_AOT" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -s \
  tests/gpu/test_triton_aot_gpu.py >"$OUT/tests_aot.log" 2>&1
r=$?; [[ $rc == 0 ]] && rc=$r
grep -E "cubins load|bit-identical|passed|failed|error|^FAILED|^ERROR" "$OUT/tests_aot.log" | tail -n 20
echo "rc=$r"

note "Triton GLU suite on the cubins (TSCT_TRITON_BACKEND=aot)"
TSCT_TRITON_BACKEND=aot timeout "$T_SUITE" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
  --durations=5 tests/gpu/test_triton_glu.py >"$OUT/tests_glu_aot.log" 2>&1
r=$?; [[ $rc == 0 ]] && rc=$r
grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/tests_glu_aot.log" | tail -n 20
echo "rc=$r"

cd /tmp
if [[ -n ${KBENCH:-} ]]; then  # per-kernel profile, graph replay and host time of the installed kernels
  note "b1 kernel harness on the cubins (tsct.kernels.triton_glu._bench)"
  timeout "${T_KBENCH:-120}" python3 -m tsct.kernels.triton_glu._bench --no-baseline --json "$OUT/kbench_b1.json" \
    ${BENCH_VARIANTS:+--variants "$BENCH_VARIANTS"} >"$OUT/kbench.log" 2>&1
  r=$?; [[ $rc == 0 ]] && rc=$r
  tail -n 30 "$OUT/kbench.log"
  echo "rc=$r"
fi

note "b1 timing on the cubins"
TSCT_TRITON_BACKEND=aot TSCT_BENCH_GIT_COMMIT=${COMMIT:-unknown} timeout "$T_BENCH" python3 -m tsct.bench --preset b1 --arms "${ARMS:-padded-bmm,tsct-triton-*}" \
  --formats bf16 --json "$OUT/b1_aot.json" >"$OUT/bench_aot.log" 2>&1
r=$?; [[ $rc == 0 ]] && rc=$r
tail -n 25 "$OUT/bench_aot.log"
echo "rc=$r"
note "done rc=$rc"
exit $rc
