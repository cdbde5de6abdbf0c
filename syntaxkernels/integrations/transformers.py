"""Syntax-aware attention for transformers encoders (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, DistilBERT; ModernBERT
with method "bias"), the encoder of T5 / mT5 and of the translation models BART, mBART, Marian, M2M100 / NLLB (method
"bias") and decoder-only language models (GPT-2, Llama, Mistral, Qwen2, Qwen3; method "bias"), in one call.

::

    from syntaxkernels.integrations.transformers import enable_syntax_attention
    model = BertForTokenClassification.from_pretrained("bert-base-multilingual-cased")
    enable_syntax_attention(model, method="bias")            # or "subnetwork", or "gat"
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees)   # trees: sk.TreeBatch, N = seq length

How it plugs in (transformers 5.x):

- The attention runs through transformers' attention-function interface: the function
  :func:`syntax_attention_forward` is registered as ``attn_implementation = "syntaxkernels"`` in
  ``AttentionInterface``, together with a mask function in ``AttentionMaskInterface`` that hands the 2-D
  padding mask (``bool [B, N]``, True = attend) down unchanged instead of expanding it to ``[B, 1, N, N]``.
  ``enable_syntax_attention`` switches the model to that implementation.
- Model families are rows of :data:`FAMILIES` (:class:`ModelFamily`: where the encoder, the layers, the
  self-attention module and its projections live, and how positions are encoded).
- Every patched layer's self-attention module (``...encoder.layer[i].attention.self`` for BERT) gets a child module
  ``syntax`` holding the new parameters, so they sit in ``model.state_dict()``, reach the optimizer through
  ``model.parameters()``, and are saved by ``save_pretrained``. These children are the building blocks of
  :mod:`syntaxkernels.nn` (:class:`~syntaxkernels.nn.DistanceBias`, :class:`~syntaxkernels.nn.Subnetworks`,
  :class:`~syntaxkernels.nn.SyntaxHeads`) with transformers' calling convention; the GAT and the probe are
  :class:`~syntaxkernels.nn.SyntaxGAT` and :class:`~syntaxkernels.nn.StructuralProbeLoss`.
- ``syntax_trees`` (and ``syntax_pos`` for the GAT) are ordinary forward keyword arguments: the model
  classes pass ``**kwargs`` from ``model(...)`` through the encoder and layers to the attention function.
  A forward pre-hook on the encoder checks the trees against the batch (shape, device, padding), moves
  them to the model's device, and for ``method="gat"`` runs the syntax GAT once per forward, adding its
  output ``G`` to the keyword arguments every layer receives. For the paper's and the release's GAT a forward
  pre-hook on the base model hands the word embeddings of the input (its GAT input) on to the encoder. Because the trees and ``G`` travel as
  arguments, gradient checkpointing recomputes layers with the right inputs.

Predicted trees (``trees="predicted", predictor_layer=k``): a :class:`SyntaxTreePredictor` on the output of encoder
layer k (``encoder.syntax``) predicts the token trees when a forward gets no ``syntax_trees``: a forward hook on layer
k decodes them and forward pre-hooks on the layers above hand them on as ``syntax_trees`` (a fresh record per
forward, dropped when the encoder's forward ends; gradient checkpointing recomputes a layer's ``forward`` with the
keyword arguments it got, so with the same trees). With trees given, the predictor's head cross-entropy on them is
:func:`syntax_aux_loss`. :func:`predict_syntax_trees` runs layers ``0..k`` only and returns the trees.

What each method promises for a freshly enabled model (same pre-trained weights); "subnetwork" and "gat" take
``variant="paper" | "release" | "package"`` (docs/semantics.md, "Paper, release and package"):

- ``"bias"``: distance-bias table zeros, ``bias_scale`` 1 -> exactly plain attention; outputs at every
  non-padding token equal the unpatched model's (fp32 rounding aside).
- ``"subnetwork"``: each token mixes its sub-networks evenly (paper: the average of its M outputs, empty rows
  filled with plain attention; release: their sum over sqrt(M); package: the average of the non-empty ones).
  With ``masks`` enabling only ``full`` this is exactly plain attention in every variant; with relation masks
  (the default) a fresh model differs from the pre-trained one: that is the method, not a defect.
- ``"gat"``: ``variant="package"``: the syntax-head injection weights start at zero -> exactly plain attention;
  the GAT and the probe have random (trainable) parameters but do not change the outputs until the injection has
  learned. ``"paper"`` / ``"release"``: the syntax heads start as the release's (N(0, initializer_range), a bias),
  so a fresh model differs a little (paper: its GAT reads the raw word embeddings) or more (release: a
  layer-normalised GAT output).

Other differences from the unpatched model:

- Padding positions: the fused ops give query rows at or beyond a sequence's length a zero attention
  output (``"bias"``, ``"subnetwork"``); hidden states at padding positions therefore differ from plain
  BERT's (which are meaningless anyway). Compare and train on non-padding tokens only. Padding must be
  right padding (valid tokens first), and the trees' lengths must equal the attention mask's.
- Attention dropout: in training mode ``"bias"`` layers drop attention probabilities in the fused op (its
  ``dropout_p``, a seed drawn per call from torch's default generator), as the model's own attention does; layers
  left plain and ``"gat"`` layers keep ordinary attention dropout (SDPA's; on a packed row the varlen op's, a zero
  bias). ``"subnetwork"`` layers drop each
  sub-network's probabilities in the sub-network op (its ``dropout_p``, sub-network m drawing the mask of
  ``stream_seed(seed, m)`` of one seed per call), before the topical mix.
- ``output_attentions=True`` returns no attention weights (the fused ops never form them).
- Encoder-decoder / decoder (``is_decoder``) BERT configurations and cross-attention layers are rejected.

Decoder-only language models (the rows of :data:`FAMILIES` with ``causal=True``: GPT-2, Llama, Mistral, Qwen2,
Qwen3) take ``method="bias"`` (with ``trees="given"``): every syntax layer runs
:func:`syntaxkernels.syntax_bias_attention` with ``causal=True``; the sub-network masks and the GAT read the whole
tree and are refused (``ValueError``). What differs from the encoders:

- Trees: a whole-sentence tree tells token i about the words after it (its distances to earlier tokens can run
  through later ones), so a causal LM trained on it peeks at the future. Build leak-free trees
  (``TreeBatch.from_heads(..., leak_free=True)``, ``TreeCollator(leak_free=True)``, docs/semantics.md "Leak-free
  distances for causal models"): row i is computed on the tree induced on tokens ``0..i``, so no position's output
  depends on a later token or head. Whole-tree batches are accepted (for a model that is only scored on whole
  sentences), but they leak.
- Positions and heads: rotary positions are applied by the model before the attention function, and k, v arrive
  with ``config.num_key_value_heads`` heads (grouped-query attention); they are passed to the op unrepeated. GPT-2
  computes q, k, v with one fused ``Conv1D`` (``c_attn``) and adds learned positions before the layers.
- The base model runs its layers itself (``encoder == ""``): a forward pre-hook on it checks the trees against
  ``input_ids`` (or ``inputs_embeds``) and the padding mask (right padding, as for encoders); its positional
  arguments are read by name.
- Padded batches: ``attention_mask [B, N]`` (right padding) and ``syntax_trees`` (a ``TreeBatch``); layers left
  plain run causal SDPA. Packed batches (``DataCollatorWithFlattening``'s layout, or
  ``TreeCollator(packed=True, leak_free=True)``): ``input_ids [1, T]``, ``position_ids`` restarting at every
  sequence, no attention mask, ``syntax_trees=<PackedTreeBatch>``; attention stays causal within each sequence.
- Generation (``model.generate(input_ids, syntax_trees=trees, ...)`` with the default dynamic KV cache): the trees
  cover the prompt, whose forward (from an empty cache) uses them. A generated token has no tree row, so it gets no
  syntax bias: a forward after cached tokens runs plain attention in every layer, with transformers' own causal mask;
  without a ``window`` this equals giving the token distance 255 (the unreachable bucket, one constant per row, which
  softmax cancels) to every key. The prompt's keys and values in the cache were computed with the bias, so later
  tokens still see the prompt's syntax-aware states. A prompt fed in chunks (a forward that starts inside the trees
  after cached tokens) and static caches raise ``ValueError``; batched prompts of different lengths would need left
  padding, which the syntax ops do not take (generate them one length at a time). Beam search and
  ``num_return_sequences`` (``num_beams=k > 1``): ``generate`` repeats every tensor input per beam
  (``repeat_interleave(k)`` along the batch); the trees, not tensors, are repeated the same way by
  :func:`_expand_generate_inputs` (``TreeBatch.repeat_interleave``), set on the model in place of
  ``_expand_inputs_for_generation``.
- Sliding windows (Mistral's ``config.sliding_window``, Qwen2/Qwen3's sliding layers): a padded batch longer than
  the window keeps it (the op's ``position_window``, combined with the tree bias), and so does a packed row (positions
  within each sequence); cached decoding uses transformers' sliding mask.
- Under autocast the rotary positions leave q, k in float32 and v in the autocast dtype: q, k, v go to the autocast
  dtype, as SDPA's autocast rule does.
- ``generate`` checks its keyword arguments against the model's forward: ``enable_syntax_attention`` lets
  ``syntax_trees`` through (``model._validate_model_kwargs``, transformers' check for every other argument), and
  repeats them per beam (``model._expand_inputs_for_generation``, transformers' expansion for the tensors); both are
  ``functools.partial`` objects of the model, copied with it by ``copy.deepcopy`` and pickle.

ModernBERT (the row of :data:`FAMILIES` with ``encoder == ""`` that is not causal) takes ``method="bias"`` with
``trees="given"``:

- Layers: global layers (``config.layer_types`` ``"full_attention"``, every ``global_attn_every_n_layers``-th from
  layer 0) attend every valid key; local layers (``"sliding_attention"``) only keys with ``|i - j| <=
  local_attention // 2`` (transformers passes ``sliding_window = local_attention // 2 + 1`` to the attention function;
  its "sdpa" and "eager" masks are ``|i - j| <= config.sliding_window``). A syntax layer keeps the window as the op's
  ``position_window`` (combined with the tree bias and the lengths), a local layer left plain as a band in its SDPA
  mask; a fresh model therefore gives the unpatched model's outputs on valid tokens.
- Positions: rotary, applied by the attention module before the attention function (separate ``rope_theta`` for
  global and local layers); q, k, v come from one fused ``Wqkv``.
- The base model runs its layers itself (``encoder == ""``): a forward pre-hook on it checks the trees against
  ``input_ids`` (or ``inputs_embeds``) and the 2-D padding mask (right padding, any 0/1 dtype); a precomputed dict of
  masks is refused. The model code of transformers 5 (5.24 tested) no longer unpads ModernBERT batches
  (``reference_compile`` and the unpadded flash path are gone from its forward; a flash implementation unpads inside
  its own attention function, which the integration replaces): the integration runs the padded batch. Packed rows
  (``position_ids`` restarting, no mask, a ``PackedTreeBatch``) keep the local window too (positions within each
  sequence).
- "subnetwork", "gat" and ``trees="predicted"`` are refused (``ValueError``, :attr:`ModelFamily.limits`): the
  sub-network op takes no positional window, and there is no encoder module whose input the GAT reads or whose
  layers the tree predictor hooks.

T5 and mT5 (the rows of :data:`FAMILIES` with ``seq2seq=True``; Flan-T5 is T5) take ``method="bias"`` with
``trees="given"`` in the **encoder's self-attention only**:

- Positions: T5's bucketed relative-position bias (layer 0's ``relative_attention_bias``, an ``nn.Embedding [P, H]``
  every encoder layer shares) is added inside the op (``position_buckets=RelativePositionSpec(P, max_distance,
  bidirectional=True)``, ``position_table = weight.T``, a view, so the gradient reaches the Embedding), beside the tree
  bias; T5 does not scale the scores (``scaling`` 1.0 is passed on). A forward pre-hook on the encoder stack
  (``model.encoder``, which embeds the input itself) checks the trees against ``input_ids`` (or ``inputs_embeds``) and
  the 0/1 padding mask (right padding) and hands every layer the keyword ``syntax_relative_position = (spec, table)``
  (recomputed layers under gradient checkpointing get it again). A layer left plain (``layers=``) runs SDPA with T5's
  own ``position_bias [1, H, N, N]``, which T5's layer 0 builds (``compute_bias``). When every layer of the stack is
  a syntax layer nothing reads it: a forward pre-hook on layer 0's self-attention
  (:func:`_unused_position_bias_pre_hook`) hands it an empty placeholder, so T5 skips ``compute_bias`` (the decoder
  with ``decoder_trees=True`` likewise in its forward with target trees; its cached decoding steps build the bias for
  their plain attention).
- The decoder (its self-attention and the cross-attention) is untouched: only the encoder stack is switched to the
  syntaxkernels attention implementation (the rest of the model keeps its own; ``"sdpa"`` when it was loaded from a
  syntax checkpoint), and a forward pre-hook on the decoder drops ``syntax_trees`` (the model's forward passes its
  keyword arguments to both stacks). With ``decoder_trees=True`` the decoder's self-attention takes target trees
  too (below, "Translation models", "Target trees"): for T5 the op adds the decoder's own relative-position term
  beside the tree bias (causal buckets, ``bidirectional=False``; the decoder's layer-0 table), and while decoding with
  a cache the plain attention keeps T5's ``position_bias``.
- ``model.generate(input_ids, attention_mask=..., syntax_trees=trees, ...)``: the encoder runs once, with the trees;
  the decoder decodes plainly from the syntax-aware encoder states. With ``num_beams > 1`` the encoder runs on the B
  items before ``generate`` repeats its inputs (and the trees, :func:`_expand_generate_inputs`) per beam.
- "subnetwork", "gat", ``trees="predicted"`` and packed trees are refused (``ValueError``): the sub-network op and the
  GAT take no relative-position table.
- ``torch.compile``: the forward traces in one graph (``fullgraph=True`` with ``backend="aot_eager"`` tested for T5
  and BART with source and target trees): the position buckets of each stack (a
  :class:`~syntaxkernels.RelativePositionSpec`, whose construction reads its bucket table to the host) are built once
  by :func:`enable_syntax_attention` and kept on the stack as ``syntax_position_spec``.
- A new encoder-decoder family laid out like T5 is two things: its row of :data:`FAMILIES` (``seq2seq=True``) and its
  tests; T5 itself took the rows, the ``seq2seq`` field, the encoder-stack and decoder hooks, one branch of
  :func:`syntax_attention_forward` (:func:`_t5_encoder_attention`) and the position arguments of
  :class:`SyntaxDistanceBias` (docs/api.md, "T5 and mT5").

Translation models: BART, mBART, Marian (``MarianMTModel``) and M2M100 (``M2M100ForConditionalGeneration``; NLLB is
M2M100), the other rows with ``seq2seq=True``, take ``method="bias"`` with ``trees="given"`` in the **encoder's
self-attention only** (source trees), as T5 does (same hooks, same refusals, same ``generate``):

- Positions: absolute (learned for BART and mBART, sinusoidal for Marian and M2M100), added to the token embeddings
  before the encoder layers; the rows have ``relative_positions=False``, so the encoder hook hands on no position
  table and a layer takes the generic branch of :func:`syntax_attention_forward`: the tree bias added to ``q.k *
  scaling`` (the module's ``scaling``, 1/sqrt(D), as transformers passes it).
- One attention class (``BartAttention`` and its copies) serves the encoder's self-attention, the decoder's
  (``is_causal=True``) and the cross-attention, each reading ``self.config._attn_implementation``, and the encoder and
  the decoder are built from one config object: :func:`enable_syntax_attention` gives the encoder stack a config copy
  of its own (:func:`_own_encoder_config`) before switching it, so only the encoder's self-attention layers run the
  syntaxkernels attention (and only they get ``syntax`` children); the decoder keeps its implementation.
- Target trees (``enable_syntax_attention(model, "bias", decoder_trees=True)``; T5 and mT5 too, with their decoder's
  relative-position term as above): every decoder layer's self-attention
  gets a causal :class:`SyntaxDistanceBias` too (``model.decoder.layers.{i}.self_attn.syntax``; T5:
  ``decoder.block.{i}.layer.0.SelfAttention.syntax``; the same bucket,
  per-head, scale and window arguments) and the decoder stack switches to the syntaxkernels attention as well: its
  self-attention runs as a decoder-only family's layer (:func:`_causal_attention`, ``is_causal``), its
  cross-attention (not causal, no ``syntax`` child) plain attention over the valid source tokens. Forward:
  ``model(..., syntax_trees=source, decoder_input_ids=..., decoder_attention_mask=..., decoder_syntax_trees=target)``
  (right padding; leak-free trees, ``TreeBatch.from_heads(..., leak_free=True)``, for training: the causal op keeps
  keys ``j <= i`` and leak-free distances keep later heads out of row i). The decoder's pre-hook
  (:func:`_target_trees_pre_hook`) hands ``decoder_syntax_trees`` on as the layers' ``syntax_trees`` and checks them
  as :func:`_decoder_pre_hook` does. ``generate(..., syntax_trees=source, decoder_syntax_trees=prompt)``: the trees of
  ``decoder_input_ids`` (the start token alone: ``TreeBatch.from_heads([[-1]] * B)``) bias the decoder's first
  forward; generated tokens have no tree rows and attend plainly, as in a decoder-only family. With ``num_beams >
  1`` the target trees are repeated per beam as the decoder prompt is (:func:`_expand_generate_inputs`).

Saving and loading: ``enable_syntax_attention`` records its arguments in ``model.config.syntax_attention``
(a JSON-serialisable dict), so ``save_pretrained`` writes them to ``config.json`` and the syntax parameters
to the weights file. :func:`load_syntax_model` reloads both (reading the syntax parameters back is
:mod:`syntaxkernels.integrations.checkpoint`). A plain ``from_pretrained`` would drop the syntax parameters as
unexpected keys, so the saved ``config.json`` names the attention implementation
:data:`SAVED_ATTN_IMPLEMENTATION`: without this module imported, transformers refuses to load it (its error
quotes that name, which says to use ``load_syntax_model``); with this module imported the model loads but its
first forward raises a ``ValueError`` saying the same. Never a model that silently ignores its trees.

POS ids for the GAT: :func:`token_pos_ids` and :data:`UPOS_TAGS` (from :mod:`syntaxkernels.integrations.upos`).

Fine-tuning: at a fine-tuning learning rate (1e-4) the zero-initialised syntax parameters barely move; give them
their own rate with ``torch.optim.AdamW(syntaxkernels.syntax_param_groups(model, lr=1e-4, weight_decay=0.01))``
(README, "Fine-tuning: make the syntax parameters learn").

Errors: ``TypeError`` for an argument of the wrong kind (a model that is not a transformers model, trees that
are not a TreeBatch, a ``buckets`` that is neither a BucketSpec nor a dict), ``ValueError`` for a wrong value
(an unsupported architecture, an unknown method, a window out of range, trees that do not match the batch).

Distributed training: the syntax parameters are ordinary parameters of the model, so
``DistributedDataParallel`` and FSDP (``fully_shard`` per ``encoder.layer[i]``, then the model; the GAT and
the probe live in ``encoder`` and shard with the root) synchronise them like any other
(``python_tests/test_distributed.py`` checks both on CPU with gloo).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

import transformers
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.pytorch_utils import Conv1D

from .. import _validation as V
from .. import variants as VR
from ..nn import (DistanceBias, StructuralProbeLoss, Subnetworks, SyntaxGAT, SyntaxHeads, TreePredictor,
                  _check_pos_ids, _packed_plain)
from ..plan import StructurePlan
from ..specs import BucketSpec, MaskSpec
from ..trees.batch import TreeBatch
from ..trees.packed import PackedTreeBatch
from ..trees.relations import RelationBatch
from .checkpoint import quiet_syntax_keys_report, restore_parameters
from .upos import UPOS_TAGS, token_pos_ids

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FAMILIES",
    "REFUSED_FAMILIES",
    "ModelFamily",
    "encoder_layers",
    "SAVED_ATTN_IMPLEMENTATION",
    "METHODS",
    "DEFAULT_GAT_CONFIG",
    "enable_syntax_attention",
    "load_syntax_model",
    "syntax_aux_loss",
    "predict_syntax_trees",
    "TREES",
    "SyntaxTreePredictor",
    "syntax_attention_forward",
    "syntax_parameters",
    "token_pos_ids",
    "UPOS_TAGS",
    "SyntaxDistanceBias",
    "SyntaxSubnetworks",
    "SyntaxHeadInjection",
]

ATTN_IMPLEMENTATION = "syntaxkernels"

#: The attention implementation that the ``config.json`` of a saved syntax model names (``enable_syntax_attention``
#: records it as ``config.attn_implementation``). A plain ``from_pretrained`` of such a checkpoint would drop the
#: syntax parameters, so it must not give a working model: without this module imported transformers rejects the
#: name, and its error quotes the name, which says how to load the model; with this module imported the name is
#: registered to :func:`_dropped_syntax_guard`, which raises at the first forward. :func:`load_syntax_model`
#: switches the loaded model to :data:`ATTN_IMPLEMENTATION`.
SAVED_ATTN_IMPLEMENTATION = ("syntaxkernels - this checkpoint was saved with syntax attention, load it with "
                             "syntaxkernels.integrations.transformers.load_syntax_model")
METHODS = ("bias", "subnetwork", "gat")
#: Where the trees of a forward come from: ``"given"`` (``syntax_trees=`` on every forward) or ``"predicted"`` (a
#: :class:`SyntaxTreePredictor` on the output of one encoder layer predicts them when none are given).
TREES = ("given", "predicted")

#: Defaults of ``gat_config`` (the paper's GAT shape, Appendix B; ``num_pos_tags=None``: the variant's, 21 for
#: "paper" and "release", 18 for "package"; ``probe_rank=None`` leaves the structural probe off).
DEFAULT_GAT_CONFIG: Dict[str, Any] = {
    "num_layers": 4,
    "num_heads": 4,
    "head_dim": 64,
    "window": 4,
    "num_pos_tags": None,
    "probe_rank": None,
}


# ----------------------------------------------------------------------------------------------------------
# Per-layer parameter holders (child module ``syntax`` of each patched self-attention module): the nn building
# blocks, called the way syntax_attention_forward calls them
# ----------------------------------------------------------------------------------------------------------


class SyntaxDistanceBias(DistanceBias):
    """Method "bias" in one transformers layer: :class:`syntaxkernels.nn.DistanceBias` with the layer's window.

    ``s_ij = q_i.k_j * scale + c * table[bucket(d_ij)]``. Parameters ``distance_bias`` (``[T]`` shared,
    ``[H, T]`` per head; zeros) and ``bias_scale`` (``[1]``, ones; None when ``learnable_scale=False``): a fresh
    module is plain attention. ``window``: None or an int in 0..254 (``ValueError`` otherwise). ``causal``: keys
    ``j <= i`` only (the layers of a decoder-only family). ``relations``: R relations per score (the trees a
    :class:`~syntaxkernels.RelationBatch`; tables ``[R, T]`` / ``[R, H, T]``, strengths ``[R]``).
    """

    def __init__(self, num_heads: int, buckets: BucketSpec, per_head: bool = False, learnable_scale: bool = True,
                 window: Optional[int] = None, backend: str = "auto", *, causal: bool = False,
                 relations: Optional[int] = None):
        V.check_window(window)
        super().__init__(num_heads, buckets, per_head, learnable_scale, backend, relations=relations)
        self.window = window
        self.causal = bool(causal)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees: TreeBatch,
                scale: Optional[float] = None, dropout_p: float = 0.0,
                position_window: Optional[int] = None, position_buckets=None,
                position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``q [B, H, N, D]``, ``k, v [B, H_kv, N, D]`` (``H % H_kv == 0``: grouped-query attention, k and v not
        repeated), the batch's :class:`TreeBatch` -> ``[B, H, N, D]`` (padding query rows 0); ``dropout_p``:
        attention dropout on the probabilities; ``position_window``: keys with ``|i - j| <= position_window`` only
        (a decoder's sliding window); ``position_buckets`` (a :class:`~syntaxkernels.RelativePositionSpec`) and
        ``position_table [H, P]``: T5's relative-position bias, added in the op."""
        return self.attend(q, k, v, trees, scale=scale, window=self.window, causal=self.causal, dropout_p=dropout_p,
                           position_window=position_window, position_buckets=position_buckets,
                           position_table=position_table)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", window={self.window}" + (", causal=True" if self.causal else "")


