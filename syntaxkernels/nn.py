"""Drop-in ``nn.Module``s for syntax-tree-aware attention (docs/semantics.md, docs/api.md).

The modules hold parameters and call the public ops (:func:`syntaxkernels.syntax_bias_attention`,
:func:`syntaxkernels.syntax_subnetwork_attention`, :func:`syntaxkernels.ops.syntax_window_attention`) with their
``backend`` passed through: "auto" runs the fused kernels where they apply (Triton on CUDA tensors, the C++
kernels on CPU tensors) and the pure-PyTorch reference elsewhere (float64), "reference" always runs the reference.

Building blocks on already projected heads (``q, k, v [B, H, N, D]``), shared by the self-attention modules
below and by :mod:`syntaxkernels.integrations.transformers`:

- :class:`DistanceBias`: the learnable tree-distance bias table (method 1) and the attention that reads it;
- :class:`Subnetworks`: Syntax-BERT's masked sub-networks mixed by :class:`TopicalAttention` (method 2);
- :class:`SyntaxHeads`: the injection of the GAT output into the first heads (method 3).

Methods 2 and 3 take ``variant="paper" | "release" | "package"`` (docs/semantics.md, "Paper, release and
package"): the paper's text (default), the authors' released code, or the package's own earlier form.

Self-attention modules (projections + one building block):

- :class:`SyntaxBiasedSelfAttention`: multi-head self-attention plus a learnable tree-distance bias
  (zero-initialised: a fresh layer is plain attention).
- :class:`SyntaxBertSelfAttention` with :class:`TopicalAttention`: Syntax-BERT sub-networks sharing Q, K, V,
  mixed per token (a fresh layer mixes the sub-networks evenly).
- :class:`SyntaxGAT`, :class:`SyntaxHeadSelfAttention`, :class:`StructuralProbeLoss`: syntax-augmented
  mBERT (a windowed graph-attention network, its output added to the first heads' Q/K (paper) or K/V (release),
  and the probe loss).
- :class:`TreePredictor`: a biaffine arc scorer on hidden states, trained on gold or parsed heads, decoding to
  well-formed trees (:func:`syntaxkernels.trees.decode_tree`): a structure plan without a parser at inference.
- :class:`SyntaxTransformerEncoderLayer`: mirrors ``torch.nn.TransformerEncoderLayer`` with any of the three.

Training: :func:`syntax_param_groups` gives optimizer groups with the syntax parameters at a learning rate of their
own (a zero-initialised table barely moves at a fine-tuning rate).

Shapes: B batch, N tokens, E model width, H heads, D = E / H head width, M sub-networks.

Errors: a ``TypeError`` when an argument is of the wrong kind (not a tensor, not a TreeBatch, not a
BucketSpec), a ``ValueError`` when it has the wrong value, shape, dtype or device.

Dropout: in training mode the attention modules drop attention *probabilities*, as ``nn.MultiheadAttention``
does: :class:`SyntaxBiasedSelfAttention` through the fused op's ``dropout_p`` (a Philox mask of a seed drawn per
call from torch's default generator, so ``torch.manual_seed`` reproduces it; the backward regenerates it), and
:class:`SyntaxHeadSelfAttention` through SDPA's ``dropout_p``. :class:`SyntaxBertSelfAttention` drops each
sub-network's probabilities through the sub-network op's ``dropout_p`` (one seed per call, sub-network m drawing
the mask of ``reference.stream_seed(seed, m)``), before the topical mix. In eval mode (or with ``dropout=0``)
nothing is dropped.

Padding: a token at position ``>= lengths[b]`` never receives attention weight; its own attention output is
zero before ``out_proj`` (so after it, it is ``out_proj.bias``). Mask padded positions in your loss.
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import _validation as V
from . import ops, reference
from . import variants as VR
from .ops.topical_mix import topical_mix
from .plan import StructurePlan
from .specs import MAX_PATH, BucketSpec, MaskSpec
from .trees.batch import TreeBatch
from .trees.packed import PackedTreeBatch
from .trees.relations import RelationBatch

__all__ = [
    "DistanceBias",
    "Subnetworks",
    "SyntaxHeads",
    "SyntaxBiasedSelfAttention",
    "TopicalAttention",
    "SyntaxBertSelfAttention",
    "SyntaxGAT",
    "SyntaxHeadSelfAttention",
    "StructuralProbeLoss",
    "TreePredictor",
    "SyntaxTransformerEncoderLayer",
    "syntax_param_groups",
    "DEFAULT_SYNTAX_LR",
    "DEFAULT_PREDICTOR_LR",
    "draw_dropout_seed",
]

TreesLike = Union[TreeBatch, torch.Tensor]


def _packed_view(x: torch.Tensor) -> torch.Tensor:
    """``[1, H, T, D]`` (a packed row in the padded layout) -> ``[T, H, D]`` (a view)."""
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f"with packed trees, q, k, v must be [1, H, T, D] (one packed row) or [T, H, D], got "
                         f"{tuple(x.shape)}")
    return x[0].transpose(0, 1)


def _packed_heads(q, k, v, op):
    """Run a varlen ``op`` on ``[T, H, D]`` views of ``[1, H, T, D]`` inputs (or on ``[T, H, D]`` inputs as they
    are), returning the caller's layout."""
    if q.dim() == 3:
        return op(q, k, v)
    return op(_packed_view(q), _packed_view(k), _packed_view(v)).transpose(0, 1)[None]


def _distance_and_lengths(trees: TreesLike, lengths):
    """``(distance uint8 [B, N, N], lengths)`` from a TreeBatch or a distance tensor.

    A TreeBatch supplies its own lengths unless ``lengths`` (int ``[B]`` or boolean key-padding mask) is given.
    """
    if isinstance(trees, TreeBatch):
        return trees.distance, trees.lengths if lengths is None else lengths
    if isinstance(trees, StructurePlan) and not trees.is_packed:  # another source's plan (a GraphBatch)
        return trees.distance, trees.kernel_lengths if lengths is None else lengths
    if isinstance(trees, torch.Tensor) and trees.dtype == torch.uint8 and trees.dim() in (3, 4):
        return trees, lengths  # its size is checked by the op (ValueError); 4-D: R relations [B, R, N, N]
    if isinstance(trees, torch.Tensor):
        what = f"a {trees.dtype} tensor of shape {tuple(trees.shape)}"
    else:
        what = type(trees).__name__
    raise TypeError("trees must be a TreeBatch (sk.TreeBatch.from_heads), a structure plan (sk.GraphBatch, ...) or "
                    f"a uint8 distance tensor [B, N, N], got {what}")


def _tree_shape(trees) -> Optional[Tuple[int, int]]:
    """``(B, N)`` of a TreeBatch, a padded plan or a ``[B, N, N]`` distance tensor; None for anything else (checked
    later)."""
    if isinstance(trees, StructurePlan) and not trees.is_packed:
        return tuple(trees.distance.shape[:2])
    if isinstance(trees, torch.Tensor) and trees.dim() == 3:
        return tuple(trees.shape[:2])
    if isinstance(trees, torch.Tensor) and trees.dim() == 4:  # R relations [B, R, N, N]
        return trees.shape[0], trees.shape[2]
    return None


def _check_input(x, embed_dim: int, name: str = "x", trees=None, batch_first: bool = True) -> None:
    """``x`` must be a tensor ``[B, N, embed_dim]`` (``[N, B, embed_dim]`` with ``batch_first=False``) whose B and
    N are the trees' when ``trees`` is given: TypeError for a non-tensor, ValueError for a wrong shape (saying
    when ``x`` looks transposed, which would otherwise surface as a distance shape error inside the op)."""
    layout = "[B, N, E]" if batch_first else "[N, B, E]"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor {layout} with E = {embed_dim}, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"{name} must have shape {layout} with E = {embed_dim}, got {tuple(x.shape)}")
    shape = _tree_shape(trees)
    if shape is None:
        return
    B, N = shape
    got = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    if got == (B, N):
        return
    expected = [B, N, embed_dim] if batch_first else [N, B, embed_dim]
    hint = ""
    if got == (N, B):
        hint = (f"; it looks sequence-first [N, B, E]: pass {name}.transpose(0, 1)" if batch_first else
                "; it looks batch-major [B, N, E]: pass it transposed, or build the layer with batch_first=True")
    raise ValueError(f"{name} must have shape {layout} = {expected} to match the trees (B = {B} sequences of "
                     f"N = {N} tokens), got {tuple(x.shape)}{hint}")


def _check_treebatch(trees, why: str = "") -> None:
    if not isinstance(trees, TreeBatch):
        raise TypeError(f"trees must be a TreeBatch{why}, got {type(trees).__name__}")


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[B, N, H*D] -> [B, H, N, D]``."""
    B, N, E = x.shape
    return x.view(B, N, num_heads, E // num_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, D] -> [B, N, H*D]``."""
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)


def _check_heads(embed_dim: int, num_heads: int) -> int:
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if num_heads <= 0 or embed_dim % num_heads:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
    return embed_dim // num_heads


