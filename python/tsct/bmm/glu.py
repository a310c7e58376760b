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

import torch
from torch import Tensor

from tsct.kernels.layout import is_kmajor

__all__ = ["Plan", "plan_from_counts", "static_plan", "grouped_glu_forward", "grouped_glu_forward_saved",
           "grouped_glu_backward", "saved_like", "combine_rows"]

#: tile heights the eager plan chooses from
TILE_ROWS = (32, 64, 128, 256)


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
    ``12 (2 d r + r f)``). Candidates: ``h0`` in 0 and the counts' values rounded up to 8 (at most 33
    quantiles), tile heights ``TILE_ROWS``.
    """
    import numpy as np

    c = np.asarray(counts, dtype=np.int64)
    e = c.size
    if e == 0 or int(c.max(initial=0)) == 0:
        return Plan(0, TILE_ROWS[0], 0)
    row = 18 * d + 12 * f
    tile_w = 20 * (2 * d * r + r * f)
    qs = np.unique(np.quantile(c, np.linspace(0, 1, 33), method="higher").astype(np.int64))
    cands = np.unique(np.concatenate([[0], -(-qs // 8) * 8]))
    over = np.clip(c[None, :] - cands[:, None], 0, None)                       # [K, E]
    b = np.asarray(TILE_ROWS, dtype=np.int64)
    nt = (-(-over[:, None, :] // b[None, :, None])).sum(2)                      # [K, len(TILE_ROWS)]
    cost = e * cands[:, None] * row + nt * (b[None, :] * row + tile_w)
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

@dataclasses.dataclass
class _Layout:
    dest: Tensor          # [M] int64 buffer row of each routed row; the dump row R for padding rows
    valid: Tensor         # [M] bool: routed row (before offs[-1])
    row_expert: Tensor    # [R + 1] int64 expert of each buffer row (0 for the dump row)
    row_live: Tensor      # [R + 1] bool: the buffer row holds a routed row
    tile_expert: Tensor   # [n_tiles] int64
    tile_offsets: Tensor  # [E + 1] int64: expert e's tiles are tile_offsets[e]:tile_offsets[e+1]
    hot_expert: Tensor    # [H] int64, H = min(E, n_tiles): the experts with tiles, in order, then E - 1 (no tiles)
    hot_offsets: Tensor   # [H + 1] int64: hot_expert[h]'s tiles (empty segments for the padding entries)
    r0: int               # rows of the dense part (E * h0)
    rows: int             # R


def _layout(offs: Tensor, m: int, plan: Plan) -> _Layout:
    dev = offs.device
    e_count = offs.shape[0]
    h0, b, n = plan.h0, plan.b, plan.n_tiles
    r0 = e_count * h0
    rows = r0 + n * b
    ends = offs.long()
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = ends - starts
    i = torch.arange(m, device=dev)
    e = torch.searchsorted(ends, i, right=True)
    valid = e < e_count
    e = e.clamp(max=e_count - 1)
    j = i - starts[e]
    nt = torch.div(torch.clamp(counts - h0, min=0) + (b - 1), b, rounding_mode="floor")
    tile_end = torch.cumsum(nt, 0)
    jo = torch.clamp(j - h0, min=0)
    tile = tile_end[e] - nt[e] + torch.div(jo, b, rounding_mode="floor")
    dest = torch.where(j < h0, e * h0 + j, r0 + tile * b + jo % b)
    # rows past offs[-1], and (only for offsets the checks would refuse) a tile past the bound: dump row
    dest = torch.where(valid & ((j < h0) | (tile < n)), dest, rows)
    t = torch.arange(n, device=dev)
    tile_expert = torch.searchsorted(tile_end, t, right=True).clamp(max=max(e_count - 1, 0))
    row_expert = torch.cat([torch.arange(e_count, device=dev).repeat_interleave(h0),
                            tile_expert.repeat_interleave(b), torch.zeros(1, dtype=torch.long, device=dev)])
    row_live = torch.zeros(rows + 1, dtype=torch.bool, device=dev)
    row_live.index_fill_(0, dest, True)
    row_live.narrow(0, rows, 1).fill_(False)  # the dump row (no host scalar: capture-safe)
    tile_offsets = torch.cat([tile_end.new_zeros(1), tile_end.clamp(max=n)])
    n_hot = min(e_count, n)
    is_hot = nt > 0
    hot = torch.full((n_hot + 1,), e_count, dtype=torch.long, device=dev)
    hot.index_copy_(0, torch.where(is_hot, torch.cumsum(is_hot, 0) - 1, n_hot).clamp(max=n_hot),
                    torch.arange(e_count, device=dev))
    hot = hot[:n_hot]
    nt_ext = torch.cat([nt, nt.new_zeros(1)])
    hot_offsets = torch.cat([nt.new_zeros(1), torch.cumsum(nt_ext[hot], 0).clamp(max=n)])
    return _Layout(dest, valid, row_expert, row_live, tile_expert, tile_offsets, hot.clamp(max=e_count - 1),
                   hot_offsets, r0, rows)


def _to_buffer(src: Tensor, idx: Optional[Tensor], lay: _Layout, pad_cols: int = 0) -> Tensor:
    """``[R + 1, C + pad_cols]``: buffer row ``dest[i]`` holds ``src[idx[i]]`` (``src[i]`` without idx);
    every other row is exactly 0 (so no NaN or inf of another row can reach a product): one gather from
    ``src`` with a zero row (and ``pad_cols`` columns, 16-byte rows at odd widths) appended."""
    m, n = lay.dest.shape[0], src.shape[0]
    rows = idx.long() if idx is not None else torch.arange(m, device=src.device)
    buf_src = torch.full((lay.rows + 1,), n, dtype=torch.long, device=src.device)
    buf_src.index_copy_(0, lay.dest, torch.where(lay.valid, rows, n))
    buf_src.narrow(0, lay.rows, 1).fill_(n)
    return torch.nn.functional.pad(src, (0, pad_cols, 0, 1)).index_select(0, buf_src)


def _row_ids(idx: Optional[Tensor], valid: Tensor) -> Optional[Tensor]:
    """gather/scatter indices with padding entries (never read, possibly garbage) replaced by 0."""
    if idx is None:
        return None
    return torch.where(valid, idx.long(), 0)


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
    if o.dtype == a.dtype:
        torch.bmm(a, b, out=o)
    elif _bmm_out_dtype_ok(a.device.type):
        torch.bmm(a, b, out_dtype=o.dtype, out=o)
    elif a.device.type == "cpu":
        torch.bmm(a.to(o.dtype), b.to(o.dtype), out=o)
    else:
        o.copy_(torch.bmm(a, b))


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
        torch.bmm(da, w, out=do[..., :n_out])
    if plan.n_tiles:
        torch.bmm(ta, w_tiles, out=to[..., :n_out])
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
        g = torch.bmm(aa.transpose(1, 2), ba)
    else:
        g = torch.zeros(e_count, a_dim, b_dim, dtype=a_buf.dtype, device=a_buf.device)
    if plan.n_tiles:  # only the experts with tiles; the padding entries add exact zeros
        part = _mm32(at.transpose(1, 2), bt).reshape(plan.n_tiles, a_dim * b_dim)
        tiles = torch.segment_reduce(part, "sum", offsets=lay.hot_offsets, axis=0, unsafe=True)
        g.index_add_(0, lay.hot_expert, tiles.view(-1, a_dim, b_dim).to(g.dtype))
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
    ``rows_of``) and one ``sum`` over it adds them in fp32 and rounds once. Without it each target's
    segment is summed by ``torch.segment_reduce`` in that order (each add rounded). Rows with ``valid``
    False are left out. ``cols``: the first columns of ``rows_of`` that hold data (default all).
    """
    m, c = target.shape[0], (cols if cols is not None else rows_of.shape[1])
    dump = rows_of.shape[0] - 1
    if m == 0 or num_out_rows == 0:
        return rows_of.new_zeros(num_out_rows, c)
    key = torch.where(valid, target, num_out_rows)
    order = torch.sort(key, stable=True).indices
    skey = key[order]
    if fan > 0:
        rank = torch.arange(m, device=key.device) - torch.searchsorted(skey, skey)
        slot = torch.where(skey < num_out_rows, skey * fan + rank, num_out_rows * fan)
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
    bounds = torch.searchsorted(skey, torch.arange(num_out_rows + 1, device=key.device))
    data = rows_of.index_select(0, rows_src[order])[:, :c]
    return torch.segment_reduce(data, "sum", offsets=bounds, axis=0, unsafe=True)


