# Interpreter check of the rejected prototype (session 11): copy 2026-11-30_persistent_up_combine_rejected.py to
# sweep/upc_proto.py, then: PYTHONPATH=python TRITON_INTERPRET=1 python3 <this file> (fp16: bf16 loads are wrong
# under Triton 3.9's interpreter on the CPU image). One program (the interpreter runs programs one after another).
import torch, sys
sys.path.insert(0, "sweep")
import upc_proto as U
from tsct.kernels.triton_glu import glu
torch.manual_seed(1)
E, R, F, T, K = 6, 64, 300, 40, 2
m = T * K
dev = "cpu"
ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
ids[ids == 3] = 2  # expert 3 empty... make sure distinct
ids = torch.stack([torch.randperm(E - 1)[:K] for _ in range(T)])
ids[ids >= 3] += 1
ids[:20, 0] = 1  # expert 1 gets > 16 rows
wts = torch.rand(T, K)
from tsct.kernels.triton_glu._bench import route
offs, token, rw, _, _ = route(ids, wts, E)
z = torch.randn(m, R).half()
wd = torch.randn(E, F, R).half().transpose(1, 2)  # K-major
cum = glu._tile_cum(offs, 16, (0, 0))
order, ptr = glu._csr(token, offs, m, T, (0, 0))
y = (z.float()[:, None, :] @ wd.float()[torch.repeat_interleave(torch.arange(E), torch.diff(offs, prepend=offs.new_zeros(1)).long())]).squeeze(1) * rw[:, None]
y = y.half().float()
ref = torch.zeros(T, F).index_add_(0, token, y).half()
te = torch.empty(3 * (m // 16 + E) + E * 16 * 64 // 2 + E + 1, dtype=torch.int32)
for BN, AM in ((128, 0), (256, 0), (128, 2), (256, 3), (128, 3)):
    ybuf = torch.full((2, m, BN), float("nan")).half()
    out = torch.full((T, F), float("nan")).half()
    cnt = torch.zeros(1, dtype=torch.int32)
    U.up_combine[(1,)](z, offs, cum, wd, rw, te, ybuf, order, ptr, out, cnt, E, R, F, m, T,
                       HAS_RW=True, BM=16, BN=BN, BK=64, BT=64, BLOCK_E=8, EV_W="evict_first", EV_Y="evict_last", SYNC=True, A_MODE=AM)
    print(BN, AM, "max err", (out.float() - ref.float()).abs().max().item(), "cnt", cnt.item(), "nan", out.isnan().any().item())
print("te", te[:cum[-1]].tolist(), "cum", cum.tolist(), "offs", offs.tolist())
nch = -(-F // BN)
c = nch - 1
yb = ybuf[c % 2].float()
cols = F - c * BN
print("ybuf err", (yb[: int(offs[-1]), :cols] - y[:, c * BN:]).abs().max().item())
print("out err per chunk", [(out.float()[:, i*BN:(i+1)*BN] - ref.float()[:, i*BN:(i+1)*BN]).abs().max().item() for i in range(nch)])
print(yb[0, :5], y[0, c*BN:c*BN+5])
print(yb[20, :5], y[20, c*BN:c*BN+5])
sc = token // 3
T2 = int(sc.max()) + 2
order2, ptr2 = glu._csr(sc, offs, m, T2, (0, 0))
ref2 = torch.zeros(T2, F).index_add_(0, sc, y).half()
for BT in (4, 64):
    ybuf = torch.full((2, m, 128), float("nan")).half()
    out = torch.full((T2, F), float("nan")).half()
    cnt = torch.zeros(1, dtype=torch.int32)
    U.up_combine[(1,)](z, offs, cum, wd, rw, te, ybuf, order2, ptr2, out, cnt, E, R, F, m, T2,
                       HAS_RW=True, BM=16, BN=128, BK=64, BT=BT, BLOCK_E=8, EV_W="evict_first", EV_Y="evict_last", SYNC=True, A_MODE=3)
    print("scatter//3", BT, (out.float() - ref2.float()).abs().max().item(), out.isnan().any().item(), out[-1].abs().max().item())
