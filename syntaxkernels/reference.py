"""Pure-PyTorch reference of every op: the specification the fused kernels are tested against.

Readable before fast: these functions materialise ``[B, H, N, N]`` scores and ``[B, M, N, N]`` masks.
They are autograd-correct (fp64 ``gradcheck`` passes), run on any device, and take the same arguments as
the public ops (``backend`` and ``deterministic`` are accepted and ignored).

Numerics: matrix products run in the input dtype, scores, bias and softmax in float32 (float64 for
float64 inputs), like an ordinary PyTorch implementation.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from . import _validation as V
from .specs import MAX_PATH, UNREACHABLE, BucketSpec, MaskSpec, RelativePositionSpec

__all__ = [
    "syntax_bias_attention",
    "gather_bias",
    "allowed_pairs",
    "masked_softmax",
    "masked_attention",
    "syntax_masks",
    "syntax_subnetwork_attention",
    "topical_attention",
    "gat_attention",
    "gat_layer",
    "inject_syntax_heads",
    "structural_probe_loss",
    "philox",
    "dropout_keep",
    "dropout_threshold",
    "stream_seed",
    "apply_attention_dropout",
    "leak_free_distance",
    "expand_kv_heads",
]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` over the allowed entries of the last dimension; a row with none is all zeros (zero
    gradients, never NaN); a row with a NaN or ``+inf`` allowed score is NaN (as ``torch.softmax``). ``allowed`` is
    bool, broadcastable to ``scores``."""
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    # Only a max of -inf (no allowed key, or only -inf scores) is replaced: a NaN or +inf max keeps the row NaN.
    row_max = torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    return weights / denom.masked_fill(denom == 0, 1.0)


def masked_attention(scores: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0,
                     dropout_seed: Optional[int] = None, dropout_item: int = 0) -> torch.Tensor:
    """Softmax attention over the allowed keys only; a row with no allowed key outputs zeros.

    Args:
        scores: float ``[B, H, N, N]`` (already scaled and biased).
        allowed: bool broadcastable to scores.
        v: ``[B, H, N, Dv]``.
        dropout_p, dropout_seed, dropout_item: attention dropout on the weights (:func:`apply_attention_dropout`:
            the pairs :func:`dropout_keep` drops are zeroed, the others scaled by ``1 / (1 - p)``); ``dropout_item``
            is batch item 0's index in the mask's numbering.
    Returns:
        ``[B, H, N, Dv]`` in v's dtype. Gradients of empty rows are exactly zero, never NaN.

    Non-finite scores of allowed pairs propagate as in ``torch.softmax`` and SDPA: a row holding a NaN or ``+inf``
    score has NaN weights throughout (its output and gradients are NaN); a ``-inf`` score gets weight 0 (a row
    whose allowed scores are all ``-inf`` outputs 0, like a row with no allowed key). Scores of pairs that are not
    allowed are never read. A NaN or infinite ``v`` row reaches the output through the product ``weights @ v``:
    every row that gives it weight, and (``0 * inf`` is NaN) the other rows with an allowed key too.
    """
    weights = apply_attention_dropout(masked_softmax(scores, allowed), dropout_p, dropout_seed, dropout_item)
    return (weights.to(v.dtype) @ v).masked_fill(~allowed.any(dim=-1, keepdim=True), 0)


# ---------------------------------------------------------------------------------------------------------
# Attention dropout: the keep mask every backend draws (docs/semantics.md, "Attention dropout")
# ---------------------------------------------------------------------------------------------------------

PHILOX_ROUNDS = 7
_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85


def _mul_hi_lo(x: torch.Tensor, a: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x * a) >> 32`` and ``(x * a) & 0xFFFFFFFF`` of int64 tensors holding uint32 values (a 32-bit constant),
    without int64 overflow: ``a`` in 16-bit halves."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    high_part, low_part = x * a_hi, x * a_lo  # < 2^48 each
    hi = (high_part + (low_part >> 16)) >> 16
    lo = (((high_part & 0xFFFF) << 16) + low_part) & _M32
    return hi, lo


