"""Drop-in ``nn.Module``s for syntax-tree-aware attention (DESIGN.md §2-3).

The modules hold parameters and call the public ops (:func:`syntaxkernels.syntax_bias_attention`,
:func:`syntaxkernels.syntax_subnetwork_attention`) with their ``backend`` passed through: "auto" runs the
fused Triton kernels on CUDA tensors and the pure-PyTorch reference elsewhere, "reference" always runs the
reference.

- :class:`SyntaxBiasedSelfAttention`: multi-head self-attention plus a learnable tree-distance bias
  (zero-initialised: a fresh layer is plain attention).
- :class:`SyntaxBertSelfAttention` with :class:`TopicalAttention`: Syntax-BERT sub-networks sharing Q, K, V,
  mixed per token (a fresh layer averages the non-empty sub-networks).
- :class:`SyntaxGAT`, :class:`SyntaxHeadSelfAttention`, :class:`StructuralProbeLoss`: syntax-augmented
  mBERT (a windowed graph-attention network, its output added to the first heads' Q/K, and the probe loss).
- :class:`SyntaxTransformerEncoderLayer`: mirrors ``torch.nn.TransformerEncoderLayer`` with any of the three.

Shapes: B batch, N tokens, E model width, H heads, D = E / H head width.

Dropout: the fused ops have no attention-weight dropout, so every attention module here applies its
``dropout`` to the attention output (per head, before ``out_proj``), whichever backend runs. This differs
from ``nn.MultiheadAttention``, which drops attention weights; with ``dropout=0`` (or in eval mode) they agree.

Padding: a token at position ``>= lengths[b]`` never receives attention weight; its own attention output is
zero before ``out_proj`` (so after it, it is ``out_proj.bias``). Mask padded positions in your loss.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import _validation as V
from . import ops, reference
from .specs import BucketSpec, MaskSpec
from .trees.batch import TreeBatch

__all__ = [
    "SyntaxBiasedSelfAttention",
    "TopicalAttention",
    "SyntaxBertSelfAttention",
    "SyntaxGAT",
    "SyntaxHeadSelfAttention",
    "StructuralProbeLoss",
    "SyntaxTransformerEncoderLayer",
]

TreesLike = Union[TreeBatch, torch.Tensor]


def _distance_and_lengths(trees: TreesLike, lengths):
    """``(distance uint8 [B, N, N], lengths)`` from a TreeBatch or a distance tensor.

    A TreeBatch supplies its own lengths unless ``lengths`` (int ``[B]`` or boolean key-padding mask) is given.
    """
    if isinstance(trees, TreeBatch):
        return trees.distance, trees.lengths if lengths is None else lengths
    if isinstance(trees, torch.Tensor) and trees.dtype == torch.uint8 and trees.dim() == 3:
        return trees, lengths
    raise TypeError("trees must be a TreeBatch (sk.TreeBatch.from_heads) or a uint8 distance tensor [B, N, N], "
                    f"got {type(trees).__name__}")


def _check_input(x: torch.Tensor, embed_dim: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != embed_dim:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape [B, N, E] with E = {embed_dim}, got {shape}")


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[B, N, H*D] -> [B, H, N, D]``."""
    B, N, E = x.shape
    return x.view(B, N, num_heads, E // num_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, D] -> [B, N, H*D]``."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)


def init_distance_bias(module: nn.Module, num_heads: int, buckets: BucketSpec, per_head: bool,
                       learnable_scale: bool) -> None:
    """Give ``module`` the bias parameters DESIGN.md fixes: ``distance_bias`` ``[T]`` (or ``[H, T]`` per head),
    zero-initialised, and ``bias_scale`` ``[1]`` initialised to 1 (None when the scale is not learnable)."""
    shape = (num_heads, buckets.num_buckets) if per_head else (buckets.num_buckets,)
    module.distance_bias = nn.Parameter(torch.zeros(shape))
    if learnable_scale:
        module.bias_scale = nn.Parameter(torch.ones(1))
    else:
        module.register_parameter("bias_scale", None)


def _check_heads(embed_dim: int, num_heads: int) -> int:
    if num_heads <= 0 or embed_dim % num_heads:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
    return embed_dim // num_heads


class SyntaxBiasedSelfAttention(nn.Module):
    """Multi-head self-attention with a learnable tree-distance bias (method 1).

    ``s_ij = q_i . k_j / sqrt(D) + c * table[bucket(d_ij)]``; ``table`` is ``distance_bias`` (zero init) and
    ``c`` is ``bias_scale`` (init 1), so a fresh layer computes plain multi-head attention.

    Args:
        embed_dim: E.
        num_heads: H (E must be divisible by H).
        buckets: the :class:`BucketSpec` (table length T = ``buckets.num_buckets``).
        per_head: one table per head (``distance_bias [H, T]``) instead of one shared ``[T]``.
        learnable_scale: learn the strength c; when False ``bias_scale`` is None (c = 1).
        dropout: applied to the attention output before ``out_proj`` (see the module docstring).
        bias: biases in the four projections.
        backend: "auto", "triton" or "reference".

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear(E, E)``).
    """

    def __init__(self, embed_dim: int, num_heads: int, buckets: BucketSpec = BucketSpec(), per_head: bool = False,
                 learnable_scale: bool = True, dropout: float = 0.0, bias: bool = True, backend: str = "auto"):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = _check_heads(embed_dim, num_heads)
        if not isinstance(buckets, BucketSpec):
            raise TypeError(f"buckets must be a BucketSpec, got {type(buckets).__name__}")
        self.buckets = buckets
        self.per_head = per_head
        self.backend = backend
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        init_distance_bias(self, num_heads, buckets, per_head, learnable_scale)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, trees: TreesLike, lengths=None, causal: bool = False,
                window: Optional[int] = None) -> torch.Tensor:
        """
        Args:
            x: ``[B, N, E]``.
            trees: a :class:`TreeBatch` or ``uint8 distance [B, N, N]``.
            lengths: ``int [B]`` or boolean key-padding mask ``[B, N]`` (True = padding); defaults to
                ``trees.lengths`` for a TreeBatch, else no padding.
            causal: allow only keys ``j <= i``.
            window: allow only pairs with ``d_ij <= window``.
        Returns:
            ``[B, N, E]``.
        """
        _check_input(x, self.embed_dim)
        distance, lengths = _distance_and_lengths(trees, lengths)
        q = _split_heads(self.q_proj(x), self.num_heads)
        k = _split_heads(self.k_proj(x), self.num_heads)
        v = _split_heads(self.v_proj(x), self.num_heads)
        out = ops.syntax_bias_attention(q, k, v, distance, self.distance_bias, buckets=self.buckets,
                                        bias_scale=self.bias_scale, lengths=lengths, window=window, causal=causal,
                                        backend=self.backend)
        return self.out_proj(self.dropout(_merge_heads(out)))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, buckets={self.buckets}, "
                f"per_head={self.per_head}, backend={self.backend!r}")