class SyntaxSubnetworks(Subnetworks):
    """Method "subnetwork" in one transformers layer: :class:`syntaxkernels.nn.Subnetworks`, M masked
    sub-networks sharing the layer's Q, K, V, mixed per token by the child ``topical``
    (:class:`syntaxkernels.nn.TopicalAttention`; query zeros, ``key_weight``/``value_weight`` identity, so a
    fresh module averages the non-empty sub-networks). In training mode the layer's attention dropout drops each
    sub-network's probabilities (the op's ``dropout_p``, one seed per call)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees: TreeBatch,
                scale: Optional[float] = None, dropout_p: float = 0.0) -> torch.Tensor:
        """``q, k, v [B, H, N, D]`` -> ``[B, H, N, D]`` (0 where every mask of a token is empty); ``dropout_p``:
        attention dropout on each sub-network's probabilities (sub-network m: the mask of
        ``reference.stream_seed(seed, m)``, the seed drawn by :func:`syntaxkernels.nn.draw_dropout_seed`)."""
        return self.attend(q, k, v, trees, scale=scale, dropout_p=dropout_p)


class SyntaxHeadInjection(SyntaxHeads):
    """Method "gat" in one transformers layer: :class:`syntaxkernels.nn.SyntaxHeads`, ``t_h += G W_t (+ b_t)`` for
    the first ``syntax_heads`` heads and each target t of ``targets``.

    ``syntax_proj[t]`` is ``nn.Linear(syntax_dim, syntax_heads * D)``: for ``variant="package"`` without a bias and
    with zero weights, so a fresh layer is plain attention; for "paper" and "release" with a bias, initialised as
    the release does (N(0, ``initializer_range``), bias 0). The attention itself stays ordinary softmax attention.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v [B, H, N, D]``, ``G [B, N, syntax_dim]`` -> updated ``(q, k, v)``."""
        return self.inject(q, k, v, g)


class SyntaxTreePredictor(TreePredictor):
    """``trees="predicted"``: the encoder's child ``syntax``, a :class:`syntaxkernels.nn.TreePredictor` (biaffine arc
    scorer, Chu-Liu/Edmonds decoding) on the hidden states output by encoder layer ``layer``.

    When a forward gets no ``syntax_trees`` it predicts the token trees of the batch from that layer's output
    (:meth:`TreePredictor.predict` over each row's valid tokens) and the syntax layers above ``layer`` use them; when
    ``syntax_trees`` are given its head cross-entropy on them is :func:`syntax_aux_loss`. ``predicted_tree_ratio``:
    in training mode with trees given, the share of forwards (drawn per forward from torch's default generator)
    whose syntax layers use the predicted trees instead (the loss is still on the given trees).
    """

    def __init__(self, hidden_size: int, layer: int, arc_size: int = 128, predicted_tree_ratio: float = 0.0):
        super().__init__(hidden_size, arc_size)
        self.layer = layer
        self.predicted_tree_ratio = predicted_tree_ratio

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layer={self.layer}, predicted_tree_ratio={self.predicted_tree_ratio}"


# ----------------------------------------------------------------------------------------------------------
# The attention function and the mask function registered with transformers
# ----------------------------------------------------------------------------------------------------------


def _plain_attention(q, k, v, valid: Optional[torch.Tensor], dropout: float, scale: Optional[float],
                     band: Optional[int] = None):
    """Ordinary softmax attention over the valid keys (what transformers' "sdpa" implementation computes), and only
    keys with ``|i - j| <= band`` when given (a local layer's sliding window)."""
    mask = None if valid is None else valid[:, None, None, :]
    if band is not None:
        n = q.shape[2]
        near = torch.ones(n, n, dtype=torch.bool, device=q.device).tril(band).triu(-band)
        mask = near if mask is None else mask & near
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)


def _position_band(sliding_window: Optional[int], n: int) -> Optional[int]:
    """The op's ``position_window`` for the ``sliding_window`` transformers passes to the attention function (keys
    with ``|i - j| < sliding_window``: a decoder's ``i - j < W``, ModernBERT's local layers ``local_attention // 2 +
    1``), or None when the window covers every pair of the ``n`` tokens (or there is none)."""
    return sliding_window - 1 if sliding_window is not None and n > sliding_window else None


def _packed_plain_attention(q, k, v, trees: PackedTreeBatch, dropout: float, scale: Optional[float],
                            causal: bool = False, band: Optional[int] = None):
    """Ordinary softmax attention within each sequence of a packed row (``q [1, H, T, D]``, ``k, v [1, H_kv, T,
    D]``): the varlen fused op with a zero bias, attention dropout on its probabilities (as on the padded rows'
    SDPA); ``causal``: keys ``j <= i`` of the sequence only; ``band``: keys with ``|i - j| <= band`` only."""
    q3, k3, v3 = (x[0].transpose(0, 1) for x in (q, k, v))
    return _packed_plain(q3, k3, v3, trees, scale, dropout, causal=causal,
                         position_window=band).transpose(0, 1)[None]


def _causal_plain_attention(q, k, v, valid: Optional[torch.Tensor], dropout: float, scale: Optional[float],
                            band: Optional[int] = None):
    """Causal softmax attention over the valid keys ``j <= i`` (and ``i - j <= band`` when given: a sliding window)
    (``q [B, H, N, D]``, ``k, v [B, H_kv, N, D]``; ``valid bool [B, N]`` or None): what transformers' "sdpa"
    implementation computes for a decoder."""
    gqa = q.shape[1] != k.shape[1]
    if valid is None and band is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale, is_causal=True, enable_gqa=gqa)
    n = q.shape[2]
    lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    if band is not None:
        lower = lower & ~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-band - 1)
    mask = lower if valid is None else valid[:, None, None, :] & lower
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa)