def philox(seed: int, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
           rounds: int = PHILOX_ROUNDS) -> Tuple[torch.Tensor, ...]:
    """Philox-4x32 (``rounds`` rounds) of the counters ``(c0, c1, c2, c3)`` (int64 tensors holding uint32 values,
    broadcastable) under the key ``(seed & 0xFFFFFFFF, seed >> 32)``: four int64 tensors of uint32 values. The
    kernels' generator (``tl.philox`` in Triton, the C++ kernels' own), written with int64 arithmetic."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    shape = torch.broadcast_shapes(c0.shape, c1.shape, c2.shape, c3.shape)
    c0, c1, c2, c3 = (c.expand(shape).to(torch.int64) for c in (c0, c1, c2, c3))
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(c2, _ROUND_B)
        hi_a, lo_a = _mul_hi_lo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


STREAM_STEP = 0x9E3779B97F4A7C15


def stream_seed(seed: int, stream: int) -> int:
    """The seed of dropout stream ``stream`` of a call with ``seed``: ``(seed + stream * 0x9E3779B97F4A7C15) mod
    2^64``. Stream 0 is the seed itself; an op with several attentions per call (the sub-networks, one stream
    each) draws each one's mask with its own stream seed."""
    return (int(seed) + int(stream) * STREAM_STEP) & 0xFFFFFFFFFFFFFFFF


def dropout_threshold(p: float) -> int:
    """The uint32 threshold of dropout probability ``p`` in ``[0, 1)``: a pair is kept when its random uint32 is
    ``>= floor(p * 2^32)``."""
    if not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {p!r}")
    return min(int(float(p) * 2.0 ** 32), _M32)


def dropout_keep(seed: int, p: float, batch: int, heads: int, rows: int, cols: int, *, first_item: int = 0,
                 device=None) -> torch.Tensor:
    """The attention-dropout keep mask, bool ``[batch, heads, rows, cols]``: pair (query i, key j) of head h of
    batch item b is kept when word ``j % 4`` of ``philox(seed, j // 4, i, (first_item + b) * heads + h, 0)`` is
    ``>= dropout_threshold(p)``. A function of the seed, the item, the head and the pair's positions in its
    sequence only: a padded batch and its packed form (item = sequence) draw the same mask, on every backend, in
    the forward and the backward."""
    threshold = dropout_threshold(p)
    i = torch.arange(rows, device=device, dtype=torch.int64)[:, None]
    j = torch.arange(cols, device=device, dtype=torch.int64)[None, :]
    bh = torch.arange(batch * heads, device=device, dtype=torch.int64) + first_item * heads
    words = philox(int(seed), (j >> 2)[None], i[None], bh[:, None, None], torch.zeros(1, dtype=torch.int64,
                                                                                      device=device))
    lane = (j & 3)[None].expand(batch * heads, rows, cols)
    word = torch.stack(words).gather(0, lane[None]).squeeze(0)
    return (word >= threshold).view(batch, heads, rows, cols)


def apply_attention_dropout(weights: torch.Tensor, p: float, seed: Optional[int], first_item: int = 0
                            ) -> torch.Tensor:
    """``weights`` (``[B, H, N, N]`` attention probabilities) with the pairs :func:`dropout_keep` drops zeroed and
    the kept ones scaled by ``1 / (1 - p)``; unchanged when ``p == 0``. A dropped pair is ``weight * 0``: a NaN row
    (a NaN or ``+inf`` allowed score) stays NaN whatever is dropped, as in the kernels (whose NaN normaliser
    reaches the whole row)."""
    if p == 0.0:
        return weights
    if seed is None:
        raise ValueError("dropout_p > 0 needs a dropout_seed (an int)")
    B, H, N, M = weights.shape
    keep = dropout_keep(seed, p, B, H, N, M, first_item=first_item, device=weights.device)
    return torch.where(keep, weights * (1.0 / (1.0 - p)), weights * 0.0)


def expand_kv_heads(q: torch.Tensor, *tensors: torch.Tensor):
    """Grouped-query attention's key/value heads repeated for their query heads: each ``[B, H_kv, N, *]`` (or packed
    ``[T, H_kv, *]``) tensor becomes ``H = q.shape[1]`` heads, head h a copy of head ``h // (H / H_kv)`` (the
    specification of every fused kernel's head mapping; autograd sums each group's gradients back)."""
    group = q.shape[1] // tensors[0].shape[1]
    if group == 1:
        return tensors
    return tuple(t.repeat_interleave(group, dim=1) for t in tensors)


def _without_padding(lengths: Optional[torch.Tensor], *tensors: torch.Tensor):
    """The ``[B, H, N, *]`` tensors with their tokens at or past ``lengths`` set to 0 (None: unchanged), so that
    padding tokens take no part in the dense products: whatever they hold (a NaN included), the valid rows'
    outputs and every gradient ignore them, and their own gradients are exactly 0, as on the fused paths."""
    if lengths is None:
        return tensors
    N = tensors[0].shape[2]
    padding = (torch.arange(N, device=lengths.device)[None, :] >= lengths[:, None])[:, None, :, None]
    return tuple(t.masked_fill(padding, 0) for t in tensors)