class TopicalAttention(nn.Module):
    """Syntax-BERT topical attention: per head, a learnable task query mixes a token's M sub-network outputs.

    ``w = softmax_m(q_h . (H_m Wk_h) / sqrt(D))`` over the non-empty m, output ``sum_m w_m H_m Wv_h``
    (:func:`syntaxkernels.reference.topical_attention`). Parameters ``query [H, D]`` (zero init),
    ``key_weight [H, D, D]`` and ``value_weight [H, D, D]`` (identity init): a fresh module averages the
    non-empty sub-networks.
    """

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.query = nn.Parameter(torch.zeros(num_heads, head_dim))
        eye = torch.eye(head_dim).expand(num_heads, head_dim, head_dim)
        self.key_weight = nn.Parameter(eye.clone())
        self.value_weight = nn.Parameter(eye.clone())

    def forward(self, outputs: torch.Tensor, nonempty: torch.Tensor) -> torch.Tensor:
        """``outputs [B, M, H, N, D]``, ``nonempty bool [B, M, N]`` -> ``[B, H, N, D]`` (0 where all empty)."""
        return reference.topical_attention(outputs, nonempty, self.query, self.key_weight, self.value_weight)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"


class SyntaxBertSelfAttention(nn.Module):
    """Syntax-BERT self-attention (method 2): M masked sub-networks sharing Q, K, V, mixed by topical attention.

    A fresh layer outputs, per token, the average over its non-empty masks of the masked attention outputs;
    with ``MaskSpec`` enabling only ``full`` it is exactly plain multi-head attention.

    Args:
        embed_dim: E.
        num_heads: H.
        masks: the :class:`MaskSpec` (M = ``masks.num_masks`` sub-networks).
        dropout: applied to the mixed attention output before ``out_proj``.
        bias: biases in the four projections.
        backend: "auto", "triton" or "reference".

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear(E, E)``) and ``topical``
    (:class:`TopicalAttention`).
    """

    def __init__(self, embed_dim: int, num_heads: int, masks: MaskSpec = MaskSpec(), dropout: float = 0.0,
                 bias: bool = True, backend: str = "auto"):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = _check_heads(embed_dim, num_heads)
        if not isinstance(masks, MaskSpec):
            raise TypeError(f"masks must be a MaskSpec, got {type(masks).__name__}")
        self.masks = masks
        self.backend = backend
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.topical = TopicalAttention(num_heads, self.head_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, trees: TreeBatch) -> torch.Tensor:
        """
        Args:
            x: ``[B, N, E]``.
            trees: a :class:`TreeBatch` on x's device (its padding, ``segment == -1``, is the padding here).
        Returns:
            ``[B, N, E]``.
        """
        _check_input(x, self.embed_dim)
        if not isinstance(trees, TreeBatch):
            raise TypeError("trees must be a TreeBatch for the sub-network attention (the masks need depth and "
                            f"segment), got {type(trees).__name__}")
        q = _split_heads(self.q_proj(x), self.num_heads)
        k = _split_heads(self.k_proj(x), self.num_heads)
        v = _split_heads(self.v_proj(x), self.num_heads)
        outputs, nonempty = ops.syntax_subnetwork_attention(q, k, v, trees, self.masks, backend=self.backend)
        mixed = self.topical(outputs, nonempty)
        return self.out_proj(self.dropout(_merge_heads(mixed)))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, masks={self.masks.names}, "
                f"backend={self.backend!r}")