def _qkv(module: nn.Module, x: torch.Tensor, num_heads: int):
    """The module's ``q_proj``, ``k_proj``, ``v_proj`` of ``x [B, N, E]``, each split into ``[B, H, N, D]``."""
    return (_split_heads(module.q_proj(x), num_heads), _split_heads(module.k_proj(x), num_heads),
            _split_heads(module.v_proj(x), num_heads))


def _projections(module: nn.Module, embed_dim: int, bias: bool) -> None:
    """Give ``module`` the four ``nn.Linear(E, E)`` of multi-head attention."""
    module.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
    module.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
    module.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
    module.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)


# ----------------------------------------------------------------------------------------------------------
# Building blocks on projected heads
# ----------------------------------------------------------------------------------------------------------


class DistanceBias(nn.Module):
    """The learnable tree-distance bias of method 1 and the attention that reads it.

    ``s_ij = q_i . k_j * scale + c * table[bucket(d_ij)]`` (:func:`syntaxkernels.syntax_bias_attention`), with
    ``table`` = ``distance_bias`` (zeros: a fresh module is plain attention) and ``c`` = ``bias_scale`` (ones).

    Args:
        num_heads: H.
        buckets: the :class:`BucketSpec` (table length T = ``buckets.num_buckets``).
        per_head: one table per head (``distance_bias [H, T]``) instead of one shared ``[T]``.
        learnable_scale: learn the strength c (``bias_scale [1]``); when False ``bias_scale`` is None (c = 1).
        backend: "auto", "triton" or "reference".
        relations: R, for several relations per score (a :class:`~syntaxkernels.RelationBatch` as the trees):
            ``distance_bias [R, T]`` (``[R, H, T]`` per head) and ``bias_scale [R]``, one table and strength per
            relation, ``s_ij = q_i . k_j * scale + sum_r c_r * table_r[bucket_r(d_r)]``. ``buckets`` may then be a
            sequence of R BucketSpecs (relation r uses the first ``buckets[r].num_buckets`` entries of its row).
            None (default): one distance.

    Raises ``TypeError`` for a ``buckets`` that is not a BucketSpec (or, with ``relations``, a sequence of R of
    them), ``ValueError`` for an unknown backend or a bad ``relations``.
    :meth:`attend` runs the attention; :class:`SyntaxBiasedSelfAttention` adds the projections.
    """

    def __init__(self, num_heads: int, buckets: BucketSpec = BucketSpec(), per_head: bool = False,
                 learnable_scale: bool = True, backend: str = "auto", relations: Optional[int] = None):
        super().__init__()
        if relations is not None:
            if isinstance(relations, bool) or not isinstance(relations, int) or relations < 1:
                raise ValueError(f"relations must be a positive int or None, got {relations!r}")
            if not isinstance(buckets, BucketSpec):
                buckets = tuple(buckets)
                if len(buckets) != relations or not all(isinstance(b, BucketSpec) for b in buckets):
                    raise TypeError(f"buckets must be a BucketSpec or a sequence of relations = {relations} "
                                    f"BucketSpecs, got {buckets!r}")
        elif not isinstance(buckets, BucketSpec):
            raise TypeError(f"buckets must be a BucketSpec, got {type(buckets).__name__}")
        V.check_backend(backend)
        self.num_heads = num_heads
        self.buckets = buckets
        self.per_head = per_head
        self.backend = backend
        self.relations = relations
        if relations is None:
            width = buckets.num_buckets
        else:
            specs = (buckets,) * relations if isinstance(buckets, BucketSpec) else buckets
            width = max(spec.num_buckets for spec in specs)
            from .trees.relations import code_buckets

            code_buckets(specs)  # (the ValueError now when the relations' buckets do not fit one byte)
        shape = (num_heads, width) if per_head else (width,)
        if relations is not None:
            shape = (relations,) + shape
        self.distance_bias = nn.Parameter(torch.zeros(shape))
        if learnable_scale:
            self.bias_scale = nn.Parameter(torch.ones(1 if relations is None else relations))
        else:
            self.register_parameter("bias_scale", None)

    def _table(self):
        """The table argument of the op: ``distance_bias``, or with relations of different lengths each relation's
        used entries."""
        if self.relations is None or isinstance(self.buckets, BucketSpec):
            return self.distance_bias
        return [self.distance_bias[r, ..., :spec.num_buckets] for r, spec in enumerate(self.buckets)]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees: TreesLike, lengths=None, *,
               scale: Optional[float] = None, window: Optional[int] = None, causal: bool = False,
               dropout_p: float = 0.0, position_window: Optional[int] = None, position_buckets=None,
               position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Distance-bias attention of projected heads.

        Args:
            q, k, v: ``[B, H, N, D]`` (k and v may have ``H_kv`` heads: grouped-query attention).
            trees: a :class:`TreeBatch`, another padded structure plan (a :class:`~syntaxkernels.GraphBatch`) or
                ``uint8 distance [B, N, N]``; a packed plan with ``[1, H, T, D]`` (or ``[T, H, D]``) inputs. With
                ``relations=R``: a :class:`~syntaxkernels.RelationBatch` of R relations (padded or packed) or uint8
                ``[B, R, N, N]``.
            lengths: ``int [B]`` or boolean key-padding mask ``[B, N]`` (True = padding); defaults to the plan's
                lengths, else no padding.
            scale: score scale, default ``1/sqrt(D)``.
            window: allow only pairs with ``d_ij <= window``.
            causal: allow only keys ``j <= i``.
            position_window: allow only keys with ``|i - j| <= position_window`` (a sliding window; positions within
                each sequence of a packed batch).
            position_buckets, position_table: T5's relative-position term ``position_table[h, bucket(j - i)]``
                (a :class:`~syntaxkernels.RelativePositionSpec` and ``[H, P]``), added by the op beside the tree bias.
            dropout_p: attention dropout on the probabilities (whatever the module's mode: the caller decides;
                a seed is drawn from torch's default generator, :func:`draw_dropout_seed`).
        Returns:
            ``[B, H, N, D]``; query rows past the length are 0.
        """
        given = _relations_given(trees)
        if given != self.relations:
            raise ValueError(f"this DistanceBias takes {self.relations or 'no'} relations (relations="
                             f"{self.relations}), the trees hold {given or 'one distance, not several relations'}: "
                             "pass a RelationBatch (or uint8 [B, R, N, N]) of that many relations, or build the "
                             "module with relations=R")
        seed = draw_dropout_seed() if dropout_p > 0.0 else None
        if isinstance(trees, StructurePlan) and trees.is_packed:  # packed: [1, H, T, D] (or [T, H, D]) in and out
            return _packed_heads(q, k, v, lambda q3, k3, v3: ops.syntax_bias_attention(
                q3, k3, v3, trees, self._table(), buckets=self.buckets, scale=scale,
                bias_scale=self.bias_scale, window=window, causal=causal, backend=self.backend,
                dropout_p=dropout_p, dropout_seed=seed, position_window=position_window,
                position_buckets=position_buckets, position_table=position_table))
        _distance_and_lengths(trees, lengths)  # (the TypeError for anything else)
        # The TreeBatch itself is the batch's structure plan: what the kernels derive from it is kept on it for
        # every layer (a bare distance tensor gets a plan of its own, per call).
        return ops.syntax_bias_attention(q, k, v, trees, self._table(), buckets=self.buckets, scale=scale,
                                         bias_scale=self.bias_scale, lengths=lengths, window=window, causal=causal,
                                         backend=self.backend, dropout_p=dropout_p, dropout_seed=seed,
                                         position_window=position_window, position_buckets=position_buckets,
                                         position_table=position_table)

    def extra_repr(self) -> str:
        relations = "" if self.relations is None else f", relations={self.relations}"
        return (f"num_heads={self.num_heads}, buckets={self.buckets}, per_head={self.per_head}, "
                f"backend={self.backend!r}{relations}")


def _relations_given(trees) -> Optional[int]:
    """R of a structure of several relations (a RelationBatch, or uint8 ``[B, R, N, N]``); None for one distance."""
    if isinstance(trees, RelationBatch):
        return trees.num_relations
    if isinstance(trees, torch.Tensor) and trees.dim() == 4:
        return trees.shape[1]
    return None


class TopicalAttention(nn.Module):
    """Syntax-BERT topical attention: a learnable task query mixes a token's M sub-network outputs.

    ``variant`` (docs/semantics.md, "Syntax-BERT: paper, release, package"):

    - ``"paper"`` (default): one softmax per token over its M outputs at full width E = H * D (heads
      concatenated), shared by all heads: ``w = softmax_m(q_task . (H_m W^K) / sqrt(E))``, output
      ``sum_m w_m H_m W^V``. Parameters ``query [1, E]`` (q_task, zeros), ``key_weight [E, E]`` and
      ``value_weight [E, E]`` (identity): a fresh module averages the M outputs. Every m takes part (the
      paper/release :class:`Subnetworks` fill empty rows before mixing).
    - ``"release"``: no parameters; ``sum_m H_m / sqrt(M)`` (the release trains with its topical attention
      switched off).
    - ``"package"``: per head, ``w = softmax_m(q_h . (H_m Wk_h) / sqrt(D))`` over the non-empty m, output
      ``sum_m w_m H_m Wv_h`` (the specification is :func:`syntaxkernels.reference.topical_attention`). Parameters
      ``query [H, D]`` (zeros), ``key_weight [H, D, D]`` and ``value_weight [H, D, D]`` (identity): a fresh module
      averages the non-empty sub-networks; tokens whose M masks are all empty output 0 with zero gradients. With
      one head it is the paper's mix over the non-empty m.

    Both weighted forms compute ``q . (H_m W^K) = H_m . (W^K q)`` (the keys are never formed) and
    ``sum_m w_m (H_m W^V) = (sum_m w_m H_m) W^V`` (the values are projected once, after mixing), with a
    hand-written backward (:func:`syntaxkernels.ops.topical_mix.topical_mix`). First derivatives only:
    differentiating the backward again raises a ``RuntimeError`` (the reference function supports higher orders).
    """

    def __init__(self, num_heads: int, head_dim: int, *, variant: str = VR.DEFAULT_VARIANT):
        super().__init__()
        self.variant = VR.check_variant(variant)
        self.num_heads = num_heads
        self.head_dim = head_dim
        if variant == "release":
            return
        if variant == "paper":
            width = num_heads * head_dim
            self.query = nn.Parameter(torch.zeros(1, width))
            self.key_weight = nn.Parameter(torch.eye(width))
            self.value_weight = nn.Parameter(torch.eye(width))
            return
        self.query = nn.Parameter(torch.zeros(num_heads, head_dim))
        eye = torch.eye(head_dim).expand(num_heads, head_dim, head_dim)
        self.key_weight = nn.Parameter(eye.clone())
        self.value_weight = nn.Parameter(eye.clone())

    def forward(self, outputs: torch.Tensor, nonempty: torch.Tensor) -> torch.Tensor:
        """``outputs [B, M, H, N, D]``, ``nonempty bool [B, M, N]`` -> ``[B, H, N, D]`` ("package": 0 where all
        empty; "paper" and "release" mix every m and read ``nonempty`` only for its shape).

        Raises ``TypeError`` for a non-tensor and ``ValueError`` for a shape or dtype that does not match the
        module (:func:`syntaxkernels.reference.check_topical_inputs`).
        """
        if self.variant == "package":
            reference.check_topical_inputs(outputs, nonempty, self.query, self.key_weight, self.value_weight)
        else:
            _check_mix_inputs(outputs, nonempty, self.num_heads, self.head_dim)
        B, M, H, N, D = outputs.shape
        if self.variant == "release":
            return VR.sum_mix(outputs)
        if self.variant == "paper":
            E = H * D
            u = (self.key_weight @ self.query[0]) * (1.0 / math.sqrt(E))  # W^K q_task / sqrt(E), [E]
            rows = outputs.permute(0, 1, 3, 2, 4).reshape(B, M, 1, N, E)  # heads concatenated
            every = torch.ones((B, M, N), dtype=torch.bool, device=outputs.device)
            mixed = topical_mix(rows, every, u[None])[0]  # [B, N, E]
            out = mixed @ self.value_weight.to(mixed.dtype)
            return out.view(B, N, H, D).permute(0, 2, 1, 3)
        u = torch.matmul(self.key_weight, self.query[:, :, None])[:, :, 0] * (1.0 / math.sqrt(D))  # [H, D]
        mixed = topical_mix(outputs, nonempty, u)  # [H, B, N, D]
        out = torch.bmm(mixed.view(H, B * N, D), self.value_weight.to(mixed.dtype))
        return out.view(H, B, N, D).permute(1, 0, 2, 3)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, variant={self.variant!r}"


def _check_mix_inputs(outputs, nonempty, num_heads: int, head_dim: int) -> None:
    """The shape checks of the paper and release mixes: ``outputs [B, M, H, N, D]`` with the module's H and D,
    ``nonempty bool [B, M, N]``."""
    for name, t in (("outputs", outputs), ("nonempty", nonempty)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if outputs.dim() != 5 or tuple(outputs.shape[2:3]) + tuple(outputs.shape[4:]) != (num_heads, head_dim):
        raise ValueError(f"outputs must have shape [B, M, H, N, D] with H = {num_heads}, D = {head_dim}, got "
                         f"{tuple(outputs.shape)}")
    B, M, _, N, _ = outputs.shape
    if nonempty.dtype != torch.bool or tuple(nonempty.shape) != (B, M, N):
        raise ValueError(f"nonempty must be bool [B, M, N] = [{B}, {M}, {N}], got {nonempty.dtype} "
                         f"{tuple(nonempty.shape)}")


class Subnetworks(nn.Module):
    """Syntax-BERT's sub-networks on projected heads (method 2): M masked attentions sharing q, k, v
    (:func:`syntaxkernels.syntax_subnetwork_attention`), mixed per token by :class:`TopicalAttention`.

    Args:
        num_heads: H.
        head_dim: D.
        masks: the :class:`MaskSpec` (M = ``masks.num_masks`` sub-networks).
        backend: "auto", "triton" or "reference".
        variant: "paper" (default), "release" or "package" (docs/semantics.md, "Syntax-BERT: paper, release,
            package"). "paper" and "release": an empty (token, mask) row, padding rows included, is plain attention
            over every key of the row (in a padded batch all N positions, padding included: the release's additive
            ``-10000`` mask), then :class:`TopicalAttention` of the same variant mixes every m. "package": an empty
            row outputs 0 and is left out of the per-head topical softmax.

    Submodule ``topical`` (:class:`TopicalAttention` of the same variant; a fresh one averages the sub-networks,
    "release" has no parameters). The masks themselves come from the trees: build them with
    :func:`syntaxkernels.trees.syntax_bert_batch` (``variant=``) for the paper's and the release's wordpiece,
    ``[CLS]``/``[SEP]`` and pairwise masks; a plain :class:`TreeBatch` gives the masks of its token tree.
    Raises ``TypeError`` for ``masks`` that is not a MaskSpec, ``ValueError`` for an unknown backend or variant.
    """

    def __init__(self, num_heads: int, head_dim: int, masks: MaskSpec = MaskSpec(), backend: str = "auto", *,
                 variant: str = VR.DEFAULT_VARIANT):
        super().__init__()
        V.check_masks(masks)
        V.check_backend(backend)
        self.variant = VR.check_variant(variant)
        self.masks = masks
        self.backend = backend
        self.topical = TopicalAttention(num_heads, head_dim, variant=variant)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees: TreeBatch, *,
               scale: Optional[float] = None, dropout_p: float = 0.0) -> torch.Tensor:
        """``q, k, v [B, H, N, D]`` and a :class:`TreeBatch` on their device (its padding, ``segment == -1``, is
        the padding here) -> ``[B, H, N, D]`` ("package": 0 for a token whose masks are all empty, padding
        included). ``scale`` is the sub-networks' score scale (default ``1/sqrt(D)``). ``dropout_p``: attention
        dropout on each sub-network's probabilities (whatever the module's mode: the caller decides; one seed is
        drawn per call from torch's default generator, :func:`draw_dropout_seed`, and sub-network m drops with
        the mask of ``reference.stream_seed(seed, m)``). The plain attention that fills empty rows ("paper",
        "release") is not dropped."""
        V.check_relations_defined(trees)  # a plan of another source (a GraphBatch) says why it has no relations
        V.check_dropout(dropout_p, None if dropout_p == 0.0 else 0)
        seed = draw_dropout_seed() if dropout_p > 0.0 else None
        if isinstance(trees, PackedTreeBatch):  # a packed batch: q, k, v [1, H, T, D] (or [T, H, D])
            squeeze = q.dim() == 3
            q3, k3, v3 = (x if squeeze else _packed_view(x) for x in (q, k, v))
            outputs, nonempty = ops.syntax_subnetwork_attention(q3, k3, v3, trees, self.masks, scale=scale,
                                                                backend=self.backend, dropout_p=dropout_p,
                                                                dropout_seed=seed)  # [T, M, H, D], [T, M]
            outputs, nonempty = outputs.permute(1, 2, 0, 3)[None], nonempty.transpose(0, 1)[None]
            if self.variant != "package":
                plain = _packed_plain(q3, k3, v3, trees, scale)  # every key of the sequence
                outputs = VR.fill_empty_rows(outputs, nonempty, plain.permute(1, 0, 2)[None])
            mixed = self.topical(outputs, nonempty)  # [1, H, T, D]
            return mixed[0].transpose(0, 1) if squeeze else mixed
        _check_treebatch(trees, " for the sub-network attention (the masks need depth and segment)")
        outputs, nonempty = ops.syntax_subnetwork_attention(q, k, v, trees, self.masks, scale=scale,
                                                            backend=self.backend, dropout_p=dropout_p,
                                                            dropout_seed=seed)
        if self.variant != "package":
            outputs = VR.fill_empty_rows(outputs, nonempty, F.scaled_dot_product_attention(q, k, v, scale=scale))
        return self.topical(outputs, nonempty)

    def extra_repr(self) -> str:
        return f"masks={self.masks.names}, backend={self.backend!r}, variant={self.variant!r}"


def _packed_plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees: PackedTreeBatch,
                  scale: Optional[float], dropout_p: float = 0.0, *, causal: bool = False,
                  position_window: Optional[int] = None) -> torch.Tensor:
    """Plain softmax attention over every key of each sequence of a packed batch: ``q, k, v [T, H, D] -> [T, H, D]``
    (k, v may have fewer heads, grouped-query attention; the varlen distance-bias op with a zero table: on CPU its
    C++ kernels); ``dropout_p``: attention dropout on the probabilities (a seed from :func:`draw_dropout_seed`);
    ``causal``: keys ``j <= i`` of the sequence only; ``position_window``: keys with ``|i - j| <= position_window``
    only."""
    from .ops._dispatch import device_constant

    buckets = BucketSpec(max_distance=1)
    dtype = torch.get_default_dtype()
    zeros = device_constant(("zero table", dtype), q, lambda: torch.zeros(buckets.num_buckets, dtype=dtype))
    return ops.syntax_bias_attention(q, k, v, trees, zeros, buckets=buckets, scale=scale, dropout_p=dropout_p,
                                     dropout_seed=draw_dropout_seed() if dropout_p > 0.0 else None, causal=causal,
                                     position_window=position_window)


def _check_syntax_heads(syntax_heads, num_heads: int, targets) -> Tuple[str, ...]:
    """The checked ``targets`` tuple; ``syntax_heads`` must be an int in 0..num_heads."""
    if isinstance(targets, str):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)):
        raise TypeError(f"targets must be a sequence of names among 'q', 'k', 'v', got {type(targets).__name__}")
    targets = tuple(targets)
    if len(set(targets)) != len(targets) or not set(targets) <= {"q", "k", "v"}:
        raise ValueError(f"targets must be distinct names among 'q', 'k', 'v', got {targets!r}")
    if isinstance(syntax_heads, bool) or not isinstance(syntax_heads, int):
        raise TypeError(f"syntax_heads must be an int, got {type(syntax_heads).__name__}")
    if not 0 <= syntax_heads <= num_heads:
        raise ValueError(f"syntax_heads must be an int in 0..{num_heads}, got {syntax_heads!r}")
    return targets


class SyntaxHeads(nn.Module):
    """The syntax-head injection of method 3 on projected heads: ``t_h += G W_t (+ b_t)`` for the first
    ``syntax_heads`` heads and every target t in ``targets`` (:func:`syntaxkernels.reference.inject_syntax_heads`).

    Args:
        syntax_dim: width of G (``SyntaxGAT.output_dim``).
        num_heads: H.
        head_dim: D.
        syntax_heads: n (``0 <= n <= H``).
        targets: which of "q", "k", "v" receive G; None: the variant's (paper ("q", "k"), section 2.3; release
            ("k", "v"), ``addi_key``/``addi_value``; package ("q", "k")).
        variant: "paper" (default), "release" or "package" (docs/semantics.md, "Syntax-augmented mBERT: paper,
            release, package"). "paper" and "release": ``nn.Linear(syntax_dim, n*D)`` with a bias, initialised as
            the release's BERT initialisation does (weights N(0, ``init_std``), bias 0), so a fresh module already
            changes the syntax heads. "package": no bias, zero weights, so a fresh module changes nothing.
        init_std: the weights' standard deviation for "paper" and "release" (BERT's ``initializer_range``, 0.02).

    Submodule ``syntax_proj`` (a ``nn.ModuleDict``, one ``nn.Linear`` per target). Raises ``ValueError`` for
    repeated or unknown targets, n out of range or an unknown variant, ``TypeError`` for a non-int n.
    """

    def __init__(self, syntax_dim: int, num_heads: int, head_dim: int, syntax_heads: int = 1,
                 targets: Optional[Sequence[str]] = None, *, variant: str = VR.DEFAULT_VARIANT,
                 init_std: float = 0.02):
        super().__init__()
        self.variant = VR.check_variant(variant)
        if targets is None:
            targets = VR.default_targets(variant)
        self.targets = _check_syntax_heads(syntax_heads, num_heads, targets)
        self.syntax_dim = syntax_dim
        self.syntax_heads = syntax_heads
        bias = variant != "package"
        self.syntax_proj = nn.ModuleDict(
            {t: nn.Linear(syntax_dim, syntax_heads * head_dim, bias=bias) for t in self.targets}
        )
        for proj in self.syntax_proj.values():
            if bias:
                nn.init.normal_(proj.weight, std=init_std)
                nn.init.zeros_(proj.bias)
            else:
                nn.init.zeros_(proj.weight)

    def inject(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               syntax: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v [B, H, N, D]``, ``syntax`` = G ``[B, N, syntax_dim]`` -> the updated ``(q, k, v)``."""
        if not isinstance(syntax, torch.Tensor):
            raise TypeError(f"syntax must be a tensor G [B, N, syntax_dim], got {type(syntax).__name__}")
        B, _, N, _ = q.shape
        if tuple(syntax.shape) != (B, N, self.syntax_dim):
            raise ValueError(f"syntax must have shape [B, N, syntax_dim] = [{B}, {N}, {self.syntax_dim}], got "
                             f"{tuple(syntax.shape)}")
        return reference.inject_syntax_heads(q, k, v, syntax, [self.syntax_proj[t].weight for t in self.targets],
                                             heads=self.syntax_heads, targets=self.targets,
                                             biases=[self.syntax_proj[t].bias for t in self.targets])

    def extra_repr(self) -> str:
        return (f"syntax_dim={self.syntax_dim}, syntax_heads={self.syntax_heads}, targets={self.targets}, "
                f"variant={self.variant!r}")


