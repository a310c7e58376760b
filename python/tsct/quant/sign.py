"""1-bit sign factors with a rank-1 magnitude: the ``SignTensor`` container and its quantizer.

Source: LittleBit (Lee et al., "LittleBit: Ultra Low-Bit Quantization via Latent Factorization",
NeurIPS 2025, arXiv:2506.13771): binarized factors with row and column scales, initialised from a
rank-1 fit of the magnitudes (their Dual-SVID). Here, per factor matrix ``W [K, N]``::

    W ~ diag(a) sign(W) diag(b),   a [K] >= 0,  b [N] >= 0,  a b^T = rank-1 fit of |W|

so ``x @ W = ((x * a) @ sign(W)) * b``: the sign matrix is E2M1 +-1 with unit block scales and runs
on the NVFP4 tensor-core path, or is decoded to bf16. Bits and decode arithmetic:
``docs/decisions/0002-nvfp4-recipe.md`` ("Sign"); the CUDA kernels (``backend="native"``) only pack
and decode; the fit is always this torch code, on the tensor's device.

The fit (``rank1_magnitude_fit``), fixed and deterministic:
  * A = |W| in fp32 with nan/inf entries replaced by 0, divided by its max (so sums cannot overflow).
  * Power iteration on A (A[k, n] = |W[k, n]|), ``iters`` rounds (default 16), from u = ones(K):
    ``v = A^T u / ||A^T u||`` (over N), ``u = A v``, ``sigma = ||u||``, ``u = u / sigma`` (over K);
    a zero norm leaves the vector 0. Matrix-vector products are elementwise multiply + sum (not
    matmul, so TF32 settings cannot change the result). A is non-negative, so the iterates stay
    >= 0 (Perron-Frobenius) and converge to the top singular pair.
  * The scale is split evenly: ``a = sqrt(sigma) sqrt(amax) * u``, ``b = sqrt(sigma) sqrt(amax) * v``
    (``||a|| = ||b||``; the split is a free choice, the product ``a_k b_n`` is the fit).
  * All-zero W: a = b = 0, so it decodes to signed zeros. Zero rows/columns of |W| get a[k] = 0 /
    b[n] = 0.
  * Non-finite inputs: excluded from the fit; then ``a[k] = NaN`` for every k whose row ``W[k, :]``
    holds a nan or +-inf, so that row decodes to NaN (visible) and nothing else changes (a matrix
    with no finite entry: b = 0, every a[k] NaN). The bit of a nan is its sign bit.
Results are deterministic for a given device and torch build; CPU and GPU may differ in the last
bits of a and b (reduction order), the bits never.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from tsct.quant import _backend
from tsct.quant._container import PackedFactor
from tsct.quant.formats import SIGN_PACK, pack_bits, unpack_bits

__all__ = ["SignTensor", "quantize_sign", "rank1_magnitude_fit", "DEFAULT_SIGN_ITERS"]

DEFAULT_SIGN_ITERS = 16


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class SignTensor(PackedFactor):
    """A sign-quantized factor bank: ``W[e, k, n] ~ (+-1) * scale_k[e, k] * scale_n[e, n]``.

    Attributes:
        bits: uint8 ``[E, N, K/8]``; element k of row n is bit k%8 of byte k//8 (LSB first); 1 = negative.
        scale_k: float32 ``[E, K]`` (``a``, over the contraction dim).
        scale_n: float32 ``[E, N]`` (``b``, over the output dim).
        shape: the LOGICAL shape, ``(E, K, N)`` or ``(K, N)`` (stored as a batch of one).
    """

    _STORAGE = ("bits", "scale_k", "scale_n")

    bits: Tensor
    scale_k: Tensor
    scale_n: Tensor
    shape: tuple

    def __post_init__(self):
        self._check_storage(SIGN_PACK, lambda: [
            ("bits", self.bits, torch.uint8, (self.batch, self.n, self.k // SIGN_PACK)),
            ("scale_k", self.scale_k, torch.float32, (self.batch, self.k)),
            ("scale_n", self.scale_n, torch.float32, (self.batch, self.n)),
        ])

    def _decode_native(self, lib, dtype: torch.dtype) -> Tensor:
        """``((+-1) * a[k]) * b[n]`` in fp32, then ``dtype`` (``PackedFactor.dequantize``)."""
        return lib.sign_dequantize(self.bits, self.scale_k, self.scale_n, dtype)

    def _decode_torch(self, e0: int, e1: int) -> Tensor:
        return _dequantize_torch(self.bits[e0:e1], self.scale_k[e0:e1], self.scale_n[e0:e1])

    def __repr__(self) -> str:
        return (f"SignTensor(shape={list(self.shape)}, device={self.device}, "
                f"storage=[{self.batch}, {self.n}, {self.k}] K-contiguous, nbytes={self.nbytes})")


def _check_iters(iters) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int):
        raise TypeError(f"iters must be an int, got {type(iters).__name__}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")


def _dequantize_torch(bits: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """bits [B, N, K/8], a [B, K], b [B, N] -> fp32 [B, N, K] = ((+-1) * a[k]) * b[n]."""
    neg = unpack_bits(bits)
    one = torch.ones((), dtype=torch.float32, device=bits.device)
    s = torch.where(neg, -one, one)
    return (s * a.unsqueeze(1)) * b.unsqueeze(2)


def rank1_magnitude_fit(x: Tensor, iters: int = DEFAULT_SIGN_ITERS, *, poison: bool = True) -> tuple[Tensor, Tensor]:
    """Rank-1 fit of ``|x|`` for x ``[B, N, K]`` (storage orientation): returns (a [B, K], b [B, N]) fp32.

    ``|x[b, n, k]| ~ a[b, k] * b[b, n]``; the procedure, zero and non-finite handling are in the module
    docstring. ``poison=False`` leaves out the last step (a[k] = NaN for the K rows holding a non-finite
    element): the ternary format marks such elements with their own code instead (decision 0022).
    """
    _check_iters(iters)
    bsz, n, k = x.shape
    # one memory layout whatever the caller's (a K-major factor is a transposed view): the sums below then add in
    # one order, so a factor gives the same scales however it is stored
    x = x.to(torch.float32, memory_format=torch.contiguous_format).contiguous()  # one copy (the second a no-op)
    finite = torch.isfinite(x)
    m = torch.where(finite, x.abs(), 0)
    if m.numel():
        amax = m.amax(dim=(1, 2), keepdim=True)
    else:
        amax = torch.zeros((bsz, 1, 1), dtype=torch.float32, device=x.device)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    m = m / torch.where(amax > 0, amax, one)  # in [0, 1]; an all-zero matrix stays 0
    tiny = torch.finfo(torch.float32).tiny
    a = torch.ones((bsz, k), dtype=torch.float32, device=x.device)
    sigma = torch.zeros((bsz,), dtype=torch.float32, device=x.device)
    for _ in range(iters):
        v = (m * a.unsqueeze(1)).sum(dim=2)  # [B, N] = A a
        v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_min(tiny)  # 0 stays 0
        a = (m * v.unsqueeze(2)).sum(dim=1)  # [B, K] = A^T v
        sigma = torch.linalg.vector_norm(a, dim=1)
        a = a / sigma.unsqueeze(1).clamp_min(tiny)
    # sqrt(sigma_1(|x|)) as a product of roots: sigma * amax overflows fp32 for large finite |x| (sigma <= sqrt(NK))
    g = (torch.sqrt(sigma) * torch.sqrt(amax.reshape(bsz))).unsqueeze(1)
    a_out, b_out = a * g, v * g
    if poison:
        poisoned = ~finite.all(dim=1)  # [B, K]: column k of storage = row k of the logical W
        a_out = a_out.masked_fill(poisoned, float("nan"))
    return a_out, b_out


def quantize_sign(w: Tensor, *, iters: int = DEFAULT_SIGN_ITERS, backend: str = "auto") -> SignTensor:
    """Quantize a factor ``w`` (logical ``[E, K, N]`` or ``[K, N]``; float32/bfloat16/float16) to sign bits.

    K = ``w.shape[-2]`` must be a multiple of 8. bits = signbit(w) (so -0.0 -> 1); (a, b) = the rank-1
    fit of |w| (``rank1_magnitude_fit``, ``iters`` power-iteration rounds, always torch). ``backend``
    picks who packs the bits ("torch", "native" or "auto", as for ``quantize_nvfp4``).

    Non-finite inputs: a nan or +-inf at (k, n) makes a[k] NaN (the magnitude fit of that K row has no finite
    value), so row k of the decoded factor is NaN for every n; the other rows, and b, are fit on the finite
    entries and stay finite.
    """
    _backend.check_factor("quantize_sign", "w", w, SIGN_PACK, "sign")
    _check_iters(iters)
    which = _backend.resolve(backend, w.device, "quantize_sign")
    shape = tuple(w.shape)
    w = w.detach()
    x = (w if w.dim() == 3 else w.unsqueeze(0)).transpose(-1, -2)  # [B, N, K] view
    bsz, n, k = x.shape
    a = torch.empty((bsz, k), dtype=torch.float32, device=w.device)
    b = torch.empty((bsz, n), dtype=torch.float32, device=w.device)
    step = _backend.chunk_rows(bsz, n * k)
    for e0 in range(0, bsz, step):
        e1 = min(e0 + step, bsz)
        a[e0:e1], b[e0:e1] = rank1_magnitude_fit(x[e0:e1], iters)
    if which == "native":
        bits = _backend.native().sign_pack(x.contiguous())
    else:
        bits = pack_bits(torch.signbit(x))
    return SignTensor(bits=bits, scale_k=a, scale_n=b, shape=shape)
