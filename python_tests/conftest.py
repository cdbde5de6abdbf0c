"""Test configuration: on a machine without CUDA, Triton kernels run under the interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection start.
Tests that compile kernels for real GPUs (sm_80/sm_90) run in a subprocess without it; every test in a
``test_compile_*.py`` file is marked ``slow`` here (minutes of compilation: the GPU suite runs ``-m 'not slow'``).

The real treebank comes from :mod:`syntaxkernels.data` (``SYNTAXKERNELS_UD``); tests that need it take the
``ud_dev_path`` fixture and skip, saying how to provide it, when it is absent.
"""
import os
import pathlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The one device every kernel test runs on: CUDA when present, else the CPU under the Triton interpreter
# (set above). Tests import it (``from conftest import KERNEL_DEVICE``) and never build CPU tensors for the
# Triton path on a GPU host.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name.startswith("test_compile_"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ud_dev_path():
    """Path of the treebank (``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`); skips the test when absent."""
    from syntaxkernels import data

    if not data.treebank_available():
        pytest.skip(data.missing_message())
    return data.treebank_path()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids OpenMP spin-waiting on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
