"""Quantization error of the fp8 and ternary factor-format candidates on trained-looking factors.

fp8 (E4M3 codes): (a) one fp32 scale per output column per expert, amax / 448; (b) MX blocks of 32 along
K with an E8M0 (power-of-two) scale, exponent rounded up so no element saturates (OCP MX v1.0 block;
the round-up exponent as TransformerEngine's MXFP8 quantizer).
ternary (codes -1 / 0 / +1, BitNet b1.58, arXiv:2402.17764): RoundClip(W / gamma, -1, 1) decoded as
q * gamma with (a) gamma = absmean of each column; (b) gamma[k, n] = a[k] b[n], the rank-1 fit of |W| the
sign format uses (tsct.quant.sign.rank1_magnitude_fit).

Errors per matrix, averaged over the experts: relative Frobenius ||W - W_hat|| / ||W|| and the max
|W - W_hat| / max |W|, and the bulk error: the median over the K rows of each row's relative error (what the
rows without outliers see). The decisions (docs/decisions/0021, 0022) quote this script's output.
Usage: PYTHONPATH=python python tools/quant_error_fp8_ternary.py [--experts 4] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from tsct.quant.sign import rank1_magnitude_fit


# ---- candidates (storage orientation [B, N, K]: K = contraction dim, contiguous) ---------------------
def fp8_per_column(x):
    amax = x.abs().amax(dim=2, keepdim=True)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x / s).to(torch.float8_e4m3fn).float() * s


def fp8_mx32(x):
    b, n, k = x.shape
    xb = x.reshape(b, n, k // 32, 32)
    amax = xb.abs().amax(dim=3, keepdim=True)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    s = torch.where(amax > 0, torch.exp2(e), torch.ones_like(amax))
    return ((xb / s).to(torch.float8_e4m3fn).float() * s).reshape(b, n, k)


def _roundclip(y):
    return torch.round(y).clamp(-1, 1)  # torch.round: half to even, as BitNet's RoundClip in torch


def ternary_absmean(x):
    g = x.abs().mean(dim=2, keepdim=True)
    q = torch.where(g > 0, _roundclip(x / torch.where(g > 0, g, 1.0)), 0.0)
    return q * g


def ternary_rank1(x):
    a, b = rank1_magnitude_fit(x)
    g = b.unsqueeze(2) * a.unsqueeze(1)
    q = torch.where(g > 0, _roundclip(x / torch.where(g > 0, g, 1.0)), 0.0)
    return q * g


# ---- trained-looking factors (logical [E, K, N]) ---------------------------------------------------
def gaussian(e, k, n, g):
    return torch.randn(e, k, n, generator=g) / k ** 0.5


def heavy_columns(e, k, n, g):
    """Student-t (3 dof) entries, each column with a log-normal scale (sigma 1)."""
    z = torch.randn(e, k, n, generator=g)
    chi = torch.randn(e, k, n, 3, generator=g).square().sum(-1) / 3
    return z / chi.sqrt() * torch.exp(torch.randn(e, 1, n, generator=g)) / k ** 0.5


def outlier_rows(factor):
    def make(e, k, n, g):
        w = torch.randn(e, k, n, generator=g) / k ** 0.5
        rows = torch.randint(0, k, (e, 4), generator=g)
        for i in range(e):
            w[i, rows[i]] *= factor
        return w
    return make


def low_rank_factor(e, k, n, g, inner=256):
    """Factors of a trained-looking matrix: M = A diag(s) B (power-law spectrum, rows of A with log-normal
    norms), truncated to rank r by SVD. k > n: the down factor U_r sqrt(S_r) [k, r]; k < n: sqrt(S_r) V_r^T."""
    out = []
    for _ in range(e):
        big, r = max(k, n), min(k, n)
        other = 4 * r
        a = torch.randn(big, inner, generator=g, dtype=torch.float64) * torch.exp(
            0.7 * torch.randn(big, 1, generator=g, dtype=torch.float64))
        s = torch.arange(1, inner + 1, dtype=torch.float64) ** -0.8
        bmat = torch.randn(inner, other, generator=g, dtype=torch.float64)
        u, sv, _ = torch.linalg.svd((a * s) @ bmat, full_matrices=False)
        f = (u[:, :r] * sv[:r].sqrt()).float()  # [big, r]
        out.append(f if k > n else f.t().contiguous())
    w = torch.stack(out)
    return w / w.std()


CASES = {
    "gaussian": gaussian,
    "heavy-tailed columns": heavy_columns,
    "4 outlier rows x30": outlier_rows(30.0),
    "4 outlier rows x1000": outlier_rows(1000.0),
    "low-rank factor": low_rank_factor,
}
CANDIDATES = {
    "fp8 per-column": fp8_per_column,
    "fp8 mx32-e8m0": fp8_mx32,
    "ternary absmean": ternary_absmean,
    "ternary rank-1": ternary_rank1,
}


def errors(w, what):
    x = w.transpose(1, 2).contiguous()
    xh = what(x).transpose(1, 2)
    d = (w - xh).double()
    rel = (d.flatten(1).norm(dim=1) / w.double().flatten(1).norm(dim=1)).mean().item()
    mx = (d.abs().flatten(1).amax(1) / w.double().abs().flatten(1).amax(1)).mean().item()
    # the bulk: the median over K rows of the row's relative error (outlier rows do not dominate it)
    bulk = (d.norm(dim=2) / w.double().norm(dim=2).clamp_min(1e-300)).median(dim=1).values.mean().item()
    return rel, mx, bulk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    shapes = {"w_gate [d=2048, r=64]": (2048, 64), "w_down [r=64, f=5461]": (64, 5461)}
    print(f"{'shape':24} {'case':22} " + " ".join(f"{c:>32}" for c in CANDIDATES))
    print(f"{'':24} {'':22} " + " ".join(f"{'rel-Frob / max-rel / bulk':>32}" for _ in CANDIDATES))
    for sname, (k, n) in shapes.items():
        for cname, make in CASES.items():
            g = torch.Generator().manual_seed(a.seed)
            w = make(a.experts, k, n, g)
            cells = []
            for what in CANDIDATES.values():
                rel, mx, bulk = errors(w, what)
                cells.append(f"{rel:8.2e} / {mx:8.2e} / {bulk:8.2e}")
            print(f"{sname:24} {cname:22} " + " ".join(f"{c:>32}" for c in cells))


if __name__ == "__main__":
    main()