def _fan(idx: Optional[Tensor], valid: Tensor, n: int) -> Tensor:
    """The most valid routed rows any of the ``n`` rows of ``idx`` receives (a 0-dim device tensor). Entries
    outside ``[0, n)`` are not counted (the value check that runs in the same host read reports them)."""
    if idx is None:
        return torch.ones((), dtype=torch.long, device=valid.device)
    cnt = torch.zeros(n + 1, dtype=torch.long, device=valid.device)
    v = idx.long()
    cnt.index_add_(0, torch.where(valid & (v >= 0) & (v < n), v, n), torch.ones_like(valid, dtype=torch.long))
    return cnt[:n].amax() if n else cnt.new_zeros(())


# ---- activations in NVFP4 (the sm_120 W4A4 recipe) ---------------------------------------------

def _expert_amax(v: Tensor, lay: _Layout, plan: Plan, e_count: int) -> Tensor:
    """max |v| over each expert's live buffer rows (finite values only): ``[E]`` fp32."""
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
    g = a * s_gate.float()[lay.row_expert] if s_gate is not None else a
    u = b * s_up.float()[lay.row_expert] if s_up is not None else b
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
    check = config.check_values
    valid = torch.arange(m, device=offs.device) < offs[-1]
    zero = offs.new_zeros((), dtype=torch.long)
    parts = [_validate.value_facts(offs, m, gather_idx, scatter_idx) if check else offs.long(),
             torch.stack([_fan(scatter_idx, valid, num_out_rows or 0) if scatter_idx is not None else zero,
                          _fan(gather_idx, valid, x_rows) if gather_idx is not None else zero])]
    host = torch.cat(parts).tolist()
    facts, (fan_out, fan_in) = host[:-2], host[-2:]
    if check:
        _validate.check_value_facts(facts, m, x_rows, num_out_rows)
    ends = facts[:e_count]
    counts = [max(b - a, 0) for a, b in zip([0] + ends[:-1], ends)]
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
        out = combine_rows(y, lay.dest, _row_ids(scatter_idx, lay.valid), lay.valid, num_out_rows, plan.fan_out, f)
    else:
        out = torch.where(lay.valid.unsqueeze(1), y.index_select(0, lay.dest)[:, :f], 0)
    return out.to(x.dtype).view(-1, f), [plan.as_tensor()]


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
    if x.device.type == "cpu" and x.dtype != torch.float32:
        inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
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
    da = dg * s_gate.float()[lay.row_expert] if s_gate is not None else dg
    db = du * s_up.float()[lay.row_expert] if s_up is not None else du
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
            grads[0] = combine_rows(dxb, lay.dest, _row_ids(gather_idx, lay.valid), lay.valid, x.shape[0], plan.fan_in)
        else:
            grads[0] = torch.where(lay.valid.unsqueeze(1), dxb.index_select(0, lay.dest), 0)
    inputs = (x, w_gate, w_up, w_down, s_gate, s_up, row_weight)
    return [gr.to(t.dtype) if (gr is not None and t is not None and need) else None
            for gr, t, need in zip(grads, inputs, needs_grad)]

