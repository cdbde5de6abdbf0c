"""What every op shares and Triton does not need: choosing between the Triton kernels and the reference
(``backend=`` of every public op; :func:`triton_status` is the package's one probe of Triton) and the constant device
tensors the ops share (:func:`device_constant`), and the dropout arguments every kernel family takes
(:func:`dropout_arguments`, :func:`seed_bits`). What an op derives from a batch once for every layer lives on the
batch's structure plan (:mod:`syntaxkernels.plan`), never in a cache here.

Imports torch but never Triton: an op module imports its Triton kernels and launchers only when
:func:`triton_status` is "ok", so that every op imports (and runs its C++ kernels or the reference) without it.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch

from .. import _validation as V
from .._interpreter import interpreting

_triton_status: Optional[str] = None

#: ``log2(e)``: the kernels keep scores in the log2 domain (``s2 = s * log2(e)``).
LOG2E = 1.4426950408889634

#: Largest head dim (q/k and v) of every Triton kernel (32, 64 and 128 run without padding); the C++ kernels and
#: the reference take any.
MAX_HEAD_DIM = 128
#: Dtypes the Triton kernels take (float64 runs the reference or the C++ kernels).
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_status() -> str:
    """'ok', or why Triton cannot be used here (probed once, then remembered).

    A plain module-level cache rather than ``functools.lru_cache``: the ops call this while ``torch.compile``
    traces them, and Dynamo warns about (and traces through) ``lru_cache``-wrapped functions. The first call
    happens when :mod:`syntaxkernels.ops` is imported, so traced calls only read the remembered value.
    """
    global _triton_status
    if _triton_status is None:
        try:
            import triton  # noqa: F401

            _triton_status = "ok"
        except Exception as exc:  # pragma: no cover - depends on the install
            _triton_status = f"triton is not importable ({exc!r})"
    return _triton_status


_CONSTANTS: Dict[Tuple[Hashable, str], torch.Tensor] = {}

#: ``recorder``: the recorder of :mod:`._replay` while this thread records a launcher (per thread: another thread's
#: launches are not this recording's); its ``paused`` flag is set while a launch or a constant's build runs.
RECORDING = threading.local()


def device_constant(key: Hashable, like: torch.Tensor, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``build()`` (a CPU tensor that depends on ``key`` only) on ``like``'s device, built and moved once per
    (key, device) and handed out again afterwards: no host-to-device copy per call.

    While ``torch.compile`` traces, or for a fake ``like``, a fresh tensor is built instead (a traced or fake
    tensor must never be remembered for the calls that follow). A build inside a launcher being recorded
    (:mod:`._replay`) is not part of its program: the program takes the value as a constant, as later calls do.
    """
    from torch._subclasses.fake_tensor import is_fake

    if V.compiling() or is_fake(like):
        return build().to(like.device)
    full_key = (key, str(like.device))
    value = _CONSTANTS.get(full_key)
    if value is None:
        recorder = getattr(RECORDING, "recorder", None)
        pause = recorder is not None and not recorder.paused
        if pause:
            recorder.paused = True
        try:
            value = _CONSTANTS[full_key] = build().to(like.device)
        finally:
            if pause:
                recorder.paused = False
    return value


def resolve_backend(backend: str, device: torch.device) -> str:
    """'triton' or 'reference' for tensors on ``device``.

    "auto" picks Triton for CUDA tensors (when Triton imports) and the reference elsewhere; "triton" on a
    CPU tensor works only under ``TRITON_INTERPRET=1`` and raises a clear error otherwise.
    """
    V.check_backend(backend)
    if backend == "reference":
        return "reference"
    usable = triton_status() == "ok" and (device.type == "cuda" or (device.type == "cpu" and interpreting()))
    if backend == "auto":
        return "triton" if usable and device.type == "cuda" else "reference"
    if not usable:
        why = triton_status()
        if why == "ok":
            why = (f"tensors are on {device}; the Triton kernels need CUDA tensors "
                   "(or CPU tensors with TRITON_INTERPRET=1 set before triton is imported)")
        raise RuntimeError(f"backend='triton' is not available: {why}")
    return "triton"


#: The oldest GPU the Triton kernels run on (compute capability): bf16 tensor cores and 99 KB or more of shared
#: memory a block (``ops._primitives.ARCH_FAMILY`` has the configs of each family).
MIN_CAPABILITY = (8, 0)


def triton_unsupported(q: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Triton kernels cannot take these q and v (None when they can)."""
    if q.device.type == "cuda":
        capability = torch.cuda.get_device_capability(q.device)  # cached by torch: no device round trip
        if tuple(capability) < MIN_CAPABILITY:
            major, minor = capability
            return (f"the GPU is sm_{major}{minor}; the Triton kernels need compute capability "
                    f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (bf16 tensor cores, 99 KB or more of shared "
                    "memory a block: T4-class GPUs run the reference)")
    if q.dtype not in TRITON_DTYPES:
        return f"q has dtype {q.dtype}; the Triton kernels take float16, bfloat16 or float32"
    for name, dim in (("q", q.shape[-1]), ("v", v.shape[-1])):
        if not 1 <= dim <= MAX_HEAD_DIM:
            return (f"{name} head dim {dim} is not supported by the Triton kernels (head dims 1..{MAX_HEAD_DIM}; "
                    "32, 64 and 128 run without padding)")
    return None


def kernels_or_reference(backend: str, chosen: str, q: torch.Tensor, v: torch.Tensor) -> str:
    """``chosen`` (from :func:`resolve_backend`), unless it is "triton" and the kernels cannot take q and v: then
    "reference" under backend="auto", and a ValueError saying why under backend="triton"."""
    if chosen == "triton":
        why = triton_unsupported(q, v)
        if why is not None:
            if backend == "triton":
                raise ValueError(f"backend='triton': {why}; use backend='reference' or 'auto'")
            return "reference"
    return chosen


def dropout_arguments(p: float, seed):
    """The kernels' dropout arguments ``(seed, threshold, keep_scale)`` of probability ``p`` and ``seed`` (an int in
    ``[0, 2^64)``, or its int64 bit pattern; unused when ``p == 0``): the seed as an int64 bit pattern (one kernel
    argument type for every seed; ``tl.philox`` reads it as uint64), the uint32 threshold of
    :func:`syntaxkernels.reference.dropout_threshold` and ``1 / (1 - p)``."""
    from ..reference import dropout_threshold
    if p == 0.0:
        return 0, 0, 1.0
    return seed_bits(seed), dropout_threshold(p), 1.0 / (1.0 - p)


def seed_bits(seed: int) -> int:
    """``seed`` (an int in ``[0, 2^64)`` or its int64 bit pattern) as its int64 bit pattern: what an int64 kernel
    argument or ``torch.library`` schema holds."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed - (1 << 64) if seed >= (1 << 63) else seed
