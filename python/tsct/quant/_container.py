"""What every packed factor container shares: logical shape accessors, storage bytes, moves.

A subclass is a frozen dataclass whose storage tensors are named in ``_STORAGE`` (the first one
defines the device; a later one may be None where the format makes it optional) and whose ``shape``
field is the LOGICAL ``(E, K, N)`` or ``(K, N)``.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable

import torch
from torch import Tensor


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FLOAT8_FIELDS = "_float8_fields"  # the pickled state's record of the tensors stored as their bytes


def float8_as_bytes(tensors: dict) -> tuple[dict, dict]:
    """(``tensors`` with each float8 tensor replaced by its bytes, a uint8 view; {name: its float8 dtype}), for
    pickle: torch writes a float8 tensor that plain ``pickle`` cannot read back (``pickle.loads`` fails in
    ``torch.storage._load_from_bytes``, torch 2.13; ``torch.save`` / ``torch.load`` and torch.multiprocessing
    are not affected), a uint8 one it can."""
    dtypes = {k: v.dtype for k, v in tensors.items() if isinstance(v, Tensor) and v.dtype in _FLOAT8}
    return {k: v.view(torch.uint8) if k in dtypes else v for k, v in tensors.items()}, dtypes


def bytes_as_float8(tensors: dict, dtypes: dict) -> dict:
    """The inverse of ``float8_as_bytes``: the named uint8 tensors viewed as their float8 dtypes again."""
    return {k: v.view(dtypes[k]) if k in dtypes else v for k, v in tensors.items()}


class PackedFactor:
    _STORAGE: tuple[str, ...] = ()
    shape: tuple

    def __getstate__(self) -> dict:
        state, dtypes = float8_as_bytes(self.__dict__)
        return {**state, _FLOAT8_FIELDS: dtypes} if dtypes else state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for name, value in bytes_as_float8(state, state.pop(_FLOAT8_FIELDS, {})).items():
            object.__setattr__(self, name, value)  # the dataclass is frozen

    def check(self) -> None:
        """Run the constructor's checks again (storage dtypes, shapes and devices against ``shape``): a container whose
        fields were replaced after construction (``object.__setattr__``, a tensor's ``.data``) fails them here.
        TypeError / ValueError naming the storage tensor."""
        self.__post_init__()

    @classmethod
    def _rebuilt(cls, **fields):
        """The container of ``fields`` (every dataclass field; ``shape`` a tuple of ints) without the checks of its
        constructor: for storage taken out of a container that passed them in this call (``tsct.ops._factors.unpack``
        on an eager call's own factors, which ``grouped_glu`` checked once with ``check``)."""
        obj = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(obj, name, value)
        return obj

    def _check_storage(self, k_multiple: int, specs: Callable[[], list], shape_note: str = "") -> None:
        """Normalise ``shape`` and check it, then each storage tensor's type, dtype, shape and device.

        ``specs()`` (called once the logical shape is known to be valid) lists (name, tensor, dtype,
        expected shape) per storage tensor, the first one defining the device; ``shape_note`` is
        appended to the shape error (e.g. the scale layout).
        """
        try:
            shape = tuple(operator.index(s) for s in self.shape)  # ints, not floats truncated
        except TypeError:
            raise TypeError(f"shape must be a sequence of ints (E, K, N) or (K, N), got {self.shape!r}") from None
        if len(shape) not in (2, 3) or min(shape) < 0:
            raise ValueError(f"shape must be (E, K, N) or (K, N) of non-negative sizes, got {shape}")
        object.__setattr__(self, "shape", shape)
        if self.k % k_multiple:
            raise ValueError(f"shape: K = {self.k} must be a multiple of {k_multiple}")
        specs = specs()
        first_name, first = specs[0][0], specs[0][1]
        for name, t, dtype, want in specs:
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
            if t.shape != tuple(want):
                raise ValueError(f"{name} must have shape {list(want)} for logical shape {list(self.shape)}"
                                 f"{shape_note}, got {list(t.shape)}")
            if t.device != first.device:
                raise ValueError(f"{name} is on {t.device}, {first_name} on {first.device}")

    @property
    def batch(self) -> int:
        """E (1 for a 2-D factor): the leading dim of every storage tensor."""
        return self.shape[0] if len(self.shape) == 3 else 1

    @property
    def k(self) -> int:
        """The contraction dim K (d for w_gate/w_up, r for w_down)."""
        return self.shape[-2]

    @property
    def n(self) -> int:
        """The output dim N."""
        return self.shape[-1]

    @property
    def device(self) -> torch.device:
        return getattr(self, self._STORAGE[0]).device

    @property
    def nbytes(self) -> int:
        """Bytes of storage, padding and scales included."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def _tensors(self) -> dict:
        """{name: tensor} of the storage tensors present (optional ones that are None left out)."""
        return {f: getattr(self, f) for f in self._STORAGE if getattr(self, f) is not None}

    def dequantize(self, dtype: torch.dtype = torch.bfloat16, backend: str = "auto", *,
                   contiguous: bool = True) -> Tensor:
        """Decode to a tensor of the logical shape (the format's value in fp32, then ``dtype``, rounding to
        nearest even): contiguous, or with ``contiguous=False`` the transposed view of the decode in storage
        order (``[E, N, K]``, K contiguous; no transposing copy: what a GEMM that takes either operand order
        wants). ``backend``: "native" (the CUDA kernels), "torch", or "auto" (``tsct.quant._backend``)."""
        from tsct.quant import _backend

        _backend.check_float_dtype(f"{type(self).__name__}.dequantize", "dtype", dtype)
        which = _backend.resolve(backend, self.device, f"{type(self).__name__}.dequantize")
        if which == "native":
            out = self._decode_native(_backend.native(), dtype).transpose(-1, -2)
        else:
            out = torch.empty((self.batch, self.n, self.k), dtype=dtype, device=self.device).transpose(-1, -2)
            step = _backend.chunk_rows(self.batch, self.n * self.k)
            for e0 in range(0, self.batch, step):
                e1 = min(e0 + step, self.batch)
                out[e0:e1].copy_(self._decode_torch(e0, e1).transpose(-1, -2))
        out = out.contiguous() if contiguous else out
        return out.reshape(self.shape)  # a view for (K, N): the batch dimension is 1

    def _decode_native(self, lib, dtype: torch.dtype) -> Tensor:
        """``[E, N, K]`` in ``dtype`` by the native decode kernel (``lib``: ``tsct.native``)."""
        raise NotImplementedError

    def _decode_torch(self, e0: int, e1: int) -> Tensor:
        """``[e1 - e0, N, K]`` fp32 values of experts ``e0:e1``, in torch."""
        raise NotImplementedError

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to(self, device, non_blocking: bool = False):
        """The same container on ``device`` (a ``torch.device``, "cuda:0", an index; tensors moved bit for bit).
        TypeError for a dtype: the storage dtypes are the format's (``dequantize(dtype)`` gives a dense tensor)."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"{type(self).__name__}.to: device must be a device, got the dtype {device} (the storage "
                            f"dtypes are the format's; .dequantize({device}) gives a dense tensor)")
        return self.replace(**{f: t.to(device, non_blocking=non_blocking) for f, t in self._tensors().items()})
