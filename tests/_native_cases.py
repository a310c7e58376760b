"""Test inputs and bitwise comparisons shared by the native-kernel tests (CPU harness and GPU).

``quant_cases()`` is the case matrix the CUDA quantize/decode kernels are checked on against the
torch reference (``tsct.quant`` with ``backend="torch"``): logical factors ``[E, K, N]`` / ``[K, N]``
(K = contraction dim, stored K-contiguous), built on the CPU with a seeded generator so every run
and every machine sees the same values. Kept with the tests, outside the installed package.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor


class Case(NamedTuple):
    name: str
    shape: tuple[int, ...]             # logical shape, [E, K, N] or [K, N]
    make: Callable[[torch.dtype, torch.Generator], Tensor]  # -> logical tensor of that dtype (CPU)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _per_block_k(shape: tuple[int, ...], g: torch.Generator, fn) -> Tensor:
    """A [.., K, N] tensor constant over each 16-long K block (the NVFP4 block axis), values from fn(n_blocks)."""
    *lead, k, n = shape
    v = fn(torch.Size([*lead, k // 16, 1, n]), g)
    return v.expand(*lead, k // 16, 16, n).reshape(*lead, k, n)


def _normal(shape, scale=1.0):
    return lambda dtype, g: (torch.randn(shape, generator=g) * scale).to(dtype)


def _heavy(shape):
    def make(dtype, g):
        # Student-t with 2 dof: z / sqrt(chi2_2 / 2), chi2_2 / 2 ~ Exp(1) = -log(U).
        z = torch.randn(shape, generator=g, dtype=torch.float64)
        u = torch.rand(shape, generator=g, dtype=torch.float64).clamp_min(1e-300)
        t = z / torch.sqrt(-torch.log(u))
        span = 3.0 if dtype == torch.float16 else 30.0  # f16 tops out at 65504
        e = _per_block_k(shape, g, lambda s, g_: torch.empty(s, dtype=torch.float64).uniform_(-span, span, generator=g_))
        return (t * torch.pow(10.0, e)).to(torch.float32).to(dtype)
    return make


def _all_zero(shape):
    def make(dtype, g):
        x = torch.zeros(shape)
        neg = torch.rand(shape, generator=g) < 0.3
        return torch.where(neg, -0.0, x).to(dtype)  # signed zeros must survive as sign-only codes
    return make


def _zero_blocks(shape):
    def make(dtype, g):
        x = torch.randn(shape, generator=g)
        kind = _per_block_k(shape, g, lambda s, g_: torch.randint(0, 4, s, generator=g_))
        x = torch.where(kind == 0, torch.zeros(()), x)
        x = torch.where(kind == 1, torch.full((), -0.0), x)
        return x.to(dtype)
    return make


def _ties(shape):
    """Blocks whose quotients y land exactly on E2M1 midpoints (and on exact magnitudes).

    The matrix amax is 6, so s_enc = 448 exactly; a block with max 6 gets sf = 448 and y = x; a
    block with max 3 gets sf = 224 and y = 2x; max 1.5 -> sf = 112, y = 4x. All exact in bf16/f16.
    """
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.125, 5.5]

    def make(dtype, g):
        *lead, k, n = shape
        rows = []
        for j in range(k // 16):
            top = [6.0, 3.0, 1.5][j % 3]
            vals = torch.tensor([top] + [m * top / 6.0 for m in mids], dtype=torch.float32)
            sign = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
            sign[0] = 1.0
            rows.append(vals * sign)
        blocks = torch.cat(rows)  # [K]
        x = blocks.reshape(k, 1).expand(*lead, k, n).clone()
        # shuffle within each block per column so ties sit at every nibble position
        perm = torch.stack([torch.randperm(16, generator=g) for _ in range(n)], dim=1)  # [16, N]
        x = x.reshape(*lead, k // 16, 16, n).gather(-2, perm.expand(*lead, k // 16, 16, n)).reshape(*lead, k, n)
        return x.to(dtype)
    return make


def _subnormal(shape):
    """Batch 0: every element a bf16 subnormal (s_enc hits the FLT_MAX clamp); batch 1: normal values
    with whole blocks of subnormals (block scales round to 0 or to UE4M3 subnormals)."""
    def make(dtype, g):
        mant = torch.randint(1, 128, shape, generator=g).to(torch.float32)
        sub = mant * 2.0 ** -133  # bf16 subnormals: m * 2^-133, m in 1..127
        sub = torch.where(torch.rand(shape, generator=g) < 0.5, -sub, sub)
        x = sub.clone()
        normal = torch.randn(shape, generator=g)
        pick = _per_block_k(shape, g, lambda s, g_: torch.rand(s, generator=g_) < 0.5)
        x[1] = torch.where(pick[1], normal[1], sub[1])
        return x.to(dtype)
    return make


def _nonfinite(shape):
    """nan, +inf and -inf sprinkled (about 1%); the last matrix holds no finite value at all."""
    def make(dtype, g):
        x = torch.randn(shape, generator=g)
        r = torch.rand(shape, generator=g)
        x = torch.where(r < 0.004, float("nan"), x)
        x = torch.where((r >= 0.004) & (r < 0.007), float("inf"), x)
        x = torch.where((r >= 0.007) & (r < 0.010), float("-inf"), x)
        x[-1] = torch.where(torch.rand(x[-1].shape, generator=g) < 0.5, float("inf"), float("nan"))
        return x.to(dtype)
    return make


def _saturate(shape):
    """Values at the top of the dtype's range, and blocks far below the matrix amax (UE4M3 scale
    underflow to subnormals and to 0: sign-only codes)."""
    def make(dtype, g):
        top = torch.finfo(dtype).max
        x = torch.randn(shape, generator=g)
        e = _per_block_k(shape, g, lambda s, g_: torch.empty(s).uniform_(-8, 0, generator=g_))
        x = x * torch.pow(10.0, e)
        x[0] = x[0].clamp(-1, 1) * top  # finite, near the max: x * s_enc must not overflow
        return x.to(dtype)
    return make


def quant_cases() -> list[Case]:
    """The case matrix (see the module docstring). Shapes include N = 5461 (not a multiple of 128),
    K/16 = 3 (block-scale padding in both dims), a 2-D factor, and batches > 1."""
    return [
        Case("normal_wdown", (3, 64, 5461), _normal((3, 64, 5461))),
        Case("normal_wgate", (2, 2048, 64), _normal((2, 2048, 64), 0.02)),
        Case("normal_pad", (4, 48, 130), _normal((4, 48, 130))),
        Case("normal_2d", (16, 1), _normal((16, 1))),
        Case("heavy_tailed", (3, 256, 96), _heavy((3, 256, 96))),
        Case("all_zero", (2, 32, 40), _all_zero((2, 32, 40))),
        Case("zero_blocks", (2, 64, 136), _zero_blocks((2, 64, 136))),
        Case("ties", (2, 96, 72), _ties((2, 96, 72))),
        Case("subnormal", (2, 64, 150), _subnormal((2, 64, 150))),
        Case("nonfinite", (3, 64, 200), _nonfinite((3, 64, 200))),
        Case("saturate", (2, 128, 131), _saturate((2, 128, 131))),
    ]


def make_case(case: Case, dtype: torch.dtype, seed: int = 0) -> Tensor:
    return case.make(dtype, _gen(seed + sum(map(ord, case.name))))


def bitwise_mismatch(a: Tensor, b: Tensor) -> str | None:
    """None if a and b have the same dtype, shape and bits (NaNs: same positions, any payload);
    otherwise a short description of the first differences."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape differ: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        diff = (na != nb) | (~na & ~nb & (a.view(bits) != b.view(bits)))
    else:
        diff = a != b
    if not bool(diff.any()):
        return None
    idx = diff.nonzero()[:5].tolist()
    show = [(i, a[tuple(i)].item(), b[tuple(i)].item()) for i in idx]
    if a.is_floating_point() and a.element_size() >= 2:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        show = [(i, x, y, hex(a.view(bits)[tuple(i)].item() & 0xFFFFFFFF), hex(b.view(bits)[tuple(i)].item() & 0xFFFFFFFF))
                for (i, x, y) in show]
    return f"{int(diff.sum())} of {diff.numel()} differ; first: {show}"


