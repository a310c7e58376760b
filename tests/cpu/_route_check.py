"""Run by tests/cpu/test_sort_by_expert.py with TRITON_INTERPRET=1: the sort_by_expert kernels (route_rank,
route_place, through ``tsct.kernels.triton_glu.route``) under Triton's interpreter against the torch path (and
the gathered router weights, bf16 / fp16 / fp32 or none, against indexing), with the outputs and scratch
poisoned first. Prints one line per case, "ok" or what differed; exit 1 if any differed."""

from __future__ import annotations

import sys

import torch

from tsct.kernels.triton_glu import route
from tsct.ops.routing import sort_by_expert_torch

_empty = torch.empty


def _poisoned(*shape, **kw):
    t = _empty(*shape, **kw)
    return t.fill_(-7) if not t.dtype.is_floating_point else t.fill_(float("nan"))


def main() -> int:
    torch.empty = _poisoned  # every buffer the launch allocates starts as garbage, not zeros
    g = torch.Generator().manual_seed(1)
    cases = [  # (T, k, E, id range beyond [0, E) on each side, dtype)
        (100, 2, 8, 2, torch.int64), (3000, 2, 1024, 0, torch.int64), (2500, 3, 7, 1, torch.int32),
        (1, 1, 1, 0, torch.int64), (1024, 2, 4096, 3, torch.int16), (700, 4, 33, 5, torch.int32),
        (513, 2, 2, 0, torch.uint8), (2048, 1, 5, 0, torch.int64),
    ]
    bad = 0
    for t, k, e, spill, dt in cases:
        lo = 0 if dt == torch.uint8 else -spill
        ids = torch.randint(lo, e + spill, (t, k), generator=g).to(dt)
        if (t, k) == (2048, 1):
            ids.fill_(3)  # every row in one expert: one key spans both chunks
        wdt = (torch.bfloat16, torch.float16, torch.float32, None)[t % 4]
        w = torch.randn(t, k, generator=g).to(wdt) if wdt is not None else None
        *got, rw = route.sort_by_expert(ids, e, w)
        want = sort_by_expert_torch(ids, e)
        why = [n for n, a, b in zip(("order", "offs", "token"), got, want) if a.dtype != b.dtype or not torch.equal(a, b)]
        if (rw is None) != (w is None) or (w is not None and not torch.equal(rw, w.reshape(-1)[want[0]].float())):
            why.append("row_weight")
        name = f"T{t}_k{k}_E{e}_{str(dt).split('.')[-1]}"
        print(name, "ok" if not why else "differs: " + ", ".join(why))
        bad += bool(why)
    empty = route.sort_by_expert(torch.zeros(0, 2, dtype=torch.int64), 4)
    ok = [x.shape[0] for x in empty[:3]] == [0, 4, 0] and not bool(empty[1].any()) and empty[3] is None
    print("T0", "ok" if ok else "differs")
    bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
