"""Session 14: the b1 bf16 K-major forward (graph replay, interleaved A/B in one process):
linked: through sort_by_expert's token (its linked CSR) vs copy: through a copy (CSR built on the side stream);
f32s: per-rank scales passed as fp32 (no conversion kernels in the forward) vs bf16 (two .float() copies)."""
import sys, json, time
import torch
from tsct import config as C
from tsct.bench import arms as A, inputs, measure
from tsct.bench.config import from_preset
import tsct

cfg = from_preset("b1", device="cuda").resolved()
dense = inputs.make_dense_factors(cfg)
sets = inputs.make_input_sets(cfg, 2)
C.check_values = False
dev = torch.device("cuda")
fac = A.kmajor_factors(dense)
sg32, su32 = fac.s_gate.detach().float(), fac.s_up.detach().float()
T = sets[0].x.shape[0]
def call(i, link, f32s):
    s_in = sets[i % 2]
    s = tsct.ops.sort_by_expert(s_in.ids, cfg.experts, s_in.weights)
    tok = s.token if link else s.token.clone()
    sg, su = (sg32, su32) if f32s else (fac.s_gate, fac.s_up)
    return tsct.ops.grouped_glu(s_in.x, s.offs, fac.w_gate, fac.w_up, fac.w_down, sg, su,
                                row_weight=s.row_weight, gather_idx=tok, scatter_idx=tok,
                                num_out_rows=T, impl="triton-bf16")
with torch.no_grad():
    a, b = call(0, True, False), call(0, False, False)
    print("bits equal:", torch.equal(a.view(torch.int16), b.view(torch.int16)), flush=True)
    del a, b
ARMS = {"linked": (True, False), "copy": (False, False), "linked_f32s": (True, True), "copy_f32s": (False, True)}
res = {}
for rep in range(3):
    for name, (link, f32s) in ARMS.items():
        tf = measure.time_graph(lambda i: call(i, link, f32s), dev, n_sets=2, replays=50)["median"]
        res.setdefault(name + "_fwd", []).append(round(tf, 4))
        print(rep, name, "fwd", round(tf, 4), flush=True)
for rep in range(2):
    for name in ("linked", "copy"):
        link, f32s = ARMS[name]
        fb = lambda i: torch.autograd.grad(call(i, link, f32s), [sets[i % 2].x, sets[i % 2].weights] + fac.leaves(),
                                           sets[i % 2].grad_out)
        tb = measure.time_graph(fb, dev, n_sets=2, replays=20)["median"]
        res.setdefault(name + "_fwdbwd", []).append(round(tb, 4))
        print(rep, name, "fwdbwd", round(tb, 4), flush=True)
for rep in range(3):
    for name in ("linked", "copy"):
        link, f32s = ARMS[name]
        hs = []
        for i in range(40):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(i, link, f32s)
            hs.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        hs.sort()
        res.setdefault(name + "_host_ms", []).append(round(hs[20], 4))
        print(rep, name, "host issue ms (median of 40 saving forwards)", round(hs[20], 4), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
