"""Test configuration: on a machine without CUDA, Triton kernels run under the interpreter.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection start.
Tests that compile kernels for real GPUs (sm_80/sm_90) run in a subprocess without it and are marked ``slow``
(a minute or more of compilation: the GPU suite runs ``-m 'not slow'``; CI runs everything). Tests that take 2 s
or more on a CPU-only 2-core machine are marked ``long_on_cpu``; every other test is marked ``quick`` here, the
subset a newcomer runs first (``-m quick``, README.md "What the tests need").

The real treebank comes from :mod:`syntaxkernels.data` (``SYNTAXKERNELS_UD``); tests that need it take the
``ud_dev_path`` fixture and skip, saying how to provide it, when it is absent.
"""
import os
import pathlib
import random

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

# The two backends of the edge-list ops, as (backend argument, device) parameters: the C++ kernels always take
# CPU tensors; the Triton kernels run on KERNEL_DEVICE.
from syntaxkernels import _ext  # noqa: E402  (after TRITON_INTERPRET is set)
from syntaxkernels.ops._dispatch import interpreting  # noqa: E402

HAS_EDGE_CPP = _ext.available() and hasattr(_ext.load(), "edge_attention_forward")
needs_cpp = pytest.mark.skipif(not HAS_EDGE_CPP, reason="C++ extension not built")
needs_triton = pytest.mark.skipif(not (torch.cuda.is_available() or interpreting()),
                                  reason="needs CUDA or TRITON_INTERPRET=1")
CPP = pytest.param(("auto", "cpu"), marks=needs_cpp, id="cpp")
TRITON = pytest.param(("triton", KERNEL_DEVICE), marks=needs_triton, id="triton")


class Launches(list):
    """The names of the kernels the distance-bias launchers started, in order; ``kwargs``: each launch's keyword
    arguments."""

    def __init__(self):
        super().__init__()
        self.kwargs = []


def spy_launches(monkeypatch, fresh_configs: bool = False) -> Launches:
    """Record every kernel the padded distance-bias launchers start (:class:`Launches`, filled as they run) and
    still run it. ``fresh_configs``: forget the remembered launch configurations first (so that a GPU family set
    with ``interpret_as`` takes effect)."""
    from syntaxkernels.ops.bias_attention import _launch

    launches = Launches()
    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        launches.append(fn.fn.__name__)
        launches.kwargs.append(kwargs)
        real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    if fresh_configs:
        monkeypatch.setattr(_launch, "_CONFIGS", {})
    return launches


def long_rows_tiles(monkeypatch) -> None:
    """The distance-bias launchers on the long rows' tiles at any N: the padded batches' rule off (no
    ``configs.PADDED_CONFIGS``: calls on a plan of short rows, or of 65..512 tokens without one, take them otherwise),
    no launch configurations remembered from before."""
    from syntaxkernels.ops.bias_attention import _launch, configs

    monkeypatch.setattr(configs, "PADDED_CONFIGS", {})
    monkeypatch.setattr(_launch, "_CONFIGS", {})


def nan_scratch(monkeypatch) -> list:
    """Every floating-point buffer the distance-bias launchers (padded and packed) allocate with ``torch.empty``
    comes filled with NaN (fresh CPU memory is often zeros, which would hide a read of bytes no kernel wrote).
    Returns the shapes allocated, in order."""
    from syntaxkernels.ops.bias_attention import _launch, _varlen_kernels

    shapes = []
    real = torch

    def empty(*size, **kw):
        out = real.empty(*size, **kw)
        shapes.append(tuple(out.shape))
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    class Torch:  # the launcher's ``torch``: every name torch's but ``empty``
        def __getattr__(self, name):
            return getattr(real, name)

    proxy = Torch()
    proxy.empty = empty
    monkeypatch.setattr(_launch, "torch", proxy)
    monkeypatch.setattr(_varlen_kernels, "torch", proxy)
    return shapes


def sentence_lengths(rng: random.Random, total: int, longest: int):
    """Lengths of whole sentences (1..longest tokens) filling exactly ``total`` tokens."""
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(1, longest), total - sum(lengths)))
    return lengths


def trees_of_kind(kind: str, n: int, seed: int = 0):
    """A small CPU TreeBatch of at most ``n`` tokens per item, of one kind of tree; ragged, with an empty item
    for most kinds."""
    import syntaxkernels as sk
    from syntaxkernels.tools.workloads import random_document, random_forest

    rng = random.Random(seed)
    if kind == "random":  # one random tree per item, ragged, one empty item
        rows = [random_forest(rng, n), random_forest(rng, max(1, n // 2)), []]
    elif kind == "forest":  # interleaved trees (random_forest), a sentence pair (random_document), one token
        rows = [random_forest(rng, n, 3), random_document(rng, [n // 3, n - n // 3]), [-1]]
    elif kind == "star":  # quadratic sibling lists: every leaf is every other leaf's sibling
        rows = [[-1] + [0] * (n - 1), [n // 2] * (n // 2) + [-1] + [n // 2] * (n - n // 2 - 1)]
    elif kind == "chain":  # the deepest tree: every parent_d / child_d row holds one key
        rows = [[-1] + list(range(n - 1)), list(range(1, n // 2)) + [-1], []]
    elif kind == "packed":  # documents of short sentences
        rows = [random_document(rng, sentence_lengths(rng, n, 9)) for _ in range(2)]
    elif kind == "single":  # one-token sentences only: every relation mask empty, pairwise full of keys
        rows = [[-1] * n, [-1] * (n - 3)]
    else:
        raise ValueError(kind)
    return sk.TreeBatch.from_heads(rows)


def pytest_collection_modifyitems(config, items):
    """The quick subset (README.md, "What the tests need"): every test marked neither ``slow`` (compiling for GPUs
    this machine lacks) nor ``long_on_cpu`` (long on a CPU-only machine) is marked ``quick``, so that
    ``python -m pytest python_tests -q -m quick`` runs it; CI runs everything."""
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("long_on_cpu") is None:
            item.add_marker(pytest.mark.quick)


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


@pytest.fixture(autouse=True)
def _launch_programs(request):
    """Launcher replay (``ops._replay``) is on only in tests marked ``replay`` (test_replay.py compares it with the
    launchers as written on every kernel path); every other test runs the launchers as written, so that a test that
    patches a module's constant, config or launch function sees its patch. Each test starts with no program."""
    from syntaxkernels.ops import _replay

    _replay.clear()
    previous = _replay.set_enabled(request.node.get_closest_marker("replay") is not None)
    yield
    _replay.set_enabled(previous)
    _replay.clear()
