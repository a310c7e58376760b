"""The CUTLASS C++ backend of the sm_120 fp4 forward (``TSCT_SM120_GEMM=cutlass``; decision 0011).

A second implementation of the W4A4 grouped GEMMs, to A/B against the CuTeDSL kernels on a 12.0 card:
the same activation quantizer, per-expert encode scales and combine, but the GEMMs run on
``tsct_cutlass_nvfp4_grouped_sm120_bf16`` (csrc/cutlass/grouped_nvfp4_sm120.cu, CUTLASS's SM120
block-scaled ptr-array collective, tile 128x32x128, operand conventions in csrc/cutlass/tsct_cutlass.h):

    xq = NVFP4(x[gather] per expert)                    K padded to a multiple of 128 (zero columns)
    [g | u] = xq @ w_gate^T, xq @ w_up^T                ONE launch, 2E groups: gate groups, then up groups
    z = silu(g * s_gate) * (u * s_up)                   torch, fp32 -> bf16 (the CuTeDSL GLU epilogue's math)
    zq = NVFP4(z per expert)                            r padded to a multiple of 128 (zero columns)
    y = (zq @ w_down^T) * row_weight                    one launch, E groups; f padded to a multiple of 8
    out[scatter_idx[i]] += y[i]                         glu.combine_rows (deterministic)

CUTLASS computes each group transposed ("swap AB"): problem (N, M_e, K), A = the factor ``[N, K]``,
B = the expert's rows ``[M_e, K]``, D = ``out_e^T`` column-major. Everything it reads per group is a
device array built here with torch ops on offs's device (no host read of routing data): ``problem_nmk``
int32 [G, 3], operand addresses int64 [G] (base ``data_ptr()`` + per-group byte offsets), ``alpha``
fp32 [G] = ``1 / (s_enc_x[e] * s_enc_w[e])``. Scales: the factor's per-expert swizzled_128x4 block
(``tsct.quant.layout.to_swizzled`` of its padded linear scales) and the quantizer's per-expert blocks
at ``sfa_offsets[e]``: CUTLASS's ``Sm1xxBlockScaledConfig`` layout for each group's own (N, M_e, K)
(checked against the compiled object by ``tsct_cutlass_nvfp4_sf_offsets_sm120``, tests/cpu/test_cutlass_gemm.py).

Padding, because the kernel needs K % 128 == 0 (whole 128-wide K tiles) and N % 8 == 0 (16-byte output
rows): K is padded with zero codes AND zero block scales (both sides), which adds exactly 0; N (only
f, the down GEMM's output width) is padded with zero factor rows and the extra columns are dropped. At
b1 (d = 2048, r = 64, f = 5461) that is r -> 128 (the down GEMM does twice the MMA work) and f -> 5464.
The factor preparation copies the factors each call (as ``glu.prepare_factors`` does).

Sign factors are not served (no CUTLASS variant: decision 0007); the CuTeDSL backend runs them.
NOT executed on any GPU: no sm_120 card exists here (design.md section 6). What is shown: the object
compiles for sm_120a with 32 OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X in the GEMM (manifest "cutlass"),
and this host preparation runs on the CPU end to end against the reference, with an emulated GEMM that
reads every operand through the prepared addresses (``emulated_gemm``).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from tsct.emulation import plan as _plan

__all__ = ["ENV_GEMM", "BACKENDS", "gemm_backend", "built", "kernel_status", "GroupedCall", "grouped_call",
           "concat_calls", "prepare_factor", "run_native", "emulated_gemm", "forward", "TILE_K", "N_ALIGN"]

ENV_GEMM = "TSCT_SM120_GEMM"
BACKENDS = ("cutedsl", "cutlass")
TILE_K = 128  # the kernel's K tile: K % 128 == 0
N_ALIGN = 8  # bf16 output rows of 16 bytes: N % 8 == 0
_SF_VEC = 16
_WS_ALIGN = 256


def gemm_backend() -> str:
    """The GEMM backend of the sm120-fp4 forward: ``$TSCT_SM120_GEMM`` ("cutedsl" when unset or empty).

    Raises ValueError naming the variable for any other value."""
    v = os.environ.get(ENV_GEMM, "").strip().lower() or "cutedsl"
    if v not in BACKENDS:
        raise ValueError(f"{ENV_GEMM}={os.environ.get(ENV_GEMM)!r}: expected one of {BACKENDS}")
    return v


def built() -> bool:
    """Whether the loaded native library has the CUTLASS kernel linked in (``tsct_cutlass_built``; loads
    the library, queries no device). False when there is no native library."""
    from tsct.native import _loader
    try:
        lib = _loader.get_lib()
    except _loader.NativeUnavailableError:
        return False
    flag = ctypes.c_int(0)
    return lib.tsct_cutlass_built(ctypes.byref(flag)) == 0 and flag.value == 1


def kernel_status(capability: Optional[tuple[int, int]]) -> tuple[bool, str]:
    """Whether the CUTLASS backend can run on a GPU of ``capability``: exactly (12, 0) (an sm_120a cubin)
    and the manifest's "cutlass" section present (a file read: no library load, no device query)."""
    from tsct import native

    if capability is None or tuple(capability) != (12, 0):
        cap = "no CUDA GPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
        return False, f"{cap}: the CUTLASS NVFP4 grouped GEMM is built for sm_120a (12.0) only"
    man = native.manifest()
    sec = (man or {}).get("cutlass")
    if not sec or not sec.get("linked"):
        return False, ("the native library was built without the CUTLASS sm_120 kernel (TSCT_CUTLASS=OFF, or AUTO "
                       "without the pinned headers; docs/decisions/0011)")
    return True, f"CUTLASS {(sec.get('headers') or {}).get('cutlass')} sm_120a grouped GEMM linked"