def allowed_pairs(distance: torch.Tensor, lengths: Optional[torch.Tensor] = None, window: Optional[int] = None,
                  causal: bool = False, position_window: Optional[int] = None) -> torch.Tensor:
    """bool ``[B, N, N]``: query i may attend key j.

    Both tokens valid (``< lengths``), ``distance <= window`` when a window is given (unreachable never),
    ``j <= i`` when causal, and ``|i - j| <= position_window`` when a positional window is given (a sliding window:
    ModernBERT's local layers, Mistral).
    """
    B, N, _ = distance.shape
    allowed = torch.ones(B, N, N, dtype=torch.bool, device=distance.device)
    if lengths is not None:
        valid = torch.arange(N, device=distance.device)[None, :] < lengths[:, None]
        allowed = allowed & valid[:, :, None] & valid[:, None, :]
    if window is not None:
        allowed = allowed & (distance.to(torch.int32) <= window)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool, device=distance.device).tril()[None]
    if position_window is not None:
        positions = torch.arange(N, device=distance.device)
        allowed = allowed & ((positions[:, None] - positions[None, :]).abs() <= position_window)[None]
    return allowed


def gather_bias(distance: torch.Tensor, table: torch.Tensor, buckets: BucketSpec, bias_scale=None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The bias ``c * table[bucket(d_ij)]`` as ``[B, 1, N, N]`` (shared table) or ``[B, H, N, N]`` (per head)."""
    bucket = buckets.lut(distance.device)[distance.long()]
    table = table.to(dtype)
    if table.dim() == 1:
        bias = table[bucket][:, None]
    else:
        bias = table[:, bucket].permute(1, 0, 2, 3)
    if bias_scale is not None:
        bias = bias * (bias_scale.to(dtype) if isinstance(bias_scale, torch.Tensor) else bias_scale)
    return bias


def _relation_terms(distance: torch.Tensor, table, buckets, bias_scale, window):
    """``[(distance_r [B, N, N], table_r, spec_r, c_r)]`` of R relations (``distance [B, R, N, N]``)."""
    R = distance.shape[1]
    if window is not None:
        raise ValueError("window applies to one distance: with several relations (distance [B, R, N, N]) pass "
                         "window=None")
    tables = list(table.unbind(0)) if isinstance(table, torch.Tensor) else list(table)
    specs = [buckets] * R if isinstance(buckets, BucketSpec) else list(buckets)
    if len(tables) != R or len(specs) != R:
        raise ValueError(f"{R} relations need {R} tables ([R, T], [R, H, T] or a sequence) and one BucketSpec or {R},"
                         f" got {len(tables)} tables and {len(specs)} specs")
    if isinstance(bias_scale, torch.Tensor) and bias_scale.numel() == R and R > 1:
        scales = list(bias_scale.reshape(-1, 1).unbind(0))
    else:
        scales = [bias_scale] * R
    return [(distance[:, r], tables[r], specs[r], scales[r]) for r in range(R)]


def syntax_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                          table: torch.Tensor, *, buckets: BucketSpec, scale: Optional[float] = None,
                          bias_scale=None, lengths=None, window: Optional[int] = None, causal: bool = False,
                          deterministic: bool = False, backend: str = "reference", dropout_p: float = 0.0,
                          dropout_seed: Optional[int] = None, dropout_item: int = 0,
                          position_window: Optional[int] = None,
                          position_buckets: Optional[RelativePositionSpec] = None,
                          position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention with a learnable tree-distance bias.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)] (+ position_table[h, pbucket(j - i)])``, softmax over
    allowed keys, ``o_i = sum_j p_ij v_j``.

    Args:
        q, k, v: ``[B, H, N, D]`` (v may have its own last dim); k, v may have ``H_kv`` heads, ``H % H_kv == 0``
            (grouped-query attention: query head h attends with key/value head ``h // (H / H_kv)``).
        distance: ``uint8 [B, N, N]`` from :func:`syntaxkernels.tree_distance`; or R relations ``uint8 [B, R, N, N]``,
            each adding its own ``c_r * table_r[bucket_r(d_r)]`` (no ``window``; the specification of the fused ops'
            :class:`~syntaxkernels.RelationBatch`, computed here relation by relation).
        table: ``[T]`` shared by all heads or ``[H, T]`` per head, ``T = buckets.num_buckets``; with R relations
            ``[R, T]`` / ``[R, H, T]`` or a sequence of R tables ``[T_r]`` / ``[H, T_r]``.
        buckets: the :class:`BucketSpec` mapping distances to table entries (R relations: one for all, or a sequence
            of R).
        scale: score scale, default ``1/sqrt(D)``.
        bias_scale: the strength c (float or one-element tensor), default 1; R relations: a tensor of R elements too.
        lengths: ``int [B]`` or boolean key-padding mask ``[B, N]``: keys at j >= length get no weight and
            query rows at i >= length output 0.
        window: allow only pairs with ``d_ij <= window``.
        causal: allow only ``j <= i``.
        position_window: allow only ``|i - j| <= position_window`` (a sliding window over positions).
        position_buckets, position_table: T5's relative-position term, both or neither: a
            :class:`RelativePositionSpec` and a table ``[H, P]``; adds ``position_table[h, pbucket(j - i)]`` to every
            score (not scaled by c; T5 divides no score by sqrt(d): pass ``scale=1.0``).
        dropout_p, dropout_seed: attention dropout on the probabilities (:func:`dropout_keep`'s mask for the
            seed); ``dropout_item``: batch item 0's index in the mask's numbering (a packed batch's sequence).
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; rows with no allowed key are 0.
    """
    relations = (_relation_terms(distance, table, buckets, bias_scale, window)
                 if isinstance(distance, torch.Tensor) and distance.dim() == 4 else None)
    if relations is not None:
        for d, t, spec, c in relations:
            V.check_bias_attention_inputs(q, k, v, d, t, spec, c, window, causal, deterministic)
        distance = relations[0][0]
    else:
        V.check_bias_attention_inputs(q, k, v, distance, table, buckets, bias_scale, window, causal, deterministic)
    V.check_dropout(dropout_p, dropout_seed)
    V.check_position_window(position_window)
    V.check_position_bias(position_buckets, position_table, q)
    lengths = V.normalize_lengths(lengths, q)
    k, v = expand_kv_heads(q, k, v)
    q, k, v = _without_padding(lengths, q, k, v)
    acc = _acc_dtype(q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)).to(acc) * scale
    if relations is not None:  # several relations: each its own table and strength, summed
        for d, t, spec, c in relations:
            scores = scores + gather_bias(d, t, spec, c, acc)
    else:
        scores = scores + gather_bias(distance, table, buckets, bias_scale, acc)
    if position_buckets is not None:
        scores = scores + position_buckets.bias(position_table, q.shape[2], acc)[None]
    allowed = allowed_pairs(distance, lengths, window, causal, position_window)[:, None]
    return masked_attention(scores, allowed, v, dropout_p=dropout_p, dropout_seed=dropout_seed,
                            dropout_item=dropout_item)


