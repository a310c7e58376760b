"""The GPU tests' CUDA-graph idiom: warm ``fn`` up on a side stream (JIT compiles, caches, allocator), as
torch.cuda.graph requires, then capture one call with the cyclic garbage collector paused (``gc_paused``: an
earlier test's graph freed by it mid-capture would invalidate the capture)."""

import torch

from tsct.bench.measure import gc_paused


def captured(fn):
    """(graph, fn's outputs, which live in the graph's memory and are rewritten by each replay)."""
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        out = fn()
    return g, out
