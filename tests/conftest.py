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


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Two workers, each running whole test files in order, when pytest-xdist is installed (the dev extra)
    and no ``-n`` was given: the suite is mostly one process waiting on another (searches, compiles), so
    two workers nearly halve it on 2 cores. ``-n 0`` runs it in one process; without xdist it runs in one."""
    if config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None:
        if not hasattr(config, "workerinput"):
            config.option.numprocesses = 2
            config.option.dist = "loadfile"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"
