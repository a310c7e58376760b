"""The GPU tests' CUDA-graph idiom: warm ``fn`` up on a side stream (JIT compiles, caches, allocator), as
torch.cuda.graph requires, then capture one call."""

import torch


def captured(fn):
    """(graph, fn's outputs, which live in the graph's memory and are rewritten by each replay)."""
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out