def draw_dropout_seed() -> int:
    """A seed for one call's attention-dropout mask, drawn from torch's default (CPU) generator: reproducible
    under ``torch.manual_seed``, and no device synchronisation whatever device the model runs on. The value of
    ``torch.randint(0, 2**63 - 1, ())`` (which is ``random_`` on a fresh int64 scalar), drawn into one scalar kept
    per thread: half the host time of a layer's draw."""
    if torch.compiler.is_compiling():
        return int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64).item())
    scalar = getattr(_SEED_SCALAR, "tensor", None)
    if scalar is None:
        scalar = _SEED_SCALAR.tensor = torch.empty((), dtype=torch.int64)
    return int(scalar.random_(0, 2 ** 63 - 1).item())


_SEED_SCALAR = threading.local()


# ----------------------------------------------------------------------------------------------------------
# Self-attention modules
# ----------------------------------------------------------------------------------------------------------


class SyntaxBiasedSelfAttention(DistanceBias):
    """Multi-head self-attention with a learnable tree-distance bias (method 1).

    ``s_ij = q_i . k_j / sqrt(D) + c * table[bucket(d_ij)]``; ``table`` is ``distance_bias`` (zero init) and
    ``c`` is ``bias_scale`` (init 1), so a fresh layer computes plain multi-head attention.

    Args:
        embed_dim: E.
        num_heads: H (E must be divisible by H).
        buckets: the :class:`BucketSpec` (table length T = ``buckets.num_buckets``).
        per_head: one table per head (``distance_bias [H, T]``) instead of one shared ``[T]``.
        learnable_scale: learn the strength c; when False ``bias_scale`` is None (c = 1).
        dropout: attention dropout on the probabilities in training mode (see the module docstring).
        bias: biases in the four projections.
        backend: "auto", "triton" or "reference".
        relations: R relations per score (trees: a :class:`~syntaxkernels.RelationBatch`), as :class:`DistanceBias`.

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear(E, E)``); the bias parameters
    come from :class:`DistanceBias`.
    """

    def __init__(self, embed_dim: int, num_heads: int, buckets: BucketSpec = BucketSpec(), per_head: bool = False,
                 learnable_scale: bool = True, dropout: float = 0.0, bias: bool = True, backend: str = "auto",
                 relations: Optional[int] = None):
        head_dim = _check_heads(embed_dim, num_heads)
        super().__init__(num_heads, buckets, per_head, learnable_scale, backend, relations=relations)
        self.embed_dim = embed_dim
        self.head_dim = head_dim
        _projections(self, embed_dim, bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, trees: TreesLike, lengths=None, causal: bool = False,
                window: Optional[int] = None) -> torch.Tensor:
        """
        Args:
            x: ``[B, N, E]``.
            trees: a :class:`TreeBatch`, another padded structure plan (a :class:`~syntaxkernels.GraphBatch`) or
                ``uint8 distance [B, N, N]``; a packed plan with ``[1, H, T, D]`` (or ``[T, H, D]``) inputs.
            lengths: ``int [B]`` or boolean key-padding mask ``[B, N]`` (True = padding); defaults to the plan's
                lengths, else no padding.
            causal: allow only keys ``j <= i``.
            window: allow only pairs with ``d_ij <= window``.
        Returns:
            ``[B, N, E]``.
        """
        _check_input(x, self.embed_dim, trees=trees)
        q, k, v = _qkv(self, x, self.num_heads)
        out = self.attend(q, k, v, trees, lengths, window=window, causal=causal,
                          dropout_p=self.dropout.p if self.training else 0.0)
        return self.out_proj(_merge_heads(out))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, " + super().extra_repr()