class _GATLayer(nn.Module):
    """One layer of :class:`SyntaxGAT`: projections only (the attention runs in SyntaxGAT.forward)."""

    def __init__(self, in_dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.q_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)


class SyntaxGAT(nn.Module):
    """The syntax graph-attention network of syntax-augmented mBERT (method 3).

    Input: token embeddings plus POS-tag embeddings. Then ``num_layers`` layers, each k = ``num_heads``
    heads of width d_g = ``head_dim`` attending only where ``d(i, j) <= window``, heads concatenated; no
    feed-forward block, no residual (:func:`syntaxkernels.reference.gat_layer`). The windowed attention runs
    through :func:`syntaxkernels.syntax_bias_attention` with a zero table and ``window=``.

    Args:
        embed_dim: width E of the token embeddings given to ``forward``.
        num_layers: L_G.
        num_heads: k.
        head_dim: d_g.
        window: delta.
        num_pos_tags: size of the POS vocabulary (18 = UPOS with an unknown tag); 0 for no POS embedding.
        backend: "auto", "triton" or "reference".

    Submodules ``pos_embedding`` (``nn.Embedding(num_pos_tags, E)``, N(0, 0.02) init) and ``layers``
    (each with ``q_proj``, ``k_proj``, ``v_proj``, no bias). Output width ``output_dim = k * d_g``.
    """

    def __init__(self, embed_dim: int, num_layers: int = 4, num_heads: int = 4, head_dim: int = 64, window: int = 4,
                 num_pos_tags: int = 18, backend: str = "auto"):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 254:
            raise ValueError(f"window must be an int in 0..254, got {window!r}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.window = window
        self.backend = backend
        self.output_dim = num_heads * head_dim
        if num_pos_tags > 0:
            self.pos_embedding = nn.Embedding(num_pos_tags, embed_dim)
            nn.init.normal_(self.pos_embedding.weight, std=0.02)
        else:
            self.register_module("pos_embedding", None)
        self.layers = nn.ModuleList(
            _GATLayer(embed_dim if layer == 0 else self.output_dim, num_heads, head_dim) for layer in range(num_layers)
        )
        self._buckets = BucketSpec(max_distance=1)
        self.register_buffer("_zero_table", torch.zeros(self._buckets.num_buckets), persistent=False)

    def forward(self, x: torch.Tensor, trees: TreesLike, pos: Optional[torch.Tensor] = None,
                lengths=None) -> torch.Tensor:
        """
        Args:
            x: token embeddings ``[B, N, E]``.
            trees: a :class:`TreeBatch` or ``uint8 distance [B, N, N]``.
            pos: ``int64 [B, N]`` POS-tag ids (padding: any valid id), or None.
            lengths: ``int [B]`` or boolean key-padding mask; defaults to ``trees.lengths``.
        Returns:
            ``G [B, N, num_heads * head_dim]``; padding rows are 0.
        """
        _check_input(x, self.embed_dim)
        distance, lengths = _distance_and_lengths(trees, lengths)
        if pos is not None:
            if self.pos_embedding is None:
                raise ValueError("pos was given but this SyntaxGAT has no POS embedding (num_pos_tags=0)")
            if pos.shape != x.shape[:2]:
                raise ValueError(f"pos must have shape [B, N] = {list(x.shape[:2])}, got {tuple(pos.shape)}")
            x = x + self.pos_embedding(pos)
        table = self._zero_table.to(x.dtype)
        for layer in self.layers:
            q = _split_heads(layer.q_proj(x), self.num_heads)
            k = _split_heads(layer.k_proj(x), self.num_heads)
            v = _split_heads(layer.v_proj(x), self.num_heads)
            out = ops.syntax_window_attention(q, k, v, trees if isinstance(trees, TreeBatch) else distance,
                                              window=self.window, lengths=lengths, backend=self.backend)
            x = _merge_heads(out)
        return x

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_layers={len(self.layers)}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, window={self.window}, backend={self.backend!r}")


class SyntaxHeadSelfAttention(nn.Module):
    """Multi-head self-attention whose first ``syntax_heads`` heads receive the GAT output (method 3).

    ``t_h += G W_t`` for the first n heads and every target t in ``targets`` (paper: ("q", "k"); the authors'
    release: ("k", "v")); see :func:`syntaxkernels.reference.inject_syntax_heads`. The injection weights
    ``syntax_proj[t]`` (``nn.Linear(syntax_dim, n*D, bias=False)``) start at zero, so a fresh layer is plain
    multi-head attention. The attention itself is plain softmax attention over the valid keys
    (``torch.nn.functional.scaled_dot_product_attention``).

    Args:
        embed_dim: E.
        num_heads: H.
        syntax_dim: width of G (``SyntaxGAT.output_dim``).
        syntax_heads: n (``0 <= n <= H``).
        targets: which of "q", "k", "v" receive G.
        dropout: applied to the attention output before ``out_proj``.
        bias: biases in the four projections.
    """

    def __init__(self, embed_dim: int, num_heads: int, syntax_dim: int, syntax_heads: int = 1,
                 targets: Sequence[str] = ("q", "k"), dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = _check_heads(embed_dim, num_heads)
        if isinstance(targets, str):
            targets = (targets,)
        self.targets = tuple(targets)
        if len(set(self.targets)) != len(self.targets) or not set(self.targets) <= {"q", "k", "v"}:
            raise ValueError(f"targets must be distinct names among 'q', 'k', 'v', got {self.targets!r}")
        if isinstance(syntax_heads, bool) or not isinstance(syntax_heads, int) or not 0 <= syntax_heads <= num_heads:
            raise ValueError(f"syntax_heads must be an int in 0..{num_heads}, got {syntax_heads!r}")
        self.syntax_dim = syntax_dim
        self.syntax_heads = syntax_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.syntax_proj = nn.ModuleDict(
            {t: nn.Linear(syntax_dim, syntax_heads * self.head_dim, bias=False) for t in self.targets}
        )
        for proj in self.syntax_proj.values():
            nn.init.zeros_(proj.weight)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, syntax: torch.Tensor, lengths=None, causal: bool = False) -> torch.Tensor:
        """
        Args:
            x: ``[B, N, E]``.
            syntax: ``G [B, N, syntax_dim]`` from :class:`SyntaxGAT`.
            lengths: ``int [B]`` or boolean key-padding mask ``[B, N]`` (True = padding), or None.
            causal: allow only keys ``j <= i``.
        Returns:
            ``[B, N, E]``.
        """
        _check_input(x, self.embed_dim)
        B, N, _ = x.shape
        if not isinstance(syntax, torch.Tensor) or tuple(syntax.shape) != (B, N, self.syntax_dim):
            shape = tuple(syntax.shape) if isinstance(syntax, torch.Tensor) else type(syntax).__name__
            raise ValueError(f"syntax must have shape [B, N, syntax_dim] = [{B}, {N}, {self.syntax_dim}], got {shape}")
        q = _split_heads(self.q_proj(x), self.num_heads)
        k = _split_heads(self.k_proj(x), self.num_heads)
        v = _split_heads(self.v_proj(x), self.num_heads)
        q, k, v = reference.inject_syntax_heads(q, k, v, syntax, [self.syntax_proj[t].weight for t in self.targets],
                                                heads=self.syntax_heads, targets=self.targets)
        counts = V.normalize_lengths(lengths, q)
        allowed = torch.ones(B, 1, N, N, dtype=torch.bool, device=x.device)
        if counts is not None:
            valid = torch.arange(N, device=x.device)[None, :] < counts[:, None]
            # Padded query rows see every key (no empty softmax row) and are zeroed below.
            allowed = (valid[:, None, None, :] | ~valid[:, None, :, None])
        if causal:
            allowed = allowed & torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        if counts is not None:
            out = out * valid[:, None, :, None].to(out.dtype)
        return self.out_proj(self.dropout(_merge_heads(out)))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, syntax_dim={self.syntax_dim}, "
                f"syntax_heads={self.syntax_heads}, targets={self.targets}")


