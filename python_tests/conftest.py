"""Test configuration: on a machine without CUDA, Triton kernels run under the interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection start.
Tests that compile kernels for real GPUs (sm_80/sm_90) run in a subprocess without it.
"""
import os
import pathlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
UD_DIR = ROOT.parent / "shared" / "data" / "ud"
UD_DEV = UD_DIR / "en_ewt-ud-dev.conllu"

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def ud_dev_path():
    """Path of the shared UD English-EWT dev treebank; skips the test when it is absent."""
    if not UD_DEV.exists():
        pytest.skip(f"treebank not present at {UD_DEV}")
    return UD_DEV


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