class SyntaxBertSelfAttention(Subnetworks):
    """Syntax-BERT self-attention (method 2): M masked sub-networks sharing Q, K, V, mixed by topical attention.

    A fresh layer outputs, per token, the average of its M masked attention outputs ("paper"; empty rows are
    plain attention), their sum over ``sqrt(M)`` ("release") or the average over its non-empty masks
    ("package"); with ``MaskSpec`` enabling only ``full`` each is exactly plain multi-head attention on the valid
    tokens.

    Args:
        embed_dim: E.
        num_heads: H.
        masks: the :class:`MaskSpec` (M = ``masks.num_masks`` sub-networks).
        dropout: attention dropout on each sub-network's probabilities in training mode (the op's ``dropout_p``,
            a seed drawn per call: see the module docstring); ``self.dropout`` is an ``nn.Dropout`` holding p.
        bias: biases in the four projections.
        backend: "auto", "triton" or "reference".
        variant: "paper" (default), "release" or "package": empty rows and the mix (see :class:`Subnetworks`).

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear(E, E)``) and ``topical``
    (:class:`TopicalAttention`, from :class:`Subnetworks`).
    """

    def __init__(self, embed_dim: int, num_heads: int, masks: MaskSpec = MaskSpec(), dropout: float = 0.0,
                 bias: bool = True, backend: str = "auto", *, variant: str = VR.DEFAULT_VARIANT):
        head_dim = _check_heads(embed_dim, num_heads)
        super().__init__(num_heads, head_dim, masks, backend, variant=variant)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        _projections(self, embed_dim, bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, trees: TreeBatch) -> torch.Tensor:
        """
        Args:
            x: ``[B, N, E]``.
            trees: a :class:`TreeBatch` on x's device (its padding, ``segment == -1``, is the padding here).
        Returns:
            ``[B, N, E]``.
        """
        _check_input(x, self.embed_dim, trees=trees)
        q, k, v = _qkv(self, x, self.num_heads)
        out = self.attend(q, k, v, trees, dropout_p=self.dropout.p if self.training else 0.0)
        return self.out_proj(_merge_heads(out))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, " + super().extra_repr()