class StructuralProbeLoss(nn.Module):
    """Structural-probe losses on the GAT output: ``(distance_loss, depth_loss)``.

    ``mean |d(i, j)^2 - ||B(g_i - g_j)||^2|`` over same-tree pairs ``i != j`` and ``mean |depth_i^2 - ||B g_i||^2|``
    over valid tokens, from Gram matrices (:func:`syntaxkernels.reference.structural_probe_loss`).

    Args:
        input_dim: width of g.
        rank: probe rank; parameter ``proj [input_dim, rank]`` (uniform(-0.05, 0.05) init).
    """

    def __init__(self, input_dim: int, rank: int):
        super().__init__()
        self.input_dim = input_dim
        self.rank = rank
        self.proj = nn.Parameter(torch.empty(input_dim, rank))
        nn.init.uniform_(self.proj, -0.05, 0.05)

    def forward(self, g: torch.Tensor, trees: TreeBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """``g [B, N, input_dim]``, a :class:`TreeBatch` -> ``(distance_loss, depth_loss)`` scalars."""
        if not isinstance(trees, TreeBatch):
            raise TypeError(f"trees must be a TreeBatch, got {type(trees).__name__}")
        return reference.structural_probe_loss(g, self.proj, trees.distance, trees.depth, trees.lengths)

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}, rank={self.rank}"