def _same_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v in one dtype. Under autocast, rotary positions (float32 cos and sin) promote q and k while v stays in
    the autocast dtype: all three go to the autocast dtype, as SDPA's autocast rule does; otherwise to the promoted
    dtype."""
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    device = q.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _causal_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float, scaling: Optional[float],
                      trees, sliding_window: Optional[int], relative=None,
                      position_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One layer of a decoder-only family: ``query [B, H, N, D]``, ``key, value [B, H_kv, N_k, D]`` ->
    ``[B, H, N, D]``.

    - No cache yet (``N_k == N``): a syntax layer runs :class:`SyntaxDistanceBias` with ``causal=True`` on the
      trees (checked by the base model's pre-hook); a plain layer runs causal softmax attention (SDPA; on a packed
      row the varlen op with a zero bias, causal within each sequence). A padded batch longer than the layer's
      sliding window keeps it (the op's ``position_window``), a packed row too (positions within each sequence).
    - Decoding with a cache (``N_k > N``): the new tokens have no tree rows (the trees cover the prompt), so every
      layer runs plain attention with transformers' mask (``bool [B, 1, N, N_k]``): the same as distance 255 (the
      unreachable bucket, one constant per row) to every key when the layer has no ``window``.
    - T5's decoder (``decoder_trees=True``): ``relative = (RelativePositionSpec, table)`` (causal buckets) goes to the
      op beside the tree bias; while decoding with a cache T5's own ``position_bias [1, H, N, N_k]`` is added to the
      plain attention's mask.
    """
    part = getattr(module, "syntax", None)
    n, n_k = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    query, key, value = _same_dtype(query, key, value)
    if _is_packed(trees):  # a sliding window: positions within each sequence
        band = _position_band(sliding_window, trees.max_seqlen)
        if isinstance(part, SyntaxDistanceBias):
            return part(query, key, value, trees, scale=scaling, dropout_p=dropout, position_window=band)
        return _packed_plain_attention(query, key, value, trees, dropout, scaling, causal=True, band=band)
    if n != n_k:
        if trees is not None:
            raise ValueError(f"syntax_trees cover the queries, but this layer attends {n_k} keys for {n} queries (a "
                             "static or pre-filled cache): syntax attention needs the prompt's forward to start "
                             "from an empty dynamic cache (the default of generate)")
        if attention_mask is None and n > 1:
            raise ValueError("decoding with a cache needs the causal mask transformers builds (got none)")
        mask = _add_position_bias(attention_mask, position_bias, query)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                              enable_gqa=gqa)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError("the syntaxkernels attention takes a 2-D padding mask [B, N]; got an attention_mask of "
                         f"shape {tuple(attention_mask.shape)} (custom 4-D masks are not supported)")
    # A sliding window W (transformers: key j attended by query i when i - j < W) as the op's positional window.
    band = _position_band(sliding_window, n)
    if isinstance(part, SyntaxDistanceBias):
        if trees is None:
            raise ValueError("this layer uses syntax attention: pass syntax_trees=<TreeBatch> to the model's forward")
        spec, table = relative if relative is not None else (None, None)
        return part(query, key, value, trees, scale=scaling, dropout_p=dropout, position_window=band,
                    position_buckets=spec, position_table=table)
    if position_bias is not None:
        raise ValueError("a plain causal layer with T5's position bias is not supported (every decoder layer of a "
                         "decoder_trees=True model is a syntax layer)")
    return _causal_plain_attention(query, key, value, attention_mask, dropout, scaling, band)


def syntax_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                             scaling: Optional[float] = None, syntax_trees: Optional[TreeBatch] = None,
                             syntax_gat_output: Optional[torch.Tensor] = None, **kwargs):
    """The attention function behind ``attn_implementation="syntaxkernels"``.

    Args:
        module: the layer's self-attention module; its child ``syntax`` (if any) decides the method; a module with
            ``is_causal`` True (a decoder-only family) attends causally (:func:`_causal_attention`).
        query, key, value: ``[B, H, N, D]`` (decoders: key and value ``[B, H_kv, N_k, D]``, grouped-query
            attention; ``N_k > N`` while decoding with a cache).
        attention_mask: ``bool [B, N]`` (True = attend) from the registered mask function, or None (decoders
            decoding with a cache: transformers' ``bool [B, 1, N, N_k]`` mask).
        dropout: the attention dropout probability transformers passes (0 in eval mode).
        scaling: the score scale (``1/sqrt(D)``).
        syntax_trees: the :class:`TreeBatch` of the batch (checked and moved by the encoder hook).
        syntax_gat_output: ``G [B, N, E_g]`` for the "gat" method (computed once per forward by the hook).
    Returns:
        ``(attn_output [B, N, H, D], None)`` as transformers expects.
    """
    if getattr(module, "is_causal", False):  # a layer of a decoder-only family
        out = _causal_attention(module, query, key, value, attention_mask, dropout, scaling, syntax_trees,
                                kwargs.get("sliding_window"), kwargs.get("syntax_relative_position"),
                                kwargs.get("position_bias"))
        return out.transpose(1, 2).contiguous(), None
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError("the syntaxkernels attention takes a 2-D padding mask [B, N]; got an attention_mask of "
                         f"shape {tuple(attention_mask.shape)} (custom 4-D masks are not supported)")
    part = getattr(module, "syntax", None)
    relative = kwargs.get("syntax_relative_position")
    if relative is not None:  # a T5 / mT5 encoder layer (the encoder hook hands on its position buckets and table)
        out = _t5_encoder_attention(part, query, key, value, attention_mask, dropout, scaling, syntax_trees,
                                    relative, kwargs.get("position_bias"))
        return out.transpose(1, 2).contiguous(), None
    if isinstance(part, (SyntaxDistanceBias, SyntaxSubnetworks)) and syntax_trees is None:
        raise ValueError("this layer uses syntax attention: pass syntax_trees=<TreeBatch> to the model's forward")
    # A local layer (ModernBERT's "sliding_attention": transformers passes sliding_window = local_attention // 2 + 1,
    # keys with |i - j| < sliding_window) keeps its window: the op's position_window, the band in a plain layer.
    sliding_window = kwargs.get("sliding_window")
    band = _position_band(sliding_window, syntax_trees.max_seqlen if _is_packed(syntax_trees) else query.shape[2])
    if band is not None and isinstance(part, SyntaxSubnetworks):
        raise ValueError("the sub-network attention takes no positional window (this layer attends within a sliding "
                         "window)")
    if isinstance(part, SyntaxDistanceBias):
        out = part(query, key, value, syntax_trees, scale=scaling, dropout_p=dropout, position_window=band)
    elif isinstance(part, SyntaxSubnetworks):
        out = part(query, key, value, syntax_trees, scale=scaling, dropout_p=dropout)
    elif isinstance(part, SyntaxHeadInjection):
        if syntax_gat_output is None:
            raise ValueError("this layer has syntax heads: pass syntax_trees=<TreeBatch> to the model's forward")
        query, key, value = part(query, key, value, syntax_gat_output)
        if _is_packed(syntax_trees):
            out = _packed_plain_attention(query, key, value, syntax_trees, dropout, scaling, band=band)
        else:
            out = _plain_attention(query, key, value, attention_mask, dropout, scaling, band)
    elif _is_packed(syntax_trees):  # a plain layer of a packed row: within each sequence
        out = _packed_plain_attention(query, key, value, syntax_trees, dropout, scaling, band=band)
    else:
        out = _plain_attention(query, key, value, attention_mask, dropout, scaling, band)
    return out.transpose(1, 2).contiguous(), None


def _t5_encoder_attention(part, query, key, value, valid: Optional[torch.Tensor], dropout: float,
                          scaling: Optional[float], trees, relative, position_bias: Optional[torch.Tensor]):
    """One self-attention layer of a T5 / mT5 encoder: ``query, key, value [B, H, N, D]`` -> ``[B, H, N, D]``.

    ``relative``: ``(RelativePositionSpec, position_table [H, P])`` from :func:`_seq2seq_encoder_pre_hook` (the
    table is a view of layer 0's ``relative_attention_bias.weight``, shared by every layer, as in T5). A syntax layer
    runs :class:`SyntaxDistanceBias` with them: T5's bucketed relative-position bias is added inside the op (no
    ``[N, N]`` tensor), beside the tree bias; ``scaling`` is T5's 1.0. A layer left plain runs SDPA with T5's own
    ``position_bias [1, H, N, N]`` (computed by layer 0) as a float mask, the padding keys masked out.
    """
    spec, table = relative
    if isinstance(part, SyntaxDistanceBias):
        if trees is None:
            raise ValueError("this layer uses syntax attention: pass syntax_trees=<TreeBatch> to the model's forward")
        return part(query, key, value, trees, scale=scaling, dropout_p=dropout, position_buckets=spec,
                    position_table=table)
    keys = None if valid is None else valid[:, None, None, :]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=_add_position_bias(keys, position_bias, query),
                                          dropout_p=dropout, scale=scaling)


def _add_position_bias(mask: Optional[torch.Tensor], position_bias: Optional[torch.Tensor], query: torch.Tensor):
    """An SDPA mask with T5's ``position_bias [1, H, N, N_k]`` (None: ``mask`` unchanged): the bias, and the dtype's
    minimum where the boolean ``mask`` (broadcastable to ``[B, H, N, N_k]``, True = attend; None: every key) is
    False."""
    if position_bias is None:
        return mask
    if position_bias.numel() == 0:
        raise RuntimeError("a plain T5 layer got the placeholder position_bias of a stack whose layers are all syntax "
                           "layers (the integration's _unused_position_bias_pre_hook should not have run)")
    bias = position_bias.to(query.dtype)
    if mask is None:
        return bias
    return torch.where(mask, bias, torch.finfo(query.dtype).min)


def _padding_mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                           mask_function=None, attention_mask: Optional[torch.Tensor] = None, **kwargs):
    """Mask function for ``attn_implementation="syntaxkernels"``: the 2-D padding mask, unexpanded.

    ``attention_mask`` arrives as ``bool [B, kv_length]`` (True = attend) or None; the syntax ops need the
    key padding only (they take ``lengths``), so nothing ``[B, 1, N, N]`` is built. Decoders decoding with a cache
    (queries after the keys already cached) get transformers' ``bool [B, 1, q_length, kv_length]`` mask instead.
    """
    from transformers.masking_utils import bidirectional_mask_function, sdpa_mask

    if mask_function is not bidirectional_mask_function and not _starts_empty(q_length, kv_length, q_offset,
                                                                                kv_offset):
        # A decoder decoding with a cache: its layers run plain attention (_causal_attention) with the mask
        # transformers' "sdpa" implementation builds (causal, padding, sliding window), always as a tensor.
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)
    # An encoder, or a decoder's forward from an empty cache (causal or sliding mask function: the syntax ops attend
    # causally themselves, the sliding window is checked by the attention function).
    if attention_mask is not None and tuple(attention_mask.shape) != (batch_size, kv_length):
        raise ValueError(f"attention_mask must have shape [B, N] = [{batch_size}, {kv_length}], got "
                         f"{tuple(attention_mask.shape)}")
    return attention_mask


def _starts_empty(q_length: int, kv_length: int, q_offset, kv_offset) -> bool:
    """Whether a forward's queries are its keys (no cached tokens before them): a tensor offset (a static cache)
    counts as not."""
    plain = all(isinstance(x, int) for x in (q_length, kv_length, q_offset, kv_offset))
    return plain and q_length == kv_length and q_offset == 0 and kv_offset == 0


def _dropped_syntax_guard(*args, **kwargs):
    """Attention and mask function of :data:`SAVED_ATTN_IMPLEMENTATION`: the model came from a plain
    ``from_pretrained`` of a syntax checkpoint, which dropped the syntax parameters; it refuses to run."""
    raise ValueError(
        "this model was loaded with a plain from_pretrained from a checkpoint saved with syntax attention "
        "(its config.json has syntax_attention): that drops the syntax parameters, and the model would ignore "
        "syntax_trees. Load it with syntaxkernels.integrations.transformers.load_syntax_model(<model class>, "
        "path), which restores them; or, to use it as a plain model on purpose, call "
        "model.set_attn_implementation('sdpa')"
    )


AttentionInterface.register(ATTN_IMPLEMENTATION, syntax_attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _padding_mask_function)
AttentionInterface.register(SAVED_ATTN_IMPLEMENTATION, _dropped_syntax_guard)
AttentionMaskInterface.register(SAVED_ATTN_IMPLEMENTATION, _dropped_syntax_guard)


# ----------------------------------------------------------------------------------------------------------
# The encoder hook: checks the trees, runs the GAT and the probe once per forward
# ----------------------------------------------------------------------------------------------------------


def _lengths_mismatch_message(tree_lengths: torch.Tensor, valid: Optional[torch.Tensor], n: int, b: int) -> str:
    """Why batch item ``b``'s tree length disagrees with the padding mask (``bool [B, N]``, None = all valid), read
    on the host (:func:`syntaxkernels._validation.check_lengths_agree` found the item)."""
    positions = torch.arange(n)
    expected = valid.cpu() if valid is not None else torch.ones(tree_lengths.shape[0], n, dtype=torch.bool)
    attended = int(expected[b].sum())
    if not bool((expected[b] == (positions < attended)).all()):
        kept = expected[b].nonzero()[:, 0].tolist()
        how = "pads on the left" if kept and kept == list(range(kept[0], n)) else "does not pad on the right"
        return (f"batch item {b}: the attention mask {how} (it attends positions {_ranges(kept)} of N = {n}); "
                "syntax attention needs right padding, valid tokens first (tokenizer.padding_side = 'right'), with "
                f"syntax_trees' lengths equal to the attended count (here {attended}; the trees have "
                f"{int(tree_lengths[b])})")
    return (f"batch item {b}: syntax_trees has {int(tree_lengths[b])} tokens but the attention mask attends "
            f"{attended} (of N = {n}); the trees' lengths must equal the attention mask's count of valid tokens, "
            "padded on the right (valid tokens first)")


