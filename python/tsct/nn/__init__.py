"""tsct.nn: expert layers as modules.

    GroupedGLUExperts     E dual-latent GLU experts through ``tsct.ops.grouped_glu`` (bf16, NVFP4 or sign factors;
                          straight-through training of low-bit factors, a frozen low-bit form for inference)
    PaddedBmmGLUExperts   the same parameters run as a capacity-padded ``torch.bmm`` (the usual layer; A/B baseline)
    ExpertParallelGLU     experts sharded over the ranks of a process group, tokens exchanged with
                          ``torch.distributed.all_to_all_single`` (``tsct.nn.parallel``)

How they fit FSDP2, torchtitan and Megatron: docs/distributed.md.
"""

from tsct.nn.experts import (ACTIVATIONS, INTERMEDIATES, STORAGES, GLUExpertBank, GroupedGLUExperts,
                             PaddedBmmGLUExperts, compute_dtype)

__all__ = ["ACTIVATIONS", "INTERMEDIATES", "STORAGES", "GLUExpertBank", "GroupedGLUExperts", "PaddedBmmGLUExperts",
           "compute_dtype", "ExpertParallelGLU"]


def __getattr__(name):
    if name == "ExpertParallelGLU":  # torch.distributed is imported only when expert parallelism is used
        from tsct.nn.parallel import ExpertParallelGLU
        return ExpertParallelGLU
    raise AttributeError(f"module 'tsct.nn' has no attribute {name!r}")