def _activation(activation: Union[str, Callable]) -> Callable:
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class SyntaxTransformerEncoderLayer(nn.Module):
    """``nn.TransformerEncoderLayer`` with syntax-aware self-attention.

    Same structure and submodule names as PyTorch's layer (``self_attn``, ``linear1``, ``dropout``,
    ``linear2``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2``; post-norm by default, ``norm_first`` for
    pre-norm). ``self_attn`` is chosen by ``method``:

    - "bias": :class:`SyntaxBiasedSelfAttention` (``buckets``, ``per_head``, ``window``);
    - "subnetwork": :class:`SyntaxBertSelfAttention` (``masks``);
    - "gat": :class:`SyntaxHeadSelfAttention`; ``forward`` then needs ``syntax=G`` from a :class:`SyntaxGAT`
      (one GAT, shared by all layers, as in the paper), injected into the first ``syntax_heads`` heads'
      ``syntax_targets``.

    Freshly initialised, the "bias" and "gat" layers compute exactly what ``nn.TransformerEncoderLayer`` with
    the same weights computes on the valid tokens (attention dropout aside: see the module docstring).

    Args:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias:
            as in ``nn.TransformerEncoderLayer``.
        method: "bias", "subnetwork" or "gat".
        buckets, per_head: for "bias".
        masks: for "subnetwork".
        window: for "bias": attention only where ``d(i, j) <= window``.
        syntax_dim, syntax_heads, syntax_targets: for "gat" (``syntax_dim`` defaults to ``d_model``).
        backend: "auto", "triton" or "reference".
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Union[str, Callable] = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True, method: str = "bias",
                 buckets: BucketSpec = BucketSpec(), per_head: bool = False, masks: MaskSpec = MaskSpec(),
                 window: Optional[int] = None, syntax_dim: Optional[int] = None, syntax_heads: int = 1,
                 syntax_targets: Sequence[str] = ("q", "k"), backend: str = "auto"):
        super().__init__()
        if method == "bias":
            self.self_attn = SyntaxBiasedSelfAttention(d_model, nhead, buckets=buckets, per_head=per_head,
                                                       dropout=dropout, bias=bias, backend=backend)
        elif method == "subnetwork":
            self.self_attn = SyntaxBertSelfAttention(d_model, nhead, masks=masks, dropout=dropout, bias=bias,
                                                     backend=backend)
        elif method == "gat":
            self.self_attn = SyntaxHeadSelfAttention(d_model, nhead, syntax_dim or d_model, syntax_heads,
                                                     syntax_targets, dropout=dropout, bias=bias)
        else:
            raise ValueError(f"method must be 'bias', 'subnetwork' or 'gat', got {method!r}")
        if window is not None and method != "bias":
            raise ValueError("window applies to method='bias' only (the GAT has its own window)")
        self.method = method
        self.window = window
        self.batch_first = batch_first
        self.norm_first = norm_first
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src: torch.Tensor, trees: Optional[TreesLike] = None, src_key_padding_mask=None,
                is_causal: bool = False, *, lengths=None, syntax: Optional[torch.Tensor] = None) -> torch.Tensor:
        """
        Args:
            src: ``[B, N, E]`` (``[N, B, E]`` when ``batch_first=False``).
            trees: a :class:`TreeBatch` (required for "subnetwork"), or ``uint8 distance [B, N, N]`` for
                "bias"; unused by "gat".
            src_key_padding_mask: bool ``[B, N]``, True = padding (must pad a suffix). For "subnetwork" the
                padding is the TreeBatch's.
            is_causal: causal attention ("bias" and "gat").
            lengths: ``int [B]``, an alternative to ``src_key_padding_mask``.
            syntax: ``G [B, N, syntax_dim]`` for "gat".
        Returns:
            same shape as ``src``.
        """
        if src_key_padding_mask is not None and lengths is not None:
            raise ValueError("give src_key_padding_mask or lengths, not both")
        padding = src_key_padding_mask if src_key_padding_mask is not None else lengths
        x = src if self.batch_first else src.transpose(0, 1)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), trees, padding, is_causal, syntax)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, trees, padding, is_causal, syntax))
            x = self.norm2(x + self._ff_block(x))
        return x if self.batch_first else x.transpose(0, 1)

    def _sa_block(self, x, trees, padding, is_causal, syntax):
        if self.method == "bias":
            if trees is None:
                raise ValueError("method='bias' needs trees (a TreeBatch or a uint8 distance tensor)")
            out = self.self_attn(x, trees, lengths=padding, causal=is_causal, window=self.window)
        elif self.method == "subnetwork":
            if is_causal:
                raise ValueError("is_causal is not supported by method='subnetwork'")
            out = self.self_attn(x, trees)
        else:
            if syntax is None:
                raise ValueError("method='gat' needs syntax=G from a SyntaxGAT")
            if padding is None and isinstance(trees, TreeBatch):
                padding = trees.lengths
            out = self.self_attn(x, syntax, lengths=padding, causal=is_causal)
        return self.dropout1(out)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