@dataclass
class GroupedCall:
    """The arguments of one ``tsct_cutlass_nvfp4_grouped_sm120_bf16`` launch (device tensors on one device).

    problem_nmk int32 [G, 3] = (N, M_e, K); ptr_* int64 [G] byte addresses; alpha fp32 [G]. ``keep`` holds
    the tensors the addresses point into (alive until the launch is done; ``emulated_gemm`` reads them)."""
    problem_nmk: Tensor
    ptr_w: Tensor
    ptr_w_sf: Tensor
    ptr_x: Tensor
    ptr_x_sf: Tensor
    ptr_out: Tensor
    alpha: Tensor
    keep: list = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return int(self.problem_nmk.shape[0])


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _counts_starts(offs: Tensor) -> tuple[Tensor, Tensor]:
    o = offs.long()
    starts = torch.cat([o.new_zeros(1), o[:-1]])
    return o - starts, starts


def _check_aligned(**tensors: Tensor) -> None:
    """Base addresses: operands 16-byte, scales (names ending in _sf) 128-byte aligned (TMA). The per-group
    offsets keep that: k % 128 and n % 8 make row offsets multiples of 16 bytes, scale blocks of 512."""
    for name, t in tensors.items():
        a = 128 if name.endswith("_sf") else 16
        _need(t.data_ptr() % a == 0, f"{name}: data_ptr() must be {a}-byte aligned (TMA), got {t.data_ptr():#x}")