class _GATLayer(nn.Module):
    """One layer of :class:`SyntaxGAT` ("package"): projections only (the attention runs in SyntaxGAT.forward)."""

    def __init__(self, in_dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.q_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)


class _PaperGATLayer(nn.Module):
    """One layer of the paper's GAT (Eq. 2): one projection ``t_proj`` makes the queries and the keys (T), one
    ``v_proj`` the values; no bias (the release's ``W`` has none)."""

    def __init__(self, in_dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.t_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, num_heads * head_dim, bias=False)


class _ReleaseGATLayer(nn.Module):
    """One layer of the release's GAT (``graph_utils.py``, ``GraphAttentionNetwork`` of ``GraphAttentionHead``):
    per head a ``W`` (``weight [k, E_in, d]``) and the score vectors ``a1``, ``a2`` (``att_src``, ``att_dst``
    ``[k, d]``), each initialised per head as the release does (Xavier uniform, gain 1.414, on ``[E_in, d]`` and
    ``[d, 1]``)."""

    def __init__(self, in_dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, in_dim, head_dim))
        self.att_src = nn.Parameter(torch.empty(num_heads, head_dim))
        self.att_dst = nn.Parameter(torch.empty(num_heads, head_dim))
        for h in range(num_heads):
            nn.init.xavier_uniform_(self.weight.data[h], gain=1.414)
            nn.init.xavier_uniform_(self.att_src.data[h].view(head_dim, 1), gain=1.414)
            nn.init.xavier_uniform_(self.att_dst.data[h].view(head_dim, 1), gain=1.414)


class SyntaxGAT(nn.Module):
    """The syntax graph-attention network of syntax-augmented mBERT (method 3).

    Input: token embeddings plus POS-tag embeddings. Then ``num_layers`` layers, each k = ``num_heads``
    heads of width d_g = ``head_dim`` attending only where ``d(i, j) <= window``, heads concatenated; no
    feed-forward block, no residual. What a layer computes is the ``variant`` (docs/semantics.md,
    "Syntax-augmented mBERT: paper, release, package"):

    - ``"paper"`` (default, Eq. 2-3): ``T = x W_T``, ``V = x W_V`` per head, ``softmax(T T^T / sqrt(d_g))`` within
      the window (queries and keys are the same matrix); dropout on each layer's output. POS ids: the release's
      21 (0 padding, a ``padding_idx`` row without gradient).
    - ``"release"``: additive GAT scores ``LeakyReLU_0.2(a1 . Wh_i + a2 . Wh_j)`` with one ``W`` for scores and
      values, dropout on the attention weights and on each layer's output, and ``LayerNorm(k * d_g)`` on the
      output (dense PyTorch, :func:`syntaxkernels.variants.additive_gat_attention`). POS ids as for "paper".
    - ``"package"``: separate q/k/v projections per layer, dot-product attention within the window, no dropout,
      no LayerNorm; POS ids 0..17 with a learned row 0 (:func:`syntaxkernels.reference.gat_layer`).

    The dot-product windowed attention runs through :func:`syntaxkernels.ops.syntax_window_attention` (edge lists
    of the window on CPU; on CUDA the edge lists or the fused dense kernel, whichever is cheaper).

    Args:
        embed_dim: width E of the token embeddings given to ``forward``.
        num_layers: L_G (>= 1).
        num_heads: k.
        head_dim: d_g.
        window: delta, an int in 0..254.
        num_pos_tags: size of the POS vocabulary; None: the variant's (21 for "paper" and "release", 18 =
            UPOS with an unknown tag for "package"); 0 for no POS embedding.
        backend: "auto", "triton" or "reference".
        variant: "paper", "release" or "package".
        dropout: the dropout probability ("paper" and "release"; the release runs 0.1, BERT's
            ``hidden_dropout_prob``); active in training mode only.
        layer_norm_eps: the epsilon of the release's output LayerNorm (BERT's ``layer_norm_eps``, 1e-12).

    Submodules ``pos_embedding`` (``nn.Embedding(num_pos_tags, E)``, N(0, 0.02) init; ``padding_idx=0`` for
    "paper" and "release"), ``layers`` and, for "release", ``norm``. Output width ``output_dim = k * d_g``.
    """

    def __init__(self, embed_dim: int, num_layers: int = 4, num_heads: int = 4, head_dim: int = 64, window: int = 4,
                 num_pos_tags: Optional[int] = None, backend: str = "auto", *, variant: str = VR.DEFAULT_VARIANT,
                 dropout: float = 0.0, layer_norm_eps: float = 1e-12):
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int):
            raise TypeError(f"num_layers must be an int, got {type(num_layers).__name__}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if window is None:
            raise ValueError(f"window must be an int in 0..{MAX_PATH} for the GAT, got None")
        V.check_window(window)
        V.check_backend(backend)
        self.variant = VR.check_variant(variant)
        self.dropout = VR.dropout_or_none(dropout)
        if num_pos_tags is None:
            num_pos_tags = VR.default_pos_tags(variant)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.window = window
        self.backend = backend
        self.output_dim = num_heads * head_dim
        if num_pos_tags > 0:
            padding = None if variant == "package" else VR.POS_PAD
            self.pos_embedding = nn.Embedding(num_pos_tags, embed_dim, padding_idx=padding)
            # The release's BERT initialisation redraws every row, the padding row included (it gets no gradient).
            nn.init.normal_(self.pos_embedding.weight, std=0.02)
        else:
            self.register_module("pos_embedding", None)
        layer = {"paper": _PaperGATLayer, "release": _ReleaseGATLayer, "package": _GATLayer}[variant]
        self.layers = nn.ModuleList(
            layer(embed_dim if i == 0 else self.output_dim, num_heads, head_dim) for i in range(num_layers)
        )
        if variant == "release":
            self.norm = nn.LayerNorm(self.output_dim, eps=layer_norm_eps)

    def forward(self, x: torch.Tensor, trees: TreesLike, pos: Optional[torch.Tensor] = None,
                lengths=None) -> torch.Tensor:
        """
        Args:
            x: token embeddings ``[B, N, E]``.
            trees: a :class:`TreeBatch` (its window lists are built once and cached on it) or
                ``uint8 distance [B, N, N]``.
            pos: ``int64 [B, N]`` POS-tag ids (padding: any valid id), or None.
            lengths: ``int [B]`` or boolean key-padding mask; defaults to ``trees.lengths``.
        Returns:
            ``G [B, N, num_heads * head_dim]``; padding rows are 0.
        """
        packed = isinstance(trees, PackedTreeBatch)
        if packed:  # one packed row x [1, T, E]
            _check_input(x, self.embed_dim)
            if tuple(x.shape[:2]) != (1, trees.num_tokens):
                raise ValueError(f"x must be one packed row [1, T, E] = [1, {trees.num_tokens}, {self.embed_dim}] "
                                 f"for these packed trees, got {tuple(x.shape)}")
            distance = None
        else:
            _check_input(x, self.embed_dim, trees=trees)
            distance, lengths = _distance_and_lengths(trees, lengths)
        if pos is not None:
            if self.pos_embedding is None:
                raise ValueError("pos was given but this SyntaxGAT has no POS embedding (num_pos_tags=0)")
            if not isinstance(pos, torch.Tensor):
                raise TypeError(f"pos must be an int64 tensor [B, N] of POS ids, got {type(pos).__name__}")
            if pos.shape != x.shape[:2]:
                raise ValueError(f"pos must have shape [B, N] = {list(x.shape[:2])}, got {tuple(pos.shape)}")
            _check_pos_ids(pos, self.pos_embedding.num_embeddings)
            x = x + self.pos_embedding(pos)
        if self.variant == "release":
            return self._release(x, trees, distance, lengths)
        for layer in self.layers:
            if self.variant == "paper":
                t = _split_heads(layer.t_proj(x), self.num_heads)
                q, k, v = t, t, _split_heads(layer.v_proj(x), self.num_heads)
            else:
                q, k, v = _qkv(layer, x, self.num_heads)
            if packed:
                out = _packed_heads(q, k, v, lambda q3, k3, v3: ops.syntax_window_attention(
                    q3, k3, v3, trees, window=self.window, backend=self.backend))
            else:
                out = ops.syntax_window_attention(q, k, v, trees if isinstance(trees, TreeBatch) else distance,
                                                  window=self.window, lengths=lengths, backend=self.backend)
            x = F.dropout(_merge_heads(out), self.dropout, self.training) if self.dropout else _merge_heads(out)
        return x

    def _release(self, x: torch.Tensor, trees, distance, lengths) -> torch.Tensor:
        """The release's layers (dense additive attention), its output dropout and LayerNorm; padding rows 0."""
        if isinstance(trees, PackedTreeBatch):  # the sequences laid out padded (cached per batch), then back
            sequence, position, lengths, distance, _ = trees.padded_layout()
            rows = x.new_zeros((trees.num_sequences, trees.max_seqlen, x.shape[-1]))
            g = self._release(rows.index_put((sequence, position), x[0]), distance, distance, lengths)
            return g[sequence, position][None]
        B, N, _ = x.shape
        counts = V.normalize_lengths(lengths, x.new_empty(B, 1, N, 1))
        if counts is None:
            counts = torch.full((B,), N, dtype=torch.int64, device=x.device)
        allowed = reference.allowed_pairs(distance, counts, self.window)
        for layer in self.layers:
            x = VR.additive_gat_attention(x, layer.weight, layer.att_src, layer.att_dst, allowed,
                                          dropout=self.dropout, training=self.training)
            x = F.dropout(x, self.dropout, self.training) if self.dropout else x
        valid = torch.arange(N, device=x.device)[None, :] < counts[:, None]
        return self.norm(x) * valid[..., None].to(x.dtype)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_layers={len(self.layers)}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, window={self.window}, backend={self.backend!r}, variant={self.variant!r}")


def _check_pos_ids(pos: torch.Tensor, num_tags: int, name: str = "pos") -> None:
    """POS ids must be integers in ``0..num_tags-1``: read on the host for a CPU tensor (``ValueError`` naming the
    batch item and token), a device-side assertion for a GPU tensor (no host synchronisation); skipped while
    compiling."""
    if pos.dtype.is_floating_point or pos.dtype == torch.bool or pos.is_complex():
        raise ValueError(f"{name} must hold integer POS ids (int64), got {pos.dtype}")
    if V.compiling():
        return
    bad = (pos < 0) | (pos >= num_tags)
    if V._on_host(pos):
        if bool(bad.any()):
            b, i = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"{name}: batch item {b}, token {i}: POS id {int(pos[b, i])} is outside 0..{num_tags - 1} "
                             f"(this SyntaxGAT has num_pos_tags = {num_tags}; token_pos_ids gives ids 0..20, 0..17 "
                             "with variant='package')")
    else:
        torch._assert_async(~bad.any(), f"{name}: POS ids must be in 0..{num_tags - 1} (num_pos_tags = {num_tags})")


