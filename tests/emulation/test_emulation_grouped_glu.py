"""The emulated W4A4 grouped GLU (two NVFP4 grouped GEMMs + epilogues) against the reference op."""

import torch

from _glu_oracle import problem_with_counts
from tsct.emulation import plan
from tsct.emulation.grouped_glu import (dequantize_rows_grouped, grouped_glu_w4a4, prepare_glu_factors,
                                        quantize_rows_grouped)
from tsct.emulation.nvfp4_mma import grouped_gemm_emulated
from tsct.reference.glu import grouped_glu_forward


def test_each_kernel_matches_reference_on_dequantized_operands():
    counts = [32, 0, 7, 40, 0, 1]
    offs, x, wg, wu, wd, sg, su, rw = problem_with_counts(counts, d=128, r=64, f=75)
    fac = prepare_glu_factors(wg, wu, wd)
    y, mid = grouped_glu_w4a4(x, offs, fac, sg, su, rw, return_intermediates=True)
    xd = dequantize_rows_grouped(mid["xq"], offs)
    wgd, wud, wdd = (fac.gate.dequantize(torch.float32), fac.up.dequantize(torch.float32),
                     fac.down.dequantize(torch.float32))
    # kernel 1 (GLU epilogue) == the reference's z on the dequantized x and factors; z is bf16
    bounds = [0] + offs.tolist()
    for e in range(len(counts)):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            g = (xd[lo:hi] @ wgd[e]) * sg[e]
            u = (xd[lo:hi] @ wud[e]) * su[e]
            z_ref = torch.nn.functional.silu(g) * u
            torch.testing.assert_close(mid["z"][lo:hi].float(), z_ref, rtol=2 ** -7, atol=1e-4)
    # kernel 2 (row_weight epilogue) == the reference second half on the dequantized z and w_down
    zd = dequantize_rows_grouped(mid["zq"], offs)
    y_ref = torch.cat([zd[bounds[e]:bounds[e + 1]] @ wdd[e] for e in range(len(counts))]) * rw.unsqueeze(1)
    torch.testing.assert_close(y.float(), y_ref, rtol=2 ** -7, atol=1e-4)
    # and the whole op with the GEMM-1 input already dequantized matches the reference op's first half
    y_full_ref = grouped_glu_forward(xd, offs, wgd, wud, wdd, sg, su, rw)
    rel = (y.float() - y_full_ref).norm() / y_full_ref.norm()
    assert rel < 0.15  # only z's requantization separates them


def test_w4a4_error_vs_bf16_reference():
    counts = [32, 0, 17, 40, 3, 0, 36]
    offs, x, wg, wu, wd, sg, su, rw = problem_with_counts(counts, d=256, r=64, f=96, seed=1)
    fac = prepare_glu_factors(wg, wu, wd)
    y = grouped_glu_w4a4(x, offs, fac, sg, su, rw)
    ref = grouped_glu_forward(x.bfloat16(), offs, wg.bfloat16(), wu.bfloat16(), wd.bfloat16(), sg.bfloat16(),
                              su.bfloat16(), rw.bfloat16()).float()
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    # NVFP4 (E2M1, 16-element UE4M3 blocks) on both operands of both GEMMs (x, w_gate/w_up, z, w_down):
    # measured 0.23 relative error on this problem (2026-11-29, CPU, seed 1), all of it the format's
    # (the test above shows the kernels match the reference on the dequantized operands); a layout or
    # scale bug gives O(1).
    print(f"W4A4 relative Frobenius error vs bf16 reference: {rel:.4f}")
    assert 0.05 < rel < 0.35
    cos = torch.nn.functional.cosine_similarity(y.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.97


def test_glu_epilogue_pairs_interleaved_rows():
    # one expert, identity-like check: the GLU epilogue pairs B row 2j (gate) with 2j+1 (up)
    offs, x, wg, wu, wd, sg, su, rw = problem_with_counts([5], d=64, r=64, f=32)
    fac = prepare_glu_factors(wg, wu, wd)
    xq = quantize_rows_grouped(x, offs, 32)
    p = plan.make_plan(offs, 5, 128, 64, tile_m=32, tile_n=128)
    ones = torch.ones(1, 64)
    ep0, ep1 = plan.glu_scales(fac.gate.global_scale, fac.up.global_scale, ones, ones, 64)
    alpha = plan.alpha_from_encode_scales(xq.s_enc)
    z = grouped_gemm_emulated(xq.codes, xq.sfa, xq.sfa_offsets, fac.gu_codes, fac.gu_sfb, offs, p.tile_expert,
                              p.tile_row, 32, alpha, epilogue="glu", ep0=ep0, ep1=ep1, out_dtype=torch.float32,
                              m_out=5)
    xd = dequantize_rows_grouped(xq, offs)
    g, u = xd @ fac.gate.dequantize(torch.float32)[0], xd @ fac.up.dequantize(torch.float32)[0]
    torch.testing.assert_close(z, torch.nn.functional.silu(g) * u, rtol=1e-5, atol=1e-5)
