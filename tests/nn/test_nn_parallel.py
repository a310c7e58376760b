"""tsct.nn on torch.distributed with the gloo backend, 2 and 4 CPU processes: expert parallelism
(``ExpertParallelGLU``: all_to_all_single dispatch and combine) and FSDP2 ``fully_shard`` against the
single-process layer (the checks are in tests/_nn_parallel_check.py). One process group per world size runs every
check: starting the processes (importing torch and tsct in each) is most of the cost on a 2-core machine."""

from __future__ import annotations

import functools

import pytest
import torch.distributed as dist

import _nn_parallel_check as C

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

CASES = [
    (C.check_expert_parallel, {"capacity": "exact"}),
    (C.check_expert_parallel, {"capacity": "static"}),
    (C.check_expert_parallel, {"capacity": "tight"}),  # rows dropped for capacity
    (C.check_expert_parallel, {"capacity": "exact", "unweighted": 1}),  # one rank passes no router weights
    (C.check_expert_parallel, {"capacity": "static", "storage": "nvfp4"}),
    (C.check_expert_parallel, {"capacity": "exact", "storage": "sign", "frozen": True}),
    (C.check_expert_parallel, {"capacity": "static", "dtype": "bfloat16", "tol": 1e-2}),
    (C.check_ranks_must_agree, {}),
    (C.check_fsdp2, {}),
    (C.check_fsdp2, {"storage": "nvfp4"}),  # the straight-through masters re-quantized after each step
]


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_and_fsdp2_match_the_single_process_layer(world):
    C.spawn(functools.partial(C.run_cases, cases=CASES), world)
