import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA GPU; on a machine without CUDA they skip with a reason."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m gpu tests on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
