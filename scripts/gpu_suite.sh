#!/usr/bin/env bash
# The GPU suite: one device script whose stages are chosen by name. Run on the GPU machine from the repo root,
# with a wheel built on the CPU machine carried in (carry ["dist"], or the WHEEL_DIR, to the GPU machine):
#
#   bash scripts/gpu_suite.sh STAGE [STAGE ...]       e.g. `bash scripts/gpu_suite.sh probe aot lowbit bench`
#   bash scripts/gpu_suite.sh --list                  the stages and what each checks
#
# First the newest $WHEEL_DIR/tsct-*.whl (default dist/) is installed into the image's python (no deps, no index:
# torch and Triton are the image's; NO_INSTALL=1 skips it, and so does a run of source-tree stages only), then
# OVERLAY files ("python/tsct/a.py ..." from this tree) are copied over the installed package (a Python-only change
# without a new wheel). Tests run from /tmp, so `import tsct` is the installed wheel, never python/ of the checkout
# (stages glu-jit, bwd-ab and bwd-chunks excepted: they run the source tree through Triton JIT). Each step has a
# timeout and a log in $OUT (default /tmp/tsct_out; the last $TAIL lines are shown); a failing step does not stop
# the next ones; a summary comes last, exit status 1 if any step failed, 2 for an unknown stage, 3 if the install
# failed.
#
# Knobs: OUT, WHEEL_DIR, NO_INSTALL, OVERLAY, TAIL; COMMIT (recorded by tsct-bench); CFG (TSCT_TRITON_GLU_CFG of the
# test, sweep and bench steps, e.g. CFG=warps_up_lb=8); CUDA_KERNELS (TSCT_CUDA_KERNELS of every step, e.g.
# CUDA_KERNELS=none: the Triton kernels where sm_90a takes CUDA ones); ARMS, FORMATS (bench); CFGS, CUDA_SWEEP,
# SWEEP_ARMS (sweep, hostprof, hostprof-ab, wheel-ab); RUNS (wheel-ab, hostprof-ab), SHAPES (wheel-ab, bwd-ab), ROUNDS
# (hostprof-ab); GLU_K (pytest -k of stage glu); PROXY_K (stage proxy: only the suite's tests matching this -k,
# then the verdicts: a run for kernels whose source changed); T_<STEP> (seconds, the step's timeout: T_LOWBIT=200 ...).
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT ROOT
unset PYTHONPATH TSCT_TRITON_BACKEND TSCT_TRITON_GLU_CFG
CFG=${CFG-}
export TSCT_CUDA_KERNELS=${CUDA_KERNELS:-auto}
declare -A RC
ORDER=()
t_start=$(date +%s)

# step NAME DEFAULT_TIMEOUT CMD...: run CMD in /tmp under a timeout (T_<NAME> overrides it), log to $OUT/NAME.log
step() {
  local name=$1 t=$2; shift 2
  local var="T_$(echo "$name" | tr 'a-z' 'A-Z' | tr -c 'A-Z0-9\n' '_')"  # a step name may hold '.' or '-'
  t=${!var:-$t}
  local t0=$(date +%s)
  echo "== $name ($(date +%T), timeout ${t}s)"
  (cd /tmp && timeout --kill-after=10 "$t" "$@") >"$OUT/$name.log" 2>&1
  local r=$?
  RC[$name]="rc=$r $(( $(date +%s) - t0 ))s$([[ $r == 124 || $r == 137 ]] && echo ' TIMEOUT')"
  ORDER+=("$name")
  grep -E "^\[(PASS|FAIL|INFO)\]|^(FAILED|ERROR)|[0-9]+ (passed|failed|deselected)|Error" "$OUT/$name.log" \
    | tail -n "${TAIL:-12}"
  echo "== $name: ${RC[$name]}"
}
# pytest from /tmp: the installed wheel is imported, and the repo's conftest / rootdir settings are not used
pyt() { python3 -m pytest -q -p no:cacheprovider --tb=short -rfEs --rootdir=/tmp --durations=5 "$@"; }
export -f pyt
T="$ROOT/tests"  # tests/<package folder>/test_*.py; the GPU ones are marked gpu