def _mask_pairs(distance: torch.Tensor, depth: torch.Tensor, segment: torch.Tensor,
                valid: Optional[torch.Tensor] = None, pairwise_self: bool = False):
    """``pairs(kind, d)`` -> bool ``[B, N, N]``: ``[b, i, j]`` is True when key j is in query i's mask
    ``<kind>_<d>`` (``d`` 0 for pairwise and full; docs/semantics.md, "Syntax-BERT masks"). The definition of
    each mask kind, for :func:`syntax_masks` and the PyTorch list builder
    (:func:`syntaxkernels.trees.batch.python_edge_lists`).

    From the tree tensors: i is an ancestor of j iff they are in the same tree and ``depth[j] - depth[i] ==
    d(i, j)``. ``valid`` (bool ``[B, N]``, default ``segment >= 0``): the tokens that take part. ``pairwise_self``:
    ``pairwise`` also holds each valid token itself (the release's pairwise mask, a batch built by
    :func:`syntaxkernels.trees.syntax_bert_batch` with ``variant="release"``).
    """
    dist = distance.to(torch.int32)
    depth = depth.to(torch.int32)
    segment = segment.to(torch.int32)
    if valid is None:
        valid = segment >= 0
    pair_valid = valid[:, :, None] & valid[:, None, :]
    same_tree = pair_valid & (segment[:, :, None] == segment[:, None, :])
    depth_gap = depth[:, None, :] - depth[:, :, None]  # depth[j] - depth[i]
    ancestor = same_tree & (depth_gap == dist)  # i is an ancestor of j (or i == j)
    descendant = same_tree & (-depth_gap == dist)  # i is a descendant of j (or i == j)

    def pairs(kind: str, d: int) -> torch.Tensor:
        if kind == "parent":
            return ancestor & (dist == d)
        if kind == "child":
            return descendant & (dist == d)
        if kind == "sibling":
            return same_tree & ~ancestor & ~descendant & (dist == d)
        if kind == "pairwise":
            if pairwise_self:
                eye = torch.eye(dist.shape[-1], dtype=torch.bool, device=dist.device)[None]
                return pair_valid & (~same_tree | eye)
            return pair_valid & ~same_tree
        if kind == "full":
            return pair_valid
        raise ValueError(f"unknown mask kind {kind!r}")

    return pairs


