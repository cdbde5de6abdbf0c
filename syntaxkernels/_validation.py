"""Input checks shared by the reference and the fused ops: every message names the offending argument.

The shape, dtype and device checks also run while ``torch.compile`` traces (they read metadata only, which
costs nothing at trace time, and a distance smaller than q's N must fail there too); the per-value checks
(lengths, key-padding masks) never run under compilation.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import _ext
from .specs import MAX_PATH, BucketSpec, MaskSpec, RelativePositionSpec

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compiling() -> bool:
    return torch.compiler.is_compiling()


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_groups: bool = False) -> None:
    """q, k, v ``[B, H, N, D]`` of one float dtype and one device.

    ``kv_groups`` (the distance-bias op): k and v may hold fewer heads, ``[B, H_kv, N, D]`` with ``H % H_kv == 0``
    (grouped-query attention: query head h reads key/value head ``h // (H / H_kv)``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape [B, H, N, D], got {tuple(t.shape)}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    B, H, N, D = q.shape
    grouped = kv_groups and k.shape[1] != H and k.shape[1] > 0 and H % k.shape[1] == 0
    if grouped:
        if tuple(k.shape) != (B, k.shape[1], N, D) or v.shape[:3] != k.shape[:3]:
            raise ValueError(
                f"grouped-query k, v must be [B, H_kv, N, D] with q's B, N (and k q's D) and one H_kv; got "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    elif k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        if kv_groups and k.dim() == 4 and k.shape[1] != H:
            raise ValueError(
                f"k and v have {k.shape[1]} heads and q {H}: grouped-query attention needs H_kv to divide H "
                f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
        raise ValueError(
            f"q, k, v must be [B, H, N, D] with the same B, H, N (and q, k the same D); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def kv_group(q: torch.Tensor, k: torch.Tensor) -> int:
    """How many query heads share one key/value head: ``H / H_kv`` (1 without grouped-query attention); q and k
    ``[B, H, N, D]`` or packed ``[T, H, D]`` (heads on dim 1 either way)."""
    return q.shape[1] // k.shape[1] if k.shape[1] else 1


def check_distance(distance: torch.Tensor, q: torch.Tensor) -> None:
    """distance ``uint8 [B, N, N]`` on q's device."""
    if not isinstance(distance, torch.Tensor):
        raise TypeError(f"distance must be a uint8 tensor [B, N, N], got {type(distance).__name__}")
    B, _, N, _ = q.shape
    if distance.dtype != torch.uint8:
        raise ValueError(f"distance must be uint8 (from sk.tree_distance), got {distance.dtype}")
    if tuple(distance.shape) != (B, N, N):
        H = q.shape[1]
        if distance.dim() == 3 and distance.shape[0] == B and distance.shape[1] == distance.shape[2] == H != N:
            # q's dim 1 (heads) holds the trees' token count: the heads were not moved in front of the tokens.
            raise ValueError(
                f"q, k, v must be [B, H, N, D] (heads before tokens) with N = {H} tokens as in distance "
                f"{tuple(distance.shape)}; got q of shape {tuple(q.shape)}, which looks like [B, N, H, D]: "
                f"pass q.transpose(1, 2) (and k, v likewise)"
            )
        raise ValueError(f"distance must have shape [B, N, N] = [{B}, {N}, {N}] for q of shape [B, H, N, D] = "
                         f"{list(q.shape)}, got {tuple(distance.shape)}")
    if distance.device != q.device:
        raise ValueError(f"distance is on {distance.device} but q is on {q.device}")


def check_table(table: torch.Tensor, buckets: BucketSpec, q: torch.Tensor) -> None:
    """table ``[T]`` (shared) or ``[H, T]`` (per head) with T = buckets.num_buckets."""
    if not isinstance(buckets, BucketSpec):
        raise TypeError(f"buckets must be a BucketSpec, got {type(buckets).__name__}")
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"table must be a tensor [T] or [H, T], got {type(table).__name__}")
    H = q.shape[1]
    T = buckets.num_buckets
    if table.dim() == 1:
        ok = table.shape[0] == T
    elif table.dim() == 2:
        ok = tuple(table.shape) == (H, T)
    else:
        ok = False
    if not ok:
        raise ValueError(
            f"table must have shape [T] = [{T}] or [H, T] = [{H}, {T}] for this BucketSpec, got {tuple(table.shape)}"
        )
    if not table.is_floating_point():
        raise ValueError(f"table must be a float tensor, got {table.dtype}")
    if table.device != q.device:
        raise ValueError(f"table is on {table.device} but q is on {q.device}")


def check_bias_scale(bias_scale, q: torch.Tensor) -> None:
    """bias_scale None, a number or a one-element tensor on q's device (TypeError for anything else)."""
    if bias_scale is None or (isinstance(bias_scale, (int, float)) and not isinstance(bias_scale, bool)):
        return
    if not isinstance(bias_scale, torch.Tensor):
        raise TypeError(f"bias_scale must be None, a float or a one-element tensor, got {type(bias_scale).__name__}")
    if bias_scale.numel() != 1:
        raise ValueError(f"bias_scale must be None, a float or a one-element tensor, got shape "
                         f"{tuple(bias_scale.shape)}")
    if bias_scale.device != q.device:
        raise ValueError(f"bias_scale is on {bias_scale.device} but q is on {q.device}")


def _on_host(tensor: torch.Tensor) -> bool:
    """Whether reading ``tensor``'s values costs no device synchronisation (a test may pretend otherwise)."""
    return tensor.device.type == "cpu"


def normalize_lengths(lengths, q: torch.Tensor) -> Optional[torch.Tensor]:
    """``lengths`` as ``int64 [B]`` on q's device (:func:`normalize_plan_lengths` with q's B and N)."""
    if lengths is None:
        return None
    B, _, N, _ = q.shape
    return normalize_plan_lengths(lengths, B, N, q.device)


def normalize_plan_lengths(lengths, B: int, N: int, device) -> torch.Tensor:
    """``lengths`` as ``int64 [B]`` on ``device``, from ``int [B]`` or a boolean key-padding mask ``[B, N]`` (True =
    padding, as in ``nn.MultiheadAttention``; it must pad a suffix).

    Values are checked where they live without a host synchronisation: a CPU tensor (or a list) is checked
    here, with a ``ValueError`` naming the batch item, before it moves to ``device``; a tensor already on a
    GPU is checked by a device-side assertion (``torch._assert_async``), which fails at the next
    synchronisation instead of stalling the stream now.
    """
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths)
    on_host = _on_host(lengths)
    if lengths.dtype == torch.bool:
        if tuple(lengths.shape) != (B, N):
            raise ValueError(f"a boolean key-padding mask must have shape [B, N] = [{B}, {N}], got {tuple(lengths.shape)}")
        valid = ~lengths
        counts = valid.sum(dim=1)
        if not compiling():
            prefix = torch.arange(N, device=lengths.device)[None, :] < counts[:, None]
            bad = (prefix != valid).any(dim=1)
            if on_host:
                if bool(bad.any()):
                    b = int(bad.nonzero()[0, 0])
                    raise ValueError(f"batch item {b}: the key-padding mask must pad a suffix (valid tokens first)")
            else:
                torch._assert_async(~bad.any(), "the key-padding mask must pad a suffix (valid tokens first)")
        return counts.to(device=device, dtype=torch.int64, non_blocking=True)
    if lengths.dtype.is_floating_point or lengths.dim() != 1 or lengths.shape[0] != B:
        raise ValueError(f"lengths must be an integer tensor [B] = [{B}], got {lengths.dtype} {tuple(lengths.shape)}")
    if not compiling():
        bad = (lengths < 0) | (lengths > N)
        if on_host:
            if bool(bad.any()):
                b = int(bad.nonzero()[0, 0])
                raise ValueError(f"batch item {b}: lengths[{b}] = {int(lengths[b])} is outside 0..N = 0..{N}")
        else:
            torch._assert_async(~bad.any(), f"lengths must be in 0..N = 0..{N}")
    return lengths.to(device=device, dtype=torch.int64, non_blocking=True)


def check_plan_distance(distance) -> None:
    """A padded distance of a plan: uint8 ``[B, N, N]``."""
    if not isinstance(distance, torch.Tensor):
        raise TypeError(f"distance must be a uint8 tensor [B, N, N], got {type(distance).__name__}")
    if distance.dtype != torch.uint8:
        raise ValueError(f"distance must be uint8 (from sk.tree_distance), got {distance.dtype}")
    if distance.dim() != 3 or distance.shape[1] != distance.shape[2]:
        raise ValueError(f"distance must have shape [B, N, N], got {tuple(distance.shape)}")


def check_packed_structure(distance, cu_seqlens, num_tokens: Optional[int] = None) -> None:
    """A packed batch: uint8 distance ``[sum n_s^2]`` and int ``cu_seqlens [S + 1]`` (starting at 0, never
    decreasing, ending at ``num_tokens`` when given) that needs exactly that many distance bytes. Values are read on CPU tensors (``ValueError``); on a
    GPU they are a device-side assertion (no host synchronisation). Skipped while ``torch.compile`` traces."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError("cu_seqlens must be an int32 (or int64) tensor [S + 1]")
    if not isinstance(distance, torch.Tensor) or distance.dtype != torch.uint8 or distance.dim() != 1:
        what = f"{distance.dtype} {tuple(distance.shape)}" if isinstance(distance, torch.Tensor) else type(distance).__name__
        raise ValueError(f"a packed distance must be uint8 [sum n_s^2] (PackedTreeBatch.distance), got {what}")
    if distance.device != cu_seqlens.device:
        raise ValueError(f"the packed distance is on {distance.device} but cu_seqlens is on {cu_seqlens.device}")
    if compiling():
        return
    cu = cu_seqlens.to(torch.int64)
    sizes = cu[1:] - cu[:-1]
    need = (sizes * sizes).sum()
    if _on_host(cu):
        if int(cu[0]) != 0 or bool((sizes < 0).any()):
            raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {cu.tolist()[:8]}"
                             f"{'...' if cu.shape[0] > 8 else ''}")
        if num_tokens is not None and int(cu[-1]) != num_tokens:
            raise ValueError(f"cu_seqlens must end at T = {num_tokens} (the packed q's tokens), got {int(cu[-1])}")
        if distance.shape[0] != int(need):
            raise ValueError(f"the packed distance has {distance.shape[0]} bytes but the sequences of cu_seqlens "
                             f"need sum n_s^2 = {int(need)}")
    else:
        ok = (cu[0] == 0) & (sizes >= 0).all() & (need == distance.shape[0])
        if num_tokens is not None:
            ok = ok & (cu[-1] == num_tokens)
        torch._assert_async(ok, "cu_seqlens must start at 0, never decrease, and need exactly the packed distance's "
                                "sum n_s^2 bytes; run the batch on CPU to see where")


def first_disagreement(lengths: torch.Tensor, valid: Optional[torch.Tensor], n: int) -> Optional[int]:
    """The first batch item whose tokens ``0 .. lengths[b] - 1`` are not exactly its ``valid`` ones, or None when
    every item agrees. Reads the values: CPU tensors only (:func:`check_lengths_agree` decides).

    Args:
        lengths: int ``[B]``.
        valid: bool ``[B, n]`` (True = a token), or None: all ``n`` tokens of every item.
        n: the padded length N.
    """
    expected = torch.arange(n)[None, :] < lengths.reshape(-1, 1).cpu()
    actual = valid.cpu() if valid is not None else torch.ones_like(expected)
    bad = (expected != actual).any(dim=1)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def check_lengths_agree(lengths: torch.Tensor, valid: Optional[torch.Tensor], n: int, describe: Callable[[int], str],
                        device_message: str) -> None:
    """Check that ``lengths`` (int ``[B]``) and ``valid`` (bool ``[B, n]``, None = all ``n`` tokens) describe the same
    tokens, where the data is, without a host synchronisation for device tensors.

    When every given tensor is in CPU memory, the values are read here and the first batch item that disagrees
    raises ``ValueError(describe(b))``. Otherwise the check is queued on the device (``torch._assert_async`` with
    ``device_message``: a device-side assertion that fails the next synchronising call on a GPU; it raises at once
    on CPU tensors); ``lengths`` is moved to ``valid``'s device when they differ. Skipped while ``torch.compile``
    traces. The one lengths-against-structure check of the package: the transformers integration (the trees'
    lengths against the attention mask) and the plans made from bare tensors (the lengths against the trees a
    distance holds, :func:`check_lengths_match_distance`) call it.
    """
    if compiling():
        return
    if _on_host(lengths) and (valid is None or _on_host(valid)):
        b = first_disagreement(lengths, valid, n)
        if b is not None:
            raise ValueError(describe(b))
        return
    if valid is not None:
        expected = torch.arange(n, device=valid.device)[None, :] < lengths.to(valid.device)[:, None]
        agree = (expected == valid).all()
    else:
        agree = (lengths == n).all()
    torch._assert_async(agree, device_message)


def check_lengths_match_distance(lengths: Optional[torch.Tensor], distance: torch.Tensor) -> None:
    """Check ``lengths`` (None or int ``[B]``, already normalised) against the trees of ``distance`` when the
    package built it (a :class:`~syntaxkernels.TreeBatch`'s, :func:`~syntaxkernels.tree_distance`'s result: the
    tensor carries the mark of :func:`syntaxkernels.trees.batch.is_tree_distance`): its diagonal is 0 for the
    trees' tokens and 255 for padding, so the trees' lengths are known. None means every one of the N tokens, so a
    padded batch without ``lengths`` disagrees too. A distance the package did not build is not checked (its
    padding, if any, is unknown).

    Through :func:`check_lengths_agree`: on CPU tensors a ``ValueError`` names the batch item and both lengths; on
    a GPU a device-side assertion (no host synchronisation). Run when a plan is made from these tensors
    (:func:`syntaxkernels.plan.structure_plan`): once per plan; a ``TreeBatch`` passed as the plan is its own
    lengths' source and needs no check.

    Args:
        lengths: None or int ``[B]`` on the distance's device.
        distance: uint8 ``[B, N, N]``.
    """
    from .specs import UNREACHABLE
    from .trees.batch import is_tree_distance

    if compiling() or not is_tree_distance(distance):
        return
    B, N = distance.shape[0], distance.shape[1]
    trees = distance.diagonal(dim1=1, dim2=2) != UNREACHABLE  # bool [B, N]: the trees' tokens

    def describe(b: int) -> str:
        tokens = int(trees[b].sum())
        said = (f"lengths is None (all N = {N} tokens attend)" if lengths is None
                else f"lengths[{b}] = {int(lengths[b])}")
        return (f"batch item {b}: {said} but the trees of distance have {tokens} tokens (a tree distance's "
                f"diagonal is 0 for the trees' tokens, 255 for padding); pass the TreeBatch's lengths "
                f"(lengths=trees.lengths), or the TreeBatch itself")

    full = torch.full((B,), N, dtype=torch.int64, device=distance.device) if lengths is None else lengths
    check_lengths_agree(full, trees, N, describe,
                        "syntax_bias_attention: lengths differ from the trees of distance (its diagonal: 0 for "
                        "the trees' tokens, 255 for padding); run the batch on CPU to see which item")


def check_window(window) -> None:
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_PATH:
        raise ValueError(f"window must be None or an int in 0..{MAX_PATH}, got {window!r}")


def check_position_window(position_window) -> None:
    """A positional (sliding) window: None, or an int >= 0 (``|i - j| <= position_window``)."""
    if position_window is None:
        return
    if isinstance(position_window, bool) or not isinstance(position_window, int) or position_window < 0:
        raise ValueError(f"position_window must be None or an int >= 0 (|i - j| <= position_window), got "
                         f"{position_window!r}")


def check_position_bias(position_buckets, position_table, q: torch.Tensor) -> None:
    """T5's relative-position term: both None, or a :class:`RelativePositionSpec` and a float table ``[H, P]`` (H =
    q's heads, P = its ``num_buckets``) on q's device."""
    if position_buckets is None and position_table is None:
        return
    if position_buckets is None or position_table is None:
        raise ValueError("position_buckets and position_table go together (T5's relative-position term): pass both "
                         "or neither")
    if not isinstance(position_buckets, RelativePositionSpec):
        raise TypeError(f"position_buckets must be a RelativePositionSpec, got {type(position_buckets).__name__}")
    if not isinstance(position_table, torch.Tensor) or not position_table.is_floating_point():
        raise ValueError("position_table must be a float tensor [H, P]")
    heads = q.shape[1] if q.dim() == 4 else q.shape[-2]  # padded [B, H, N, D] or packed [T, H, D]
    if tuple(position_table.shape) != (heads, position_buckets.num_buckets):
        raise ValueError(f"position_table must have shape [H, P] = [{heads}, {position_buckets.num_buckets}] (P = "
                         f"position_buckets.num_buckets), got {tuple(position_table.shape)}")
    if position_table.device != q.device:
        raise ValueError(f"position_table must be on q's device ({q.device}), got {position_table.device}")


def check_backend(backend: str) -> None:
    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'reference', got {backend!r}")


def check_trees(trees, q: torch.Tensor) -> None:
    from .trees.batch import TreeBatch

    if not isinstance(trees, TreeBatch):
        check_relations_defined(trees)
        raise TypeError(f"trees must be a TreeBatch (sk.TreeBatch.from_heads), got {type(trees).__name__}")
    check_distance(trees.distance, q)
    B, _, N, _ = q.shape
    for name in ("depth", "segment"):
        t = getattr(trees, name)
        if tuple(t.shape) != (B, N):
            raise ValueError(f"trees.{name} must have shape [B, N] = [{B}, {N}], got {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"trees.{name} is on {t.device} but q is on {q.device}")


def check_masks(masks) -> None:
    if not isinstance(masks, MaskSpec):
        raise TypeError(f"masks must be a MaskSpec, got {type(masks).__name__}")


def check_dropout(p, seed) -> None:
    """Attention dropout's arguments: ``p`` a float in ``[0, 1)``; with ``p > 0`` a ``seed``, an int in
    ``[0, 2^64)`` (the Philox key of the mask)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {p!r}")
    if p > 0.0:
        if seed is None:
            raise ValueError("dropout_p > 0 needs a dropout_seed (an int in [0, 2^64); the modules draw one per "
                             "call from torch's generator)")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"dropout_seed must be an int in [0, 2^64), got {seed!r}")


#: Shape classes whose checks passed (:func:`check_once`), the oldest first out past :data:`MAX_PASSED`.
_PASSED: dict = {}
MAX_PASSED = 1024


def check_once(check: Callable[..., None], *args) -> None:
    """``check(*args)``, unless the same check already passed for arguments of the same class: every tensor of the
    same shape, strides, dtype and device (and which arguments are one tensor), every other argument of the same
    class and equal. For checks that read nothing but that (a shape, dtype, device or type check): a model's layers
    after the first skip them. Without the C++ extension, while ``torch.compile`` traces, for a tensor subclass or an
    unhashable argument the check simply runs. Never for a check of tensor values."""
    native = _ext.replay_helpers()
    if native is None or compiling():
        check(*args)
        return
    leaves: list = []
    key: list = [check, tuple(a.__class__ for a in args)]  # (classes too: True == 1 == 1.0 as values)
    if not native.replay_flatten(args, leaves, key):
        check(*args)
        return
    shape_class = tuple(key)
    try:
        if shape_class in _PASSED:
            return
    except TypeError:  # (an unhashable argument)
        check(*args)
        return
    check(*args)
    _PASSED[shape_class] = True
    while len(_PASSED) > MAX_PASSED:
        _PASSED.pop(next(iter(_PASSED)), None)


def check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal=False,
                                deterministic=False) -> None:
    """Every shape/dtype/device/type check of ``syntax_bias_attention``'s arguments (the reference, the fused
    op and the Triton-less fallback all call it, before choosing a backend). k, v may hold ``H_kv`` heads
    (grouped-query attention, :func:`check_qkv`)."""
    check_qkv(q, k, v, kv_groups=True)
    check_distance(distance, q)
    check_table(table, buckets, q)
    check_bias_scale(bias_scale, q)
    check_window(window)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be a bool, got {deterministic!r}")


def check_relations_defined(trees) -> None:
    """``TypeError`` with the source's reason when ``trees`` is a plan whose structure has no tree relations (a
    plan of another source, e.g. a ``GraphBatch``, sets ``relations_refused`` to the reason)."""
    refused = getattr(trees, "relations_refused", None)
    if isinstance(refused, str):
        raise TypeError(f"syntax_subnetwork_attention takes a TreeBatch or PackedTreeBatch, got "
                        f"{type(trees).__name__}: {refused}")


def check_subnetwork_inputs(q, k, v, trees, masks) -> None:
    """Every check of ``syntax_subnetwork_attention``'s arguments (a leak-free batch is refused: every mask, the
    dense ones too, comes from the whole tree)."""
    check_relations_defined(trees)
    if getattr(trees, "leak_free", False):
        raise ValueError("syntax_subnetwork_attention: a leak-free batch (leak_free=True) has no sub-network masks "
                         "(they come from the whole tree, which would leak later tokens' heads into earlier rows); "
                         "build the batch without leak_free for Syntax-BERT's masks")
    check_qkv(q, k, v)
    check_trees(trees, q)
    check_masks(masks)
