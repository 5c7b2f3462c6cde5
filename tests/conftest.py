"""Test setup: without CUDA the kernel runs under Triton's interpreter.

``@triton.jit`` decides interpreter-or-compiler when ``kernels.decode`` is imported, so the variable
is set here, before any test module imports the kernel.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"
