import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests run through the device tool; on a machine without CUDA they skip with a reason."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run tests/gpu through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
