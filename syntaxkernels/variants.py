"""The methods as their papers wrote them and as their authors ran them: the ``variant`` knob (docs/semantics.md,
"Paper, release and package").

Every part of Syntax-BERT (sub-networks, topical attention, the mask builder) and of syntax-augmented mBERT (the
GAT, its POS ids, the syntax heads, the structural probe, the token tree of wordpieces and sentence pairs) takes
``variant=``:

- ``"paper"`` (the default): what the paper's text states; where it is silent, what the authors' release computes;
- ``"release"``: what the authors' released code computes (dropout follows the module's training mode);
- ``"package"``: this package's own form before the variants existed (separate q/k/v projections in the GAT, zero
  outputs for empty mask rows left out of a per-head topical softmax, zero-initialised syntax heads without a bias,
  one pooled probe). Kept, documented, never a silent default.

This module holds the names and the variant-specific computations the modules of :mod:`syntaxkernels.nn` share
(plain PyTorch: none of them has a fused kernel of its own; the paper's GAT and the sub-networks run on the
existing ops).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .reference import masked_softmax
from .specs import UNREACHABLE

__all__ = [
    "VARIANTS",
    "DEFAULT_VARIANT",
    "check_variant",
    "RELEASE_POS_TAGS",
    "POS_PAD",
    "POS_CLS",
    "POS_SEP",
    "POS_UNK",
    "additive_gat_attention",
    "probe_losses",
    "fill_empty_rows",
    "sum_mix",
]

VARIANTS = ("paper", "release", "package")
DEFAULT_VARIANT = "paper"

#: The POS vocabulary of the release (``processors/constants.py``, ``UPOS_MAP``): 0 padding, 1..17 the UPOS tags
#: in UD order, 18 ``[CLS]``, 19 ``[SEP]``, 20 ``[UNK]`` (21 ids; ``pos_tag_vocab_size = len(POS_SYMBOLS) + 4``).
RELEASE_POS_TAGS = 21
POS_PAD, POS_CLS, POS_SEP, POS_UNK = 0, 18, 19, 20


def check_variant(variant, allowed: Tuple[str, ...] = VARIANTS, what: str = "variant") -> str:
    """``variant`` itself when it is one of ``allowed``; ``TypeError`` for a non-string, ``ValueError`` otherwise."""
    if not isinstance(variant, str):
        raise TypeError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {type(variant).__name__}")
    if variant not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {variant!r}")
    return variant


def additive_gat_attention(x: torch.Tensor, weight: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor,
                           allowed: torch.Tensor, *, negative_slope: float = 0.2, dropout: float = 0.0,
                           training: bool = False) -> torch.Tensor:
    """One layer of the release's GAT (``graph_utils.py``, ``GraphAttentionHead.forward``), every head at once.

    Per head h: ``Wh = x W_h``, ``e_ij = LeakyReLU(a1_h . Wh_i + a2_h . Wh_j)``, softmax over the allowed j (the
    release writes ``-9e15`` elsewhere: the same weights for a row with an allowed key), dropout on the weights,
    ``out_i = sum_j p_ij Wh_j``; heads concatenated (``GraphAttentionNetwork``, ``concat=False``: no ELU). The
    release's dropout on the concatenated output is the caller's.

    Args:
        x: ``[B, N, E_in]``.
        weight: ``[k, E_in, d]`` (one ``W`` per head; it makes the scores and the values).
        att_src, att_dst: ``[k, d]`` (``a1``, ``a2``).
        allowed: bool ``[B, N, N]`` (within the window, both tokens valid). A row with no allowed key outputs 0
            (the release's padding rows average every key; nothing valid reads them).
    Returns:
        ``[B, N, k * d]``. Dense: ``[B, k, N, N]`` scores, as in the release (its scores are no dot product, so the
        fused window kernels do not apply).
    """
    B, N, _ = x.shape
    k, _, d = weight.shape
    wh = torch.einsum("bne,hed->bhnd", x, weight.to(x.dtype))  # [B, k, N, d]
    f_src = torch.einsum("bhnd,hd->bhn", wh, att_src.to(x.dtype))
    f_dst = torch.einsum("bhnd,hd->bhn", wh, att_dst.to(x.dtype))
    scores = F.leaky_relu(f_src[..., :, None] + f_dst[..., None, :], negative_slope)
    weights = masked_softmax(scores, allowed[:, None])
    weights = F.dropout(weights, dropout, training) if dropout > 0.0 else weights
    out = weights.to(wh.dtype) @ wh  # [B, k, N, d]
    return out.transpose(1, 2).reshape(B, N, k * d)


def probe_losses(g: torch.Tensor, distance_proj: torch.Tensor, depth_proj: torch.Tensor, distance: torch.Tensor,
                 depth: torch.Tensor, lengths: torch.Tensor, *, squared: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The structural probe per sentence (paper section 2.4, Hewitt and Manning's probes as the release runs them).

    For each batch item s with n_s valid tokens (``n_s > 0``), ``p = g B1`` and ``r = g B2``:

    - ``distance_loss = mean_s (1 / n_s^2) sum_{i, j} |t(i, j) - ||p_i - p_j||^2|`` over the valid pairs of one tree
      (the diagonal adds 0), with ``t = d(i, j)^2`` (``squared=True``, the paper's equation) or ``d(i, j)`` (the
      release: ``L1DistanceLoss`` against the unsquared distance matrix);
    - ``depth_loss = mean_s (1 / n_s) sum_i |depth_i - ||r_i||^2|`` (``L1DepthLoss`` of ``OneWordPSDProbe``).

    Squared norms come from Gram matrices (no ``[B, N, N, rank]`` tensor). Items without a valid token are left out
    of both means (a batch of them gives zero losses with gradients). Accumulates in float32 (float64 inputs:
    float64).
    """
    B, N, _ = g.shape
    acc = torch.float64 if g.dtype == torch.float64 else torch.float32
    valid = torch.arange(N, device=g.device)[None, :] < lengths.to(g.device)[:, None]
    p = (g @ distance_proj.to(g.dtype)).to(acc)
    norms = (p * p).sum(-1)
    squared_dist = norms[:, :, None] + norms[:, None, :] - 2 * (p @ p.transpose(-1, -2))
    eye = torch.eye(N, dtype=torch.bool, device=g.device)[None]  # d(i, i) = 0 = ||p_i - p_i||^2 exactly
    pairs = valid[:, :, None] & valid[:, None, :] & ~eye & (distance != UNREACHABLE)
    target = distance.to(acc)
    if squared:
        target = target * target
    n = lengths.to(device=g.device, dtype=acc)
    items = n > 0
    count = items.sum().clamp(min=1)
    per_item = ((target - squared_dist).abs() * pairs).sum(dim=(1, 2)) / (n * n).clamp(min=1)
    distance_loss = (per_item * items).sum() / count
    r = (g @ depth_proj.to(g.dtype)).to(acc)
    depth_err = (depth.to(acc) - (r * r).sum(-1)).abs() * valid
    depth_loss = (depth_err.sum(-1) / n.clamp(min=1) * items).sum() / count
    return distance_loss, depth_loss


def fill_empty_rows(outputs: torch.Tensor, nonempty: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """``outputs [B, M, H, N, D]`` with every empty (token, mask) row replaced by ``plain [B, H, N, D]``: the
    release's additive ``-10000`` mask turns a row with no key into plain attention over every key."""
    return torch.where(nonempty[:, :, None, :, None], outputs, plain[:, None].to(outputs.dtype))


def sum_mix(outputs: torch.Tensor) -> torch.Tensor:
    """The release's mix of the M sub-networks (``modeling_syntaxbert.py``, ``SyntaxBertSelfAttention.forward``,
    ``use_task_aggregation = False``): ``sum_m H_m / sqrt(M)``; ``outputs [B, M, H, N, D] -> [B, H, N, D]``."""
    M = outputs.shape[1]
    return outputs.sum(dim=1) / math.sqrt(M) if M else outputs.sum(dim=1)


def default_targets(variant: str) -> Tuple[str, ...]:
    """The syntax heads' targets of a variant: the paper adds G to the queries and keys (section 2.3), the release to
    the keys and values (``modeling_bert.py``, ``BertSelfAttention.forward``: ``addi_key``, ``addi_value``)."""
    return ("k", "v") if variant == "release" else ("q", "k")


def default_pos_tags(variant: str) -> int:
    """The POS vocabulary of a variant: 21 ids for the paper and the release (:data:`RELEASE_POS_TAGS`), 18 for the
    package (0 unknown / special / padding, 1..17 UPOS)."""
    return 18 if variant == "package" else RELEASE_POS_TAGS


def dropout_or_none(p: Optional[float]) -> float:
    if p is None:
        return 0.0
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {p!r}")
    return float(p)