def grouped_call(offs: Tensor, n: int, k: int, w_codes: Tensor, w_sf: Tensor, x_codes: Tensor, x_sf: Tensor,
                 x_sf_offsets: Tensor, out: Tensor, alpha: Tensor) -> GroupedCall:
    """Per-group arrays for ``out[rows of e, :n] = alpha[e] * x[rows of e] @ w[e]^T`` (one group per expert).

    Args:
        offs: int32 [E] cumulative END offsets of the routed rows (rows past offs[-1] are not touched).
        n, k: the GEMM's N (output columns) and K; k % 128 == 0, n % 8 == 0.
        w_codes: uint8 [E, n, k/2] factor codes (K contiguous); w_sf: uint8 [E, pad128(n) * pad4(k/16)]
            the factor's swizzled_128x4 scales per expert.
        x_codes: uint8 [m_alloc, k/2] routed-row codes; x_sf: uint8 flat per-expert swizzled scales with
            expert e's block at byte x_sf_offsets[e] (int32/int64 [E]; ``quantize_rows_grouped``).
        out: bf16 [>= offs[-1], n] contiguous; alpha: fp32 [E].
    Returns a GroupedCall on offs's device (sync-free: works on ``meta``). Raises ValueError / TypeError
    naming the argument whose dtype, shape, device or alignment is not what the kernel reads.
    """
    if not isinstance(offs, Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError(f"offs must be a 1-D int32 tensor of cumulative end offsets, got {getattr(offs, 'dtype', offs)}")
    e = offs.shape[0]
    _need(k > 0 and k % TILE_K == 0, f"k={k} must be a positive multiple of {TILE_K} (pad K with zero blocks)")
    _need(n > 0 and n % N_ALIGN == 0, f"n={n} must be a positive multiple of {N_ALIGN} (16-byte output rows)")
    kbp = -(-(k // _SF_VEC) // 4) * 4
    np_ = -(-n // 128) * 128
    for name, t, dt, shape in (("w_codes", w_codes, torch.uint8, (e, n, k // 2)),
                               ("w_sf", w_sf, torch.uint8, (e, np_ * kbp)),
                               ("x_codes", x_codes, torch.uint8, None), ("x_sf", x_sf, torch.uint8, None),
                               ("out", out, torch.bfloat16, None), ("alpha", alpha, torch.float32, (e,))):
        if not isinstance(t, Tensor) or t.dtype != dt:
            raise TypeError(f"{name} must be a {dt} tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        _need(t.is_contiguous(), f"{name} must be contiguous")
        _need(t.device == offs.device, f"{name} is on {t.device}, offs on {offs.device}")
        if shape is not None:
            _need(tuple(t.shape) == shape, f"{name} must be {list(shape)}, got {list(t.shape)}")
    _need(x_codes.dim() == 2 and x_codes.shape[1] == k // 2, f"x_codes must be [m, {k // 2}], got {list(x_codes.shape)}")
    _need(out.dim() == 2 and out.shape[1] == n, f"out must be [m, {n}], got {list(out.shape)}")
    _need(x_sf_offsets.dim() == 1 and x_sf_offsets.shape[0] == e, f"x_sf_offsets must be [{e}]")
    if offs.device.type == "cuda":  # device memory is what TMA reads (torch's CUDA allocator gives 512 bytes)
        _check_aligned(w_codes=w_codes, x_codes=x_codes, out=out, w_sf=w_sf, x_sf=x_sf)
    cnt, starts = _counts_starts(offs)
    gi = torch.arange(e, dtype=torch.int64, device=offs.device)
    problem = torch.stack([cnt.new_full((e,), n), cnt, cnt.new_full((e,), k)], 1).to(torch.int32)
    base = (lambda t: 0) if offs.device.type == "meta" else (lambda t: t.data_ptr())
    return GroupedCall(
        problem_nmk=problem.contiguous(),
        ptr_w=base(w_codes) + gi * (n * k // 2),
        ptr_w_sf=base(w_sf) + gi * (np_ * kbp),
        ptr_x=base(x_codes) + starts * (k // 2),
        ptr_x_sf=base(x_sf) + x_sf_offsets.long(),
        ptr_out=base(out) + starts * (n * 2),
        alpha=alpha.contiguous(),
        keep=[w_codes, w_sf, x_codes, x_sf, out, alpha])


def concat_calls(*calls: GroupedCall) -> GroupedCall:
    """One launch for several GroupedCalls (groups in order): the kernel takes any list of groups."""
    cat = lambda name: torch.cat([getattr(c, name) for c in calls]).contiguous()  # noqa: E731
    return GroupedCall(problem_nmk=cat("problem_nmk"), ptr_w=cat("ptr_w"), ptr_w_sf=cat("ptr_w_sf"),
                       ptr_x=cat("ptr_x"), ptr_x_sf=cat("ptr_x_sf"), ptr_out=cat("ptr_out"), alpha=cat("alpha"),
                       keep=[t for c in calls for t in c.keep])


def _pad_last(t: Tensor, size: int) -> Tensor:
    if t.shape[-1] == size:
        return t
    return torch.nn.functional.pad(t, (0, size - t.shape[-1]))


def prepare_factor(w, n_pad: int, k_pad: int) -> tuple[Tensor, Tensor]:
    """An ``NVFP4Tensor`` factor (logical ``[E, K, N]``, stored ``[E, N, K/2]``) -> the kernel's A operand:
    codes uint8 ``[E, n_pad, k_pad/2]`` and swizzled scales uint8 ``[E, pad128(n_pad) * pad4(k_pad/16)]``,
    zero-padded (zero codes and zero scales contribute exactly 0). Raises TypeError for another container
    and ValueError when a padded size is smaller than the factor's."""
    from tsct.quant.layout import to_linear, to_swizzled
    from tsct.quant.nvfp4 import NVFP4Tensor

    if not isinstance(w, NVFP4Tensor):
        raise TypeError(f"the CUTLASS backend takes NVFP4Tensor factors, got {type(w).__name__}")
    _need(n_pad >= w.n and k_pad >= w.k and k_pad % _SF_VEC == 0,
          f"padded sizes ({n_pad}, {k_pad}) must cover the factor's ({w.n}, {w.k})")
    sf = w.block_scale.view(torch.uint8)
    if w.layout != "linear":
        sf = to_linear(sf, w.n, w.k // _SF_VEC)
    codes = _pad_last(w.codes, k_pad // 2)
    sf = _pad_last(sf, k_pad // _SF_VEC)
    if n_pad != w.n:
        codes = torch.nn.functional.pad(codes, (0, 0, 0, n_pad - w.n))
        sf = torch.nn.functional.pad(sf, (0, 0, 0, n_pad - w.n))
    return codes.contiguous(), to_swizzled(sf).contiguous()


def run_native(call: GroupedCall) -> None:
    """Launch ``tsct_cutlass_nvfp4_grouped_sm120_bf16`` on the current CUDA stream of the call's device.

    Raises RuntimeError with the library's message when it returns non-zero (e.g. not built in, a device
    that is not compute capability 12.0, a failed ``can_implement``)."""
    from tsct.native import _loader

    lib = _loader.get_lib()
    dev = call.problem_nmk.device
    if dev.type != "cuda":
        raise ValueError(f"the CUTLASS GEMM runs on CUDA tensors, got {dev}")
    g = call.num_groups
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    nbytes = ctypes.c_uint64(0)
    rc = lib.tsct_cutlass_nvfp4_grouped_sm120_workspace(g, sms, ctypes.byref(nbytes))
    if rc:
        raise RuntimeError(_loader.error_message("tsct_cutlass_nvfp4_grouped_sm120_workspace", rc))
    ws = torch.empty(nbytes.value + _WS_ALIGN, dtype=torch.uint8, device=dev)
    ws_ptr = -(-ws.data_ptr() // _WS_ALIGN) * _WS_ALIGN
    stream = torch.cuda.current_stream(dev).cuda_stream
    rc = lib.tsct_cutlass_nvfp4_grouped_sm120_bf16(
        g, call.problem_nmk.data_ptr(), call.ptr_w.data_ptr(), call.ptr_w_sf.data_ptr(), call.ptr_x.data_ptr(),
        call.ptr_x_sf.data_ptr(), call.ptr_out.data_ptr(), call.alpha.data_ptr(), ws_ptr, nbytes.value, sms, stream)
    if rc:
        raise RuntimeError(_loader.error_message("tsct_cutlass_nvfp4_grouped_sm120_bf16", rc))
    ws.record_stream(torch.cuda.current_stream(dev))


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _swizzle(r: Tensor, kb: Tensor, k: int) -> Tensor:
    kbp = -(-(k // _SF_VEC) // 4) * 4
    return (r // 128) * (kbp // 4) * 512 + (kb // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + kb % 4


def emulated_gemm(call: GroupedCall) -> None:
    """What the kernel computes, on the CPU, reading every operand ONLY through the call's addresses.

    Each address is resolved to one of ``call.keep``'s tensors (a host loop over groups: tests only);
    per group (N, M_e, K): D[j, i] = alpha * sum_k A[j, k] * B[i, k] with A = the factor rows at ptr_w
    (scales at ptr_w_sf, CUTLASS's layout for rows N), B = the expert's rows at ptr_x (scales at
    ptr_x_sf, layout for rows M_e), written as bf16 row-major [M_e, N] at ptr_out. Raises ValueError
    for an address outside every kept tensor (what would be a wild read on the GPU)."""
    bufs = [(t.data_ptr(), t.numel() * t.element_size(), t) for t in call.keep]
    lut = torch.tensor(_E2M1)

    def at(addr: int, nbytes: int) -> tuple[Tensor, int]:
        for base, size, t in bufs:
            if base <= addr and addr + nbytes <= base + size:
                return t, addr - base
        raise ValueError(f"address {addr:#x} (+{nbytes} bytes) is in no operand buffer")

    def read(addr: int, nbytes: int) -> Tensor:
        t, off = at(addr, nbytes)
        return t.view(-1).view(torch.uint8)[off:off + nbytes]

    def decode(codes: Tensor, sf_addr: int, rows: int, k: int) -> Tensor:
        vals = torch.stack([lut[(codes & 15).long()], lut[(codes >> 4).long()]], -1).flatten(-2)  # [rows, k]
        kbp = -(-(k // _SF_VEC) // 4) * 4
        block = read(sf_addr, -(-rows // 128) * 128 * kbp)
        off = _swizzle(torch.arange(rows).unsqueeze(1), torch.arange(k // _SF_VEC).unsqueeze(0), k)
        sf = block[off].view(torch.float8_e4m3fn).float()
        return vals * sf.repeat_interleave(_SF_VEC, -1)

    for g in range(call.num_groups):
        n, m_e, k = (int(v) for v in call.problem_nmk[g])
        if m_e == 0:
            continue
        a = decode(read(int(call.ptr_w[g]), n * k // 2).view(n, k // 2), int(call.ptr_w_sf[g]), n, k)
        b = decode(read(int(call.ptr_x[g]), m_e * k // 2).view(m_e, k // 2), int(call.ptr_x_sf[g]), m_e, k)
        d = (float(call.alpha[g]) * (b @ a.T)).to(torch.bfloat16)  # [M_e, N] = D^T
        t, off = at(int(call.ptr_out[g]), m_e * n * 2)
        t.view(-1).view(torch.uint8)[off:off + m_e * n * 2] = d.reshape(-1).view(torch.uint8)


def _row_expert(offs: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """(expert of each routed row clamped to [0, E), bool valid = row < offs[-1]); sync-free."""
    rows = torch.arange(m, device=offs.device, dtype=torch.int64)
    e = torch.searchsorted(offs.long(), rows, right=True)
    return e.clamp_max(offs.shape[0] - 1), rows < offs[-1].long()


def forward(x: Tensor, offs: Tensor, w_gate, w_up, w_down, s_gate: Optional[Tensor], s_up: Optional[Tensor],
            row_weight: Optional[Tensor], gather_idx: Optional[Tensor], scatter_idx: Optional[Tensor],
            num_out_rows: Optional[int], *, gemm: Optional[Callable[[GroupedCall], None]] = None,
            quant_backend: str = "native") -> Tensor:
    """The sm_120 W4A4 forward on the CUTLASS GEMM (module docstring); inputs validated by ``tsct.ops``.

    NVFP4Tensor factors only (TypeError naming the factor otherwise). ``gemm`` defaults to ``run_native``;
    the CPU tests pass ``emulated_gemm`` (and ``quant_backend="torch"``). Returns ``[num_out_rows, f]``
    with scatter_idx, else ``[M, f]``, in x.dtype; rows past offs[-1] are zero.
    """
    from tsct.kernels.sm120_fp4.glu import combine_rows
    from tsct.kernels.sm120_fp4.quant_rows import quantize_rows_grouped
    from tsct.quant.nvfp4 import NVFP4Tensor

    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if not isinstance(w, NVFP4Tensor):
            raise TypeError(f"{name}: the CUTLASS backend ({ENV_GEMM}=cutlass) takes NVFP4Tensor factors, got "
                            f"{type(w).__name__} (sign factors: use the CuTeDSL backend)")
    d, r, f = w_gate.k, w_gate.n, w_down.n
    if (w_up.k, w_up.n) != (d, r) or w_down.k != r:
        raise ValueError(f"factor shapes disagree: w_gate [E, {d}, {r}], w_up [E, {w_up.k}, {w_up.n}], "
                         f"w_down [E, {w_down.k}, {f}]")
    _need(r % N_ALIGN == 0, f"r={r} must be a multiple of {N_ALIGN} (the gate/up GEMM's output width)")
    gemm = gemm or run_native
    e = w_gate.batch
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    dev = x.device
    d_pad, r_pad, f_pad = -(-d // TILE_K) * TILE_K, -(-r // TILE_K) * TILE_K, -(-f // N_ALIGN) * N_ALIGN
    g = torch.zeros(m, r, dtype=torch.bfloat16, device=dev)
    u = torch.zeros(m, r, dtype=torch.bfloat16, device=dev)
    y = torch.zeros(m, f_pad, dtype=torch.bfloat16, device=dev)
    if m == 0:
        return torch.zeros(num_out_rows if scatter_idx is not None else 0, f, dtype=x.dtype, device=dev)

    # 1) gate and up: one launch of 2E groups over the same quantized rows
    xin = _pad_last(x, d_pad)
    xq = quantize_rows_grouped(xin, offs, gather_idx=gather_idx, m=m, m_alloc=m, backend=quant_backend)
    sfa1 = xq.sfa.view(torch.uint8).contiguous()
    wg, wg_sf = prepare_factor(w_gate, r, d_pad)
    wu, wu_sf = prepare_factor(w_up, r, d_pad)
    gate = grouped_call(offs, r, d_pad, wg, wg_sf, xq.codes, sfa1, xq.sfa_offsets, g,
                        _plan.alpha_from_encode_scales(xq.s_enc, w_gate.global_scale).contiguous())
    up = grouped_call(offs, r, d_pad, wu, wu_sf, xq.codes, sfa1, xq.sfa_offsets, u,
                      _plan.alpha_from_encode_scales(xq.s_enc, w_up.global_scale).contiguous())
    gemm(concat_calls(gate, up))

    # 2) the GLU in the latent (fp32, like the CuTeDSL epilogue), padding rows 0
    ex, valid = _row_expert(offs, m)
    sg = torch.ones(e, r, device=dev) if s_gate is None else s_gate.float()
    su = torch.ones(e, r, device=dev) if s_up is None else s_up.float()
    gf = g.float() * sg[ex]
    z = (gf * torch.sigmoid(gf) * (u.float() * su[ex]))
    z = torch.where(valid.unsqueeze(1), z, torch.zeros_like(z)).to(torch.bfloat16)

    # 3) down: E groups, K = r padded to 128, N = f padded to 8
    zq = quantize_rows_grouped(_pad_last(z, r_pad), offs, m_alloc=m, backend=quant_backend)
    wd, wd_sf = prepare_factor(w_down, f_pad, r_pad)
    gemm(grouped_call(offs, f_pad, r_pad, wd, wd_sf, zq.codes, zq.sfa.view(torch.uint8).contiguous(),
                      zq.sfa_offsets, y, _plan.alpha_from_encode_scales(zq.s_enc, w_down.global_scale).contiguous()))
    rw = torch.ones(m, device=dev) if row_weight is None else row_weight.float()
    out = (y[:, :f].float() * torch.where(valid, rw, torch.zeros_like(rw)).unsqueeze(1)).to(torch.bfloat16)
    if scatter_idx is not None:
        out = combine_rows(out, scatter_idx, offs, num_out_rows)
    return out.to(x.dtype)