class SyntaxHeadSelfAttention(SyntaxHeads):
    """Multi-head self-attention whose first ``syntax_heads`` heads receive the GAT output (method 3).

    ``t_h += G W_t (+ b_t)`` for the first n heads and every target t in ``targets`` (paper: ("q", "k"); the
    authors' release: ("k", "v")); see :class:`SyntaxHeads` and :func:`syntaxkernels.reference.inject_syntax_heads`.
    With ``variant="package"`` the injection weights ``syntax_proj[t]`` start at zero, so a fresh layer is plain
    multi-head attention; "paper" and "release" start them as the release does (N(0, ``init_std``), bias 0). The
    attention itself is plain softmax attention over the valid keys
    (``torch.nn.functional.scaled_dot_product_attention``).

    Args:
        embed_dim: E.
        num_heads: H.
        syntax_dim: width of G (``SyntaxGAT.output_dim``).
        syntax_heads: n (``0 <= n <= H``).
        targets: which of "q", "k", "v" receive G (None: the variant's).
        dropout: attention dropout on the probabilities in training mode (SDPA's ``dropout_p``).
        bias: biases in the four projections.
        variant, init_std: see :class:`SyntaxHeads`.
    """

    def __init__(self, embed_dim: int, num_heads: int, syntax_dim: int, syntax_heads: int = 1,
                 targets: Optional[Sequence[str]] = None, dropout: float = 0.0, bias: bool = True, *,
                 variant: str = VR.DEFAULT_VARIANT, init_std: float = 0.02):
        head_dim = _check_heads(embed_dim, num_heads)
        super().__init__(syntax_dim, num_heads, head_dim, syntax_heads, targets, variant=variant, init_std=init_std)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        _projections(self, embed_dim, bias)
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
        q, k, v = self.inject(*_qkv(self, x, self.num_heads), syntax)
        counts = V.normalize_lengths(lengths, q)
        allowed = torch.ones(B, 1, N, N, dtype=torch.bool, device=x.device)
        if counts is not None:
            valid = torch.arange(N, device=x.device)[None, :] < counts[:, None]
            # Padded query rows see every key (no empty softmax row) and are zeroed below.
            allowed = (valid[:, None, None, :] | ~valid[:, None, :, None])
        if causal:
            allowed = allowed & torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                             dropout_p=self.dropout.p if self.training else 0.0)
        if counts is not None:
            out = out * valid[:, None, :, None].to(out.dtype)
        return self.out_proj(_merge_heads(out))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, " + super().extra_repr()


class StructuralProbeLoss(nn.Module):
    """Structural-probe losses on the GAT output: ``(distance_loss, depth_loss)``.

    ``variant`` (docs/semantics.md, "Syntax-augmented mBERT: paper, release, package"):

    - ``"paper"`` (default, section 2.4): two matrices, ``proj`` (theta_1) for distances and ``depth_proj``
      (theta_2) for depths; per sentence ``(1/n^2) sum_ij |d(i, j)^2 - ||theta_1 (g_i - g_j)||^2|`` and
      ``(1/n) sum_i |depth_i - ||theta_2 g_i||^2|``, each averaged over the batch's sentences
      (:func:`syntaxkernels.variants.probe_losses`);
    - ``"release"``: the same with the unsquared distance as the target (Hewitt and Manning's loss, as the
      release's ``L1DistanceLoss`` runs it);
    - ``"package"``: one matrix for both, squared targets, each mean pooled over every valid pair / token of the
      batch (:func:`syntaxkernels.reference.structural_probe_loss`).

    Pairs of different trees (a forest) are left out. The squared norms come from Gram matrices.

    Args:
        input_dim: width of g.
        rank: probe rank; parameters ``proj [input_dim, rank]`` and ("paper", "release") ``depth_proj``, both
            uniform(-0.05, 0.05) init (the release's rank is its head width, 64).
        variant: "paper", "release" or "package".
    """

    def __init__(self, input_dim: int, rank: int, *, variant: str = VR.DEFAULT_VARIANT):
        super().__init__()
        self.variant = VR.check_variant(variant)
        self.input_dim = input_dim
        self.rank = rank
        self.proj = nn.Parameter(torch.empty(input_dim, rank))
        nn.init.uniform_(self.proj, -0.05, 0.05)
        if variant == "package":
            self.register_parameter("depth_proj", None)
        else:
            self.depth_proj = nn.Parameter(torch.empty(input_dim, rank))
            nn.init.uniform_(self.depth_proj, -0.05, 0.05)

    def forward(self, g: torch.Tensor, trees: TreeBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """``g [B, N, input_dim]``, a :class:`TreeBatch` -> ``(distance_loss, depth_loss)`` scalars."""
        _check_input(g, self.input_dim, name="g")
        if isinstance(trees, PackedTreeBatch):  # g [1, T, E]: the sequences laid out padded (cached per batch)
            if g.dim() != 3 or tuple(g.shape[:2]) != (1, trees.num_tokens):
                raise ValueError(f"g must be one packed row [1, T, E] with T = {trees.num_tokens}, got "
                                 f"{tuple(g.shape)}")
            sequence, position, lengths, distance, depth = trees.padded_layout()
            padded = g.new_zeros((trees.num_sequences, trees.max_seqlen, g.shape[-1]))
            g = padded.index_put((sequence, position), g[0])
        else:
            _check_treebatch(trees)
            lengths, distance, depth = trees.lengths, trees.distance, trees.depth
        if self.variant == "package":
            return reference.structural_probe_loss(g, self.proj, distance, depth, lengths)
        return VR.probe_losses(g, self.proj, self.depth_proj, distance, depth, lengths,
                               squared=self.variant == "paper")

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}, rank={self.rank}, variant={self.variant!r}"


