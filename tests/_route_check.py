"""Run by tests/ops/test_sort_by_expert.py with TRITON_INTERPRET=1: the sort_by_expert kernels (route_rank,
route_place, through ``tsct.kernels.triton_common.route``) under Triton's interpreter against the torch path (and
the gathered router weights, bf16 / fp16 / fp32 or none, against indexing), with the outputs and scratch
poisoned first; and the combine's CSR that route_place links to the token tensor (``runtime.link_csr``) against the
one ``runtime._csr`` builds, as indices and through ``combine_rows`` (padding rows of the source poisoned with NaN).
Prints one line per case, "ok" or what differed; exit 1 if any differed."""

from __future__ import annotations

import sys

import torch

from tsct.kernels.triton_common import runtime as C
from tsct.kernels.triton_common import route
from tsct.ops.routing import sort_by_expert_torch

_empty = torch.empty


def _poisoned(*shape, **kw):
    t = _empty(*shape, **kw)
    return t.fill_(-7) if not t.dtype.is_floating_point else t.fill_(float("nan"))


def _linked_csr_differs(token: torch.Tensor, offs: torch.Tensor, t: int, k: int, g: torch.Generator) -> list[str]:
    """What differs between the CSR linked to ``token`` and ``runtime._csr``'s for the same targets."""
    m = t * k
    linked = C.linked_csr(token, offs, m, t)
    if linked is None:
        return ["no linked csr"]
    rows, ptr = linked
    why = []
    if not torch.equal(ptr, torch.arange(t + 1, dtype=torch.int64) * k):
        why.append("csr ptr")
    want_rows = torch.argsort(token, stable=True)  # each token's k positions, increasing (stable)
    if not torch.equal(rows, want_rows):  # token t's k sorted positions, increasing
        why.append("csr rows")
    end = int(offs[-1])
    built = C.build_csr(token, offs, m, t, (0, 0))
    if not torch.equal(built[0][:int(built[1][-1])], rows[rows < end]):  # the same rows, padding dropped
        why.append("csr rows vs built")
    if t > 1024:  # the combine under the interpreter: one program per target
        return why
    src = torch.randn(m, 37, generator=g)
    src[end:] = float("nan")  # padding rows: combine_rows must skip them
    cfg = C.tile_config((0, 0))
    a = C.combine(src, token, offs, t, cfg, (0, 0), csr=linked)
    b = C.combine(src, token, offs, t, cfg, (0, 0), csr=built)
    if not torch.equal(a, b) or bool(a.isnan().any()):
        why.append("combine through the linked csr")
    token2 = token.clone()
    if C.linked_csr(token2, offs, m, t) is not None or C.linked_csr(token, offs.clone(), m, t) is not None:
        why.append("csr linked to another tensor")
    token.add_(0)  # an in-place change voids the link
    if C.linked_csr(token, offs, m, t) is not None:
        why.append("csr link survived an in-place change")
    return why


def _links_voided_or_absent() -> list[str]:
    """No link from an inference-mode sort (inference tensors have no version counter), and a storage swap
    (``set_``) voids one."""
    ids = torch.randint(-1, 9, (300, 2))
    why = []
    with torch.inference_mode():
        order, offs, token, _ = route.sort_by_expert(ids, 9)
    if C.linked_csr(token, offs, 600, 300) is not None:
        why.append("inference-mode sort linked a csr")
    order, offs, token, _ = route.sort_by_expert(ids, 9)
    if C.linked_csr(token, offs, 600, 300) is None:
        why.append("no linked csr")
    token.set_(token.clone().untyped_storage())  # another storage
    if C.linked_csr(token, offs, 600, 300) is not None:
        why.append("csr link survived a storage swap")
    return why


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
        why += _linked_csr_differs(got[2], got[1], t, k, g)
        name = f"T{t}_k{k}_E{e}_{str(dt).split('.')[-1]}"
        print(name, "ok" if not why else "differs: " + ", ".join(why))
        bad += bool(why)
    why = _links_voided_or_absent()
    print("links", "ok" if not why else "differs: " + ", ".join(why))
    bad += bool(why)
    empty = route.sort_by_expert(torch.zeros(0, 2, dtype=torch.int64), 4)
    ok = [x.shape[0] for x in empty[:3]] == [0, 4, 0] and not bool(empty[1].any()) and empty[3] is None
    print("T0", "ok" if ok else "differs")
    bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