def _ranges(positions) -> str:
    """``[2, 3, 4, 7]`` -> ``"2..4, 7"``."""
    if not positions:
        return "none"
    parts, start, prev = [], positions[0], positions[0]
    for p in positions[1:] + [None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        parts.append(str(start) if start == prev else f"{start}..{prev}")
        if p is not None:
            start = prev = p
    return ", ".join(parts)


def _on_host(*tensors: Optional[torch.Tensor]) -> bool:
    """True when every given tensor is in CPU memory, so reading it costs no device synchronisation."""
    return all(t is None or V._on_host(t) for t in tensors)


def _check_trees(trees, hidden: torch.Tensor, valid: Optional[torch.Tensor]) -> TreeBatch:
    """Validate ``syntax_trees`` against the hidden states ``[B, N, E]`` and the padding mask; move it.

    Shapes are compared on the host (metadata only). The lengths must equal the mask's valid prefix: where
    both are still in CPU memory (trees from a collator and a CPU mask) they are read there and a mismatch
    raises a ``ValueError`` naming the batch item; otherwise (a CUDA model) the check is a device-side
    assertion, so a valid batch costs no host synchronisation. Skipped while ``torch.compile`` traces.
    """
    if _is_packed(trees):
        return _check_packed_trees(trees, hidden, valid)
    if not isinstance(trees, StructurePlan):
        raise TypeError(f"syntax_trees must be a syntaxkernels.TreeBatch or PackedTreeBatch (or another structure "
                        f"plan: a GraphBatch), got {type(trees).__name__}")
    B, N = hidden.shape[:2]
    if tuple(trees.distance.shape) != (B, N, N):
        raise ValueError(f"syntax_trees must cover the token sequence: expected batch {B} and N = {N} tokens "
                         f"(distance [B, N, N] = [{B}, {N}, {N}]), got distance {tuple(trees.distance.shape)}; "
                         "build it on the token-level heads padded to the input_ids length")
    lengths = trees.lengths if isinstance(trees, TreeBatch) else getattr(trees, "lengths", trees.kernel_lengths)
    V.check_lengths_agree(lengths, valid, N, lambda b: _lengths_mismatch_message(lengths, valid, N, b),
                          "syntax_trees' lengths differ from the attention mask (which must pad on the right, valid "
                          "tokens first); run the batch on CPU to see which item")
    if trees.device != hidden.device:
        trees = trees.to(hidden.device, non_blocking=True)
    return trees


def _is_packed(trees) -> bool:
    """Whether ``trees`` is a packed plan (a PackedTreeBatch, a packed GraphBatch): one row of T tokens."""
    return isinstance(trees, StructurePlan) and trees.is_packed


def _check_packed_trees(trees: StructurePlan, hidden: torch.Tensor, valid: Optional[torch.Tensor]):
    """A padding-free batch (``DataCollatorWithFlattening``, ``TreeCollator(packed=True)``): one row ``[1, T, E]``
    holding the trees' T tokens, no padding (an attention mask, if any, attends everything); moved to the
    hidden states' device."""
    tokens, sequences = trees.sequence.shape[0], trees.cu_seqlens.shape[0] - 1
    if hidden.shape[0] != 1 or hidden.shape[1] != tokens:
        raise ValueError(f"packed syntax_trees ({sequences} sequences, T = {tokens} tokens) need "
                         f"input_ids [1, T] = [1, {tokens}] (one packed row, position_ids restarting at "
                         f"every sequence), got hidden states {tuple(hidden.shape[:2])}")
    if valid is not None and _on_host(valid) and not bool(valid.all()):
        raise ValueError("a packed batch has no padding: drop the attention_mask (or make it all ones)")
    if trees.device != hidden.device:
        trees = trees.to(hidden.device, non_blocking=True)
    return trees


def _check_attn_implementation(config) -> None:
    """``RuntimeError`` when ``set_attn_implementation`` replaced the syntaxkernels attention of a syntax model."""
    if config._attn_implementation != ATTN_IMPLEMENTATION:
        raise RuntimeError(
            f"syntax attention is enabled on this model but config._attn_implementation is "
            f"{config._attn_implementation!r}: set_attn_implementation() replaced the syntaxkernels attention. "
            f"Call model.set_attn_implementation({ATTN_IMPLEMENTATION!r}) to restore it."
        )


def _encoder_pre_hook(encoder: nn.Module, args: tuple, kwargs: dict):
    config = encoder.config
    _check_attn_implementation(config)
    hidden = args[0] if args else kwargs["hidden_states"]
    mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
    if mask is not None and (mask.dim() != 2 or mask.dtype != torch.bool):
        raise ValueError("the syntaxkernels attention takes a 2-D padding attention_mask [B, N]; got "
                         f"{mask.dtype} {tuple(mask.shape)}")
    if isinstance(getattr(encoder, "syntax", None), SyntaxTreePredictor):
        return _predicted_trees_pre_hook(encoder, hidden, mask, args, kwargs)
    trees = kwargs.get("syntax_trees")
    pos = kwargs.pop("syntax_pos", None)
    if trees is None:
        method = config.syntax_attention["method"]
        raise ValueError(f"syntax attention (method={method!r}) is enabled on this model: pass "
                         "syntax_trees=<syntaxkernels.TreeBatch> (token-level, N = sequence length) to forward")
    trees = _check_trees(trees, hidden, mask)
    kwargs["syntax_trees"] = trees
    gat = getattr(encoder, "syntax_gat", None)
    if gat is not None and not isinstance(trees, (TreeBatch, PackedTreeBatch)):
        raise TypeError(f"method 'gat' reads the trees' heads (its GAT runs on tree edges): syntax_trees must be a "
                        f"TreeBatch or PackedTreeBatch, got {type(trees).__name__}; a graph's distance works with "
                        "method 'bias'")
    encoder.syntax_aux_losses = None
    if gat is not None:
        if pos is not None:
            if not isinstance(pos, torch.Tensor):
                raise TypeError(f"syntax_pos must be an int64 tensor [B, N] of POS ids, got {type(pos).__name__}")
            if tuple(pos.shape) != tuple(hidden.shape[:2]):
                raise ValueError(f"syntax_pos must have shape [B, N] = {list(hidden.shape[:2])}, got "
                                 f"{tuple(pos.shape)}")
            if gat.pos_embedding is not None:
                _check_pos_ids(pos, gat.pos_embedding.num_embeddings, "syntax_pos")  # on the host where it is
            pos = pos.to(hidden.device, non_blocking=True)
        elif gat.pos_embedding is not None:
            # No tags given: every token gets tag 0 ("unknown"), which keeps the POS table in the graph (DDP
            # needs every parameter to take part in each step).
            pos = torch.zeros(hidden.shape[:2], dtype=torch.int64, device=hidden.device)
        words = kwargs.pop("syntax_word_embeddings", None)
        if gat.variant == "package":
            gat_input = hidden
        elif words is None:
            raise ValueError(f"the {gat.variant!r} GAT reads the word embeddings of the input (w_i W_e), handed on by "
                             "the model's forward: call the model (or its base model), not its encoder alone")
        else:
            gat_input = words
        g = gat(gat_input, trees, pos=pos)
        kwargs["syntax_gat_output"] = g
        probe = getattr(encoder, "syntax_probe", None)
        if probe is not None:
            encoder.syntax_aux_losses = probe(g, trees)
    elif pos is not None:
        raise ValueError("syntax_pos is used by method='gat' only")
    return args, kwargs


def _forward_argument_names(module: nn.Module) -> Tuple[str, ...]:
    """The names of ``module.forward``'s positional parameters, in order (to read positional arguments by name)."""
    import inspect

    names = []
    for name, parameter in inspect.signature(module.forward).parameters.items():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(name)
    return tuple(names)


def _tree_tokens(trees) -> int:
    """The tokens a batch's trees cover per row: N of a padded plan, the longest sequence of a packed one."""
    return int(trees.max_seqlen) if _is_packed(trees) else int(trees.distance.shape[1])


def _decoder_pre_hook(base: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of a decoder-only family's base model (it runs the layers itself).

    A forward from an empty cache (training, scoring, the prompt of ``generate``) needs ``syntax_trees`` covering its
    tokens; they are checked against the input and the padding mask (:func:`_check_trees`) and moved. A forward after
    cached tokens (each generated token) gets no tree rows: when its cache already holds at least the trees' tokens,
    ``syntax_trees`` (which ``generate`` hands to every step) is dropped and every layer runs plain attention; a
    forward that continues inside the trees (a prompt fed in chunks) raises ``ValueError``.
    """
    given, tokens = _base_model_inputs(base, args, kwargs, "decoder-only families take method='bias'")
    if tokens is None:
        return args, kwargs  # the model's own error follows
    past = _past_tokens(given)
    trees = kwargs.get("syntax_trees")
    if past > 0:
        if trees is not None:
            covered = _tree_tokens(trees)
            if past < covered:
                raise ValueError(f"the cache holds {past} tokens but syntax_trees cover {covered}: a prompt fed in "
                                 "chunks is not supported (run the prompt in one forward from an empty cache)")
            kwargs["syntax_trees"] = None  # generated tokens have no tree rows: plain attention
        return args, kwargs
    if trees is None:
        raise ValueError("syntax attention (method='bias') is enabled on this model: pass syntax_trees=<TreeBatch> "
                         "(token-level, N = sequence length; leak-free for a causal model: "
                         "TreeBatch.from_heads(..., leak_free=True)) to forward or generate")
    kwargs["syntax_trees"] = _check_trees(trees, tokens, _base_model_mask(given))
    return args, kwargs


def _past_tokens(given: dict):
    """The tokens already in the cache of a forward's arguments ``given`` by name (``cache`` or
    ``past_key_values``; 0 without one)."""
    cache = given.get("cache", given.get("past_key_values"))
    past = cache.get_seq_length() if cache is not None else 0
    return int(past) if isinstance(past, (int, torch.Tensor)) else past


def _base_model_inputs(base: nn.Module, args: tuple, kwargs: dict, why_no_pos: str):
    """The forward arguments of a base model that runs its layers itself (read by name, positional ones included)
    and its token tensor (``input_ids``, else ``inputs_embeds``; None when neither is given). Checks the attention
    implementation and drops a ``syntax_pos`` of None (``ValueError`` for one given: only the GAT reads it)."""
    _check_attn_implementation(base.config)
    if kwargs.get("syntax_pos") is not None:
        raise ValueError(f"syntax_pos is used by method='gat' only ({why_no_pos})")
    kwargs.pop("syntax_pos", None)
    given = dict(zip(base.syntax_forward_arguments, args))
    given.update(kwargs)
    tokens = given.get("input_ids")
    if tokens is None:
        tokens = given.get("inputs_embeds")
    return given, tokens


def _base_model_mask(given: dict) -> Optional[torch.Tensor]:
    """A base model's ``attention_mask`` argument as ``bool [B, N]`` (None when absent); ``ValueError`` for
    anything but a 2-D tensor (4-D masks, ModernBERT's precomputed dict of masks)."""
    mask = given.get("attention_mask")
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        what = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError("the syntaxkernels attention takes a 2-D padding attention_mask [B, N]; got "
                         f"{what} (custom 4-D masks and precomputed masks are not supported)")
    return mask.to(torch.bool)


def _base_encoder_pre_hook(base: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of an encoder family whose base model runs the layers itself (``encoder == ""``, not
    causal: ModernBERT): checks ``syntax_trees`` against ``input_ids`` (or ``inputs_embeds``) and the padding mask
    (right padding; :func:`_check_trees`) and moves them to the model's device."""
    _given_trees(base, args, kwargs, "syntax attention (method='bias') is enabled on this model: pass "
                 "syntax_trees=<syntaxkernels.TreeBatch> (token-level, N = sequence length) to forward")
    return args, kwargs


def _given_trees(module: nn.Module, args: tuple, kwargs: dict, missing: str, packed: bool = True) -> bool:
    """What a pre-hook of a module that embeds its input itself does with ``syntax_trees``: checked against
    ``input_ids`` (or ``inputs_embeds``) and the 0/1 padding mask (right padding; :func:`_check_trees`) and moved, in
    ``kwargs``; ``ValueError(missing)`` without trees, and for packed trees unless ``packed``. False when the call
    has no tokens (the model's own error follows)."""
    given, tokens = _base_model_inputs(module, args, kwargs, f"{_family(module).name} takes method='bias'")
    if tokens is None:
        return False
    trees = kwargs.get("syntax_trees")
    if trees is None:
        raise ValueError(missing)
    if not packed and _is_packed(trees):
        raise ValueError(f"{_family(module).name} takes padded batches only (a TreeBatch and an attention_mask "
                         "[B, N]), not packed trees")
    kwargs["syntax_trees"] = _check_trees(trees, tokens, _base_model_mask(given))
    return True


def _seq2seq_encoder_pre_hook(encoder: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of an encoder-decoder family's encoder stack (``model.encoder`` of T5 / mT5, BART, mBART,
    Marian, M2M100; it embeds the input itself): checks ``syntax_trees`` against ``input_ids`` (or
    ``inputs_embeds``) and the 0/1 padding mask (right padding; :func:`_check_trees`) and moves them. For a family
    with ``relative_positions`` (T5, mT5) it also hands every layer T5's relative-position term as the keyword
    ``syntax_relative_position = (RelativePositionSpec, table [H, P])`` (:func:`_t5_relative_position`). The others
    add absolute positions to the embeddings before the layers: nothing more to hand on."""
    kwargs.pop("decoder_syntax_trees", None)  # the decoder's (the model's forward hands its arguments to both stacks)
    if not _given_trees(encoder, args, kwargs, "syntax attention (method='bias') is enabled on this model's encoder: "
                        "pass syntax_trees=<syntaxkernels.TreeBatch> (token-level, N = encoder input length) to "
                        "forward or generate", packed=False):
        return args, kwargs  # the model's own error follows
    if _family(encoder).relative_positions:
        kwargs["syntax_relative_position"] = _t5_relative_position(encoder, bidirectional=True)
    return args, kwargs


def _t5_relative_position(stack: nn.Module, bidirectional: bool):
    """T5's relative-position term of one stack (encoder: ``bidirectional``; decoder: causal buckets) as the op takes
    it: ``(RelativePositionSpec, table [H, P])``, the table ``.weight.T`` of the stack's layer 0
    ``relative_attention_bias`` (a view, so its gradient reaches the Embedding). The spec is the one
    :func:`_position_spec` built when syntax attention was enabled (kept on the stack as ``syntax_position_spec``):
    building one reads its bucket table to the host, which ``torch.compile`` would have to break its graph for."""
    spec = getattr(stack, "syntax_position_spec", None)
    if spec is None or spec.bidirectional != bidirectional:
        spec = _position_spec(stack, bidirectional)
    first = getattr(stack, _family(stack).layers)[0]
    return spec, first.layer[0].SelfAttention.relative_attention_bias.weight.t()


def _position_spec(stack: nn.Module, bidirectional: bool):
    """The :class:`~syntaxkernels.RelativePositionSpec` of a T5 / mT5 stack's config (encoder: ``bidirectional``;
    decoder: causal buckets)."""
    from ..specs import RelativePositionSpec

    config = stack.config
    return RelativePositionSpec(int(config.relative_attention_num_buckets),
                                int(config.relative_attention_max_distance), bidirectional=bidirectional)


def _unused_position_bias_pre_hook(attention: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of layer 0's self-attention (the ``T5Attention`` holding ``relative_attention_bias``) of a T5 /
    mT5 stack whose every self-attention layer is a syntax layer: those add T5's position term inside the op
    (``syntax_relative_position``) and read no ``position_bias``, so a forward with trees (``syntax_trees``: the
    encoder's; the decoder's first forward with ``decoder_trees=True``) hands layer 0 an empty placeholder
    (:func:`_unused_position_bias`) and T5 skips ``compute_bias`` (its ``[1, H, N, N]`` bias). A forward without trees
    (a decoder decoding with a cache: plain attention with T5's bias) is left as it is."""
    if kwargs.get("position_bias") is None and kwargs.get("syntax_trees") is not None:
        hidden = args[0] if args else kwargs["hidden_states"]
        kwargs["position_bias"] = _unused_position_bias(hidden)
    return args, kwargs


def _unused_position_bias(like: torch.Tensor) -> torch.Tensor:
    """The placeholder ``position_bias`` of a stack that reads none: an empty ``[1, 0, 0, 0]`` tensor (T5 passes it
    from layer to layer; :func:`_add_position_bias` refuses it, so it is never added to scores by mistake)."""
    return like.new_zeros((1, 0, 0, 0))


def _drop_syntax_kwargs_pre_hook(decoder: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of an encoder-decoder family's decoder stack: the model's forward hands its keyword
    arguments (``syntax_trees`` included) to the decoder too; the decoder is plain attention and gets none
    (``ValueError`` for ``decoder_syntax_trees``: target trees need ``enable_syntax_attention(...,
    decoder_trees=True)``)."""
    kwargs.pop("syntax_trees", None)
    kwargs.pop("syntax_pos", None)
    if kwargs.pop("decoder_syntax_trees", None) is not None:
        raise ValueError("decoder_syntax_trees given, but this model's decoder takes no trees: enable it with "
                         "enable_syntax_attention(model, 'bias', decoder_trees=True)")
    return args, kwargs


def _target_trees_pre_hook(decoder: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of the decoder stack of an encoder-decoder model with ``decoder_trees=True``: the source trees
    (``syntax_trees``) are the encoder's; the decoder's self-attention layers take ``decoder_syntax_trees`` (of the
    decoder input, leak-free for training), handed on as their ``syntax_trees`` and checked, and dropped after the
    first forward of ``generate`` (the tokens it generates have no tree rows) by :func:`_decoder_pre_hook`, as in a
    decoder-only family. The cross-attention runs plain attention over the valid source tokens. T5 / mT5: the layers
    also get the decoder's relative-position term (causal buckets, the decoder's layer-0 table) as
    ``syntax_relative_position``."""
    kwargs.pop("syntax_trees", None)
    kwargs["syntax_trees"] = kwargs.pop("decoder_syntax_trees", None)
    if kwargs["syntax_trees"] is None and _past_tokens({**dict(zip(decoder.syntax_forward_arguments, args)),
                                                        **kwargs}) == 0:
        raise ValueError("this model's decoder takes target trees (decoder_trees=True): pass decoder_syntax_trees="
                         "<TreeBatch> of the decoder input (leak-free: TreeBatch.from_heads(..., leak_free=True); "
                         "for generate, the trees of decoder_input_ids, e.g. the start token alone)")
    args, kwargs = _decoder_pre_hook(decoder, args, kwargs)
    if _family(decoder).relative_positions:  # T5: the decoder's own table, causal buckets
        kwargs["syntax_relative_position"] = _t5_relative_position(decoder, bidirectional=False)
    return args, kwargs


def _validate_generate_kwargs(model: nn.Module, model_kwargs: dict) -> None:
    """``generate``'s check of its keyword arguments on a decoder with syntax attention: ``syntax_trees`` is one
    (``generate`` hands it to every forward; :func:`_decoder_pre_hook` uses it for the prompt only), the others are
    checked by transformers' own method. Set on the model as ``functools.partial(this, model)`` (copied with the
    model by ``copy.deepcopy`` and pickle)."""
    model_kwargs.pop("syntax_trees", None)
    model_kwargs.pop("decoder_syntax_trees", None)
    return type(model)._validate_model_kwargs(model, model_kwargs)


def _expand_generate_inputs(model: nn.Module, expand_size: int = 1, is_encoder_decoder: bool = False,
                            input_ids: Optional[torch.Tensor] = None, **model_kwargs):
    """``generate``'s expansion of its inputs for beam search and ``num_return_sequences`` (``expand_size`` =
    ``max(num_beams, num_return_sequences)``) on a model with syntax attention: transformers' own method expands every
    tensor argument with ``repeat_interleave(expand_size, dim=0)`` (item b's copies next to each other); the trees
    (``syntax_trees``, ``decoder_syntax_trees``) are not tensors, so they get the same with
    :meth:`TreeBatch.repeat_interleave <syntaxkernels.TreeBatch.repeat_interleave>`: the forward after expansion (a
    decoder's prompt, an encoder-decoder's decoder prompt with ``decoder_trees=True``) sees ``B * expand_size`` rows
    and as many trees. (An encoder-decoder's encoder runs before the expansion, on the ``B`` source trees.) Other
    structure plans (a ``GraphBatch``, a packed batch) raise ``ValueError`` when ``expand_size > 1`` (a padded
    :class:`~syntaxkernels.RelationBatch` repeats too). Set on the model
    as ``functools.partial(this, model)`` (copied with the model by ``copy.deepcopy`` and pickle)."""
    input_ids, model_kwargs = type(model)._expand_inputs_for_generation(
        model, expand_size=expand_size, is_encoder_decoder=is_encoder_decoder, input_ids=input_ids, **model_kwargs)
    if expand_size != 1:
        for key in ("syntax_trees", "decoder_syntax_trees"):
            trees = model_kwargs.get(key)
            if trees is None:
                continue
            if not (isinstance(trees, (TreeBatch, RelationBatch)) and not trees.is_packed):
                raise ValueError(f"generate with num_beams or num_return_sequences > 1 repeats each batch item's "
                                 f"{key}: that takes a padded TreeBatch or RelationBatch, got "
                                 f"{type(trees).__name__} (generate with num_beams=1 and num_return_sequences=1, or "
                                 "pass a TreeBatch)")
            model_kwargs[key] = trees.repeat_interleave(int(expand_size))
    return input_ids, model_kwargs


def _word_embeddings_pre_hook(base: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of the base model for the "paper" and "release" GATs: hands the word embeddings of the
    input (``w_i W_e``, the embedding matrix shared with the encoder; ``inputs_embeds`` when given) to the encoder
    hook as the keyword ``syntax_word_embeddings`` (the base model passes its keyword arguments on to the encoder)."""
    embeds = kwargs.get("inputs_embeds")
    if embeds is None:
        ids = args[0] if args else kwargs.get("input_ids")
        if ids is not None:
            embeds = base.get_input_embeddings()(ids)
    kwargs["syntax_word_embeddings"] = embeds
    return args, kwargs


# ----------------------------------------------------------------------------------------------------------
# trees="predicted": the predictor on layer k's output feeds the syntax layers above it
# ----------------------------------------------------------------------------------------------------------


class _TreePrediction:
    """What one forward of a ``trees="predicted"`` model carries from the encoder hook to the layer hooks (a fresh
    object per forward, held by the encoder as ``syntax_prediction`` until the forward ends)."""

    __slots__ = ("lengths", "given", "use_predicted", "trees", "done")

    def __init__(self, lengths: torch.Tensor, given: Optional[TreeBatch], use_predicted: bool):
        self.lengths = lengths  # int64 [B], valid tokens per row
        self.given = given  # the checked syntax_trees, or None
        self.use_predicted = use_predicted  # whether the layers above k take the predicted trees
        self.trees: Optional[TreeBatch] = None  # the predicted trees, once layer k has run
        self.done = False


def _predicted_lengths(hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Valid tokens per row from the padding mask (``bool [B, N]``, None: all valid); ``ValueError`` naming the
    batch item when a row is not right-padded (the trees cover a valid prefix)."""
    B, N = hidden.shape[:2]
    if mask is None:
        return torch.full((B,), N, dtype=torch.int64, device=hidden.device)
    lengths = mask.sum(1).to(torch.int64)
    prefix = torch.arange(N, device=mask.device)[None, :] < lengths[:, None]
    bad = (prefix != mask).any(1)
    if bool(bad.any()):  # read on the host: the decoder reads the scores there anyway
        b = int(bad.nonzero()[0, 0])
        kept = mask[b].nonzero()[:, 0].tolist()
        raise ValueError(f"batch item {b}: the attention mask does not pad on the right (it attends positions "
                         f"{_ranges(kept)} of N = {N}); predicted trees cover each row's valid tokens, which must "
                         "come first (tokenizer.padding_side = 'right')")
    return lengths.to(hidden.device)


def _predicted_trees_pre_hook(encoder: nn.Module, hidden: torch.Tensor, mask: Optional[torch.Tensor], args: tuple,
                              kwargs: dict):
    """The encoder pre-hook of a ``trees="predicted"`` model: checks given trees (or that none are needed), and
    starts this forward's :class:`_TreePrediction`."""
    predictor: SyntaxTreePredictor = encoder.syntax
    if kwargs.pop("syntax_pos", None) is not None:
        raise ValueError("syntax_pos is used by method='gat' only")
    trees = kwargs.pop("syntax_trees", None)
    packed_kwargs = [k for k in ("cu_seq_lens_q", "cu_seq_lens_k") if kwargs.get(k) is not None]
    if _is_packed(trees) or packed_kwargs:
        raise ValueError("packed (padding-free) batches are not supported with trees='predicted': use padded "
                         "batches (TreeCollator(packed=False), an attention_mask [B, N])")
    encoder.syntax_aux_losses = None
    encoder.syntax_prediction = None
    if trees is not None:
        if not isinstance(trees, TreeBatch):
            raise TypeError(f"with trees='predicted', given syntax_trees must be a TreeBatch (the predictor learns "
                            f"their heads), got {type(trees).__name__}")
        trees = _check_trees(trees, hidden, mask)
        kwargs["syntax_trees"] = trees
        ratio = predictor.predicted_tree_ratio
        use_predicted = bool(encoder.training and ratio > 0 and float(torch.rand(())) < ratio)
        lengths = trees.lengths.to(hidden.device)
    else:
        use_predicted = True
        lengths = _predicted_lengths(hidden, mask)
    encoder.syntax_prediction = _TreePrediction(lengths, trees, use_predicted)
    return args, kwargs


def _predictor_layer_hook(encoder: nn.Module, layer: nn.Module, args: tuple, output):
    """Forward hook of encoder layer k: the predictor's loss on the given trees, and the predicted trees when the
    layers above take them (once per forward; a recomputation under gradient checkpointing runs the layer's
    ``forward`` only, not its hooks)."""
    state = getattr(encoder, "syntax_prediction", None)
    if state is None or state.done:
        return None
    state.done = True
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    predictor: SyntaxTreePredictor = encoder.syntax
    if state.given is not None:
        encoder.syntax_aux_losses = (predictor.loss(hidden, state.given),)
    if state.use_predicted:
        state.trees = predictor.predict(hidden, state.lengths)
    return None


def _predicted_layer_pre_hook(encoder: nn.Module, index: int, layer: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of each encoder layer above k: hands it this forward's predicted trees."""
    state = getattr(encoder, "syntax_prediction", None)
    if state is not None and state.use_predicted:
        if state.trees is None:
            raise RuntimeError(f"encoder layer {index} runs before layer {encoder.syntax.layer} predicted the trees of "
                               "this forward (the encoder must run its layers in order)")
        kwargs["syntax_trees"] = state.trees
    return args, kwargs


def _end_of_forward_hook(encoder: nn.Module, args: tuple, output):
    """Forward hook of the encoder: drops this forward's predicted trees, so that no later forward sees them."""
    encoder.syntax_prediction = None
    return None


class _StopAfterPrediction(Exception):
    """Raised by :func:`predict_syntax_trees`' temporary hook to end the forward once the trees are predicted."""


def predict_syntax_trees(model, input_ids: Optional[torch.Tensor] = None,
                         attention_mask: Optional[torch.Tensor] = None, **kwargs) -> TreeBatch:
    """The token trees a ``trees="predicted"`` model predicts for a batch, running layers ``0..predictor_layer``
    only (the layers above are skipped): what the syntax layers would use in a forward without ``syntax_trees``.

    Args:
        model: a model after ``enable_syntax_attention(..., trees="predicted")`` (or a DDP wrapper of one).
        input_ids: ``[B, N]``; attention_mask: ``[B, N]`` 0/1, right padding; kwargs: other inputs of the base
            model (``token_type_ids``, ``inputs_embeds`` ...), not ``syntax_trees``.
    Returns:
        a :class:`TreeBatch` ``[B, N]`` on the model's device (lengths: the attention mask's valid tokens).
    Raises:
        ``ValueError`` for a model without predicted trees, or with ``syntax_trees`` given.
    """
    model = getattr(model, "module", model)
    base = _base_model(model)
    encoder = _encoder(base)
    predictor = getattr(encoder, "syntax", None)
    if not isinstance(predictor, SyntaxTreePredictor):
        raise ValueError("predict_syntax_trees needs a model enabled with enable_syntax_attention(..., "
                         "trees='predicted', predictor_layer=k)")
    if kwargs.get("syntax_trees") is not None:
        raise ValueError("predict_syntax_trees predicts the trees: do not pass syntax_trees")
    found = []

    def stop(layer, args, output):
        state = encoder.syntax_prediction
        found.append(None if state is None else state.trees)
        raise _StopAfterPrediction

    layer = getattr(encoder, _family(base).layers)[predictor.layer]
    handle = layer.register_forward_hook(stop)  # after the predictor's own hook
    try:
        with torch.no_grad():
            base(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    except _StopAfterPrediction:
        pass
    finally:
        handle.remove()
        encoder.syntax_prediction = None
    if not found or found[0] is None:
        raise RuntimeError("the encoder did not reach the predictor's layer")
    return found[0]


# ----------------------------------------------------------------------------------------------------------
# enable / load / helpers
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFamily:
    """Where one transformers model family keeps what :func:`enable_syntax_attention` patches.

    Every supported family computes q, k, v in its self-attention module, splits them into ``[B, H, N, D]``
    (H = ``config.num_attention_heads``, D = ``config.hidden_size / H``; the configs' ``attribute_map`` gives those
    names to DistilBERT's ``n_heads``/``dim``), adds its positions before the attention function (absolute
    embeddings before the encoder), and calls transformers' attention interface with them; the padding mask
    comes from ``create_bidirectional_mask``. That is what the integration replaces. The fields say where the
    pieces are:

    - ``base_class``: the transformers class of the base model (``model.base_model``);
    - ``encoder``: the attribute of the base model whose forward runs the layers (its input is what the GAT
      reads; the trees are checked and moved by a forward pre-hook on it);
    - ``layers``: the attribute of the encoder holding the layers (``nn.ModuleList``; FSDP shards each);
    - ``self_attention``: the dotted path inside a layer to the module that calls the attention function (its
      child ``syntax`` holds a layer's syntax parameters);
    - ``projections``: the q, k, v projections of that module (``nn.Linear``, or one fused ``Conv1D`` for GPT-2);
    - ``positions``: how the family encodes positions (the syntax ops add the tree on top of it);
    - ``causal``: a decoder-only language model (see "Decoder-only language models" in the module docstring):
      ``encoder`` is ``""`` (the base model runs the layers itself, and the trees are checked by a forward pre-hook
      on it), the mask comes from ``create_causal_mask`` (or ``create_sliding_window_causal_mask``), k and v may
      have fewer heads than q (grouped-query attention), and only ``method="bias"`` applies.
    - ``seq2seq``: an encoder-decoder family (T5, mT5, BART, mBART, Marian, M2M100): only the encoder stack's
      self-attention is patched (``encoder`` is that stack, which embeds the input itself: the trees are checked
      against ``input_ids`` by a forward pre-hook on it), only the encoder stack is switched to the syntaxkernels
      attention implementation (given a config object of its own where it shares the decoder's, as BART's does);
      the decoder (self- and cross-attention) keeps its own; ``method="bias"``, ``trees="given"`` only.
    - ``relative_positions``: a seq2seq family whose encoder layers share T5's bucketed relative-position table
      (layer 0's ``relative_attention_bias``), which the op adds itself (T5, mT5); False: absolute positions added to
      the embeddings before the layers, nothing for the op to add.
    - ``methods``: the methods the family takes (an encoder whose base model runs the layers, ``encoder == ""`` and
      not causal, takes ``trees="given"`` only: the predicted trees hook an encoder module), and ``limits``: why it
      takes no others (quoted by the ``ValueError``).

    A layer that attends within a sliding window gets it as transformers' ``sliding_window`` argument of the
    attention function (keys with ``|i - j| < sliding_window``; a decoder's ``i - j < W``): it becomes the op's
    ``position_window`` (``sliding_window - 1``) in a syntax layer and a band in the mask of a plain one, whatever
    the family.
    """

    name: str
    model_type: str
    base_class: str
    encoder: str
    layers: str
    self_attention: str
    projections: Tuple[str, ...]
    positions: str
    causal: bool = False
    methods: Tuple[str, ...] = METHODS
    limits: str = ""
    seq2seq: bool = False
    relative_positions: bool = False


_ABSOLUTE = "learned absolute position embeddings, added to the token embeddings before the encoder"
_ROTARY = ("rotary (RoPE), applied to q and k inside the attention module before the attention function; k, v with "
           "config.num_key_value_heads heads (grouped-query attention)")

_T5_LIMITS = ("only the encoder's self-attention takes the trees (the decoder and the cross-attention stay plain); "
              "the sub-network op and the GAT take no relative-position table, and the tree predictor is not wired "
              "for the encoder stack")
_T5_POSITIONS = ("T5's bucketed relative-position bias (config.relative_attention_num_buckets, "
                 "relative_attention_max_distance; layer 0's relative_attention_bias shared by every encoder layer), "
                 "added inside the op (position_buckets / position_table) beside the tree bias; scores not scaled "
                 "(scale 1.0)")
_SEQ2SEQ_LIMITS = ("only the encoder's self-attention takes the trees (the decoder and the cross-attention stay "
                   "plain); the sub-network op, the GAT and the tree predictor are not wired for an encoder-decoder "
                   "model")
_SEQ2SEQ_SCALED = "; scores scaled by the module's scaling (1/sqrt(D))"
#: The supported families, one row each (see :class:`ModelFamily`).
FAMILIES: Tuple[ModelFamily, ...] = (
    ModelFamily("BERT (incl. multilingual BERT)", "bert", "BertModel", "encoder", "layer", "attention.self",
                ("query", "key", "value"), _ABSOLUTE),
    ModelFamily("RoBERTa", "roberta", "RobertaModel", "encoder", "layer", "attention.self",
                ("query", "key", "value"), _ABSOLUTE + " (offset by padding_idx + 1)"),
    ModelFamily("XLM-RoBERTa", "xlm-roberta", "XLMRobertaModel", "encoder", "layer", "attention.self",
                ("query", "key", "value"), _ABSOLUTE + " (offset by padding_idx + 1)"),
    ModelFamily("CamemBERT", "camembert", "CamembertModel", "encoder", "layer", "attention.self",
                ("query", "key", "value"), _ABSOLUTE + " (offset by padding_idx + 1)"),
    ModelFamily("ELECTRA", "electra", "ElectraModel", "encoder", "layer", "attention.self",
                ("query", "key", "value"), _ABSOLUTE + "; embeddings_project maps embedding_size to hidden_size "
                "first, so the GAT reads hidden_size-wide inputs"),
    ModelFamily("DistilBERT", "distilbert", "DistilBertModel", "transformer", "layer", "attention",
                ("q_lin", "k_lin", "v_lin"), "learned or sinusoidal (config.sinusoidal_pos_embds) absolute position "
                "embeddings, added before the encoder"),
    ModelFamily("GPT-2", "gpt2", "GPT2Model", "", "h", "attn", ("c_attn",),
                "learned absolute position embeddings (wpe), added before the layers; q, k, v from one fused "
                "Conv1D", causal=True),
    ModelFamily("Llama", "llama", "LlamaModel", "", "layers", "self_attn", ("q_proj", "k_proj", "v_proj"),
                _ROTARY, causal=True),
    ModelFamily("Mistral", "mistral", "MistralModel", "", "layers", "self_attn", ("q_proj", "k_proj", "v_proj"),
                _ROTARY + "; config.sliding_window kept (the op's position_window, padded and packed)",
                causal=True),
    ModelFamily("Qwen2", "qwen2", "Qwen2Model", "", "layers", "self_attn", ("q_proj", "k_proj", "v_proj"),
                _ROTARY + "; sliding-window layers (use_sliding_window) keep their window",
                causal=True),
    ModelFamily("Qwen3", "qwen3", "Qwen3Model", "", "layers", "self_attn", ("q_proj", "k_proj", "v_proj"),
                _ROTARY + " (after the per-head q_norm / k_norm); sliding-window layers keep their window",
                causal=True),
    ModelFamily("ModernBERT", "modernbert", "ModernBertModel", "", "layers", "attn", ("Wqkv",),
                "rotary (RoPE), applied to q and k inside the attention module before the attention function; q, k, "
                "v from one fused Linear Wqkv; global layers (every config.global_attn_every_n_layers-th) attend "
                "everywhere, local ones |i - j| <= local_attention // 2 (kept: the op's position_window, padded "
                "and packed)",
                methods=("bias",),
                limits="its local layers attend within a sliding window, which the sub-network op does not take, and "
                "its base model runs the layers itself (no encoder module whose input the GAT reads or whose layers "
                "the tree predictor hooks)"),
    ModelFamily("T5 (incl. Flan-T5)", "t5", "T5PreTrainedModel", "encoder", "block", "layer.0.SelfAttention",
                ("q", "k", "v"), _T5_POSITIONS, methods=("bias",), limits=_T5_LIMITS, seq2seq=True,
                relative_positions=True),
    ModelFamily("mT5", "mt5", "MT5PreTrainedModel", "encoder", "block", "layer.0.SelfAttention",
                ("q", "k", "v"), _T5_POSITIONS, methods=("bias",), limits=_T5_LIMITS, seq2seq=True,
                relative_positions=True),
    ModelFamily("BART", "bart", "BartPreTrainedModel", "encoder", "layers", "self_attn",
                ("q_proj", "k_proj", "v_proj"), "learned absolute position embeddings (offset 2), added to the "
                "token embeddings before the encoder layers" + _SEQ2SEQ_SCALED, methods=("bias",),
                limits=_SEQ2SEQ_LIMITS, seq2seq=True),
    ModelFamily("mBART", "mbart", "MBartPreTrainedModel", "encoder", "layers", "self_attn",
                ("q_proj", "k_proj", "v_proj"), "learned absolute position embeddings (offset 2), added to the "
                "token embeddings before the (pre-LayerNorm) encoder layers" + _SEQ2SEQ_SCALED, methods=("bias",),
                limits=_SEQ2SEQ_LIMITS, seq2seq=True),
    ModelFamily("Marian", "marian", "MarianPreTrainedModel", "encoder", "layers", "self_attn",
                ("q_proj", "k_proj", "v_proj"), "sinusoidal absolute position embeddings, added to the token "
                "embeddings before the encoder layers" + _SEQ2SEQ_SCALED, methods=("bias",), limits=_SEQ2SEQ_LIMITS,
                seq2seq=True),
    ModelFamily("M2M100 (incl. NLLB)", "m2m_100", "M2M100PreTrainedModel", "encoder", "layers", "self_attn",
                ("q_proj", "k_proj", "v_proj"), "sinusoidal absolute position embeddings (counted from "
                "padding_idx + 1, padding tokens skipped), added to the token embeddings before the (pre-LayerNorm) "
                "encoder layers" + _SEQ2SEQ_SCALED, methods=("bias",), limits=_SEQ2SEQ_LIMITS, seq2seq=True),
)


#: Families that are refused, with why (a model of another family is refused as not supported). None at present.
REFUSED_FAMILIES: Dict[str, str] = {}


def _supported_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def _family(base: nn.Module) -> Optional[ModelFamily]:
    names = {cls.__name__ for cls in type(base).__mro__}
    for family in FAMILIES:
        if family.base_class not in names:  # (no import of the other families' modules)
            continue
        cls = getattr(transformers, family.base_class, None)
        if cls is not None and isinstance(base, cls):
            return family
    return None


def _base_model(model) -> nn.Module:
    if not isinstance(model, transformers.PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel ({_supported_names()}), got "
                        f"{type(model).__name__}")
    base = model.base_model
    if _family(base) is None:
        model_type = getattr(model.config, "model_type", None)
        why = REFUSED_FAMILIES.get(model_type)
        if why is not None:
            raise ValueError(f"enable_syntax_attention: {type(model).__name__} (model_type {model_type!r}) is refused. "
                             f"{why}. Supported: {_supported_names()}")
        raise ValueError(
            f"enable_syntax_attention supports {_supported_names()}; {type(model).__name__} (model_type "
            f"{model_type!r}) is not supported"
        )
    if getattr(base.config, "add_cross_attention", False):
        raise ValueError("enable_syntax_attention supports self-attention only: this model has "
                         "add_cross_attention=True (cross-attention layers)")
    if not _family(base).causal and getattr(base.config, "is_decoder", False):
        raise ValueError(f"enable_syntax_attention supports encoders only for {_family(base).name}: this model has "
                         "is_decoder=True (decoder-only language models: the causal rows of FAMILIES, GPT-2, Llama, "
                         "Mistral, Qwen2, Qwen3)")
    return base


def _encoder(base: nn.Module) -> nn.Module:
    """The module whose forward runs the layers: the family's ``encoder`` attribute, the base model itself for a
    decoder-only family (``encoder == ""``)."""
    name = _family(base).encoder
    return getattr(base, name) if name else base


def encoder_layers(model) -> nn.ModuleList:
    """The layers of a supported model (``model.bert.encoder.layer``, ``model.distilbert.transformer.layer``, ...),
    e.g. to ``fully_shard`` each of them under FSDP. Accepts a ``DistributedDataParallel`` wrapper."""
    base = _base_model(getattr(model, "module", model))
    return getattr(_encoder(base), _family(base).layers)


def _as_buckets(buckets, relations: Optional[int] = None):
    """The layer's BucketSpec; with ``relations`` also one per relation (a list or tuple of R BucketSpecs or dicts
    of their fields: a tuple of BucketSpecs back)."""
    if relations is not None and isinstance(buckets, (list, tuple)):
        if len(buckets) != relations:
            raise ValueError(f"buckets holds {len(buckets)} BucketSpecs for relations = {relations}: give one spec "
                             "for every relation, or one BucketSpec for all of them")
        return tuple(_as_buckets(b) for b in buckets)
    if buckets is None:
        return BucketSpec()
    if isinstance(buckets, BucketSpec):
        return buckets
    if isinstance(buckets, dict):
        return BucketSpec(**buckets)
    raise TypeError(f"buckets must be a BucketSpec, a dict of its fields or None (with relations=R also a list of "
                    f"R of them), got {type(buckets).__name__}")


def _as_masks(masks) -> MaskSpec:
    if masks is None:
        return MaskSpec()
    if isinstance(masks, MaskSpec):
        return masks
    if isinstance(masks, dict):
        return MaskSpec(**masks)
    raise TypeError(f"masks must be a MaskSpec, a dict of its fields or None, got {type(masks).__name__}")


def _as_gat_config(gat_config) -> Dict[str, Any]:
    if gat_config is None:
        gat_config = {}
    if not isinstance(gat_config, dict):
        raise TypeError(f"gat_config must be a dict, got {type(gat_config).__name__}")
    unknown = set(gat_config) - set(DEFAULT_GAT_CONFIG)
    if unknown:
        raise ValueError(f"gat_config has unknown keys {sorted(unknown)}; known: {sorted(DEFAULT_GAT_CONFIG)}")
    return {**DEFAULT_GAT_CONFIG, **gat_config}


def _as_layers(layers, num_layers: int):
    if layers is None:
        return list(range(num_layers))
    if isinstance(layers, int):
        layers = [layers]
    out = []
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not -num_layers <= i < num_layers:
            raise ValueError(f"layers must hold layer indices in 0..{num_layers - 1}, got {i!r}")
        out.append(i % num_layers)
    if len(set(out)) != len(out):
        raise ValueError(f"layers has duplicates: {list(layers)}")
    return sorted(out)


_PROJECTIONS = (nn.Linear, Conv1D)  # Conv1D: GPT-2's fused q, k, v projection


def _self_attention_modules(base: nn.Module):
    family = _family(base)
    modules = []
    for layer in getattr(_encoder(base), family.layers):
        module = layer
        for name in family.self_attention.split("."):
            module = getattr(module, name)
        missing = [p for p in family.projections if not isinstance(getattr(module, p, None), _PROJECTIONS)]
        if missing:  # another transformers version moved them: refuse rather than patch the wrong module
            raise ValueError(f"enable_syntax_attention: {family.name} layer {family.self_attention} "
                             f"({type(module).__name__}) has no projections {missing}; this transformers "
                             f"{transformers.__version__} does not lay the family out as expected")
        modules.append(module)
    return modules


def _decoder_self_attention_modules(base: nn.Module, family: ModelFamily):
    """``decoder_trees=True``: the self-attention modules of an encoder-decoder model's decoder layers (laid out as its
    encoder's, with ``is_causal``); ``ValueError`` for another family or a model without a decoder
    (``T5EncoderModel``)."""
    decoder = getattr(base, "decoder", None)
    if not family.seq2seq or decoder is None:
        raise ValueError(f"decoder_trees=True applies to the encoder-decoder families (T5, mT5, BART, mBART, Marian, "
                         f"M2M100) with a decoder; {family.name} ({type(base).__name__}) has none")
    modules = []
    for layer in getattr(decoder, family.layers):
        for name in family.self_attention.split("."):
            layer = getattr(layer, name)
        modules.append(layer)
    if not all(getattr(m, "is_causal", False) for m in modules):
        raise ValueError(f"{family.name}: the decoder's self-attention modules are not causal (is_causal) in this "
                         f"transformers {transformers.__version__}")
    return modules


def _use_own_config(model: nn.Module) -> None:
    """Give ``model`` private copies of the configuration objects its modules hold.

    transformers models keep a reference to the config object they were built from (the model, the base
    model and the attention modules all read it), and several models may be built from one object. Enabling
    syntax attention writes to the config (``syntax_attention``, the attention implementation), so the model
    first switches every such reference to a deep copy (one copy per object, shared sub-configs stay shared):
    other models built from the same object are left exactly as they were.
    """
    memo: Dict[int, Any] = {}
    copies: Dict[int, Any] = {}
    for module in model.modules():
        config = module.__dict__.get("config")
        if isinstance(config, transformers.PretrainedConfig):
            if id(config) not in copies:
                copies[id(config)] = copy.deepcopy(config, memo)
            module.config = copies[id(config)]


def _own_encoder_config(model: nn.Module, encoder: nn.Module) -> None:
    """Give an encoder-decoder model's encoder stack a config object of its own when modules outside it hold the
    same one (BART, mBART, Marian and M2M100 build the encoder and the decoder from one config; T5 copies it per
    stack): its attention implementation can then change without the decoder's (each attention module reads
    ``self.config._attn_implementation``)."""
    inside = {id(m) for m in encoder.modules()}
    shared = encoder.config
    if not any(m.__dict__.get("config") is shared for m in model.modules() if id(m) not in inside):
        return
    own = copy.deepcopy(shared)
    for module in encoder.modules():
        if module.__dict__.get("config") is shared:
            module.config = own


def _predicted_layers(method: str, variant: Optional[str], layers, predictor_layer, arc_size, ratio,
                      num_layers: int):
    """Checks the ``trees="predicted"`` arguments; the syntax layers (``layers``, default every layer above k)."""
    if method == "gat" or (method == "subnetwork" and variant != "package"):
        what = ("method='gat' (its GAT reads the trees before the first layer)" if method == "gat" else
                f"method='subnetwork' with variant={variant!r} (its masks come from word-level trees)")
        raise ValueError(f"trees='predicted' supports method='bias' and method='subnetwork' with "
                         f"variant='package' (token trees), not {what}")
    if isinstance(predictor_layer, bool) or not isinstance(predictor_layer, int) or \
            not 0 <= predictor_layer <= num_layers - 2:
        raise ValueError(f"trees='predicted' needs predictor_layer, an int in 0..{num_layers - 2} (the encoder has "
                         f"{num_layers} layers and the syntax layers come after it), got {predictor_layer!r}")
    if isinstance(arc_size, bool) or not isinstance(arc_size, int) or arc_size <= 0:
        raise ValueError(f"predictor_arc_size must be a positive int, got {arc_size!r}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"predicted_tree_ratio must be a number in [0, 1], got {ratio!r}")
    if layers is None:
        return list(range(predictor_layer + 1, num_layers))
    chosen = _as_layers(layers, num_layers)
    below = [i for i in chosen if i <= predictor_layer]
    if below:
        raise ValueError(f"with trees='predicted' the syntax layers must come after predictor_layer = "
                         f"{predictor_layer} (layers 0..{predictor_layer} compute the hidden states the trees are "
                         f"predicted from): layers {below} are not above it")
    return chosen


def _attach_predictor(base: nn.Module, encoder: nn.Module, config, k: int, arc_size: int, ratio: float,
                      factory: dict, training: bool) -> None:
    """Adds the :class:`SyntaxTreePredictor` as ``encoder.syntax`` and the hooks of ``trees="predicted"``."""
    predictor = SyntaxTreePredictor(config.hidden_size, k, arc_size, ratio)
    encoder.syntax = predictor.to(**factory).train(training)
    encoder.syntax_prediction = None
    layer_modules = getattr(encoder, _family(base).layers)
    handles = [layer_modules[k].register_forward_hook(functools.partial(_predictor_layer_hook, encoder))]
    for i in range(k + 1, len(layer_modules)):
        handles.append(layer_modules[i].register_forward_pre_hook(
            functools.partial(_predicted_layer_pre_hook, encoder, i), with_kwargs=True))
    handles.append(encoder.register_forward_hook(_end_of_forward_hook))
    encoder.syntax_prediction_handles = handles


def enable_syntax_attention(model, method: str = "bias", *, buckets: Union[BucketSpec, dict, None] = None,
                            per_head: bool = False, learnable_scale: bool = True, window: Optional[int] = None,
                            masks: Union[MaskSpec, dict, None] = None, gat_config: Optional[dict] = None,
                            syntax_heads: int = 1, targets: Optional[Sequence[str]] = None,
                            layers: Union[int, Iterable[int], None] = None, backend: str = "auto",
                            variant: Optional[str] = None, trees: str = "given",
                            predictor_layer: Optional[int] = None, predictor_arc_size: int = 128,
                            predicted_tree_ratio: float = 0.0, decoder_trees: bool = False,
                            relations: Optional[int] = None):
    """Make a transformers encoder or decoder-only language model of a family in :data:`FAMILIES` syntax-aware, in
    place.

    Args:
        model: any model whose ``base_model`` is the base class of a row of :data:`FAMILIES` (``BertModel``,
            ``RobertaModel``, ``XLMRobertaModel``, ``CamembertModel``, ``ElectraModel``, ``DistilBertModel``; e.g.
            ``BertForTokenClassification``), configured as an encoder; or of a causal row (``GPT2Model``,
            ``LlamaModel``, ``MistralModel``, ``Qwen2Model``, ``Qwen3Model``; e.g. ``LlamaForCausalLM``) with
            ``method="bias"`` (module docstring, "Decoder-only language models"); or ``ModernBertModel`` (e.g.
            ``ModernBertForMaskedLM``) with ``method="bias"`` (module docstring, "ModernBERT"); or a T5 / mT5 model
            (``T5ForConditionalGeneration``, ``T5EncoderModel``, ``MT5ForConditionalGeneration``, ...) with
            ``method="bias"``: the encoder's self-attention only (module docstring, "T5 and mT5"); or a translation
            model (``BartForConditionalGeneration``, ``MBartForConditionalGeneration``, ``MarianMTModel``,
            ``M2M100ForConditionalGeneration``, ...) with ``method="bias"``, likewise (module docstring,
            "Translation models").
        method: "bias" (learnable tree-distance bias), "subnetwork" (Syntax-BERT sub-networks with topical
            attention) or "gat" (syntax-augmented mBERT: a GAT over the tree feeding syntax heads).
        buckets: "bias": the :class:`BucketSpec` (or a dict of its fields); default ``BucketSpec()``. With
            ``relations=R`` also a list of R of them, one per relation.
        per_head: "bias": one table per head (``[H, T]``) instead of one shared ``[T]``.
        learnable_scale: "bias": learn the strength c (``bias_scale``, init 1).
        window: "bias": attend only where ``d(i, j) <= window`` (None: every key).
        masks: "subnetwork": the :class:`MaskSpec` (or a dict); default ``MaskSpec()`` (parent/child/sibling
            up to 3, plus full).
        gat_config: "gat": overrides of :data:`DEFAULT_GAT_CONFIG` -- ``num_layers``, ``num_heads``,
            ``head_dim``, ``window`` (delta), ``num_pos_tags`` (0: no POS input), ``probe_rank`` (an int
            enables the structural-probe loss, see :func:`syntax_aux_loss`).
        syntax_heads: "gat": the first n heads of each chosen layer receive G.
        targets: "gat": which of "q", "k", "v" receive G; None: the variant's (paper ("q", "k"); authors' release
            ("k", "v"); package ("q", "k")).
        layers: indices of the encoder layers to patch (None: all). Other layers stay plain attention.
        backend: "auto" (fused Triton kernels on CUDA, C++ kernels on CPU, the reference for float64), "triton"
            or "reference".
        variant: "subnetwork" and "gat": ``"paper"`` (None, the default), ``"release"`` or ``"package"``; it sets
            every part of the method at once (docs/semantics.md, "Paper, release and package"). "subnetwork":
            empty mask rows and the topical mix (the masks come with the trees:
            ``sk.trees.syntax_bert_batch(..., variant=...)``). "gat": the GAT's scores, input (paper and release:
            the word embeddings ``w_i W_e`` plus POS embeddings; package: the embedding layer's output), POS ids
            (``token_pos_ids(..., variant=...)``), output LayerNorm (release), syntax heads (paper and release:
            with a bias, started as the release does, so a fresh model already differs from the pre-trained one;
            package: zero, so it does not) and probe. "bias" has one form (no variant).
        trees: ``"given"`` (default): every forward needs ``syntax_trees``. ``"predicted"``: a
            :class:`SyntaxTreePredictor` (``<base>.encoder.syntax``) reads the hidden states output by encoder layer
            ``predictor_layer``; a forward without ``syntax_trees`` predicts the token trees of its valid tokens there
            and the syntax layers above use them (padded batches only: packed ones raise ``ValueError``); a forward
            with ``syntax_trees`` (a padded ``TreeBatch``) uses them and makes the predictor's head cross-entropy on
            them :func:`syntax_aux_loss`. ``method="bias"`` and ``"subnetwork"`` with ``variant="package"`` only
            (the GAT runs before the first layer; the paper's sub-network masks are word-level).
        predictor_layer: ``trees="predicted"``: k in ``0..L-2``; layers ``0..k`` stay plain attention and every
            layer in ``layers`` must be above k (``layers=None``: every layer above k).
        predictor_arc_size: ``trees="predicted"``: the predictor's ``arc_size``.
        predicted_tree_ratio: ``trees="predicted"``, in ``[0, 1]``: in training mode, the share of forwards with
            ``syntax_trees`` given whose syntax layers use the predicted trees instead (drawn per forward from
            torch's default generator; the loss stays on the given trees). 0 (default): never.
        decoder_trees: an encoder-decoder model (T5, mT5, BART, mBART, Marian, M2M100): its decoder's self-attention
            takes target trees too (causal, like a decoder-only family; leak-free trees), given as
            ``decoder_syntax_trees`` (module docstring, "Translation models"); the cross-attention stays plain.
            ``method="bias"`` only.

    Returns:
        the same ``model`` (parameters added, ``config.syntax_attention`` recorded, attention switched to
        ``"syntaxkernels"``). The model gets its own copy of its config first (``model.config`` is then a new
        object), so other models built from the same config object are not changed. Forward then needs
        ``syntax_trees=TreeBatch`` (and takes ``syntax_pos`` = POS ids ``int64 [B, N]`` for "gat", e.g. from
        :func:`token_pos_ids`; without it every token gets tag 0, "unknown"); with ``trees="predicted"``
        ``syntax_trees`` is optional (without it the predicted trees are used; :func:`predict_syntax_trees`).

    For "gat" the GAT reads the word embeddings of the input (``"paper"``, ``"release"``: ``w_i W_e``, the paper's
    ``g_i``) or the embedding layer's output (``"package"``: word + position + type embeddings after their
    LayerNorm), plus its own POS embeddings, once per forward; its output G feeds the syntax heads of every
    chosen layer. With ``probe_rank`` set, add :func:`syntax_aux_loss` to the loss (under DDP an unused
    probe would need ``find_unused_parameters=True``).

    New parameters (state-dict names under ``<base>.encoder``): ``layer.{i}.attention.self.syntax.*``
    (``distance_bias``/``bias_scale``; ``topical.*``; ``syntax_proj.{t}.weight``), and for "gat"
    ``syntax_gat.*`` and ``syntax_probe.proj``; decoders: ``<base>.h.{i}.attn.syntax.*`` (GPT-2),
    ``<base>.layers.{i}.self_attn.syntax.*`` (the others); ModernBERT: ``model.layers.{i}.attn.syntax.*``; T5 / mT5:
    ``encoder.block.{i}.layer.0.SelfAttention.syntax.*``; BART, mBART, Marian, M2M100:
    ``model.encoder.layers.{i}.self_attn.syntax.*``. They take
    the dtype and device of the model's parameters.

        relations: "bias" with several relations per score (``syntax_trees`` a
            :class:`~syntaxkernels.RelationBatch` of that many relations: two parses, a tree and a graph, the steps
            up and down a tree): each layer's ``distance_bias`` is ``[R, T]`` (``[R, H, T]`` per head) and its
            ``bias_scale`` ``[R]``, every relation bucketed by ``buckets`` (one BucketSpec for all, or a list of R:
            the relations' own, e.g. ``RelationBatch.code_model``'s four of different sizes, whose tables then are
            R tensors ``[T_r]``); the encoder's (or a decoder-only model's) layers only. None (default): one
            distance.
    Raises:
        ``TypeError`` for a model that is not a transformers ``PreTrainedModel`` or arguments of the wrong
        kind; ``ValueError`` for an unsupported architecture or an ``is_decoder`` encoder, a decoder-only family with
        another method than "bias" or with ``trees="predicted"``, a family's method outside its ``methods`` (ModernBERT:
        "bias" with ``trees="given"`` only; the message says why), a second call, an unknown method or
        backend, arguments of another method, a window outside 0..254, layer indices out of range, unknown
        ``gat_config`` keys, ``syntax_heads`` outside 1..H or unknown targets, ``decoder_trees=True`` outside the
        encoder-decoder families or without a decoder (``T5EncoderModel``). The model is unchanged when it raises.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "bias":
        if variant is not None:
            raise ValueError("variant applies to method='subnetwork' and method='gat' (the distance bias has one form)")
    else:
        variant = VR.check_variant(VR.DEFAULT_VARIANT if variant is None else variant)
    base = _base_model(model)
    config = base.config
    encoder = _encoder(base)
    causal = _family(base).causal
    attention_modules = _self_attention_modules(base)  # checks the family's layout before anything changes
    if causal and (method != "bias" or trees != "given"):
        raise ValueError(f"decoder-only families ({_family(base).name}) take method='bias' with trees='given' "
                         f"(got method={method!r}, trees={trees!r}): the sub-network masks and the GAT read the whole "
                         "tree, which would tell a token about later words")
    family = _family(base)
    if method not in family.methods or ((not family.encoder or family.seq2seq) and trees != "given"):
        takes = " or ".join(repr(m) for m in family.methods)
        raise ValueError(f"{family.name} takes method={takes} with trees='given' (got method={method!r}, "
                         f"trees={trees!r}): {family.limits}")
    if getattr(config, "syntax_attention", None) is not None or hasattr(encoder, "syntax_hook_handle"):
        raise ValueError("syntax attention is already enabled on this model (config.syntax_attention is set); "
                         "use load_syntax_model to reload a saved syntax model")
    V.check_backend(backend)
    if method != "bias" and (buckets is not None or window is not None or per_head or relations is not None):
        raise ValueError("buckets, per_head, window and relations apply to method='bias' only")
    if relations is not None and (window is not None or decoder_trees or trees != "given"):
        raise ValueError("relations takes no window (it applies to one distance), no decoder_trees and "
                         "trees='given' only")
    if method != "subnetwork" and masks is not None:
        raise ValueError("masks applies to method='subnetwork' only")
    if method != "gat" and gat_config is not None:
        raise ValueError("gat_config applies to method='gat' only")
    decoder_modules = _decoder_self_attention_modules(base, family) if decoder_trees else []

    num_heads = config.num_attention_heads
    head_dim = config.hidden_size // num_heads
    if trees not in TREES:
        raise ValueError(f"trees must be one of {TREES}, got {trees!r}")
    if trees == "given":
        if predictor_layer is not None or predictor_arc_size != 128 or predicted_tree_ratio != 0.0:
            raise ValueError("predictor_layer, predictor_arc_size and predicted_tree_ratio apply to "
                             "trees='predicted' only")
        chosen = _as_layers(layers, config.num_hidden_layers)
    else:
        chosen = _predicted_layers(method, variant, layers, predictor_layer, predictor_arc_size,
                                   predicted_tree_ratio, config.num_hidden_layers)
    spec: Dict[str, Any] = {"method": method, "layers": None if layers is None else chosen, "backend": backend}
    if variant is not None:
        spec["variant"] = variant
    if trees == "predicted":
        spec.update(trees=trees, predictor_layer=predictor_layer, predictor_arc_size=predictor_arc_size,
                    predicted_tree_ratio=float(predicted_tree_ratio))
    encoder_parts: Dict[str, nn.Module] = {}
    # Every part is built (and every argument checked by its constructor) before the model changes.
    if method == "bias":
        bucket_spec = _as_buckets(buckets, relations)
        saved = ([asdict(b) for b in bucket_spec] if isinstance(bucket_spec, tuple) else asdict(bucket_spec))
        spec.update(buckets=saved, per_head=per_head, learnable_scale=learnable_scale, window=window)
        if relations is not None:
            spec.update(relations=relations)

        def make():
            return SyntaxDistanceBias(num_heads, bucket_spec, per_head, learnable_scale, window, backend,
                                      causal=causal, relations=relations)
    elif method == "subnetwork":
        mask_spec = _as_masks(masks)
        spec.update(masks=asdict(mask_spec))

        def make():
            return SyntaxSubnetworks(num_heads, head_dim, mask_spec, backend, variant=variant)
    else:
        gcfg = _as_gat_config(gat_config)
        if gcfg["num_pos_tags"] is None:
            gcfg["num_pos_tags"] = VR.default_pos_tags(variant)
        targets = VR.default_targets(variant) if targets is None else targets
        targets = (targets,) if isinstance(targets, str) else targets
        if isinstance(targets, (tuple, list)) and not targets:
            raise ValueError("targets must name at least one of 'q', 'k', 'v'")
        if syntax_heads == 0 and not isinstance(syntax_heads, bool):
            raise ValueError(f"syntax_heads must be an int in 1..{num_heads} (with 0 the GAT would be unused)")
        # The paper's and the release's GAT read the word embeddings (w_i W_e, shared with the encoder), the
        # package's the embedding layer's output; the release's dropout is BERT's hidden_dropout_prob.
        width = config.hidden_size if variant == "package" else base.get_input_embeddings().embedding_dim
        dropout = 0.0 if variant == "package" else getattr(config, "hidden_dropout_prob", getattr(config, "dropout", 0.1))
        gat = SyntaxGAT(width, num_layers=gcfg["num_layers"], num_heads=gcfg["num_heads"],
                        head_dim=gcfg["head_dim"], window=gcfg["window"], num_pos_tags=gcfg["num_pos_tags"],
                        backend=backend, variant=variant, dropout=dropout,
                        layer_norm_eps=getattr(config, "layer_norm_eps", 1e-12))
        init_std = getattr(config, "initializer_range", 0.02)

        def make():
            return SyntaxHeadInjection(gat.output_dim, num_heads, head_dim, syntax_heads, targets, variant=variant,
                                       init_std=init_std)

        encoder_parts["syntax_gat"] = gat
        if gcfg["probe_rank"] is not None:
            encoder_parts["syntax_probe"] = StructuralProbeLoss(gat.output_dim, int(gcfg["probe_rank"]),
                                                                variant=variant)

    prototype = make()  # checks the arguments even when no layer is chosen
    parts = [prototype] + [make() for _ in chosen[1:]] if chosen else []
    decoder_heads = getattr(base.config, "decoder_attention_heads", num_heads)  # T5: one num_heads
    decoder_parts = [SyntaxDistanceBias(decoder_heads, bucket_spec, per_head, learnable_scale, window, backend,
                                        causal=True) for _ in decoder_modules]
    if decoder_trees:
        spec["decoder_trees"] = True
    if method == "gat":
        spec.update(gat_config=gcfg, syntax_heads=syntax_heads, targets=list(prototype.targets))

    _use_own_config(model)  # everything below writes to this model's own copy
    config = base.config
    reference_param = next(model.parameters())
    factory = {"device": reference_param.device, "dtype": reference_param.dtype}
    for i, part in zip(chosen, parts):  # the new parts follow the model's mode (the GAT's dropout)
        attention_modules[i].syntax = part.to(**factory).train(model.training)
    for module, part in zip(decoder_modules, decoder_parts):
        module.syntax = part.to(**factory).train(model.training)
    for name, part in encoder_parts.items():
        setattr(encoder, name, part.to(**factory).train(model.training))
    if not isinstance(getattr(encoder, "config", None), transformers.PretrainedConfig):
        encoder.config = config  # the hook reads it (DistilBERT's encoder keeps none of its own)
    encoder.syntax_aux_losses = None
    if trees == "predicted":
        _attach_predictor(base, encoder, config, predictor_layer, predictor_arc_size, float(predicted_tree_ratio),
                          factory, model.training)
    if causal or family.seq2seq:
        if callable(getattr(model, "_validate_model_kwargs", None)):  # generate(..., syntax_trees=...)
            model._validate_model_kwargs = functools.partial(_validate_generate_kwargs, model)
        if callable(getattr(model, "_expand_inputs_for_generation", None)):  # num_beams, num_return_sequences > 1
            model._expand_inputs_for_generation = functools.partial(_expand_generate_inputs, model)
    if not _family(base).encoder:  # the base model runs the layers: its forward's arguments are read by name
        base.syntax_forward_arguments = _forward_argument_names(base)
    if family.seq2seq:  # the encoder stack embeds the input itself: its arguments are read by name
        encoder.syntax_forward_arguments = _forward_argument_names(encoder)
        if family.relative_positions:  # built once here, not in every forward (torch.compile)
            encoder.syntax_position_spec = _position_spec(encoder, bidirectional=True)
            if decoder_trees:
                base.decoder.syntax_position_spec = _position_spec(base.decoder, bidirectional=False)
            # Stacks whose every self-attention layer is a syntax layer read no position_bias [1, H, N, N]: layer 0
            # is handed a placeholder instead of building it (_unused_position_bias_pre_hook).
            for modules, parts_of in ((attention_modules, parts), (decoder_modules, decoder_parts)):
                if modules and len(parts_of) == len(modules):
                    modules[0].syntax_position_bias_hook_handle = modules[0].register_forward_pre_hook(
                        _unused_position_bias_pre_hook, with_kwargs=True)
        hook = _seq2seq_encoder_pre_hook
        decoder = getattr(base, "decoder", None)
        if decoder is not None:
            decoder.syntax_forward_arguments = _forward_argument_names(decoder)
            decoder.syntax_hook_handle = decoder.register_forward_pre_hook(
                _target_trees_pre_hook if decoder_trees else _drop_syntax_kwargs_pre_hook, with_kwargs=True)
    else:
        hook = _decoder_pre_hook if causal else _base_encoder_pre_hook if encoder is base else _encoder_pre_hook
    encoder.syntax_hook_handle = encoder.register_forward_pre_hook(hook, with_kwargs=True)
    if method == "gat" and variant != "package":
        encoder.syntax_embedding_hook_handle = base.register_forward_pre_hook(_word_embeddings_pre_hook,
                                                                              with_kwargs=True)

    # config.json then names SAVED_ATTN_IMPLEMENTATION: a plain from_pretrained of the saved model fails loudly
    # instead of silently dropping the syntax parameters (see SAVED_ATTN_IMPLEMENTATION).
    for each in {id(config): config, id(model.config): model.config}.values():
        each.syntax_attention = spec
        each.attn_implementation = SAVED_ATTN_IMPLEMENTATION
    if family.seq2seq:
        # Only the encoder stack runs the syntaxkernels attention; the rest of the model (the decoder's self- and
        # cross-attention) keeps its implementation ("sdpa" where it came from a saved syntax checkpoint).
        kept = getattr(getattr(base, "decoder", None) or model, "config", model.config)._attn_implementation
        if kept in (None, SAVED_ATTN_IMPLEMENTATION, ATTN_IMPLEMENTATION):
            kept = "sdpa"
        model.set_attn_implementation(kept)
        _own_encoder_config(model, encoder)
        encoder.set_attn_implementation(ATTN_IMPLEMENTATION)
        if decoder_trees:  # the decoder's self-attention (causal) and its cross-attention (plain) run it too
            base.decoder.set_attn_implementation(ATTN_IMPLEMENTATION)
            _check_attn_implementation(base.decoder.config)
        config = encoder.config
    else:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    if config._attn_implementation != ATTN_IMPLEMENTATION:
        raise RuntimeError(f"could not switch {type(model).__name__} to attn_implementation="
                           f"{ATTN_IMPLEMENTATION!r} (it is {config._attn_implementation!r})")
    return model


def syntax_parameters(model) -> Dict[str, nn.Parameter]:
    """The parameters ``enable_syntax_attention`` added, by their ``model.named_parameters()`` name."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    out = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if "syntax" in parts or "syntax_gat" in parts or "syntax_probe" in parts:
            out[name] = p
    return out


def syntax_aux_loss(model, *, parts: bool = False):
    """The structural-probe loss of the last forward (``method="gat"`` with ``gat_config["probe_rank"]``), or the
    tree predictor's loss (``trees="predicted"``).

    Returns ``distance_loss + depth_loss`` (a scalar tensor with gradients to the GAT and the probe), or the
    pair when ``parts=True``; None when the probe is off. With ``trees="predicted"``: the predictor's head
    cross-entropy on the last forward's ``syntax_trees`` (mean over their valid tokens; gradients to the predictor
    and to layers ``0..predictor_layer``), ``(loss,)`` when ``parts=True``; ``RuntimeError`` when the last forward
    had no ``syntax_trees``. Add it to the task loss with a weight, e.g.
    ``loss = out.loss + 0.1 * syntax_aux_loss(model)``. Accepts a ``DistributedDataParallel`` wrapper.
    """
    model = getattr(model, "module", model)
    base = _base_model(model)
    encoder = _encoder(base)
    if isinstance(getattr(encoder, "syntax", None), SyntaxTreePredictor):
        losses = encoder.syntax_aux_losses
        if losses is None:
            raise RuntimeError("no forward with syntax_trees has run since the last one without: the tree "
                               "predictor's loss is its head cross-entropy on given trees (a forward without "
                               "syntax_trees predicts them and has no loss)")
        return losses if parts else losses[0]
    if getattr(encoder, "syntax_probe", None) is None:
        return None
    losses = encoder.syntax_aux_losses
    if losses is None:
        raise RuntimeError("no forward has run since syntax attention was enabled")
    return losses if parts else losses[0] + losses[1]


def load_syntax_model(model_class, path: str, **kwargs):
    """Load a model saved with ``save_pretrained`` after :func:`enable_syntax_attention`.

    ``model_class.from_pretrained(path, **kwargs)`` loads the pre-trained weights, then syntax attention is
    re-enabled from ``config.syntax_attention`` and the syntax parameters are read from the checkpoint
    (:func:`syntaxkernels.integrations.checkpoint.restore_parameters`). Loading under another head class (e.g.
    ``BertModel`` from a ``BertForTokenClassification`` save) works.

    Args:
        model_class: e.g. ``BertForTokenClassification`` or ``AutoModel``.
        path: a directory written by ``save_pretrained`` (or a hub id).
        kwargs: passed to ``from_pretrained`` (``torch_dtype``, ``device_map`` ...).
    Returns:
        the model, syntax attention enabled, every syntax parameter restored.
    Raises:
        ``ValueError`` when the checkpoint has no ``config.syntax_attention`` (not saved from a syntax model) or
        lacks a syntax parameter.
    """
    with quiet_syntax_keys_report():  # the syntax keys are "unexpected" to the plain class
        model = model_class.from_pretrained(path, **kwargs)
    spec = getattr(model.config, "syntax_attention", None)
    if spec is None:
        raise ValueError(f"{path} has no config.syntax_attention: it was not saved from a syntax model "
                         "(use enable_syntax_attention on a freshly loaded model instead)")
    spec = dict(spec)
    if spec.get("method") in ("subnetwork", "gat"):
        spec.setdefault("variant", "package")  # saved before the variants existed: what it computed then
    model.config.syntax_attention = None
    model.base_model.config.syntax_attention = None
    enable_syntax_attention(model, **spec)
    restore_parameters(model, path, list(syntax_parameters(model)), model.base_model_prefix)
    return model
