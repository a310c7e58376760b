"""The bmm path: the grouped GLU as a few ``torch.bmm`` calls over rows laid out per expert.

The fallback of every GPU and the CPU path ("bf16 decode plus bmm", design.md section 4). Factors
arrive dense (packed factors are decoded to ``x.dtype`` once per call by ``tsct.ops``); routed rows
are copied into a padded buffer in two parts:

    dense part     every expert e, rows 0..h0-1 of e at buffer rows e*h0 ..      (weights read in place)
    overflow tiles rows h0.. of each expert, in tiles of b rows; tile t belongs to expert tile_expert[t]
                   (the tiles' factors gathered once per call: ``w[tile_expert]``)

so one hot expert costs tiles, not a padded buffer of E x (largest expert) rows. Every routed row
gets a slot: nothing is dropped (unlike a capacity-factor bmm). The math is the reference's
(design.md section 2) with bf16 (``x.dtype``) products accumulated in fp32; g, u, z, the row
weight and the combine in fp32.

Plans (``Plan``): an eager call reads the per-expert row counts on the host ONCE per forward (the
one sync of this path; the backward reuses the plan) and picks ``h0`` and ``b`` by a byte-cost model
(``plan_from_counts``). Under CUDA-graph capture or ``torch.compile`` no host read is possible: the
static plan (``static_plan``) bounds the tiles from the shapes alone (docs/decisions/0018).

Determinism: every sum over rows is fixed-order. The combine sorts the routed rows by output row
(stable) and sums each segment with ``torch.segment_reduce`` (one thread per output element, a
serial loop over the segment); the tiles' partial weight gradients are summed per expert the same
way. Padding rows (past ``offs[-1]``) are never read: zero output, zero gradient. Empty experts get
exact zero factor gradients (their buffer rows are zero and every gradient row outside the routed
rows is masked with ``torch.where``, so even NaN factors cannot leak into them).

Activations: with ``activations="nvfp4"`` the forward quantizes x and z to NVFP4 exactly as the
sm_120 tensor-core path does (one encode scale per expert over its rows, UE4M3 block scales per 16
along K, E2M1 codes; docs/decisions/0002 and 0017), then multiplies the quantized values in bf16,
which is exact for them, and applies 1 / s_enc after the product. The backward is the bf16 one
(straight-through for the activation quantization, as on sm_120).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from tsct.kernels.layout import is_kmajor

__all__ = ["Plan", "plan_from_counts", "static_plan", "grouped_glu_forward", "grouped_glu_forward_saved",
           "grouped_glu_backward", "saved_like", "combine_rows"]

#: tile heights the eager plan chooses from
TILE_ROWS = (32, 64, 128, 256)
#: what having any tiles costs in the eager plan's model, as bytes: the tile part launches ~35 more kernels
#: per forward and backward (tile tables, factor gathers, tile products, partial sums), ~0.9 ms of host
#: time at the ~25 us per launch measured on the H200's host; counted here as 1 GB (~0.25 ms at its copy
#: rate), so a few overflowing rows go into a taller dense part instead
TILE_PART_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Plan:
    """Buffer layout: ``h0`` rows per expert for all E experts, then ``n_tiles`` tiles of ``b`` rows.
    ``fan_out`` / ``fan_in``: the most routed rows one output row / one x row receives (0: unknown, the
    combines then use ``torch.segment_reduce``; known, they gather a ``[rows, fan, C]`` table and sum it)."""
    h0: int
    b: int
    n_tiles: int
    fan_out: int = 0
    fan_in: int = 0

    def rows(self, experts: int) -> int:
        """Padded rows of the buffer (without the one dump row for padding entries)."""
        return experts * self.h0 + self.n_tiles * self.b

    def as_tensor(self) -> Tensor:
        """The plan as a CPU int64 tensor (how it travels from the forward to the backward)."""
        return torch.tensor([self.h0, self.b, self.n_tiles, self.fan_out, self.fan_in], dtype=torch.int64)

    @staticmethod
    def from_tensor(t: Tensor) -> "Plan":
        return Plan(*(int(v) for v in t.tolist()))


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def plan_from_counts(counts: Sequence[int], d: int, r: int, f: int) -> Plan:
    """The cheapest layout for known per-expert row counts (host integers).

    Cost model in bytes moved by a forward and backward: a buffer row costs ``18 d + 12 f`` (three times
    the forward's ``6 d + 4 f``: the bf16 row written and read for gate/up, its output row written and
    read once); a tile additionally costs its factors' copy (bf16, written and read, forward and
    backward: ``8 (2 d r + r f)``) and its fp32 weight-gradient partial (written, read, reduced:
    ``12 (2 d r + r f)``); a plan with tiles costs ``TILE_PART_BYTES`` more. Candidates: ``h0`` in 0 and
    the counts' values rounded up to 8 (at most 33 quantiles), tile heights ``TILE_ROWS``.
    """
    c = np.asarray(counts, dtype=np.int64)
    e = c.size
    if e == 0 or int(c.max(initial=0)) == 0:
        return Plan(0, TILE_ROWS[0], 0)
    row = 18 * d + 12 * f
    tile_w = 20 * (2 * d * r + r * f)
    vals, mult = np.unique(c, return_counts=True)                               # V distinct counts: V <= E
    pos = np.ceil(np.linspace(0, 1, 33) * (e - 1)).astype(np.int64)             # the 33 "higher" quantiles
    qs = vals[np.searchsorted(np.cumsum(mult), pos, side="right")]
    cands = np.unique(np.concatenate([[0], -(-qs // 8) * 8]))                  # K <= 33 heights
    over = np.clip(vals[None, :] - cands[:, None], 0, None)                    # [K, V]
    b = np.asarray(TILE_ROWS, dtype=np.int64)
    nt = ((-(-over[:, None, :] // b[None, :, None])) * mult).sum(2)             # [K, len(TILE_ROWS)]
    cost = e * cands[:, None] * row + nt * (b[None, :] * row + tile_w) + np.where(nt > 0, TILE_PART_BYTES, 0)
    k, j = np.unravel_index(int(np.argmin(cost)), cost.shape)                   # first minimum: smallest h0, b
    return Plan(int(cands[k]), int(b[j]), int(nt[k, j]))


def static_plan(m: int, experts: int) -> Plan:
    """A layout that fits ANY routing of ``m`` rows over ``experts`` experts, from the shapes alone.

    ``h0`` = twice the mean rows per expert rounded up to 8 (at least 8, at most 256: a capacity factor
    of 2 covers balanced routing without tiles), tiles of ``b = h0`` rows. Tiles needed:
    ``sum_e ceil((c_e - h0) / h0) = sum_e (ceil(c_e / h0) - 1) <= sum_e (c_e - 1) / h0 < m / h0`` over
    the experts with ``c_e > h0``, so ``m // h0`` tiles hold every routing and the buffer has at most
    ``E h0 + m`` rows. (Taller tiles need more rows for the same bound: the worst case is many experts
    with ``h0 + 1`` rows, one tile each, so the tile count bound stays ~``m / h0`` whatever ``b`` is.)
    """
    if experts == 0 or m == 0:
        return Plan(0, 64, 0)
    h0 = min(256, max(8, _round_up(-(-2 * m // experts), 8)))
    return Plan(h0, h0, m // h0)


# ---- layout ------------------------------------------------------------------------------------

class _Layout:
    """Where each routed row sits in the buffer (``_layout``). ``dest`` and ``valid`` are computed at once; the
    per-buffer-row and per-tile tables only when first used (the forward of bf16 activations needs
    ``row_expert`` and ``tile_expert``; the rest serve the backward), so an eager forward launches fewer
    kernels (its host time is what it waits for: ~25 us per launch on the H200's host)."""

    def __init__(self, offs: Tensor, m: int, plan: Plan):
        dev = offs.device
        e_count = offs.shape[0]
        h0, b, n = plan.h0, plan.b, plan.n_tiles
        self.plan, self.e_count = plan, e_count
        self.r0 = e_count * h0
        self.rows = self.r0 + n * b
        ends = offs.long()
        start = torch.cat([ends.new_zeros(1), ends[:-1]])
        i = torch.arange(m, device=dev)
        e = torch.searchsorted(ends, i, right=True)
        self.valid = e < e_count                                          # [M] bool: a routed row
        e.clamp_(max=e_count - 1)
        # row i of expert e, j = i - start[e]: dense row e*h0 + j (j < h0), else row j - h0 of e's tiles
        base = torch.arange(0, self.r0, h0, device=dev) - start if h0 else None
        if n:
            self.nt = (ends - start).sub_(h0).clamp_(min=0).add_(b - 1).div_(b, rounding_mode="floor")
            self.tile_end = torch.cumsum(self.nt, 0)
            tile_base = (self.tile_end - self.nt).mul_(b).add_(self.r0 - h0).sub_(start)
            if base is None:
                dest = i + tile_base[e]
            else:
                dest = i + torch.where(i - start[e] < h0, base[e], tile_base[e])
        else:
            dest = i + base[e] if base is not None else torch.full_like(i, self.rows)
        # rows past offs[-1], and (only for offsets the checks would refuse) rows past the tile bound: the dump row
        self.dest = torch.where(self.valid, dest, self.rows).clamp_(max=self.rows)   # [M] int64

    @functools.cached_property
    def tile_expert(self) -> Tensor:
        """[n_tiles] int64: the expert of each tile."""
        n = self.plan.n_tiles
        t = torch.arange(n, device=self.dest.device)
        return torch.searchsorted(self.tile_end, t, right=True).clamp_(max=max(self.e_count - 1, 0))

    @functools.cached_property
    def row_expert(self) -> Tensor:
        """[R + 1] int64: the expert of each buffer row (0 for the dump row)."""
        dev, h0, b = self.dest.device, self.plan.h0, self.plan.b
        parts = [torch.arange(self.r0, device=dev).div_(h0, rounding_mode="floor")] if h0 else []
        if self.plan.n_tiles:
            parts.append(self.tile_expert.repeat_interleave(b))
        parts.append(torch.zeros(1, dtype=torch.long, device=dev))
        return torch.cat(parts)

    @functools.cached_property
    def row_live(self) -> Tensor:
        """[R + 1] bool: the buffer row holds a routed row."""
        live = torch.zeros(self.rows + 1, dtype=torch.bool, device=self.dest.device)
        live.index_fill_(0, self.dest, True)
        live.narrow(0, self.rows, 1).fill_(False)  # the dump row (no host scalar: capture-safe)
        return live

    @functools.cached_property
    def tile_offsets(self) -> Tensor:
        """[E + 1] int64: expert e's tiles are tile_offsets[e]:tile_offsets[e+1]."""
        return torch.cat([self.tile_end.new_zeros(1), self.tile_end.clamp(max=self.plan.n_tiles)])

    @functools.cached_property
    def hot(self) -> tuple[Tensor, Tensor]:
        """(hot_expert [H], hot_offsets [H + 1]), H = min(E, n_tiles): the experts with tiles in order, then
        E - 1 with empty segments (padding entries), and each one's tiles."""
        e_count, n, nt = self.e_count, self.plan.n_tiles, self.nt
        dev = nt.device
        n_hot = min(e_count, n)
        is_hot = nt > 0
        hot = torch.full((n_hot + 1,), e_count, dtype=torch.long, device=dev)
        hot.index_copy_(0, torch.where(is_hot, torch.cumsum(is_hot, 0) - 1, n_hot).clamp(max=n_hot),
                        torch.arange(e_count, device=dev))
        hot = hot[:n_hot]
        nt_ext = torch.cat([nt, nt.new_zeros(1)])
        offsets = torch.cat([nt.new_zeros(1), torch.cumsum(nt_ext[hot], 0).clamp(max=n)])
        return hot.clamp(max=e_count - 1), offsets


def _layout(offs: Tensor, m: int, plan: Plan) -> _Layout:
    return _Layout(offs, m, plan)


def _to_buffer(src: Tensor, idx: Optional[Tensor], lay: _Layout, pad_cols: int = 0) -> Tensor:
    """``[R + 1, C + pad_cols]``: buffer row ``dest[i]`` holds ``src[idx[i]]`` (``src[i]`` without idx);
    every other row is exactly 0 (so no NaN or inf of another row can reach a product): one gather from
    ``src`` with a zero row (and ``pad_cols`` columns, 16-byte rows at odd widths) appended."""
    m, n = lay.dest.shape[0], src.shape[0]
    rows = idx if idx is not None else torch.arange(m, device=src.device)
    buf_src = torch.full((lay.rows + 1,), n, dtype=rows.dtype, device=src.device)
    buf_src.index_copy_(0, lay.dest, rows)  # padding entries all land in the dump row ...
    buf_src.narrow(0, lay.rows, 1).fill_(n)  # ... which then reads the zero row
    return torch.nn.functional.pad(src, (0, pad_cols, 0, 1)).index_select(0, buf_src)


# ---- products ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _bmm_out_dtype_ok(device_type: str) -> bool:
    """Whether ``torch.bmm(a, b, out_dtype=torch.float32, out=...)`` runs for bf16 inputs here (CUDA)."""
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(1, 2, 2, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(1, 2, 2, device="cuda", dtype=torch.float32)
        torch.bmm(a, a, out_dtype=torch.float32, out=o)
        return bool((o == 2).all())
    except (TypeError, RuntimeError):
        return False


def _mm_into(a: Tensor, b: Tensor, o: Tensor) -> None:
    """``o = a @ b`` batched, accumulated in fp32; ``o`` in the inputs' dtype or fp32. An fp32 ``o`` of bf16
    inputs: ``bmm(out_dtype=fp32)`` on CUDA, the fp32 product on the CPU (the same values); a CUDA torch
    without ``out_dtype`` rounds to bf16 first (an fp32 GEMM there would cost 4-8x)."""
    if a.is_cuda and _mm_split(a, b, o):
        return
    if o.dtype == a.dtype:
        torch.bmm(a, b, out=o)
    elif _bmm_out_dtype_ok(a.device.type):
        torch.bmm(a, b, out_dtype=o.dtype, out=o)
    elif a.device.type == "cpu":
        torch.bmm(a.to(o.dtype), b.to(o.dtype), out=o)
    else:
        o.copy_(torch.bmm(a, b))


def _mm_split(a: Tensor, b: Tensor, o: Tensor) -> bool:
    """Split ``o = a @ b`` at a multiple of 8 in N, else M, else K (when ``o`` is fp32: the remainder's product
    added in fp32) and compute the parts; False if no dimension needs it. cuBLAS takes its unaligned kernels
    for the whole product when M or N is not a multiple of 8 (f = 5461; measured on the H200 at b1: the wide
    projection 1.17 ms, split 0.39 ms). CUDA only: the CPU's GEMMs do not care and the split costs calls."""
    m, k, n = a.shape[1], a.shape[2], b.shape[2]
    if n % 8 and n > 8:
        n8 = n - n % 8
        _mm_into(a, b[..., :n8], o[..., :n8])
        _mm_into(a, b[..., n8:], o[..., n8:])
    elif m % 8 and m > 8:
        m8 = m - m % 8
        _mm_into(a[:, :m8], b, o[:, :m8])
        _mm_into(a[:, m8:], b, o[:, m8:])
    elif k % 8 and k > 8 and o.dtype == torch.float32:
        k8 = k - k % 8
        _mm_into(a[..., :k8], b[:, :k8], o)
        o.add_(_mm32(a[..., k8:], b[:, k8:]))
    else:
        return False
    return True


def _mm32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` batched, returned in fp32."""
    o = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=torch.float32, device=a.device)
    _mm_into(a, b, o)
    return o


def _parts(buf: Tensor, lay: _Layout, plan: Plan, e_count: int):
    """The dense part ``[E, h0, C]`` and the tiles ``[n, b, C]`` of a ``[R + 1, C]`` buffer (views)."""
    c = buf.shape[1]
    return (buf[:lay.r0].view(e_count, plan.h0, c),
            buf[lay.r0:lay.rows].view(plan.n_tiles, plan.b, c))


def _project(buf: Tensor, w: Tensor, w_tiles: Optional[Tensor], lay: _Layout, plan: Plan, fp32: bool) -> Tensor:
    """``buf @ w[expert of the row]`` for every buffer row: ``[R + 1, N]`` (fp32 or the compute dtype)."""
    e_count, n_out = w.shape[0], w.shape[2]
    out = torch.empty(lay.rows + 1, n_out, dtype=torch.float32 if fp32 else buf.dtype, device=buf.device)
    out.narrow(0, lay.rows, 1).zero_()
    da, ta = _parts(buf, lay, plan, e_count)
    do, to = _parts(out, lay, plan, e_count)
    if plan.h0:
        _mm_into(da, w, do)
    if plan.n_tiles:
        _mm_into(ta, w_tiles, to)
    return out


def _project_wide(buf: Tensor, w: Tensor, w_tiles: Optional[Tensor], lay: _Layout, plan: Plan) -> Tensor:
    """``buf @ w[expert of the row]`` for a wide ``w`` (N = f): ``[R + 1, pad8(N)]`` in the buffer's dtype,
    columns past N unset. The rows are padded to a multiple of 8 elements so that each starts 16-byte
    aligned at odd N (f = 5461): the combine's row gathers then run vectorized (torch.bmm writes the
    padded rows in place: cuBLAS takes the row stride as its leading dimension)."""
    e_count, n_out = w.shape[0], w.shape[2]
    out = torch.empty(lay.rows + 1, _round_up(n_out, 8), dtype=buf.dtype, device=buf.device)
    out.narrow(0, lay.rows, 1).zero_()
    da, ta = _parts(buf, lay, plan, e_count)
    do, to = _parts(out, lay, plan, e_count)
    if plan.h0:
        _mm_into(da, w, do[..., :n_out])
    if plan.n_tiles:
        _mm_into(ta, w_tiles, to[..., :n_out])
    return out


def _weight_grad(a_buf: Tensor, b_buf: Tensor, lay: _Layout, plan: Plan, e_count: int) -> Tensor:
    """``sum over an expert's rows of a_row^T b_row`` per expert: ``[E, A, B]`` in the buffers' dtype.

    The dense part is one bmm per expert (fp32 accumulation, one rounding); an expert's tiles add their
    fp32 partial sums in tile order (``segment_reduce``), rounded once more, into its row (``index_add_``
    whose only repeated index, the padding entries', adds exact zeros), so the result is the same on
    every run."""
    a_dim, b_dim = a_buf.shape[1], b_buf.shape[1]
    aa, at = _parts(a_buf, lay, plan, e_count)
    ba, bt = _parts(b_buf, lay, plan, e_count)
    if plan.h0:
        g = torch.empty(e_count, a_dim, b_dim, dtype=a_buf.dtype, device=a_buf.device)
        _mm_into(aa.transpose(1, 2), ba, g)
    else:
        g = torch.zeros(e_count, a_dim, b_dim, dtype=a_buf.dtype, device=a_buf.device)
    if plan.n_tiles:  # only the experts with tiles; the padding entries add exact zeros
        part = _mm32(at.transpose(1, 2), bt).reshape(plan.n_tiles, a_dim * b_dim)
        tiles = torch.segment_reduce(part, "sum", offsets=lay.hot[1], axis=0, unsafe=True)
        g.index_add_(0, lay.hot[0], tiles.view(tiles.shape[0], a_dim, b_dim).to(g.dtype))
    return g


def _expert_sum(v: Tensor, lay: _Layout, plan: Plan, e_count: int) -> Tensor:
    """Per-expert column sums of a ``[R + 1, C]`` fp32 buffer: ``[E, C]``, fixed order."""
    va, vt = _parts(v, lay, plan, e_count)
    s = va.sum(1) if plan.h0 else v.new_zeros(e_count, v.shape[1])
    if plan.n_tiles:
        s = s + torch.segment_reduce(vt.sum(1), "sum", offsets=lay.tile_offsets, axis=0, unsafe=True)
    return s


def combine_rows(rows_of: Tensor, rows_src: Tensor, target: Tensor, valid: Tensor, num_out_rows: int,
                 fan: int = 0, cols: Optional[int] = None) -> Tensor:
    """``out[t] = sum over routed rows i with target[i] == t of rows_of[rows_src[i]]``, in ``rows_of``'s dtype.

    Deterministic, no host read: the rows are ordered by target (stable sort, ties in routed-row order).
    With ``fan`` (the most rows any target receives, known from the host plan) their buffer rows go into a
    ``[num_out_rows, fan]`` table (empty slots point at the buffer's zero dump row, the last row of
    ``rows_of``) and one ``sum`` over it adds them in fp32 and rounds once; where that table would hold more than
    about twice the routed rows (a few targets receive many rows: a shared or sink row, expert-choice routing),
    ``torch.segment_reduce`` sums each target's rows in fp32 instead and rounds once (memory and time in the rows,
    not in targets x fan). Without ``fan`` each target's segment is summed by ``torch.segment_reduce`` in that
    order (each add rounded). Rows with ``valid`` False are left out. ``cols``: the first columns of ``rows_of``
    that hold data (default all).
    """
    m, c = target.shape[0], (cols if cols is not None else rows_of.shape[1])
    dump = rows_of.shape[0] - 1
    if m == 0 or num_out_rows == 0:
        return rows_of.new_zeros(num_out_rows, c)
    key = torch.where(valid, target, num_out_rows)
    skey, order = torch.sort(key, stable=True)
    if 0 < fan and num_out_rows * fan <= 2 * m + num_out_rows:
        rank = torch.arange(m, device=key.device) - torch.searchsorted(skey, skey)
        slot = (skey * fan + rank).clamp_(max=num_out_rows * fan)  # padding rows (key T): the spare slot
        table = torch.full((num_out_rows * fan + 1,), dump, dtype=torch.long, device=key.device)
        table.index_copy_(0, slot, rows_src[order])
        t = rows_of.index_select(0, table[:num_out_rows * fan]).view(num_out_rows, fan, rows_of.shape[1])
        if fan == 1:
            return t[:, 0, :c].contiguous()
        if fan == 2:  # computed in fp32, rounded once
            return torch.add(t[:, 0, :c], t[:, 1, :c])
        acc = t[:, 0, :c].float()
        for s in range(1, fan):
            acc += t[:, s, :c]
        return acc.to(rows_of.dtype)
    bounds = torch.searchsorted(skey, torch.arange(num_out_rows + 1, device=key.device, dtype=skey.dtype))
    data = rows_of.index_select(0, rows_src[order])[:, :c]
    if fan > 0:  # the table's math: fp32 sums, rounded once
        return torch.segment_reduce(data.float(), "sum", offsets=bounds, axis=0, unsafe=True).to(rows_of.dtype)
    return torch.segment_reduce(data, "sum", offsets=bounds, axis=0, unsafe=True)


# ---- activations in NVFP4 (the sm_120 W4A4 recipe) ---------------------------------------------

def _expert_amax(v: Tensor, lay: _Layout, plan: Plan, e_count: int) -> Tensor:
    """max |v| over each expert's live buffer rows (finite values only): ``[E]`` fp32."""
    if v.shape[1] == 0:  # K = 0 (d or r): nothing to scale; amax refuses an empty reduction
        return v.new_zeros(e_count, dtype=torch.float32)
    row = torch.where(torch.isfinite(v), v.abs(), 0).amax(1).float()
    row = torch.where(lay.row_live, row, 0)
    ra, rt = _parts(row.unsqueeze(1), lay, plan, e_count)
    a = ra.squeeze(2).amax(1) if plan.h0 else row.new_zeros(e_count)
    if plan.n_tiles:
        a = torch.maximum(a, torch.segment_reduce(rt.squeeze(2).amax(1), "max", offsets=lay.tile_offsets,
                                                  axis=0, unsafe=True, initial=0))
    return a


def _quantize_act(v: Tensor, lay: _Layout, plan: Plan, e_count: int) -> tuple[Tensor, Tensor]:
    """NVFP4 activations, one encode scale per expert: (E2M1 value x block scale in ``v.dtype``, exact;
    ``1 / s_enc`` of each buffer row, fp32). ``quantized * inv`` is what the quantized rows represent."""
    from tsct.quant import formats
    from tsct.quant.nvfp4 import _quantize_blocks_torch, nvfp4_encode_scale

    amax = _expert_amax(v, lay, plan, e_count)
    s_enc = nvfp4_encode_scale(amax.view(e_count, 1, 1))
    s_row = s_enc[lay.row_expert]
    rows, k = v.shape
    codes, sf = _quantize_blocks_torch(v.view(rows, 1, k), s_row)
    vals = formats.e2m1_decode(formats.unpack_nibbles(codes)).view(rows, k // 16, 16)
    q = (vals * sf.float().view(rows, k // 16, 1)).view(rows, k)
    return q.to(v.dtype), torch.reciprocal(s_row)


# ---- forward / backward --------------------------------------------------------------------------

def _forward_core(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, plan: Plan, activations: str,
                  need_y: bool = True):
    """(layout, buffer x, a, b, g, u, z in fp32, y buffer with the row weights applied): the forward's
    intermediates (y only with ``need_y``)."""
    e_count = offs.shape[0]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    lay = _layout(offs, m, plan)
    dt = x.dtype
    xb = _to_buffer(x, gather_idx, lay)
    tiles = lay.tile_expert if plan.n_tiles else None
    wg_t = w_gate.index_select(0, tiles) if tiles is not None else None
    wu_t = w_up.index_select(0, tiles) if tiles is not None else None
    if activations == "nvfp4":
        xq, inv_x = _quantize_act(xb, lay, plan, e_count)
        a = _project(xq, w_gate, wg_t, lay, plan, True) * inv_x.unsqueeze(1)
        b = _project(xq, w_up, wu_t, lay, plan, True) * inv_x.unsqueeze(1)
    else:
        a = _project(xb, w_gate, wg_t, lay, plan, True)
        b = _project(xb, w_up, wu_t, lay, plan, True)
    g = a * s_gate[lay.row_expert] if s_gate is not None else a
    u = b * s_up[lay.row_expert] if s_up is not None else b
    z = torch.nn.functional.silu(g) * u
    if not need_y:
        return lay, xb, a, b, g, u, z, None
    rwb = _buffer_row_weight(row_weight, lay, x.device)
    wd_t = w_down.index_select(0, tiles) if tiles is not None else None
    if activations == "nvfp4":  # z is quantized as the kernel writes it; the row weight comes after
        zq, inv_z = _quantize_act(z.to(dt), lay, plan, e_count)
        scale = inv_z if rwb is None else inv_z * rwb
        y = (_project_wide(zq, w_down, wd_t, lay, plan).float() * scale.unsqueeze(1)).to(dt)
    else:  # (z * w_row) @ W_down: the row weight folded into the small operand
        y = _project_wide((z if rwb is None else z * rwb.unsqueeze(1)).to(dt), w_down, wd_t, lay, plan)
    return lay, xb, a, b, g, u, z, y


def _buffer_row_weight(row_weight: Optional[Tensor], lay: _Layout, device) -> Optional[Tensor]:
    """The row weight of each buffer row (fp32 ``[R + 1]``; 0 for rows without a routed row), or None."""
    if row_weight is None:
        return None
    rwb = torch.zeros(lay.rows + 1, dtype=torch.float32, device=device)
    return rwb.index_copy_(0, lay.dest, torch.where(lay.valid, row_weight.float(), 0))


def _plan_for(offs: Tensor, m: int, w_gate: Tensor, w_down: Tensor, gather_idx=None, scatter_idx=None,
              num_out_rows=None, x_rows: int = 0) -> Plan:
    """The host plan from the per-expert counts and the combines' fans in eager mode, with the index-value
    checks of ``tsct.config.check_values`` (``tsct.ops`` defers them to this read): ONE device-to-host read.
    The static plan while a CUDA graph is captured or torch.compile traces."""
    from tsct import config
    from tsct.ops import _validate

    e_count = offs.shape[0]
    capturing = offs.is_cuda and torch.cuda.is_current_stream_capturing()
    if capturing or torch.compiler.is_compiling() or e_count == 0:
        return static_plan(m, e_count)
    facts = _validate.routing_facts(offs, m, gather_idx, x_rows, scatter_idx, num_out_rows).tolist()
    if config.values_checked(offs):
        _validate.check_routing_facts(facts, m, x_rows, num_out_rows)
    fan_in, fan_out = facts[-4], facts[-1]
    counts = np.diff(np.asarray(facts[:e_count], dtype=np.int64), prepend=0).clip(0)
    plan = plan_from_counts(counts, w_gate.shape[1], w_gate.shape[2], w_down.shape[2])
    return dataclasses.replace(plan, fan_out=max(fan_out, 1), fan_in=max(fan_in, 1))


def _check_activations(activations: str, d: int, r: int) -> None:
    if activations not in ("bf16", "nvfp4"):
        raise ValueError(f"grouped_glu: activations must be 'bf16' or 'nvfp4', got {activations!r}")
    if activations == "nvfp4" and (d % 16 or r % 16):
        raise ValueError(f"grouped_glu: activations='nvfp4' quantizes rows in blocks of 16 along K: d = {d} and "
                         f"r = {r} must be multiples of 16")


def _cpu_fp32(*ts):
    """On the CPU, 16-bit operands in fp32: the CPU's bf16 GEMMs are slower than its fp32 ones (and the
    products of bf16 values accumulated in fp32 are the same numbers up to the final rounding)."""
    return [t.float() if (t is not None and t.is_floating_point() and t.dtype != torch.float32) else t for t in ts]


def grouped_glu_forward_saved(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None,
                              gather_idx=None, scatter_idx=None, num_out_rows=None, *, activations: str = "bf16",
                              static: bool = False):
    """(out, [plan]): the forward (``grouped_glu_forward``) and the layout plan its backward reuses
    (a CPU int64 tensor, so the backward reads nothing from the device)."""
    if offs.shape[0] == 0:  # no experts: every row is padding (the layout's tables index expert 0)
        rows = num_out_rows if scatter_idx is not None else (gather_idx if gather_idx is not None else x).shape[0]
        return x.new_zeros(rows, w_down.shape[2]), [static_plan(0, 0).as_tensor()]
    if x.device.type == "cpu" and x.dtype != torch.float32 and activations == "bf16":
        out, saved = _forward_saved(*_cpu_fp32(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight), gather_idx,
                                    scatter_idx, num_out_rows, activations=activations, static=static)
        return out.to(x.dtype), saved
    return _forward_saved(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                          num_out_rows, activations=activations, static=static)


def _forward_saved(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None,
                   gather_idx=None, scatter_idx=None, num_out_rows=None, *, activations: str = "bf16",
                   static: bool = False):
    """(out, [plan]): the forward (``grouped_glu_forward``) and the layout plan its backward reuses
    (a CPU int64 tensor, so the backward reads nothing from the device)."""
    _check_activations(activations, w_gate.shape[1], w_gate.shape[2])
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    plan = static_plan(m, offs.shape[0]) if static else _plan_for(offs, m, w_gate, w_down, gather_idx, scatter_idx,
                                                                  num_out_rows, x.shape[0])
    lay, _, _, _, _, _, _, y = _forward_core(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                                             plan, activations)
    f = w_down.shape[2]
    if scatter_idx is not None:
        out = combine_rows(y, lay.dest, scatter_idx, lay.valid, num_out_rows, plan.fan_out, f)
    else:
        out = torch.where(lay.valid.unsqueeze(1), y.index_select(0, lay.dest)[:, :f], 0)
    return out.to(x.dtype).view(out.shape[0], f), [plan.as_tensor()]


def grouped_glu_forward(x, offs, w_gate, w_up, w_down, s_gate=None, s_up=None, row_weight=None, gather_idx=None,
                        scatter_idx=None, num_out_rows=None, *, activations: str = "bf16", static: bool = False):
    """``[num_out_rows, f]`` with ``scatter_idx``, else ``[M, f]``; ``x.dtype``. Inputs validated by
    ``tsct.ops`` (dense factors in ``x.dtype``); the math of ``tsct.reference.grouped_glu_forward``."""
    return grouped_glu_forward_saved(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                                     scatter_idx, num_out_rows, activations=activations, static=static)[0]


def saved_like(x, w_gate, gather_idx, scatter_idx=None, num_out_rows=None):
    """Fake of the saved list: the plan (CPU int64 [5])."""
    return [torch.empty(5, dtype=torch.int64, device="cpu")]


def grouped_glu_backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                         num_out_rows, needs_grad, saved=None, *, activations: str = "bf16", static: bool = False):
    """Gradients of (x, w_gate, w_up, w_down, s_gate, s_up, row_weight) (``_backward``), in each input's dtype;
    on the CPU computed from fp32 copies of 16-bit inputs, as the forward."""
    inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
    if offs.shape[0] == 0:  # no experts: every row is padding, every gradient zero
        return [torch.zeros_like(t) if (t is not None and need) else None for t, need in zip(inputs, needs_grad)]
    if x.device.type == "cpu" and x.dtype != torch.float32:
        grads = _backward(*_cpu_fp32(grad_out, x), offs, *_cpu_fp32(w_gate, w_up, w_down, s_gate, s_up, row_weight),
                          gather_idx, scatter_idx, num_out_rows, needs_grad, saved, static=static)
        return [g.to(t.dtype) if g is not None else None for g, t in zip(grads, inputs)]
    return _backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
                     num_out_rows, needs_grad, saved, static=static)


def _backward(grad_out, x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx, scatter_idx,
              num_out_rows, needs_grad, saved=None, *, static: bool = False):
    """Gradients of (x, w_gate, w_up, w_down, s_gate, s_up, row_weight), the reference's formulas
    (``tsct.reference.grouped_glu_backward``) on the padded buffer. ``activations`` does not enter:
    the activation quantization is straight-through. Gradients in each input's dtype."""
    e_count = offs.shape[0]
    m = gather_idx.shape[0] if gather_idx is not None else x.shape[0]
    if saved:
        plan = Plan.from_tensor(saved[0])
    else:
        plan = static_plan(m, e_count) if static else _plan_for(offs, m, w_gate, w_down, gather_idx, scatter_idx,
                                                                num_out_rows, x.shape[0])
    lay, xb, a, b, g, u, z, _ = _forward_core(x, offs, w_gate, w_up, w_down, s_gate, s_up, row_weight, gather_idx,
                                              plan, "bf16", need_y=False)
    dt = x.dtype
    live = lay.row_live.unsqueeze(1)
    tiles = lay.tile_expert if plan.n_tiles else None
    # dY (without the row weight) on the buffer rows
    f = w_down.shape[2]
    # rows 16-byte aligned for the gather at odd f; the pad columns never enter a product
    dyb = _to_buffer(grad_out.to(dt), scatter_idx, lay, _round_up(f, 8) - f)[:, :f]
    rwb = torch.ones(lay.rows + 1, dtype=torch.float32, device=x.device)
    if row_weight is not None:
        rwb.index_copy_(0, lay.dest, torch.where(lay.valid, row_weight.float(), 0))
    wd_t = w_down.index_select(0, tiles) if tiles is not None else None
    dz_raw = _project(dyb, w_down.transpose(1, 2), wd_t.transpose(1, 2) if wd_t is not None else None,
                      lay, plan, True)
    dz_raw = torch.where(live, dz_raw, 0)
    zl = torch.where(live, z, 0)
    grads: list[Optional[Tensor]] = [None] * 7
    if needs_grad[6] and row_weight is not None:
        drw = (dz_raw * zl).sum(1).index_select(0, lay.dest)
        grads[6] = torch.where(lay.valid, drw, 0)
    if needs_grad[3]:
        zw = (zl * rwb.unsqueeze(1)).to(dt)
        if is_kmajor(w_down):  # dW^T = dY^T zw: the K-major gradient without a transposing copy
            grads[3] = _weight_grad(dyb, zw, lay, plan, e_count).transpose(1, 2)
        else:
            grads[3] = _weight_grad(zw, dyb, lay, plan, e_count)
        del zw
    del dyb  # [R, f]: the largest buffer, freed before the other gradients are allocated (peak memory)
    dz = dz_raw * rwb.unsqueeze(1)
    sig = torch.sigmoid(g)
    du = torch.where(live, dz * (g * sig), 0)
    dg = torch.where(live, dz * u * (sig * (1 + g * (1 - sig))), 0)
    if needs_grad[4] and s_gate is not None:
        grads[4] = _expert_sum(torch.where(live, dg * a, 0), lay, plan, e_count)
    if needs_grad[5] and s_up is not None:
        grads[5] = _expert_sum(torch.where(live, du * b, 0), lay, plan, e_count)
    # masked again: an empty expert's buffer rows hold dg = 0, and 0 * a NaN / inf scale of that expert would
    # reach its factor gradients (which must be exact zeros)
    da = torch.where(live, dg * s_gate[lay.row_expert], 0) if s_gate is not None else dg
    db = torch.where(live, du * s_up[lay.row_expert], 0) if s_up is not None else du
    da_c, db_c = da.to(dt), db.to(dt)
    if needs_grad[1]:
        grads[1] = _weight_grad(xb, da_c, lay, plan, e_count)
    if needs_grad[2]:
        grads[2] = _weight_grad(xb, db_c, lay, plan, e_count)
    del xb, a, b, g, u, z, zl, dz_raw, dz, sig, du, dg, da, db
    if needs_grad[0]:
        wg_t = w_gate.index_select(0, tiles).transpose(1, 2) if tiles is not None else None
        wu_t = w_up.index_select(0, tiles).transpose(1, 2) if tiles is not None else None
        dxb = _project(da_c, w_gate.transpose(1, 2), wg_t, lay, plan, False)
        dxb += _project(db_c, w_up.transpose(1, 2), wu_t, lay, plan, False)
        if gather_idx is not None:
            grads[0] = combine_rows(dxb, lay.dest, gather_idx, lay.valid, x.shape[0], plan.fan_in)
        else:
            grads[0] = torch.where(lay.valid.unsqueeze(1), dxb.index_select(0, lay.dest), 0)
    inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
    return [gr.to(t.dtype) if (gr is not None and t is not None and need) else None
            for gr, t, need in zip(grads, inputs, needs_grad)]