def as_bytes(t: Tensor) -> Tensor:
    return t.view(torch.uint8)


# --- checks: a kernel runner against the torch reference ---------------------------------------
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def storage(w: Tensor) -> Tensor:
    """Logical [E, K, N] / [K, N] -> contiguous storage orientation [E, N, K]."""
    return (w if w.dim() == 3 else w.unsqueeze(0)).transpose(-1, -2).contiguous()


def _logical_to_storage(t: Tensor) -> Tensor:
    return (t if t.dim() == 3 else t.unsqueeze(0)).transpose(-1, -2)


def check_nvfp4(runner, w: Tensor, layout: str, s_enc_factor: float = 1.0) -> tuple[dict, dict]:
    """Quantize w with `runner` (tsct.native or the host harness: same four functions) and with the
    torch reference on w's device; decode the reference container with both. Returns
    ({check: mismatch description or None}, stats). s_enc_factor != 1 scales the encode scale
    (reaching the 448 clamp and |y| > 6 saturation), compared against the reference's block step.
    """
    from tsct.quant import nvfp4 as ref_mod

    ref = ref_mod.quantize_nvfp4(w, layout=layout, backend="torch")
    x = storage(w)
    results: dict[str, str | None] = {}
    s_enc = ref.global_scale
    codes_ref, scale_ref = ref.codes, ref.block_scale
    if s_enc_factor != 1.0:
        s_enc = s_enc * s_enc_factor
        codes_ref, scale_ref = ref_mod._quantize_blocks_torch(x, s_enc)
        if layout == "swizzled_128x4":
            from tsct.quant.layout import to_swizzled
            scale_ref = to_swizzled(scale_ref)
    codes, scale = runner.nvfp4_quantize(x, s_enc, layout)
    results["codes"] = bitwise_mismatch(codes, codes_ref)
    results["block_scale"] = bitwise_mismatch(as_bytes(scale), as_bytes(scale_ref))
    b, n, k = x.shape
    for dt in OUT_DTYPES:
        out = runner.nvfp4_dequantize(codes_ref, scale_ref, layout, s_enc, k, dt)
        if s_enc_factor == 1.0:
            exp = _logical_to_storage(ref.dequantize(dt, backend="torch"))
        else:
            lin = scale_ref if layout == "linear" else ref_mod.to_linear(scale_ref, n, k // 16)
            exp = ref_mod._dequantize_blocks_torch(codes_ref, lin, s_enc).to(dt)
        results[f"decode_{str(dt).split('.')[-1]}"] = bitwise_mismatch(out, exp)
    sb = as_bytes(scale_ref)
    nib = torch.stack((codes_ref & 0xF, codes_ref >> 4), -1)
    stats = {
        "blocks": b * n * (k // 16),
        "nan_blocks": int((sb == 0x7F).sum()),
        "zero_scales": int((sb == 0).sum()) - (sb.numel() - b * n * (k // 16)),  # minus swizzle padding
        "sub_scales": int(((sb > 0) & (sb < 8)).sum()),
        "max_codes": int(((nib & 7) == 7).sum()),
    }
    return results, stats


def check_sign(runner, w: Tensor) -> tuple[dict, dict]:
    """Sign pack / decode with `runner` against ``quantize_sign(backend="torch")`` on w's device."""
    from tsct.quant.sign import quantize_sign

    ref = quantize_sign(w, backend="torch")
    x = storage(w)
    results: dict[str, str | None] = {"bits": bitwise_mismatch(runner.sign_pack(x), ref.bits)}
    for dt in OUT_DTYPES:
        out = runner.sign_dequantize(ref.bits, ref.scale_k, ref.scale_n, dt)
        exp = _logical_to_storage(ref.dequantize(dt, backend="torch"))
        results[f"decode_{str(dt).split('.')[-1]}"] = bitwise_mismatch(out, exp)
    from tsct.quant.formats import unpack_bits

    return results, {"elements": x.numel(), "negative": int(unpack_bits(ref.bits).sum()),
                     "nan_scale_k": int(torch.isnan(ref.scale_k).sum())}


def check_fp8(runner, w: Tensor, scale_factor: float = 1.0) -> tuple[dict, dict]:
    """FP8 quantize / decode with `runner` against ``quantize_fp8(backend="torch")`` on w's device.
    scale_factor != 1 scales the column scales (codes saturating at 448, or deep in the E4M3 subnormals),
    compared against the torch encoder on the same scales."""
    from tsct.quant import fp8 as ref_mod
    from tsct.quant.formats import e4m3_encode

    ref = ref_mod.quantize_fp8(w, backend="torch")
    x = storage(w)
    scale, codes_ref = ref.scale_n, as_bytes(ref.codes)
    if scale_factor != 1.0:
        scale = scale * scale_factor
        codes_ref = e4m3_encode(torch.div(x.float(), scale.unsqueeze(2)))
    results: dict[str, str | None] = {"codes": bitwise_mismatch(runner.fp8_quantize(x, scale), codes_ref)}
    for dt in OUT_DTYPES:
        out = runner.fp8_dequantize(codes_ref, scale, dt)
        exp = _logical_to_storage(ref_mod.FP8Tensor(codes_ref.view(torch.float8_e4m3fn), scale, ref.shape)
                                  .dequantize(dt, backend="torch"))
        results[f"decode_{str(dt).split('.')[-1]}"] = bitwise_mismatch(out, exp)
    mag = codes_ref & 0x7F
    return results, {"elements": x.numel(), "nan_codes": int((mag == 0x7F).sum()),
                     "max_codes": int((mag == 0x7E).sum()), "subnormal_codes": int(((mag > 0) & (mag < 8)).sum()),
                     "zero_codes": int((mag == 0).sum())}


def check_ternary(runner, w: Tensor, scaling: str = "absmean") -> tuple[dict, dict]:
    """Ternary pack / decode with `runner` against ``quantize_ternary(backend="torch")`` on w's device (the scales
    are the torch reference's: the kernels encode, pack and decode)."""
    from tsct.quant.formats import unpack_2bit
    from tsct.quant.ternary import quantize_ternary

    ref = quantize_ternary(w, scaling=scaling, backend="torch")
    x = storage(w)
    results: dict[str, str | None] = {"codes": bitwise_mismatch(runner.ternary_pack(x, ref.scale_k, ref.scale_n),
                                                                ref.codes)}
    for dt in OUT_DTYPES:
        out = runner.ternary_dequantize(ref.codes, ref.scale_k, ref.scale_n, dt)
        exp = _logical_to_storage(ref.dequantize(dt, backend="torch"))
        results[f"decode_{str(dt).split('.')[-1]}"] = bitwise_mismatch(out, exp)
    c = unpack_2bit(ref.codes)
    return results, {"elements": x.numel(), "zero": int((c == 0).sum()), "plus": int((c == 1).sum()),
                     "minus": int((c == 3).sum()), "nan": int((c == 2).sum())}


def _fp8_ties(shape):
    """Columns whose amax is 448 (scale 1): x / scale lands exactly on E4M3 values and on the midpoints between
    neighbours (ties to even), in the normal and subnormal ranges, and just above 448 (saturation)."""
    def make(dtype, g):
        *lead, k, n = shape
        codes = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
        mids = (codes[:-1] + codes[1:]) / 2
        pool = torch.cat([codes, mids, -codes, -mids, torch.tensor([464.0, -464.0, 2.0 ** -10, -(2.0 ** -10)])])
        if dtype == torch.float16:  # f16 cannot hold 2^-10 * ... below 2^-24; keep what it can
            pool = pool[pool.abs() >= 2.0 ** -24]
        idx = torch.randint(0, pool.numel(), (*lead, k, n), generator=g)
        x = pool[idx]
        x[..., 0, :] = 448.0  # amax 448 -> scale 1 in every column
        return x.to(dtype)
    return make


def _ternary_ties(shape):
    """Columns with absmean c exactly and elements at c/2 (|y| = 0.5: rounds to 0), 3c/2, c and 0."""
    def make(dtype, g):
        *lead, k, n = shape
        c = torch.exp2(torch.randint(-6, 6, (*lead, 1, n), generator=g).float())
        unit = torch.tensor([0.5, 1.5, 1.0, 1.0])  # mean 1
        base = unit.repeat(k // 4)[torch.randperm(k, generator=g)].reshape(k, 1)
        sign = torch.where(torch.rand((*lead, k, n), generator=g) < 0.5, -1.0, 1.0)
        return (base * c * sign).to(dtype)
    return make


def fp8_cases() -> list[Case]:
    """FP8 cases beyond ``quant_cases()``: K not a multiple of 16 (the scalar tail), and exact ties."""
    return [
        Case("fp8_odd_k", (3, 37, 21), _normal((3, 37, 21))),
        Case("fp8_k20", (2, 20, 5461), _normal((2, 20, 5461), 1e-3)),
        Case("fp8_ties", (2, 64, 48), _fp8_ties((2, 64, 48))),
    ]


def ternary_cases() -> list[Case]:
    """Ternary cases beyond ``quant_cases()``: K a multiple of 4 only, and exact ties at |y| = 1/2."""
    return [
        Case("ternary_k36", (3, 36, 50), _normal((3, 36, 50))),
        Case("ternary_ties", (2, 64, 40), _ternary_ties((2, 64, 40))),
    ]


def summary(tag: str, results: dict, stats: dict) -> str:
    """One line per case for the test log: which checks passed, and what the case exercised."""
    bad = [k for k, v in results.items() if v is not None]
    checks = " ".join(f"{k}={'OK' if v is None else 'MISMATCH'}" for k, v in results.items())
    st = " ".join(f"{k}={v}" for k, v in stats.items())
    return f"[{'PASS' if not bad else 'FAIL'}] {tag}: {checks} | {st}"


# --- the host harness: the kernels' per-item code compiled for the CPU -------------------------
def find_cuda_include() -> str | None:
    """A directory holding cuda_bf16.h / cuda_fp16.h (the harness needs only these headers)."""
    import glob
    import os
    import shutil
    import sys

    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    cands.append("/usr/local/cuda")
    dirs = [os.path.join(c, "include") for c in cands if c]
    for site in sys.path:
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    for d in dirs:
        if os.path.isfile(os.path.join(d, "cuda_bf16.h")) and os.path.isfile(os.path.join(d, "cuda_fp16.h")):
            return d
    return None


def _build_host_tool(repo_root, out_dir, name: str) -> str:
    """Compile csrc/tools/<name>.cpp with the host C++ compiler into <out_dir>/<name>.so.

    Raises RuntimeError (with the compiler output) if it cannot.
    """
    import os
    import shutil
    import subprocess

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    inc = find_cuda_include()
    if not cxx or not inc:
        raise RuntimeError(f"host harness needs a C++ compiler ({cxx}) and CUDA headers ({inc})")
    src = os.path.join(repo_root, "csrc", "tools", f"{name}.cpp")
    out = os.path.join(out_dir, f"{name}.so")
    # IEEE arithmetic as on the GPU: no fast-math, no contraction into FMAs.
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off",
           "-I", os.path.join(repo_root, "csrc"), "-I", os.path.join(repo_root, "csrc", "include"), "-I", inc,
           src, "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return out


def build_host_reference(repo_root, out_dir) -> str:
    """Compile csrc/tools/host_reference.cpp with the host C++ compiler; returns the .so path.

    Raises RuntimeError (with the compiler output) if it cannot.
    """
    return _build_host_tool(repo_root, out_dir, "host_reference")


class HostRunner:
    """tsct.native's quant kernel wrappers (NVFP4, sign, FP8, ternary), run by the host harness on CPU tensors."""

    def __init__(self, path: str):
        import ctypes
        from ctypes import c_int, c_int64, c_void_p

        self._ct = ctypes
        lib = ctypes.CDLL(path)
        lib.tsct_host_nvfp4_quantize.argtypes = [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_void_p, c_int]
        lib.tsct_host_nvfp4_dequantize.argtypes = [c_void_p, c_void_p, c_int, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int]
        lib.tsct_host_sign_pack.argtypes = [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p]
        lib.tsct_host_sign_dequantize.argtypes = [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int]
        lib.tsct_host_fp8_quantize.argtypes = [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_int]
        lib.tsct_host_fp8_dequantize.argtypes = [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p, c_int, c_int]
        lib.tsct_host_ternary_pack.argtypes = [c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_void_p]
        lib.tsct_host_ternary_dequantize.argtypes = [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_int64, c_void_p,
                                                     c_int]
        lib.tsct_host_e4m3_from_f32.argtypes = [c_void_p, c_int64, c_void_p]
        self.lib = lib

    def _p(self, t: Tensor):
        return self._ct.c_void_p(t.data_ptr())

    @staticmethod
    def _poisoned(shape, dtype) -> Tensor:
        t = torch.empty(shape, dtype=dtype)
        t.view(torch.uint8).fill_(0xA5)
        return t

    def nvfp4_quantize(self, x: Tensor, s_enc: Tensor, layout: str):
        from tsct.native._ops import DTYPES, LAYOUTS, swizzled_scale_numel

        x, s_enc = x.contiguous(), s_enc.contiguous()
        b, n, k = x.shape
        codes = self._poisoned((b, n, k // 2), torch.uint8)
        shape = (b, swizzled_scale_numel(n, k)) if LAYOUTS[layout] else (b, n, k // 16)
        scale = self._poisoned(shape, torch.float8_e4m3fn)
        self.lib.tsct_host_nvfp4_quantize(self._p(x), DTYPES[x.dtype], b, n, k, self._p(s_enc), self._p(codes),
                                          self._p(scale), LAYOUTS[layout])
        return codes, scale

    def nvfp4_dequantize(self, codes, block_scale, layout, s_enc, k, out_dtype=torch.bfloat16):
        from tsct.native._ops import DTYPES, LAYOUTS

        codes, block_scale, s_enc = codes.contiguous(), block_scale.contiguous(), s_enc.contiguous()
        b, n, _ = codes.shape
        out = self._poisoned((b, n, k), out_dtype)
        self.lib.tsct_host_nvfp4_dequantize(self._p(codes), self._p(block_scale), LAYOUTS[layout], self._p(s_enc),
                                            b, n, k, self._p(out), DTYPES[out_dtype])
        return out

    def sign_pack(self, w):
        from tsct.native._ops import DTYPES

        w = w.contiguous()
        b, n, k = w.shape
        bits = self._poisoned((b, n, k // 8), torch.uint8)
        self.lib.tsct_host_sign_pack(self._p(w), DTYPES[w.dtype], b, n, k, self._p(bits))
        return bits

    def sign_dequantize(self, bits, a, b_, out_dtype=torch.bfloat16):
        from tsct.native._ops import DTYPES

        bits, a, b_ = bits.contiguous(), a.contiguous(), b_.contiguous()
        nb, n, kb = bits.shape
        out = self._poisoned((nb, n, kb * 8), out_dtype)
        self.lib.tsct_host_sign_dequantize(self._p(bits), self._p(a), self._p(b_), nb, n, kb * 8, self._p(out),
                                           DTYPES[out_dtype])
        return out

    def fp8_quantize(self, x, scale_n, vec: bool = True):
        from tsct.native._ops import DTYPES

        x, scale_n = x.contiguous(), scale_n.contiguous()
        b, n, k = x.shape
        codes = self._poisoned((b, n, k), torch.uint8)
        self.lib.tsct_host_fp8_quantize(self._p(x), DTYPES[x.dtype], b, n, k, self._p(scale_n), self._p(codes),
                                        int(vec))
        return codes

    def fp8_dequantize(self, codes, scale_n, out_dtype=torch.bfloat16, vec: bool = True):
        from tsct.native._ops import DTYPES

        codes, scale_n = codes.contiguous().view(torch.uint8), scale_n.contiguous()
        b, n, k = codes.shape
        out = self._poisoned((b, n, k), out_dtype)
        self.lib.tsct_host_fp8_dequantize(self._p(codes), self._p(scale_n), b, n, k, self._p(out), DTYPES[out_dtype],
                                          int(vec))
        return out

    def ternary_pack(self, x, scale_k, scale_n):
        from tsct.native._ops import DTYPES

        x, scale_n = x.contiguous(), scale_n.contiguous()
        sk = self._ct.c_void_p(None) if scale_k is None else self._p(scale_k.contiguous())
        b, n, k = x.shape
        codes = self._poisoned((b, n, k // 4), torch.uint8)
        self.lib.tsct_host_ternary_pack(self._p(x), DTYPES[x.dtype], b, n, k, sk, self._p(scale_n), self._p(codes))
        return codes

    def ternary_dequantize(self, codes, scale_k, scale_n, out_dtype=torch.bfloat16):
        from tsct.native._ops import DTYPES

        codes, scale_n = codes.contiguous(), scale_n.contiguous()
        scale_k = None if scale_k is None else scale_k.contiguous()
        sk = self._ct.c_void_p(None) if scale_k is None else self._p(scale_k)
        b, n, kb = codes.shape
        out = self._poisoned((b, n, kb * 4), out_dtype)
        self.lib.tsct_host_ternary_dequantize(self._p(codes), sk, self._p(scale_n), b, n, kb * 4, self._p(out),
                                              DTYPES[out_dtype])
        return out

    def e4m3_from_f32(self, v: Tensor) -> Tensor:
        v = v.contiguous().float()
        out = torch.empty(v.shape, dtype=torch.uint8)
        self.lib.tsct_host_e4m3_from_f32(self._p(v), v.numel(), self._p(out))
        return out


def build_host_rows_grouped(repo_root, out_dir) -> str:
    """Compile csrc/tools/host_rows_grouped.cpp (the grouped activation quantizer's per-item code on
    the host) like ``build_host_reference``; returns the .so path. Raises RuntimeError if it cannot."""
    return _build_host_tool(repo_root, out_dir, "host_rows_grouped")


def rows_grouped_host(path: str, x: Tensor, offs: Tensor, *, gather_idx=None, col_scale=None, m=None,
                      m_alloc=None):
    """Run the host build of ``tsct_nvfp4_quantize_rows_grouped`` on CPU tensors; returns
    (codes, sfa bytes, sfa_offsets, s_enc) like ``tsct.native.nvfp4_quantize_rows_grouped``
    (outputs pre-filled with 0xA5 so an unwritten byte cannot pass)."""
    import ctypes
    from ctypes import c_int, c_int64, c_void_p

    from tsct.emulation.plan import sfa_bytes_bound

    lib = ctypes.CDLL(path)
    fn = lib.tsct_host_nvfp4_quantize_rows_grouped
    fn.argtypes = [c_void_p, c_int, c_int64, c_int64, c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_int64,
                   c_void_p, c_void_p, c_int64, c_void_p, c_void_p]
    x = x.contiguous()
    k = x.shape[1]
    e = offs.shape[0]
    g = gather_idx.to(torch.int64).contiguous() if gather_idx is not None else None
    rows = g.shape[0] if g is not None else x.shape[0]
    m = rows if m is None else m
    m_alloc = m if m_alloc is None else m_alloc
    nbytes = sfa_bytes_bound(m, e, k)
    codes = torch.full((m_alloc, k // 2), 0xA5, dtype=torch.uint8)
    sfa = torch.full((nbytes,), 0xA5, dtype=torch.uint8)
    sfo = torch.full((e,), -7, dtype=torch.int32)
    s_enc = torch.full((e,), float("nan"), dtype=torch.float32)
    cs = col_scale.contiguous() if col_scale is not None else None
    p = lambda t: c_void_p(t.data_ptr()) if t is not None and t.numel() else c_void_p(None)  # noqa: E731
    dt = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[x.dtype]
    offs_c = offs.contiguous()
    fn(p(x), dt, x.shape[0], k, p(g), p(offs_c), e, m, p(cs), m_alloc, p(codes), p(sfa), nbytes, p(sfo), p(s_enc))
    return codes, sfa, sfo, s_enc


def rows_grouped_cases():
    """(name, x, offs, kwargs) cases for the grouped activation quantizer (CPU tensors, seeded):
    random, heavy-tailed, nan/inf, empty experts, all-empty, gather with padding rows, col_scale,
    a single expert of 300 rows, and E = 0. Shared by the CPU harness test and the GPU test."""
    g = _gen(11)
    out = []

    def offs_of(counts):
        return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32) if counts else \
            torch.zeros(0, dtype=torch.int32)

    counts = [5, 0, 33, 1, 0, 129, 7]
    m = sum(counts)
    out.append(("random_bf16", torch.randn(m, 64, generator=g).to(torch.bfloat16), offs_of(counts), {}))
    out.append(("random_f32_kb_not_mult4", torch.randn(m, 48, generator=g), offs_of(counts), {}))
    heavy = _heavy((128, m))(torch.float32, g).t().contiguous()  # [K, N] maker: K blocks
    out.append(("heavy_f32", heavy, offs_of(counts), {}))
    out.append(("heavy_f16", _heavy((128, m))(torch.float16, g).t().contiguous(), offs_of(counts), {}))
    x = torch.randn(m, 64, generator=g)
    x[3, 5] = float("nan")
    x[40, 17] = float("inf")
    x[41, :16] = float("-inf")
    x[100:104] = 0.0
    x[50, 0:16] = -0.0
    out.append(("nan_inf_zero_f32", x, offs_of(counts), {}))
    out.append(("nan_inf_zero_bf16", x.to(torch.bfloat16), offs_of(counts), {}))
    out.append(("all_empty", torch.randn(6, 32, generator=g), offs_of([0, 0, 0]), {"m_alloc": 9}))
    # padding rows past offs[-1] and an m_alloc tail (the grouped GEMM's tile_m - 1 rows)
    out.append(("padding_rows", torch.randn(m + 5, 64, generator=g).to(torch.bfloat16), offs_of(counts),
                {"m_alloc": m + 5 + 31}))
    tok = 50
    gi = torch.randint(0, tok, (m + 3,), generator=g)
    gi[m:] = 10 ** 6  # padding rows' gather entries are never read
    out.append(("gather", torch.randn(tok, 64, generator=g).to(torch.bfloat16), offs_of(counts),
                {"gather_idx": gi, "m_alloc": m + 3 + 31}))
    cs = torch.exp(torch.randn(len(counts), 64, generator=g))
    out.append(("col_scale_gather", torch.randn(tok, 64, generator=g).to(torch.bfloat16), offs_of(counts),
                {"gather_idx": gi[:m].to(torch.int32), "col_scale": cs}))
    out.append(("one_expert_300_rows", torch.randn(300, 2048 // 8, generator=g).to(torch.bfloat16), offs_of([300]),
                {"m_alloc": 331}))
    out.append(("no_experts", torch.randn(4, 32, generator=g), offs_of([]), {"m_alloc": 4}))
    return out


def rows_grouped_b1_case(seed: int = 0):
    """The b1 shape (M = 32768 routed rows, E = 1024 experts, K = d = 2048, bf16, gathered from
    T = 16384 tokens, top-2 routing with some empty experts): (x, offs, gather_idx)."""
    g = _gen(seed)
    t, k, e, d = 16384, 2, 1024, 2048
    ids = torch.randint(0, e, (t * k,), generator=g)
    ids[ids % 97 == 0] = 1  # a few empty experts, one large one
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=e).cumsum(0).to(torch.int32)
    x = torch.randn(t, d, generator=g).to(torch.bfloat16)
    return x, offs, (order // k).to(torch.int64)
