#!/usr/bin/env bash
# Device script for issue 5 (sm_120 NVFP4 path) on the lent H200 (sm_90), from the repo root, with the
# wheel built on the CPU machine carried in dist/:
#
#   bash scripts/h200_sm120.sh          # device tool: carry ["dist"]; about 2 minutes
#
# What it can show on an H200 (design.md section 6): NOT the sm_120 GEMMs (sm_120a cubins cannot run on
# sm_90), but
# 1. the wheel with the CuTeDSL objects linked in installs, imports, loads (ABI 3) and reports them;
# 2. the grouped activation quantizer (CUDA, built for every arch) is BIT-EXACT against the torch
#    reference (tests/gpu/test_sm120_quant_rows_gpu.py: codes, swizzled scales incl. padding, s_enc;
#    random, heavy-tailed, nan/inf, empty experts, gather, col_scale, b1 size; CUDA graph; side stream);
# 3. the existing quantize/decode kernels still match torch in the new library (selftest.native_quant);
# 4. the sm120-fp4 forward with everything real except the MMA kernels (emulated in their place:
#    tests/gpu/test_sm120_fp4_emulated_gpu.py): bit-identical to the CPU run, deterministic combine,
#    the first-use self-test harness passes;
# 5. off sm_120, dispatch/probe say why sm120-fp4 cannot run;
# 6. in a separate process: calling the linked CuTeDSL entry on sm_90 returns an error (no kernel image),
#    it does not crash, and the CUDA context stays usable.
# Logs go to $OUT. Exit status: the first failing stage's.
set -u -o pipefail
OUT=${OUT:-/tmp/tsct_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH  # the installed wheel, never python/ of the checkout
rc=0
note() { echo "== $* ($(date +%T))"; }

note "install"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
whl=$(ls -t dist/tsct-*.whl | head -n 1)
python3 -m pip install --no-deps --no-index --force-reinstall "$whl" >"$OUT/install.log" 2>&1 \
  || { tail -n 20 "$OUT/install.log"; exit 3; }

note "smoke: library, manifest, sm120-fp4 status"
(cd /tmp && python3 - <<'PY') 2>&1 | tee "$OUT/smoke.txt"
import torch, tsct
from tsct import dispatch, native
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
from tsct import selftest
for r in selftest.native_quant(torch.device("cuda")):
    print(("PASS" if r.ok else "FAIL"), r.name, r.detail)
    assert r.ok, r
assert cd is not None and native.sm120_built(), "the wheel has no CuTeDSL kernels"
PY
r=${PIPESTATUS[0]}; [[ $rc == 0 ]] && rc=$r; echo "rc=$r"

note "quantizer bit-exactness (tests/gpu/test_sm120_quant_rows_gpu.py)"
TSCT_GPU_LOG="$OUT/quant_rows.txt" timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -s \
  tests/gpu/test_sm120_quant_rows_gpu.py >"$OUT/tests_quant_rows.log" 2>&1
r=$?; [[ $rc == 0 ]] && rc=$r
grep -E "^\[(PASS|FAIL|INFO)\]|passed|failed|error|^FAILED|^ERROR" "$OUT/tests_quant_rows.log" | tail -n 40
echo "rc=$r"

note "sm120-fp4 forward with emulated MMA (tests/gpu/test_sm120_fp4_emulated_gpu.py)"
TSCT_GPU_LOG="$OUT/fp4_emulated.txt" timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -s \
  tests/gpu/test_sm120_fp4_emulated_gpu.py >"$OUT/tests_fp4_emulated.log" 2>&1
r=$?; [[ $rc == 0 ]] && rc=$r
grep -E "^\[(PASS|FAIL|INFO)\]|passed|failed|error|^FAILED|^ERROR" "$OUT/tests_fp4_emulated.log" | tail -n 20
echo "rc=$r"

note "probe (no self-tests)"
(cd /tmp && timeout 60 tsct-probe --no-selftest) >"$OUT/probe.txt" 2>&1
grep -E "sm120-fp4|cc 9.0|cutedsl" "$OUT/probe.txt" | head -n 12

note "the CuTeDSL entry on sm_90: must return an error, not crash (separate process)"
(cd /tmp && timeout 60 python3 - <<'PY') 2>&1 | tee "$OUT/sm120_entry_on_sm90.txt"
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
    print("UNEXPECTED: the sm_120a kernel launched on", torch.cuda.get_device_capability())
except RuntimeError as err:
    print("expected error:", str(err)[:300])
y = native.nvfp4_quantize_rows_grouped(x, offs)[0]  # the context must still work
torch.cuda.synchronize()
print("CUDA context usable afterwards:", bool(y.numel()))
PY
r=${PIPESTATUS[0]}; [[ $rc == 0 ]] && rc=$r; echo "rc=$r"

note "done rc=$rc"
exit "$rc"
