"""Loading the compiled extension ``syntaxkernels._C`` without ever failing the package import.

If the extension is missing or broken, a single warning says so (set ``SYNTAXKERNELS_DEBUG=1`` or run
``python -m syntaxkernels info`` for the full error) and the pure-Python builders are used.

Contract of ``_C`` (csrc/bindings.cpp):
    tree_distance(heads int64 [B, N] CPU, lengths int64 [B] CPU, num_threads int)
        -> (distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N])
    tree_distance_lists(rows: list of list/tuple of ints, lengths or None, num_threads int)
        -> (heads, lengths, distance, depth, segment), reading the Python lists directly (padding with -1),
        or None when a row is not a plain list/tuple (the caller then takes the tensor path)
    tree_distance_cuda(heads int64 [B, N] CUDA, lengths int64 [B] CUDA) -> same, on the GPU
        (present only in a CUDA build)
    has_cuda() -> bool
    replay_flatten(values, leaves, key) -> bool and ReplayTensors: the launcher replay's key and program tensors
        (csrc/replay.h; syntaxkernels/ops/_replay.py)
    graph_distance(edges int64 [B, E, 2] CPU, lengths int64 [B] CPU, N int, P int, directed bool, num_threads int)
        -> distance uint8 [B, P, P] (P >= N; all-pairs shortest paths, (-1, -1) pads an edge list)
    packed_graph_distance(edges int64 [E, 2], edge_offsets int64 [S + 1], cu_seqlens int64 [S + 1], directed bool,
        num_threads int) -> (distance uint8 [sum n_s^2], offsets int64 [S + 1])
    decode_tree(scores float32 [B, N, N] CPU, lengths int64 [B] CPU, num_threads int) -> heads int64 [B, N]
        (the maximum spanning tree with one root word of each item, -1 for the root word and padding;
        syntaxkernels/trees/decode.py)
They raise ValueError with the same messages as the Python builders.
"""
from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import Optional

_module: Optional[ModuleType] = None
_error: Optional[BaseException] = None
_tried = False


def load() -> Optional[ModuleType]:
    """The extension module, or None (warning once) when it cannot be imported."""
    global _module, _error, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("SYNTAXKERNELS_DISABLE_EXTENSION") == "1":
        _error = RuntimeError("disabled by SYNTAXKERNELS_DISABLE_EXTENSION=1")
        return None
    try:
        import torch  # noqa: F401  (the extension links against libtorch)
        from . import _C  # type: ignore[attr-defined]

        _module = _C
    except Exception as exc:  # ImportError, or an undefined symbol from a torch mismatch
        _error = exc
        detail = f": {exc!r}" if os.environ.get("SYNTAXKERNELS_DEBUG") == "1" else ""
        warnings.warn(
            "syntaxkernels: the C++ extension could not be loaded; using the pure-Python tree builder "
            "(slower). Run `python -m syntaxkernels info` or set SYNTAXKERNELS_DEBUG=1 for details"
            + detail,
            RuntimeWarning,
            stacklevel=3,
        )
    return _module


def available() -> bool:
    return load() is not None


_REPLAY = None
_REPLAY_LOOKED = False


def replay_helpers() -> Optional[ModuleType]:
    """The extension when it has the launcher replay's helpers (``replay_flatten``, ``ReplayTensors``), else None;
    looked up once (a hot path: every replayed call and every ``check_once`` asks)."""
    global _REPLAY, _REPLAY_LOOKED
    if not _REPLAY_LOOKED:
        module = load()
        _REPLAY = module if module is not None and hasattr(module, "replay_flatten") else None
        _REPLAY_LOOKED = True
    return _REPLAY


def has_cuda_builder() -> bool:
    module = load()
    return module is not None and hasattr(module, "tree_distance_cuda") and bool(module.has_cuda())


def status() -> str:
    """One line for ``info``: loaded (with CUDA or not), or why not."""
    module = load()
    if module is None:
        return f"not loaded ({_error!r})"
    return "loaded, CUDA builder " + ("built" if has_cuda_builder() else "not built")
