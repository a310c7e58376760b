"""Session 16 prototype harness: the up kernel with the combine fused (ablation modes), b1 NVFP4 / sign forward.
usage: fused_ab.py OUT.json   (TSCT_NATIVE_LIB selects the library; modes need the proto library)"""
import ctypes, json, os, sys
import torch
from tsct import config as C
from tsct.bench import arms as A, inputs, measure
from tsct.bench.config import from_preset
from tsct.native import _loader
from tsct.kernels.triton_glu import glu as G
from tsct.ops import sort_by_expert

cfg = from_preset("b1", device="cuda").resolved()
dense = inputs.make_dense_factors(cfg)
sets = inputs.make_input_sets(cfg, 2)
C.check_values = False
dev = torch.device("cuda")
lib = _loader.get_lib()
proto = hasattr(lib, "tsct_proto_up_fused")
T = sets[0].x.shape[0]
f = cfg.f if hasattr(cfg, "f") else dense.w_down.shape[-1]

roles = []
for s_in in sets:
    s = sort_by_expert(s_in.ids, cfg.experts, s_in.weights)
    tok = s.token.to(torch.int64)
    order = torch.argsort(tok, stable=True)
    pairs = order.view(-1, 2)
    first, second = pairs.min(1).values, pairs.max(1).values
    partner = torch.full_like(tok, -1)
    partner[second] = first
    roles.append((partner.to(torch.int32), tok.to(torch.int32),
                  torch.empty(T * ((f + 7) // 8 * 8), device=dev, dtype=torch.bfloat16)))

state = {"mode": 0, "set": 0}
orig_combine = G.combine_forward
def combine(y, scatter_idx, offs, n_out, f_, cfg_, cap, saved, save, csr):
    if state["mode"]:
        buf = roles[state["set"]][2]
        return buf.view(T, -1)[:, :f] if state["mode"] == 4 else buf[:T * f].view(T, f)
    return orig_combine(y, scatter_idx, offs, n_out, f_, cfg_, cap, saved, save, csr)
G.combine_forward = combine

res = {}
for fmt in ("nvfp4", "sign"):
    fac = inputs.quantize_factors(dense, fmt)
    def call(i, fac=fac):
        state["set"] = i % 2
        if proto:
            p, t, o = roles[i % 2]
            lib.tsct_proto_up_fused(ctypes.c_void_p(o.data_ptr()), ctypes.c_void_p(p.data_ptr()),
                                    ctypes.c_void_p(t.data_ptr()), ctypes.c_int(state["mode"]))
        s_in = sets[i % 2]
        return A.tsct_call(s_in.x, s_in.ids, s_in.weights, fac, cfg.experts, "triton-lowbit")
    modes = (0, 1, 2, 3, 4) if proto else (0,)
    with torch.no_grad():
        state["mode"] = 0
        ref = call(0).clone()
        if proto:
            state["mode"] = 1
            call(0)
            o = call(0)  # y of the previous call (same block) holds the first rows' values
            torch.cuda.synchronize()
            bad = (o.view(torch.int16) != ref.view(torch.int16)).sum().item()
            print(f"{fmt} mode1 bits differing from the unfused pass: {bad} of {o.numel()}", flush=True)
            res[f"{fmt}_mode1_bad"] = bad
    for rep in range(2):
        for mode in modes:
            state["mode"] = mode
            with torch.no_grad():
                t = measure.time_graph(call, dev, n_sets=2, replays=40)["median"]
            res.setdefault(f"{fmt}_mode{mode}", []).append(round(t, 4))
            print(f"{fmt} mode {mode}: {t:.4f} ms", flush=True)
if proto:
    lib.tsct_proto_up_fused(None, None, None, 0)
json.dump(res, open(sys.argv[1], "w"), indent=1)
