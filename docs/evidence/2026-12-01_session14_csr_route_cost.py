"""Session 14: what the combine's CSR (side stream) and the routing sort cost inside the b1 bf16 forward (graph).
Arms: shipped; CSR precomputed outside the graph (no side-stream work); routing precomputed too; CSR inline."""
import sys, json
import torch
from tsct import config as C
from tsct.bench import arms as A, inputs, measure
from tsct.bench.config import from_preset
from tsct.kernels.triton_glu import glu as G
import tsct

cfg = from_preset("b1", device="cuda").resolved()
dense = inputs.make_dense_factors(cfg)
sets = inputs.make_input_sets(cfg, 2)
C.check_values = False
dev = torch.device("cuda")
fac, impl = A.kmajor_factors(dense), "triton-bf16"
pre = [tsct.ops.sort_by_expert(s.ids, cfg.experts, s.weights) for s in sets]
T = sets[0].x.shape[0]
csrs = [G.build_csr(p.token, p.offs, p.token.shape[0], T, G._capability(dev)) for p in pre]
cur = [0]
real_overlap = G.csr_overlap
class cached_overlap:
    def __init__(self, idx, offs, m, n_out, cap):
        self.csr = None if idx is None else csrs[cur[0]]
    def __enter__(self): return self
    def __exit__(self, *exc): pass
def call(i, routing_pre):
    s_in = sets[i % 2]
    cur[0] = i % 2
    s = pre[i % 2] if routing_pre else tsct.ops.sort_by_expert(s_in.ids, cfg.experts, s_in.weights)
    return tsct.ops.grouped_glu(s_in.x, s.offs, fac.w_gate, fac.w_up, fac.w_down, fac.s_gate, fac.s_up,
                                row_weight=s.row_weight, gather_idx=s.token, scatter_idx=s.token,
                                num_out_rows=T, impl=impl)
arms = {
    "shipped": (real_overlap, True, False),
    "csr_free": (cached_overlap, True, False),
    "csr_free_route_pre": (cached_overlap, True, True),
    "route_pre": (real_overlap, True, True),
    "csr_inline": (real_overlap, False, False),
}
# same bits check
with torch.no_grad():
    ref = call(0, False)
    G.csr_overlap = cached_overlap
    alt = call(0, True)
    G.csr_overlap = real_overlap
    print("bits equal:", torch.equal(ref.view(torch.int16), alt.view(torch.int16)), flush=True)
res = {}
for rep in range(3):
    for name, (ov, side, rpre) in arms.items():
        G.csr_overlap = ov
        C.csr_side_stream = side
        if True:
            tf = measure.time_graph(lambda i: call(i, rpre), dev, n_sets=2, replays=50)["median"]
        res.setdefault(name, []).append(round(tf, 4))
        print(rep, name, round(tf, 4), flush=True)
G.csr_overlap = real_overlap
C.csr_side_stream = True
json.dump(res, open(sys.argv[1], "w"), indent=1)