def syntax_masks(trees, masks: MaskSpec) -> torch.Tensor:
    """bool ``[B, M, N, N]``: ``[b, m, i, j]`` is True when key j is in query i's mask m (docs/semantics.md,
    "Syntax-BERT masks").

    Derived from ``trees.distance``, ``trees.depth`` and ``trees.segment``: i is an ancestor of j iff they
    are in the same tree and ``depth[j] - depth[i] == d(i, j)``. A leak-free batch (``leak_free=True``) raises
    ``ValueError``: its depth and segment are the whole tree's.
    """
    if getattr(trees, "leak_free", False):
        raise ValueError("syntax_masks: a leak-free TreeBatch (leak_free=True) has no leak-free depth and segment "
                         "(they are the whole tree's); the Syntax-BERT masks need a batch built without leak_free")
    V.check_masks(masks)
    pairs = _mask_pairs(trees.distance, trees.depth, trees.segment,
                        pairwise_self=getattr(trees, "pairwise_self", False))
    return torch.stack([pairs(kind, d) for kind, d in masks.kinds()], dim=1)


def syntax_subnetwork_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, masks: MaskSpec, *,
                                scale: Optional[float] = None, backend: str = "reference", dropout_p: float = 0.0,
                                dropout_seed: Optional[int] = None,
                                dropout_item: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Syntax-BERT sub-networks: M masked attentions sharing q, k, v.

    Args:
        q, k, v: ``[B, H, N, D]``.
        trees: a :class:`syntaxkernels.TreeBatch` on q's device (distance, depth, segment).
        masks: the :class:`MaskSpec`; M = ``masks.num_masks``.
        scale: default ``1/sqrt(D)``.
        dropout_p, dropout_seed: attention dropout on each sub-network's probabilities: sub-network m (its index
            in ``masks.names``) drops with :func:`dropout_keep`'s mask of seed ``stream_seed(dropout_seed, m)``;
            ``dropout_item``: batch item 0's index in the masks' numbering (a packed batch's sequence).
    Returns:
        ``out [B, M, H, N, D]`` (zero where a token's mask is empty) and ``nonempty bool [B, M, N]``.
    """
    V.check_subnetwork_inputs(q, k, v, trees, masks)
    V.check_dropout(dropout_p, dropout_seed)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    allowed = syntax_masks(trees, masks)
    scores = (q @ k.transpose(-1, -2)).to(_acc_dtype(q.dtype)) * scale
    out = torch.stack([masked_attention(scores, allowed[:, m, None], v, dropout_p=dropout_p,
                                        dropout_seed=None if dropout_p == 0.0 else stream_seed(dropout_seed, m),
                                        dropout_item=dropout_item)
                       for m in range(masks.num_masks)], dim=1)
    return out, allowed.any(dim=-1)


def check_topical_inputs(outputs: torch.Tensor, nonempty: torch.Tensor, query: torch.Tensor, key_weight: torch.Tensor,
                         value_weight: torch.Tensor) -> None:
    """The argument checks of :func:`topical_attention` (shared with :class:`syntaxkernels.nn.TopicalAttention`).

    ``TypeError`` for an argument that is not a tensor; ``ValueError`` for a shape that does not match
    ``outputs [B, M, H, N, D]`` or a ``nonempty`` that is not bool.
    """
    for name, t in (("outputs", outputs), ("nonempty", nonempty), ("query", query), ("key_weight", key_weight),
                    ("value_weight", value_weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if outputs.dim() != 5:
        raise ValueError(f"outputs must have shape [B, M, H, N, D], got {tuple(outputs.shape)}")
    B, M, H, N, D = outputs.shape
    if nonempty.dtype != torch.bool or tuple(nonempty.shape) != (B, M, N):
        raise ValueError(f"nonempty must be bool [B, M, N] = [{B}, {M}, {N}], got {nonempty.dtype} "
                         f"{tuple(nonempty.shape)}")
    if tuple(query.shape) != (H, D):
        raise ValueError(f"query must have shape [H, D] = [{H}, {D}], got {tuple(query.shape)}")
    for name, w in (("key_weight", key_weight), ("value_weight", value_weight)):
        if tuple(w.shape) != (H, D, D):
            raise ValueError(f"{name} must have shape [H, D, D] = [{H}, {D}, {D}], got {tuple(w.shape)}")


def topical_attention(outputs: torch.Tensor, nonempty: torch.Tensor, query: torch.Tensor, key_weight: torch.Tensor,
                      value_weight: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """Syntax-BERT topical attention: mix the M sub-network outputs of every token, per head.

    For head h and token i with sub-network outputs ``H_m`` (row vectors of width D):
    ``k_m = H_m Wk_h``, ``v_m = H_m Wv_h``, ``w = softmax_m(q_h . k_m * scale)`` over the non-empty m only,
    output ``sum_m w_m v_m``. A token whose M masks are all empty outputs 0 (zero gradients, never NaN).
    With ``query = 0`` and ``value_weight = I`` it is the average of the non-empty sub-networks.

    Written for reading: it forms every key and value (``[B, H, N, M, D]`` each).
    :class:`syntaxkernels.nn.TopicalAttention` computes the same function without them.

    Args:
        outputs: ``[B, M, H, N, D]`` from :func:`syntax_subnetwork_attention`.
        nonempty: ``bool [B, M, N]``: mask m of token n has at least one key.
        query: ``[H, D]`` the learnable task query q_h.
        key_weight: ``[H, D, D]`` Wk (``k = H_m @ key_weight[h]``).
        value_weight: ``[H, D, D]`` Wv.
        scale: default ``1/sqrt(D)``.
    Returns:
        ``[B, H, N, D]`` in outputs' dtype.
    Raises:
        ``TypeError``/``ValueError`` as :func:`check_topical_inputs`.
    """
    check_topical_inputs(outputs, nonempty, query, key_weight, value_weight)
    B, M, H, N, D = outputs.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    acc = _acc_dtype(outputs.dtype)
    keys = torch.einsum("bmhnd,hde->bhnme", outputs, key_weight.to(outputs.dtype))
    values = torch.einsum("bmhnd,hde->bhnme", outputs, value_weight.to(outputs.dtype))
    # One "query row" per (b, h, n) attending over its M sub-network keys: [B, H, N, 1, M].
    scores = torch.einsum("bhnme,he->bhnm", keys.to(acc), query.to(acc))[..., None, :] * scale
    allowed = nonempty.permute(0, 2, 1)[:, None, :, None, :]
    return masked_attention(scores, allowed, values)[..., 0, :]


def gat_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor, *, window: int,
                  lengths=None, scale: Optional[float] = None) -> torch.Tensor:
    """Windowed attention of the syntax GAT: query i attends key j only when ``d(i, j) <= window``.

    Plain softmax attention restricted to the tree window (unreachable pairs never; padding never); the
    public op for it is :func:`syntax_bias_attention` with ``window=`` and a zero table.

    Args:
        q, k, v: ``[B, H, N, D]``.
        distance: ``uint8 [B, N, N]``.
        window: the delta of the paper (``0..254``); 0 lets a token see only itself.
        lengths: ``int [B]`` or a boolean key-padding mask ``[B, N]``.
        scale: default ``1/sqrt(D)``.
    Returns:
        ``[B, H, N, Dv]``; padding rows are 0.
    """
    V.check_qkv(q, k, v)
    V.check_distance(distance, q)
    if window is None:
        raise ValueError(f"window must be an int in 0..{MAX_PATH} for gat_attention, got None")
    V.check_window(window)
    lengths = V.normalize_lengths(lengths, q)
    q, k, v = _without_padding(lengths, q, k, v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)).to(_acc_dtype(q.dtype)) * scale
    return masked_attention(scores, allowed_pairs(distance, lengths, window)[:, None], v)


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[B, N, H*D] -> [B, H, N, D]``."""
    B, N, E = x.shape
    return x.view(B, N, num_heads, E // num_heads).transpose(1, 2)


def gat_layer(x: torch.Tensor, distance: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
              v_weight: torch.Tensor, *, num_heads: int, window: int, lengths=None,
              scale: Optional[float] = None) -> torch.Tensor:
    """One syntax-GAT layer: k heads of windowed attention, heads concatenated, no FFN, no residual.

    ``Q = x Wq^T``, ``K = x Wk^T``, ``V = x Wv^T`` split into ``num_heads`` heads of width d_g, then
    :func:`gat_attention` per head and the heads concatenated.

    Args:
        x: ``[B, N, E_in]``.
        distance: ``uint8 [B, N, N]``.
        q_weight, k_weight, v_weight: ``[k*d_g, E_in]`` (``torch.nn.Linear`` layout, no bias).
        num_heads: k.
        window: delta.
        lengths: ``int [B]`` or boolean key-padding mask.
    Returns:
        ``G [B, N, k*d_g]``; padding rows are 0.
    """
    out_dim = q_weight.shape[0]
    if out_dim % num_heads:
        raise ValueError(f"q_weight has {out_dim} output features, not a multiple of num_heads = {num_heads}")
    q = _split_heads(torch.nn.functional.linear(x, q_weight), num_heads)
    k = _split_heads(torch.nn.functional.linear(x, k_weight), num_heads)
    v = _split_heads(torch.nn.functional.linear(x, v_weight), num_heads)
    out = gat_attention(q, k, v, distance, window=window, lengths=lengths, scale=scale)
    B, H, N, D = out.shape
    return out.transpose(1, 2).reshape(B, N, H * D)


def inject_syntax_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, weights, *,
                        heads: int, targets=("q", "k"), biases=None):
    """Add the GAT output to the first ``heads`` attention heads ("syntax heads").

    For every target t in ``targets`` (in order, one weight each): ``t[:, :heads] += split_heads(g W_t^T)``.
    The paper adds to the queries and keys (``targets=("q", "k")``); the authors' release adds to the keys
    and values (``("k", "v")``).

    Args:
        q, k, v: ``[B, H, N, D]`` (v may have its own last dim Dv).
        g: ``G [B, N, E_g]`` from the syntax GAT.
        weights: one tensor per target, ``[heads*D, E_g]`` (``[heads*Dv, E_g]`` for "v"), ``torch.nn.Linear``
            layout.
        heads: n, the number of syntax heads (``0 <= n <= H``).
        targets: a sequence of distinct names among "q", "k", "v".
        biases: None, or one tensor (``[heads*D]``) or None per target: ``t += split_heads(g W_t^T + b_t)`` (the
            syntax heads of the paper and release variants have a bias).
    Returns:
        ``(q, k, v)`` with the syntax heads updated (new tensors; untouched inputs are returned as is).
    """
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    if len(set(targets)) != len(targets) or not set(targets) <= {"q", "k", "v"}:
        raise ValueError(f"targets must be distinct names among 'q', 'k', 'v', got {targets!r}")
    weights = tuple(weights) if not isinstance(weights, torch.Tensor) else (weights,)
    if len(weights) != len(targets):
        raise ValueError(f"weights must give one tensor per target ({len(targets)}), got {len(weights)}")
    biases = (None,) * len(targets) if biases is None else tuple(biases)
    if len(biases) != len(targets):
        raise ValueError(f"biases must give one tensor (or None) per target ({len(targets)}), got {len(biases)}")
    H = q.shape[1]
    if isinstance(heads, bool) or not isinstance(heads, int) or not 0 <= heads <= H:
        raise ValueError(f"heads must be an int in 0..{H}, got {heads!r}")
    B, N = g.shape[:2]
    if g.dim() != 3 or B != q.shape[0] or N != q.shape[2]:
        raise ValueError(f"g must have shape [B, N, E_g] with B = {q.shape[0]}, N = {q.shape[2]}, got "
                         f"{tuple(g.shape)}")
    out = {"q": q, "k": k, "v": v}
    for name, weight, bias in zip(targets, weights, biases):
        t = out[name]
        D = t.shape[-1]
        if tuple(weight.shape) != (heads * D, g.shape[-1]):
            raise ValueError(f"the weight for {name!r} must have shape [heads*D, E_g] = [{heads * D}, "
                             f"{g.shape[-1]}], got {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (heads * D,):
            raise ValueError(f"the bias for {name!r} must have shape [heads*D] = [{heads * D}], got "
                             f"{tuple(bias.shape)}")
        if heads == 0:
            continue
        added = _split_heads(torch.nn.functional.linear(g.to(t.dtype), weight.to(t.dtype),
                                                        None if bias is None else bias.to(t.dtype)), heads)
        out[name] = torch.cat([t[:, :heads] + added, t[:, heads:]], dim=1)
    return out["q"], out["k"], out["v"]


def structural_probe_loss(g: torch.Tensor, proj: torch.Tensor, distance: torch.Tensor, depth: torch.Tensor,
                          lengths=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Structural-probe losses of the syntax GAT output (distance term and depth term).

    With ``p_i = g_i B`` (``B = proj``):

    - distance loss: ``mean |d(i, j)^2 - ||p_i - p_j||^2|`` over pairs with ``i != j``, both tokens valid and
      a finite distance (same tree; 255 = unreachable pairs are left out);
    - depth loss: ``mean |depth_i^2 - ||p_i||^2|`` over valid tokens.

    Both means run over the whole batch (every pair, or every token, weighs the same). The squared norms come
    from the Gram matrix, ``||p_i - p_j||^2 = ||p_i||^2 + ||p_j||^2 - 2 <p_i, p_j>``, so no
    ``[B, N, N, rank]`` tensor exists. A batch with no valid pair gives a zero distance loss (with gradients).

    Args:
        g: ``[B, N, E]``.
        proj: ``[E, rank]``.
        distance: ``uint8 [B, N, N]``.
        depth: ``int [B, N]`` (root = 0; negative for padding).
        lengths: ``int [B]`` or boolean key-padding mask ``[B, N]``; default: tokens with ``depth >= 0``.
    Returns:
        ``(distance_loss, depth_loss)``, scalar tensors in the accumulation dtype (float32, or float64).
    """
    if g.dim() != 3:
        raise ValueError(f"g must have shape [B, N, E], got {tuple(g.shape)}")
    B, N, E = g.shape
    if proj.dim() != 2 or proj.shape[0] != E:
        raise ValueError(f"proj must have shape [E, rank] with E = {E}, got {tuple(proj.shape)}")
    if distance.dtype != torch.uint8 or tuple(distance.shape) != (B, N, N):
        raise ValueError(f"distance must be uint8 [B, N, N] = [{B}, {N}, {N}], got {distance.dtype} "
                         f"{tuple(distance.shape)}")
    if tuple(depth.shape) != (B, N):
        raise ValueError(f"depth must have shape [B, N] = [{B}, {N}], got {tuple(depth.shape)}")
    acc = _acc_dtype(g.dtype)
    if lengths is None:
        valid = depth >= 0
    else:
        counts = V.normalize_lengths(lengths, g.new_empty(B, 1, N, 1))  # reads B, N and the device
        valid = torch.arange(N, device=g.device)[None, :] < counts[:, None]
    p = (g @ proj.to(g.dtype)).to(acc)
    norms = (p * p).sum(dim=-1)  # [B, N]
    gram = p @ p.transpose(-1, -2)  # [B, N, N]
    squared = norms[:, :, None] + norms[:, None, :] - 2 * gram
    eye = torch.eye(N, dtype=torch.bool, device=g.device)[None]
    pairs = valid[:, :, None] & valid[:, None, :] & ~eye & (distance != UNREACHABLE)
    target = distance.to(acc) ** 2
    pair_err = (target - squared).abs() * pairs
    distance_loss = pair_err.sum() / pairs.sum().clamp(min=1)
    depth_err = (depth.to(acc) ** 2 - norms).abs() * valid
    depth_loss = depth_err.sum() / valid.sum().clamp(min=1)
    return distance_loss, depth_loss


def leak_free_distance(heads) -> torch.Tensor:
    """The leak-free tree distance of one sequence, by brute force: the specification of
    ``TreeBatch.from_heads(..., leak_free=True)`` (docs/semantics.md, "Leak-free distances for causal models").

    Args:
        heads: the sequence's n 0-based heads (-1 for a root; a forest), a list or a 1-D integer tensor. Assumed
            valid (no range, self-loop or cycle checks: the builders do those).
    Returns:
        uint8 ``[n, n]``: ``[i, j]`` for ``j <= i`` is the number of edges on the path between i and j in the
        forest induced on tokens ``0..i`` (the edges child -- head with both ends ``<= i``), saturating at
        ``MAX_PATH``, and ``UNREACHABLE`` when no such path exists; ``UNREACHABLE`` for ``j > i``. Not symmetric.

    One breadth-first search per row over that row's induced forest, in plain Python.
    """
    heads = [int(h) for h in (heads.tolist() if isinstance(heads, torch.Tensor) else heads)]
    n = len(heads)
    out = torch.full((n, n), UNREACHABLE, dtype=torch.uint8)
    for i in range(n):
        neighbours = [[] for _ in range(i + 1)]
        for child in range(i + 1):
            head = heads[child]
            if 0 <= head <= i:
                neighbours[child].append(head)
                neighbours[head].append(child)
        hops = {i: 0}
        frontier = [i]
        while frontier:
            following = []
            for v in frontier:
                for u in neighbours[v]:
                    if u not in hops:
                        hops[u] = hops[v] + 1
                        following.append(u)
            frontier = following
        for j, d in hops.items():
            out[i, j] = min(d, MAX_PATH)
    return out
