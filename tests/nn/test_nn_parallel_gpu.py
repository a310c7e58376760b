"""tsct.nn on torch.distributed with NCCL, one process per GPU (needs 2 GPUs): expert parallelism and FSDP2 against
the single-process layer, the same checks as tests/nn/test_nn_parallel.py (tests/_nn_parallel_check.py), here on
the GPU kernel paths (bf16 activations) and NCCL's all_to_all.

    python3 -m pytest -q tests/nn/test_nn_parallel_gpu.py          (on a machine with >= 2 GPUs)
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available():
    pytest.skip("needs 2 CUDA GPUs and NCCL", allow_module_level=True)

import _nn_parallel_check as C  # noqa: E402

CASES = [
    (C.check_expert_parallel, {"capacity": "exact", "dtype": "bfloat16", "tol": 1e-2}),
    (C.check_expert_parallel, {"capacity": "static", "dtype": "bfloat16", "tol": 1e-2, "sync_free": True}),
    (C.check_expert_parallel, {"capacity": "tight", "dtype": "bfloat16", "tol": 1e-2}),
    (C.check_expert_parallel, {"capacity": "static", "dtype": "bfloat16", "storage": "nvfp4", "tol": 1e-2}),
    (C.check_expert_parallel, {"capacity": "exact"}),  # fp32: the per-expert reference path on the GPU
    (C.check_fsdp2, {}),
    (C.check_fsdp2, {"storage": "nvfp4"}),
]


def test_expert_parallel_and_fsdp2_on_two_gpus():
    C.spawn(functools.partial(C.run_cases, cases=CASES), 2, backend="nccl")