describe() {
  cat <<'EOF'
probe          tsct-probe --verify-artifacts (text, cuobjdump from the image's Triton if none on PATH) and --json
all            every GPU test (pytest -m gpu tests/*/test_*_gpu.py), result lines to $OUT/gpu_tests.log; a device
               call of its own (more than 430 s on an H100)
cpu            the torch-version-sensitive CPU tests under the image's torch (compile, reference, quant API, dispatch)
aot            the wheel's Triton cubins load on this GPU (smoke); test_triton_aot_gpu.py; the Triton GLU suite
               (test_triton_glu_gpu.py) with TSCT_TRITON_BACKEND=aot
glu            test_triton_glu_gpu.py -k "$GLU_K" (default all) on the cubins + test_bench_gpu.py
glu-jit        test_triton_glu_gpu.py from the source tree through the image's Triton JIT (PYTHONPATH=python; no install)
kbench         the b1 kernel harness (tools/triton_glu_bench.py: per-kernel profile, graph, host) -> kbench_b1.json
lowbit-ops     test_lowbit_ops_gpu.py: auto takes triton-lowbit, fwd/bwd vs the reference with STE masters,
               torch.compile fullgraph, AOT-only and JIT, quantize_master, CUDA graph
lowbit         test_triton_lowbit_gpu.py on the cubins (TSCT_TRITON_BACKEND=aot; b1_pad left out for time)
lowbit-jit     test_triton_lowbit_gpu.py through JIT on three small cases (rank block 64 at r 16/24/32, multi-K up)
native-dz      test_glu_dz_native_gpu.py: the CUDA glu_bwd_dz against fp32 torch (edge shapes, slices, bits)
native-lowbit  test_glu_lowbit_native_gpu.py: the CUDA low-bit projections against fp64 torch and the Triton kernels
sm120          the sm120-fp4 pieces that run on sm_90: library / manifest / status smoke and native_quant self-test,
               the grouped activation quantizer bit-exact, the forward with the MMA emulated, the probe's reasons,
               the linked CuTeDSL entry on sm_90 failing cleanly in a child process (context intact), the
               first-use self-test machinery (test_sm120_firstuse_gpu.py)
proxy          the sm_120 proxy build (docs/decisions/0017; a wheel built with TSCT_TRITON_AOT_ARCHS=sm_120_proxy_sm90,
               WHEEL_DIR=dist-proxy): checks it is one, runs the GPU suite through it (bf16 and low-bit, fwd and bwd,
               b1 and the edge shapes; test_sm120_proxy_gpu.py first) with a launch ledger, the replayed eager calls
               (test_replay_gpu.py), the opt-in byte-plane down projection, b1 timing labelled PROXY, and the
               per-kernel verdicts -> proxy_verdicts.txt
bench          tsct-bench --preset b1, arms $ARMS (default padded-bmm,tsct-bmm-*,tsct-triton-*,tsct-sm120-*),
               formats $FORMATS (default bf16,nvfp4,sign) -> bench_b1.json and bench_b1.png (matplotlib permitting)
perf           device time per kernel and CUDA-graph replay of the b1 passes (tools/triton_lowbit_perf.py) -> perf.json
sweep          scripts/pass_profile.py sweep: per-kernel device time for each config in $CFGS and each
               TSCT_CUDA_KERNELS setting in $CUDA_SWEEP (default none;auto) -> sweep.json
hostprof       scripts/pass_profile.py host: host issue time per eager call and its cProfile tables
hostprof-ab    the same host time on wheels built here and carried (RUNS="DIR ...", as wheel-ab), interleaved over
               $ROUNDS rounds (default 2)
replay         replayed eager calls (TSCT_EAGER_REPLAY): their bits against the path's (test_replay_gpu.py), then the
               eager pass's host time with the replay off and on, interleaved over $ROUNDS rounds (default 2)
bwd            the backward at scale and the bmm path on the wheel: test_bwd_scale_gpu.py (skew, E 16384, T 65536,
               bits twice, two chunk sizes), test_glu_dz_native_gpu.py, test_bmm_gpu.py
bmmprof        tools/bmm_profile.py: the bmm path's eager calls (host read, kernels, device time) and its decode
scale          tsct-bench --sweep $SWEEP (default all) at b1, arms $ARMS (default padded-bmm,tsct-triton-*),
               formats $FORMATS (default bf16,nvfp4) -> sweep.json and sweep.png
bwd-ab         the backward's schedule A/B through Triton JIT from source trees (scripts/bwd_scale_timing.py,
               graph ms at $SHAPES, default b1,b1_zipf12,e256,t65536): "old" = build/old_tree (`git archive <commit>
               python | tar -x -C build/old_tree`, carried) with build/old_native if carried, "new" = this tree with
               build/native (scripts/build_native.sh), "new-tdz" = this tree without the CUDA dz
               (TSCT_CUDA_KERNELS=none); then a table, the runs in $OUT/ab_runs.json
wheel-ab       the same timer on wheels built here and carried (RUNS="DIR[:OPT...] ...": p profile, tl timeline of a
               graph replay, tdz the Triton dz, noside tsct.config.side_stream off, b1 two shapes, NAME=INT a tile
               override), interleaved in one call; then the same table and file
bwd-chunks     the same timer at b1 Zipf 1.2 / 1.5 over SharedTiles.chunk_bwd (256 .. 2048) and fs_dwd (8, 32)
nn             test_nn_experts_gpu.py: the expert layers on the kernel paths against the fp32 padded bmm, STE layers,
               make_graphed_callables, torch.compile, counts without host syncs
train          examples/train_moe_lm.py --preset gpu --require-gate: the training A/B (TRAIN_STEPS steps, else
               TRAIN_BUDGET seconds, default 220) -> <date>_<gpu>_moe-lm_<commit>.json (+ .png with matplotlib)
ep             test_nn_parallel_gpu.py: expert parallelism and FSDP2 over NCCL (needs 2 GPUs)
ep-run         scripts/ep_run.py: expert parallelism at b1 per GPU, timed by phase, 2 GPUs then 1 -> ep_run_w{2,1}.json
EOF
}

install_wheel() {
  local whl
  whl=$(ls -t "$ROOT/${WHEEL_DIR:-dist}"/tsct-*.whl 2>/dev/null | head -n 1)
  [[ -n "$whl" ]] || { echo "no ${WHEEL_DIR:-dist}/tsct-*.whl: build it (ci/build_wheel.sh) and carry it"; exit 3; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/gpu.txt" 2>&1
  python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
    || { tail -n 20 "$OUT/install.log"; echo "install of $whl failed"; exit 3; }
  local sp
  sp=$(cd /tmp && python3 -c "import os, tsct; print(os.path.dirname(tsct.__file__))")
  for f in ${OVERLAY:-}; do
    local rel=${f#python/tsct/}
    mkdir -p "$sp/$(dirname "$rel")" && cp "$ROOT/$f" "$sp/$rel" && echo "overlay $rel"
  done
  (cd /tmp && python3 - <<'PY') 2>&1 | tee "$OUT/versions.txt"
import importlib.util, json, sys, torch, tsct
from tsct import native
from tsct.kernels import aot
cap = tuple(torch.cuda.get_device_capability())
tv = importlib.util.find_spec("triton") and __import__("triton").__version__
arch = aot.artifact_arch(cap)
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton (image)", tv, "| tsct", tsct.__file__,
      getattr(tsct, "__git_commit__", "?"))
print("device", torch.cuda.get_device_name(), cap, "| native:", native.available(), native.load_error() or "",
      "| Triton cubins:", arch, sum(aot.summary().get(arch, {}).values()) if arch else 0,
      "| PROXY BUILD: " + json.dumps(aot.proxy(arch)) if arch and aot.proxy(arch) else "")
PY
}

cuobjdump_env() {  # the artifact check needs cuobjdump: PATH, else the one the image's Triton bundles
  command -v cuobjdump >/dev/null && return
  local c
  c=$(cd /tmp && python3 -c "import os, triton
print(os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump'))" 2>/dev/null)
  [[ -n "$c" && -x "$c" ]] && export CUOBJDUMP="$c"
}

stage_probe() {
  cuobjdump_env
  step probe 90 bash -c "tsct-probe --verify-artifacts > '$OUT/probe.txt' 2>&1; r=\$?; tail -n 25 '$OUT/probe.txt'; \
    tsct-probe --json > '$OUT/probe.json' 2>/dev/null; exit \$r"
}

stage_all() {
  step all 560 env TSCT_GPU_LOG="$OUT/gpu_tests.log" bash -c "pyt -s -m gpu '$T'/*/test_*_gpu.py"
}

stage_cpu() {
  step cpu 200 bash -c "pyt '$T/ops/test_compile.py' '$T/ops/test_ops_reference.py' '$T/quant/test_quant_api.py' \
    '$T/package/test_dispatch.py'"
}

stage_aot() {
  step aot-smoke 60 python3 - <<'PY'
import importlib.util, torch, tsct
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
  step aot-tests 120 env TSCT_TRITON_BACKEND=aot bash -c "pyt -s '$T/kernels/test_triton_aot_gpu.py'"
  step aot-glu 240 env TSCT_TRITON_BACKEND=aot TSCT_TRITON_GLU_CFG="$CFG" bash -c "pyt '$T/kernels/test_triton_glu_gpu.py'"
}

stage_glu() {
  step glu 240 env TSCT_TRITON_BACKEND=aot TSCT_TRITON_GLU_CFG="$CFG" bash -c \
    "pyt '$T/kernels/test_triton_glu_gpu.py' -k '${GLU_K:-}' '$T/bench/test_bench_gpu.py'"
}

stage_glu-jit() {
  step glu-jit 300 env PYTHONPATH="$ROOT/python" bash -c "cd '$ROOT' && pyt tests/kernels/test_triton_glu_gpu.py"
}

stage_kbench() {
  step kbench 120 python3 "$ROOT/tools/triton_glu_bench.py" --no-baseline --json "$OUT/kbench_b1.json" \
    ${BENCH_VARIANTS:+--variants "$BENCH_VARIANTS"}
}

stage_lowbit-ops() {
  step lowbit-ops 160 env TSCT_TRITON_GLU_CFG="$CFG" bash -c "pyt '$T/ops/test_lowbit_ops_gpu.py'"
}

stage_lowbit() {
  step lowbit 240 env TSCT_TRITON_BACKEND=aot TSCT_TRITON_GLU_CFG="$CFG" bash -c \
    "pyt '$T/kernels/test_triton_lowbit_gpu.py' -k 'not b1_pad'"
}

stage_lowbit-jit() {
  step lowbit-jit 90 env TSCT_TRITON_BACKEND=jit bash -c \
    "pyt '$T/kernels/test_triton_lowbit_gpu.py' -k 'f37_empty or one_row_experts or top4_f129'"
}


stage_native-dz() {
  step native-dz 120 bash -c "pyt '$T/native/test_glu_dz_native_gpu.py'"
}

stage_native-lowbit() {
  step native-lowbit 120 env TSCT_TRITON_GLU_CFG="$CFG" bash -c "pyt '$T/native/test_glu_lowbit_native_gpu.py'"
}

stage_sm120() {
  step sm120-smoke 90 python3 - <<'PY'
import torch, tsct
from tsct import dispatch, native, selftest
from tsct.kernels import sm120_fp4
cap = torch.cuda.get_device_capability()
print("tsct", tsct.__file__, "| torch", torch.__version__, "| capability", cap)
print("native:", native.available(), native.load_error() or "", "| abi", native.build_info()["abi_version"])
cd = native.build_info().get("cutedsl")
print("cutedsl in manifest:", None if cd is None else (cd["dsl"], cd["arch"], [k["name"] for k in cd["kernels"]]))
print("tsct_sm120_built:", native.sm120_built())
for k in ("tsctk_nvfp4_rows_amax_bf16", "tsctk_nvfp4_rows_quantize_bf16", "tsctk_nvfp4_rows_finalize"):
    print("kernel_available", k, native.kernel_available(k))
print("sm120-fp4 status here:", dispatch.status(dispatch.SM120_FP4, cap, "nvfp4"))
print("auto for nvfp4 here:", dispatch.decide(cap, "nvfp4"))
for r in selftest.native_quant(torch.device("cuda")):
    print(("[PASS]" if r.ok else "[FAIL]"), r.name, r.detail)
    assert r.ok, r
assert cd is not None and native.sm120_built(), "the wheel has no CuTeDSL kernels"
PY
  step sm120-quant-rows 150 env TSCT_GPU_LOG="$OUT/quant_rows.txt" bash -c "pyt -s '$T/kernels/test_sm120_quant_rows_gpu.py'"
  step sm120-emulated 120 env TSCT_GPU_LOG="$OUT/fp4_emulated.txt" bash -c \
    "pyt -s '$T/kernels/test_sm120_fp4_emulated_gpu.py' '$T/native/test_native_quant_gpu.py'"
  step sm120-firstuse 120 env TSCT_GPU_LOG="$OUT/firstuse.txt" bash -c "pyt -s '$T/package/test_sm120_firstuse_gpu.py'"
  step sm120-probe 60 bash -c "tsct-probe --no-selftest > '$OUT/sm120_probe.txt' 2>&1; r=\$?; \
    grep -E 'sm120-fp4|cc 9.0|cutedsl' '$OUT/sm120_probe.txt' | head -n 12; exit \$r"
  # the linked CuTeDSL entry on a non-sm_120 GPU: an error (no kernel image), not a crash; the context stays usable
  step sm120-entry 60 python3 - <<'PY'
import torch
from tsct import native
from tsct.emulation import plan
dev = torch.device("cuda")
e, m, k, n = 2, 40, 64, 128
offs = torch.tensor([15, 40], dtype=torch.int32, device=dev)
x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
codes, sfa, sfo, s_enc = native.nvfp4_quantize_rows_grouped(x, offs, m_alloc=m + 31)
p = plan.make_plan(offs, m, n, k, tile_m=32, tile_n=128)
b = torch.zeros(e, n, k // 2, dtype=torch.uint8, device=dev)
sfb = torch.zeros(e, plan.sfb_bytes(1, n, k), dtype=torch.uint8, device=dev)
c = torch.zeros(m, n // 2, dtype=torch.bfloat16, device=dev)
ep = torch.ones(e, n // 2, device=dev)
try:
    native.sm120_nvfp4_grouped("glu", codes, b, sfa, sfo, sfb, c, offs, p.tile_expert, p.tile_row,
                               torch.ones(e, device=dev), ep, ep)
    torch.cuda.synchronize()
    raise SystemExit(f"UNEXPECTED: the sm_120a kernel launched on {torch.cuda.get_device_capability()}")
except RuntimeError as err:
    print("expected error:", str(err)[:300])
y = native.nvfp4_quantize_rows_grouped(x, offs)[0]  # the context must still work
torch.cuda.synchronize()
print("CUDA context usable afterwards:", bool(y.numel()))
PY
}

stage_proxy() {
  cuobjdump_env
  # 1. this install is the sm_120 proxy build, its artifacts match its manifest, and the probe says so; the probe's
  #    self-tests (each path against float64, the first-use self-test's problem included) run through the proxy
  step proxy-check 30 python3 - <<'PY'
import sys, torch
from tsct.kernels import aot
arch = aot.artifact_arch(tuple(torch.cuda.get_device_capability()))
p = aot.proxy(arch) if arch else None
print("Triton cubins for this GPU:", arch, p)
sys.exit(0 if p else "not a proxy build: build the wheel with TSCT_TRITON_AOT_ARCHS=sm_120_proxy_sm90")
PY
  step proxy-artifacts 60 python3 -m tsct.native.artifacts
  step proxy-probe 90 bash -c "tsct-probe > '$OUT/proxy_probe.txt' 2>&1; r=\$?; \
    grep -E 'PROXY|proxy|pass|FAIL' '$OUT/proxy_probe.txt' | cut -c1-160 | head -n 24; exit \$r"
  # 2. the GPU suite through the proxy cubins, nothing JITs (the jit tests and b1_pad in low-bit left out); a ledger of
  #    every launch per test (tests/_launch_ledger.py): the per-kernel verdicts come from it
  local L="$OUT/proxy_ledger.json"
  rm -f "$L"
  local LEDGER=(env TSCT_LAUNCH_LEDGER="$L" PYTHONPATH="$T")
  step proxy-suite 300 "${LEDGER[@]}" TSCT_TRITON_BACKEND=aot bash -c "pyt -p _launch_ledger \
    '$T/kernels/test_sm120_proxy_gpu.py' '$T/kernels/test_triton_glu_gpu.py' '$T/kernels/test_triton_lowbit_gpu.py' \
    '$T/ops/test_sort_by_expert_gpu.py' '$T/kernels/test_triton_aot_gpu.py' \
    -k 'not jit and not (b1_pad and (nvfp4 or sign or mixed))${PROXY_K:+ and ($PROXY_K)}'"
  if [[ -n ${PROXY_K:-} ]]; then  # a run for kernels whose source changed: the suite's subset, then the verdicts
    step proxy-verdicts 30 python3 "$ROOT/scripts/proxy_verdicts.py" "$L" --out "$OUT/proxy_verdicts.txt"
    cat "$OUT/proxy_verdicts.txt" 2>/dev/null | head -n 40
    return
  fi
  # 3. the op through tsct.ops (auto mode, as users call it; the dense-gate mix has no cubins and would JIT: left out,
  #    and the ledger counts any JIT launch apart), and its replayed eager calls against the path's bits
  step proxy-ops 150 "${LEDGER[@]}" bash -c "pyt -p _launch_ledger '$T/ops/test_lowbit_ops_gpu.py' \
    '$T/kernels/test_replay_gpu.py' -k 'not jit and not dense_gate'"
  # 4. b1 through the proxy cubins: the whole pass, % of this GPU's bytes floor, labelled PROXY
  step proxy-bench 90 env TSCT_TRITON_BACKEND=aot TSCT_BENCH_GIT_COMMIT="${COMMIT:-unknown}" tsct-bench --preset b1 \
    --arms 'tsct-triton-bf16-*,tsct-triton-lowbit-nvfp4,tsct-triton-lowbit-sign' --formats bf16,nvfp4,sign \
    --iters 10 --max-seconds 1 --json "$OUT/proxy_b1.json"
  # 5. sm_120's opt-in byte-plane down projection (TSCT_TRITON_GLU_CFG=planes_down_lb=1, shipped in its table)
  step proxy-planes-down 150 "${LEDGER[@]}" TSCT_TRITON_BACKEND=aot TSCT_TRITON_GLU_CFG=planes_down_lb=1 bash -c \
    "pyt -p _launch_ledger '$T/kernels/test_triton_lowbit_gpu.py' -k '(b1 and not b1_pad) or f37_empty or top4_f129 or r100'"
  # 6. the per-kernel verdicts and the record for tsct.kernels.sm120_proxy.RUNS
  step proxy-verdicts 30 python3 "$ROOT/scripts/proxy_verdicts.py" "$L" --bench "$OUT/proxy_b1.json" \
    --out "$OUT/proxy_verdicts.txt"
  cat "$OUT/proxy_verdicts.txt" 2>/dev/null | head -n 40
}

stage_bench() {
  step bench 200 env TSCT_TRITON_GLU_CFG="$CFG" TSCT_BENCH_GIT_COMMIT="${COMMIT:-unknown}" python3 -m tsct.bench \
    --preset b1 --arms "${ARMS:-padded-bmm,tsct-bmm-*,tsct-triton-*,tsct-sm120-*}" \
    --formats "${FORMATS:-bf16,nvfp4,sign}" --iters 30 --max-seconds 3 --json "$OUT/bench_b1.json" \
    $(python3 -c "import matplotlib" 2>/dev/null && echo --plot "$OUT/bench_b1.png")
  tail -n 30 "$OUT/bench.log"
}

stage_perf() {
  step perf 200 python3 "$ROOT/tools/triton_lowbit_perf.py" --label wheel --fmts "${FORMATS:-bf16,nvfp4,sign}" \
    --json "$OUT/perf.json"
}

stage_sweep() {
  step sweep 150 python3 "$ROOT/scripts/pass_profile.py" sweep --arms "${SWEEP_ARMS:-nvfp4,sign}" \
    --cfgs "${CFGS:-}" --cuda-kernels "${CUDA_SWEEP:-none;auto}" --json "$OUT/sweep.json"
}

stage_hostprof() {
  step hostprof 150 python3 "$ROOT/scripts/pass_profile.py" host --arms "${SWEEP_ARMS:-nvfp4,sign,bf16-kmajor}" \
    --n 30 --top 40
}

stage_replay() {
  step replay-test 240 bash -c "pyt '$T/kernels/test_replay_gpu.py'"
  local r v
  rm -f "$OUT"/replay-host-*.log
  for r in $(seq "${ROUNDS:-2}"); do
    for v in 0 1; do
      step "replay-host-$r-$v" 150 env TSCT_EAGER_REPLAY=$v python3 "$ROOT/scripts/pass_profile.py" host \
        --arms "${SWEEP_ARMS:-nvfp4,sign,bf16-kmajor}" --n 30 --top 0
    done
  done
  grep -H -E "^== |isolated" "$OUT"/replay-host-*.log
}

stage_bwd() {
  step bwd 330 bash -c "pyt '$T/kernels/test_bwd_scale_gpu.py' '$T/native/test_glu_dz_native_gpu.py' '$T/bmm/test_bmm_gpu.py'"
}

stage_bmmprof() {
  step bmmprof 150 python3 "$ROOT/tools/bmm_profile.py"
}

stage_scale() {
  local sweeps=()
  for a in ${SWEEP:-all}; do sweeps+=(--sweep "$a"); done
  step scale 560 env TSCT_BENCH_GIT_COMMIT="${COMMIT:-unknown}" python3 -m tsct.bench --preset b1 "${sweeps[@]}" \
    --arms "${ARMS:-padded-bmm,tsct-triton-*}" --formats "${FORMATS:-bf16,nvfp4}" --iters 20 --max-seconds 1.5 \
    --json "$OUT/sweep.json" $(python3 -c "import matplotlib" 2>/dev/null && echo --plot "$OUT/sweep.png")
  tail -n 40 "$OUT/scale.log"
}

# Triton JIT from a source tree (stages bwd-ab, bwd-chunks): PYTHONPATH first, so the installed wheel is not used
jit_new() {
  local n=()
  [[ -f "$ROOT/build/native/libtsct_kernels.so" ]] && n=(TSCT_NATIVE_LIB="$ROOT/build/native")
  echo env PYTHONPATH="$ROOT/python:$ROOT/tests" TSCT_TRITON_BACKEND=jit "${n[@]}"
}

ab_table() {  # one row per (shape, arm), one column per run: graph fwd / fwd+bwd ms from $OUT/time_*.json; then the
  # runs in one file, $OUT/ab_runs.json (the device returns few files per call), in place of the per-run ones
  python3 - "$OUT" <<'PY'
import datetime, json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("time_*.json"), key=lambda p: p.stat().st_mtime)  # in run order
runs = [json.loads(p.read_text()) for p in files]
if runs:
    (pathlib.Path(sys.argv[1]) / "ab_runs.json").write_text(json.dumps(
        {"device": runs[0].get("device"), "date": datetime.date.today().isoformat(), "runs": runs}, indent=1))
    for p in files:
        p.unlink()
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
PY
}

# wheel_site DIR: the tsct wheel in the checkout folder DIR unpacked once into /tmp/wheel_ab/<DIR> (imported through
# PYTHONPATH; one install per folder, two may share a basename); SITE is that folder, empty when the install failed
# (a failed step of the summary)
wheel_site() {
  SITE="/tmp/wheel_ab/${1//[^A-Za-z0-9._-]/_}"
  [[ -d "$SITE" ]] && return 0
  step "install-${SITE##*/}" 120 python3 -m pip install -q --no-deps --no-index --target "$SITE" "$ROOT/$1"/tsct-*.whl
  [[ ${RC[install-${SITE##*/}]} == rc=0* ]] || { rm -rf "$SITE"; SITE=""; }
}

stage_wheel-ab() {
  # the same timer on installed wheels, interleaved in one process tree: RUNS="DIR[:OPT...] ...", DIR a folder of the
  # checkout holding one tsct wheel (each unpacked once into /tmp, imported through PYTHONPATH); OPT: p (also the
  # per-kernel profile), tl (also the kernel timeline of a graph replay), tdz (TSCT_CUDA_KERNELS=none), noside
  # (tsct.config.side_stream off), b1 (shapes b1 and b1_zipf12 only), NAME=INT[,NAME=INT] (a TSCT_TRITON_GLU_CFG
  # override). Shapes $SHAPES (default b1,b1_zipf12,e4096,e16384).
  local timer="$ROOT/scripts/bwd_scale_timing.py" i=0 spec
  rm -f "$OUT"/time_*.json "$OUT"/ab_runs.json
  for spec in ${RUNS:?"RUNS=\"DIR[:OPT...] ...\" names the wheels (stage wheel-ab)"}; do
    local parts w o lab prof=() cuda=auto shapes=${SHAPES:-b1,b1_zipf12,e4096,e16384} cfg=""
    IFS=: read -r -a parts <<< "$spec"
    w=${parts[0]}; i=$((i + 1)); lab=${w//\//-}
    wheel_site "$w"
    [[ -n $SITE ]] || continue
    for o in "${parts[@]:1}"; do
      case $o in
        p) prof+=(--profile) ;;
        tl) prof+=(--timeline) ;;
        tdz) cuda=none; lab="$lab-tdz" ;;
        noside) prof+=(--side-stream off); lab="$lab-noside" ;;
        b1) shapes=b1,b1_zipf12 ;;
        *=*) cfg=$o; lab="$lab-${o//[=,]/-}" ;;
        *) echo "wheel-ab: unknown option '$o' in '$spec' (p, tl, tdz, noside, b1, NAME=INT)"; exit 2 ;;
      esac
    done
    lab="$i-${lab//[^A-Za-z0-9-]/-}"
    step "ab-$lab" 200 env PYTHONPATH="$SITE" TSCT_CUDA_KERNELS=$cuda \
      TSCT_TRITON_GLU_CFG="$cfg" python3 "$timer" --label "$lab" --shapes "$shapes" --arms "${SWEEP_ARMS:-bf16-kmajor,nvfp4,sign}" \
      "${prof[@]}" --json "$OUT/time_$lab.json"
  done
  ab_table
}

stage_hostprof-ab() {
  # the hostprof stage's host time of an eager pass on wheels built here and carried (RUNS="DIR ...", as wheel-ab),
  # interleaved over $ROUNDS rounds (default 2), arms $SWEEP_ARMS; then each run's per-arm lines
  local r w f
  rm -f "$OUT"/hostprof-ab-*.log
  for r in $(seq "${ROUNDS:-2}"); do
    for w in ${RUNS:?"RUNS=\"DIR ...\" names the wheels (stage hostprof-ab)"}; do
      wheel_site "$w"
      [[ -n $SITE ]] || continue
      step "hostprof-ab-$r-${w//[^A-Za-z0-9-]/-}" 150 env PYTHONPATH="$SITE" python3 "$ROOT/scripts/pass_profile.py" \
        host --arms "${SWEEP_ARMS:-nvfp4,sign,bf16-kmajor}" --n 30 --top 0
    done
  done
  for f in "$OUT"/hostprof-ab-*.log; do
    [[ -f $f ]] && { echo "${f##*/}"; grep -E "^== |isolated" "$f"; }
  done
}

stage_bwd-ab() {
  local shapes=${SHAPES:-b1,b1_zipf12,e256,t65536} timer="$ROOT/scripts/bwd_scale_timing.py"
  rm -f "$OUT"/time_*.json "$OUT"/ab_runs.json
  if [[ -d "$ROOT/build/old_tree/python" ]]; then
    local old=/nonexistent
    [[ -f "$ROOT/build/old_native/libtsct_kernels.so" ]] && old="$ROOT/build/old_native"
    step time-old 200 env PYTHONPATH="$ROOT/build/old_tree/python" TSCT_TRITON_BACKEND=jit TSCT_NATIVE_LIB="$old" \
      python3 "$timer" --label old --shapes "$shapes" --json "$OUT/time_old.json"
  fi
  step time-new 200 $(jit_new) python3 "$timer" --label new --shapes "$shapes" --json "$OUT/time_new.json"
  if [[ -f "$ROOT/build/native/libtsct_kernels.so" ]]; then
    step time-new-tdz 200 $(jit_new) TSCT_CUDA_KERNELS=none python3 "$timer" --label new-tdz \
      --shapes "$shapes" --arms bf16-kmajor --json "$OUT/time_new_tdz.json"
  fi
  ab_table
}

stage_bwd-chunks() {
  local cfg
  for cfg in chunk_bwd=256 chunk_bwd=512 chunk_bwd=1024 chunk_bwd=2048 fs_dwd=8 fs_dwd=32; do
    step "chunks-${cfg/=/-}" 60 $(jit_new) TSCT_TRITON_GLU_CFG="$cfg" python3 "$ROOT/scripts/bwd_scale_timing.py" \
      --label "$cfg" --shapes b1_zipf12,b1_zipf15 --json "$OUT/chunks_${cfg/=/_}.json"
  done
}

stage_nn() {
  step nn 300 env PYTHONPATH="$ROOT/tests" bash -c "pyt --durations=8 '$T/nn/test_nn_experts_gpu.py'"
}

stage_train() {
  local len=(--time-budget "${TRAIN_BUDGET:-220}")
  [[ -n ${TRAIN_STEPS:-} ]] && len=(--time-budget 0 --steps "$TRAIN_STEPS")
  step train $(( ${TRAIN_BUDGET:-220} + 150 )) python3 "$ROOT/examples/train_moe_lm.py" --preset gpu "${len[@]}" \
    --out "$OUT" --require-gate
}

stage_ep() {
  step ep 420 env PYTHONPATH="$ROOT/tests" bash -c "pyt '$T/nn/test_nn_parallel_gpu.py'"
}

stage_ep-run() {
  local run=(env TSCT_BENCH_GIT_COMMIT="${COMMIT:-}" python3 "$ROOT/scripts/ep_run.py")
  step ep-run 300 "${run[@]}" --world 2 --json "$OUT/ep_run_w2.json"
  tail -n 3 "$OUT/ep-run.log"
  step ep-run-w1 240 "${run[@]}" --world 1 --json "$OUT/ep_run_w1.json"
  tail -n 2 "$OUT/ep-run-w1.log"
}

if [[ $# == 0 || $1 == --list || $1 == -h || $1 == --help ]]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"
  echo
  describe
  [[ $# == 0 ]] && exit 2 || exit 0
fi
for s in "$@"; do
  declare -F "stage_$s" >/dev/null || { echo "unknown stage '$s'; stages:"; describe | grep -oE '^[a-z0-9-]+'; exit 2; }
done
# the stages that run the source tree through Triton JIT need no wheel: install only if another stage is asked for
needs_wheel=""
for s in "$@"; do
  [[ $s == glu-jit || $s == bwd-ab || $s == wheel-ab || $s == hostprof-ab || $s == bwd-chunks ]] || needs_wheel=1
done
if [[ -z ${NO_INSTALL:-} && -n $needs_wheel ]]; then
  install_wheel
fi
for s in "$@"; do
  "stage_$s"
done
echo "== summary ($(( $(date +%s) - t_start )) s, logs in $OUT) =="
rc=0
for s in "${ORDER[@]}"; do
  echo "  $s: ${RC[$s]}"
  [[ "${RC[$s]}" == rc=0* ]] || rc=1
done
exit $rc