class TreePredictor(nn.Module):
    """A biaffine arc scorer on hidden states, trained on gold (or parsed) heads, decoding to well-formed trees:
    syntax without a parser at inference.

    Two small MLPs give each word a head view ``a_h`` and a dependent view ``b_d`` (``[B, N, arc_size]``); the arc
    score of head ``h`` for dependent ``d`` is ``b_d^T U a_h + a_h . u`` (Dozat and Manning's biaffine form: ``u`` a
    prior on being a head), and the score of ``d`` being the root word is ``b_d . r + r_0``, written on the diagonal
    (:func:`syntaxkernels.trees.decode_tree`'s convention). :meth:`loss` is the cross-entropy over each word's
    heads (its root option included); :meth:`predict` decodes the maximum spanning tree with one root word
    (Chu-Liu/Edmonds) into a :class:`TreeBatch`, the structure plan the ops take.

    Args:
        hidden_size: E, the width of the hidden states.
        arc_size: width of the head and dependent views (default 128).
        dropout: on the views in training mode (default 0).
    Parameters: ``head_mlp``, ``dep_mlp`` (Linear E -> arc_size, then LeakyReLU), ``weight [arc_size, arc_size]``
    (zero init, as in the biaffine parser), ``head_bias [arc_size]``, ``root [arc_size]``, ``root_bias []``.
    """

    def __init__(self, hidden_size: int, arc_size: int = 128, *, dropout: float = 0.0):
        super().__init__()
        if hidden_size <= 0 or arc_size <= 0:
            raise ValueError(f"hidden_size and arc_size must be positive, got {hidden_size} and {arc_size}")
        self.hidden_size = hidden_size
        self.arc_size = arc_size
        self.head_mlp = nn.Linear(hidden_size, arc_size)
        self.dep_mlp = nn.Linear(hidden_size, arc_size)
        self.dropout = nn.Dropout(dropout)
        self.weight = nn.Parameter(torch.zeros(arc_size, arc_size))
        self.head_bias = nn.Parameter(torch.zeros(arc_size))
        self.root = nn.Parameter(torch.zeros(arc_size))
        self.root_bias = nn.Parameter(torch.zeros(()))

    @staticmethod
    def _lengths(hidden: torch.Tensor, lengths) -> torch.Tensor:
        B, N = hidden.shape[0], hidden.shape[1]
        if lengths is None:
            return torch.full((B,), N, dtype=torch.int64, device=hidden.device)
        lengths = torch.as_tensor(lengths, device=hidden.device)
        if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.dim() != 1 or lengths.shape[0] != B:
            raise ValueError(f"lengths must be integers [B] = [{B}], got {lengths.dtype} {tuple(lengths.shape)}")
        bad = ((lengths < 0) | (lengths > N)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            raise ValueError(f"batch item {b}: lengths[{b}] = {int(lengths[b])} is out of range 0..{N}")
        return lengths.to(torch.int64)

    def forward(self, hidden: torch.Tensor, lengths=None) -> torch.Tensor:
        """``hidden [B, N, E]``, lengths int ``[B]`` (None: all N) -> arc scores ``[B, N, N]`` (``scores[b, h, d]``
        head h for dependent d, the diagonal the root-word score), ``-inf`` where ``h`` or ``d`` is padding."""
        _check_input(hidden, self.hidden_size, name="hidden")
        lengths = self._lengths(hidden, lengths)
        N = hidden.shape[1]
        heads_view = self.dropout(F.leaky_relu(self.head_mlp(hidden), 0.1))
        deps_view = self.dropout(F.leaky_relu(self.dep_mlp(hidden), 0.1))
        scores = torch.einsum("bha,ac,bdc->bhd", heads_view, self.weight, deps_view)
        scores = scores + (heads_view @ self.head_bias).unsqueeze(-1)
        root = deps_view @ self.root + self.root_bias  # [B, N]
        eye = torch.eye(N, dtype=torch.bool, device=hidden.device)
        scores = torch.where(eye, root.unsqueeze(1).expand_as(scores), scores)
        valid = torch.arange(N, device=hidden.device) < lengths.unsqueeze(1)  # [B, N]
        pair = valid.unsqueeze(2) & valid.unsqueeze(1)
        return scores.masked_fill(~pair, float("-inf"))

    def loss(self, hidden: torch.Tensor, heads, lengths=None, scores: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Mean cross-entropy over the batch's words of the gold head (or the root option, the diagonal) among each
        word's candidates ``0 .. length-1``.

        Args:
            hidden: ``[B, N, E]``.
            heads: gold heads int ``[B, N]`` (0-based, -1 for a root; padding ignored), or a :class:`TreeBatch`
                (its heads and lengths; ``lengths`` must then be None).
            lengths: int ``[B]``; None: all N (or the TreeBatch's).
            scores: this module's ``forward(hidden, lengths)`` when already computed.
        Raises ValueError naming the batch item and word for a gold head out of range.
        """
        if isinstance(heads, TreeBatch):
            if lengths is not None:
                raise ValueError("TreePredictor.loss: give lengths or a TreeBatch, not both")
            heads, lengths = heads.heads, heads.lengths
        lengths = self._lengths(hidden, lengths)
        heads = torch.as_tensor(heads, device=hidden.device)
        B, N = hidden.shape[0], hidden.shape[1]
        if heads.shape != (B, N) or heads.is_floating_point() or heads.dtype == torch.bool:
            raise ValueError(f"heads must be integers [B, N] = [{B}, {N}], got {heads.dtype} {tuple(heads.shape)}")
        heads = heads.to(torch.int64)
        valid = torch.arange(N, device=hidden.device) < lengths.unsqueeze(1)
        bad = (valid & ((heads < -1) | (heads >= lengths.unsqueeze(1)) |
                        (heads == torch.arange(N, device=hidden.device)))).nonzero()
        if bad.numel():
            b, d = (int(i) for i in bad[0])
            raise ValueError(f"batch item {b}, word {d}: gold head {int(heads[b, d])} out of range (expected -1 "
                             f"for the root or 0..{int(lengths[b]) - 1} other than {d})")
        if scores is None:
            scores = self(hidden, lengths)
        target = torch.where(heads < 0, torch.arange(N, device=hidden.device).expand(B, N), heads)
        # Over heads h, per dependent d; a padding dependent's column (all -inf) is zeroed so no NaN reaches the
        # gradient.
        log_probs = torch.log_softmax(scores.float().masked_fill(~valid.unsqueeze(1), 0.0), dim=1)
        picked = log_probs.gather(1, target.clamp(0, max(N - 1, 0)).unsqueeze(1)).squeeze(1)  # [B, N]
        count = valid.sum()
        if int(count) == 0:
            return scores.sum() * 0.0
        return -(picked.masked_fill(~valid, 0.0)).sum() / count

    @torch.no_grad()
    def predict(self, hidden: torch.Tensor, lengths=None, *, backend: str = "auto") -> TreeBatch:
        """The maximum spanning tree with one root word of each sentence
        (:func:`~syntaxkernels.trees.decode_tree` on :meth:`forward`'s scores): a :class:`TreeBatch` on
        ``hidden``'s device, ``lengths`` as given (None: all N)."""
        from .trees.decode import decode_tree

        lengths = self._lengths(hidden, lengths)
        heads = decode_tree(self(hidden, lengths), lengths, backend=backend)
        return TreeBatch.from_heads(heads.cpu(), lengths.cpu()).to(hidden.device)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, arc_size={self.arc_size}"


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

    Freshly initialised, the "bias" layer and the ``variant="package"`` "gat" layer compute exactly what
    ``nn.TransformerEncoderLayer`` with the same weights computes on the valid tokens; in training mode they
    drop attention probabilities as it does, each with its own random mask (see the module docstring).

    Args:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias:
            as in ``nn.TransformerEncoderLayer``.
        method: "bias", "subnetwork" or "gat".
        buckets, per_head: for "bias".
        masks: for "subnetwork".
        window: for "bias": attention only where ``d(i, j) <= window``.
        syntax_dim, syntax_heads, syntax_targets: for "gat" (``syntax_dim`` defaults to ``d_model``;
            ``syntax_targets`` None: the variant's).
        backend: "auto", "triton" or "reference".
        variant: for "subnetwork" and "gat": "paper" (default), "release" or "package" (the fresh "gat" layer
            equals ``nn.TransformerEncoderLayer`` only with "package": the others start their syntax heads as the
            release does).
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Union[str, Callable] = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True, method: str = "bias",
                 buckets: BucketSpec = BucketSpec(), per_head: bool = False, masks: MaskSpec = MaskSpec(),
                 window: Optional[int] = None, syntax_dim: Optional[int] = None, syntax_heads: int = 1,
                 syntax_targets: Optional[Sequence[str]] = None, backend: str = "auto", *,
                 variant: str = VR.DEFAULT_VARIANT):
        super().__init__()
        if method == "bias":
            self.self_attn = SyntaxBiasedSelfAttention(d_model, nhead, buckets=buckets, per_head=per_head,
                                                       dropout=dropout, bias=bias, backend=backend)
        elif method == "subnetwork":
            self.self_attn = SyntaxBertSelfAttention(d_model, nhead, masks=masks, dropout=dropout, bias=bias,
                                                     backend=backend, variant=variant)
        elif method == "gat":
            self.self_attn = SyntaxHeadSelfAttention(d_model, nhead, syntax_dim or d_model, syntax_heads,
                                                     syntax_targets, dropout=dropout, bias=bias, variant=variant)
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
        _check_input(src, self.self_attn.embed_dim, "src", trees=trees, batch_first=self.batch_first)
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


# ----------------------------------------------------------------------------------------------------------
# Optimizer parameter groups: the syntax parameters at their own learning rate
# ----------------------------------------------------------------------------------------------------------

#: The syntax learning rate :func:`syntax_param_groups` uses when none is given (``max(lr, DEFAULT_SYNTAX_LR)``).
#: Chosen from ``benchmarks/syntax_lr.py`` (pre-trained all-MiniLM-L6-v2 fine-tuned for UPOS tagging on UD
#: English-EWT dev, method "bias", 60 steps; benchmarks/RESULTS.md, "Syntax learning rate"): see there for the
#: figures and why.
DEFAULT_SYNTAX_LR = 1e-2

#: The learning rate :func:`syntax_param_groups` gives a :class:`TreePredictor` (the ``SyntaxTreePredictor`` of
#: ``trees="predicted"`` included) when none is given (``max(lr, DEFAULT_PREDICTOR_LR)``): the Adam rate of the
#: biaffine parser it follows (Dozat and Manning), and the rate of the two runs in benchmarks/RESULTS.md that
#: measured the predictor ("Predicted trees: held-out UAS ...", "Predicted trees in a fine-tuned MiniLM").
DEFAULT_PREDICTOR_LR = 2e-3


def _syntax_parameter_kinds(model: nn.Module):
    """``{id(p): (name, decays)}`` of the syntax parameters of ``model``, found by module type.

    Distance tables and bias scales (:class:`DistanceBias`) and the topical attention (:class:`TopicalAttention`,
    started at zeros / identity, so decay would pull it away from what a fresh module does) do not decay; the
    syntax-head injection (:class:`SyntaxHeads`' ``syntax_proj``), the GAT (:class:`SyntaxGAT`) and the probe
    (:class:`StructuralProbeLoss`) are ordinary weight matrices and decay as given. Projections of the
    self-attention modules (``q_proj`` ...) are not syntax parameters.
    """
    found = {}

    def put(name, p, decays):
        if id(p) in found and found[id(p)][1] != decays:
            other = found[id(p)][0]
            raise ValueError(f"parameter {name} is also {other}: one is a table or scale (no weight decay), the other a "
                             "weight matrix (decay), so it would be in two groups; a parameter can be in one group only")
        found.setdefault(id(p), (name, decays))

    def add(prefix, module, decays):
        for name, p in module.named_parameters(prefix=prefix, remove_duplicate=False):
            put(name, p, decays)

    for name, module in model.named_modules():
        dot = f"{name}." if name else ""
        if isinstance(module, DistanceBias):
            for attr in ("distance_bias", "bias_scale"):
                p = getattr(module, attr)
                if p is not None:
                    put(dot + attr, p, False)
        elif isinstance(module, TopicalAttention):
            add(name, module, False)
        elif isinstance(module, SyntaxHeads):
            add(dot + "syntax_proj", module.syntax_proj, True)
        elif isinstance(module, (SyntaxGAT, StructuralProbeLoss)):
            add(name, module, True)
    return found


def _predictor_parameters(model: nn.Module, kinds) -> Dict[int, str]:
    """``{id(p): name}`` of the parameters of every :class:`TreePredictor` in ``model``; ``ValueError`` for one that
    is also a syntax parameter of ``kinds`` (it would be in two groups)."""
    found: Dict[int, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, TreePredictor):
            for pname, p in module.named_parameters(prefix=name, remove_duplicate=False):
                if id(p) in kinds:
                    raise ValueError(f"parameter {pname} of a TreePredictor is also {kinds[id(p)][0]}, a syntax "
                                     "parameter of another group; a parameter can be in one group only")
                found.setdefault(id(p), pname)
    return found


def syntax_param_groups(model: nn.Module, lr: float, syntax_lr: Optional[float] = None,
                        weight_decay: float = 0.0, *, predictor_lr: Optional[float] = None,
                        predictor_weight_decay: float = 0.0) -> list:
    """Optimizer parameter groups that give the syntax parameters, and a tree predictor, learning rates of their own.

    A zero-initialised distance table moves by about the learning rate per Adam step, so at a fine-tuning rate
    (1e-4) it stays far too small to change attention in the steps a fine-tuning run takes; this puts the syntax
    parameters at ``syntax_lr``, a :class:`TreePredictor` (the ``SyntaxTreePredictor`` of
    ``enable_syntax_attention(..., trees="predicted")``) at ``predictor_lr``, and leaves everything else as it was::

        optimizer = torch.optim.AdamW(sk.syntax_param_groups(model, lr=1e-4, weight_decay=0.01))

    Args:
        model: any module holding syntax modules: a transformers model after ``enable_syntax_attention`` (any
            method), an :mod:`syntaxkernels.nn` module or a model built from them (a ``DistributedDataParallel``
            or ``DataParallel`` wrapper is looked through).
        lr: the learning rate of every other parameter (> 0).
        syntax_lr: the learning rate of the syntax parameters (> 0); None: ``max(lr, DEFAULT_SYNTAX_LR)``.
        weight_decay: the weight decay of every other parameter and of the syntax weight matrices (the GAT, the
            probe, the syntax-head injection); distance tables, bias scales and the topical attention get none.
        predictor_lr: the learning rate of every :class:`TreePredictor`'s parameters (> 0); None:
            ``max(lr, DEFAULT_PREDICTOR_LR)`` (2e-3). The predictor is a freshly initialised parser head (its
            biaffine weight, root vector and biases start at zero) trained by its own loss on top of the encoder,
            like a biaffine parser: at the model's fine-tuning rate it learns slowly; 2e-3 is the biaffine parser's
            Adam rate and the rate its measured runs used (benchmarks/RESULTS.md).
        predictor_weight_decay: its weight decay (>= 0; default 0: the measured runs trained it without decay).

    Returns:
        a list of up to four dicts for ``torch.optim`` (each ``{"params", "lr", "weight_decay", "name"}``; groups
        without parameters are left out): ``"syntax"`` (syntax parameters without decay, at ``syntax_lr``),
        ``"syntax_decay"`` (syntax weight matrices, at ``syntax_lr`` with ``weight_decay``), ``"predictor"`` (the
        tree predictors' parameters, at ``predictor_lr`` with ``predictor_weight_decay``) and ``"other"`` (every
        other parameter, at ``lr`` with ``weight_decay``). Only parameters with ``requires_grad`` are included;
        together the groups hold each of them exactly once.

    Raises:
        ``TypeError`` for a ``model`` that is not an ``nn.Module``; ``ValueError`` for a learning rate that is not
        positive, a negative weight decay, a model without trainable syntax or predictor parameters (e.g. one on
        which ``enable_syntax_attention`` was not called), or a parameter that would land in two groups (one shared
        between a distance table / scale / topical attention and a GAT, probe or injection weight, or between a
        predictor and another syntax module). A parameter tied elsewhere in the model (registered under two names)
        is one parameter, listed once.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module  # the wrapper holds no parameters of its own
    for what, value in (("lr", lr), ("syntax_lr", syntax_lr), ("predictor_lr", predictor_lr)):
        if value is None and what != "lr":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    for what, value in (("weight_decay", weight_decay), ("predictor_weight_decay", predictor_weight_decay)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    syntax_lr = max(float(lr), DEFAULT_SYNTAX_LR) if syntax_lr is None else float(syntax_lr)
    predictor_lr = max(float(lr), DEFAULT_PREDICTOR_LR) if predictor_lr is None else float(predictor_lr)
    kinds = _syntax_parameter_kinds(model)
    predictor = _predictor_parameters(model, kinds)
    groups = {"syntax": [], "syntax_decay": [], "predictor": [], "other": []}
    for p in model.parameters():  # each parameter once, tied ones too
        if p.requires_grad:
            if id(p) in predictor:
                key = "predictor"
            else:
                key = "other" if id(p) not in kinds else ("syntax_decay" if kinds[id(p)][1] else "syntax")
            groups[key].append(p)
    if not groups["syntax"] and not groups["syntax_decay"] and not groups["predictor"]:
        frozen = [name for name, _ in kinds.values()] + list(predictor.values())
        raise ValueError("the model has no trainable syntax parameters" + (
            f" (the syntax parameters {frozen[:4]} have requires_grad=False)" if frozen else
            " (no DistanceBias, TopicalAttention, SyntaxHeads, SyntaxGAT, StructuralProbeLoss or TreePredictor "
            "module: call enable_syntax_attention(model, ...) first, or build the model from syntaxkernels.nn "
            "modules)"))
    settings = {"syntax": (syntax_lr, 0.0), "syntax_decay": (syntax_lr, float(weight_decay)),
                "predictor": (predictor_lr, float(predictor_weight_decay)),
                "other": (float(lr), float(weight_decay))}
    return [{"params": params, "lr": settings[key][0], "weight_decay": settings[key][1], "name": key}
            for key, params in groups.items() if params]
