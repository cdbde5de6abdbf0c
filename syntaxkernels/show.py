"""A look at what a syntax model learned: ``python -m syntaxkernels show SOURCE --out bias.png``.

:func:`learned_syntax` reads the syntax parameters of a model (no forward pass) and, given a batch, measures how
the model uses the trees; :func:`plot_learned` draws them, one panel per layer:

- **Distance bias** (method "bias"): for every layer, the bias each distance bucket adds to the attention
  scores, ``c * table[t]``, with the buckets' names (``BucketSpec.bucket_names()``) on the x axis and the layer's
  learned strength ``c`` (``bias_scale``) in the panel title; per-head tables are a heads x buckets heat map.
  Every layer is drawn on one shared range (y axis, colour scale: :func:`bias_scale_limit`), so layers compare
  at a glance; a layer whose bias is too small to change attention (spread across buckets below
  :data:`NEGLIGIBLE_BIAS`) is greyed and says so. One more panel shows ``c`` per layer.
- **Sub-networks** (method "subnetwork"): the topical attention's mixing weights depend on each token's
  sub-network outputs, so they are measured on a batch: for every layer, per head and relation
  (``MaskSpec.names``), the weight a token gives that relation's sub-network relative to a plain average of its
  non-empty sub-networks (1 = what a fresh model does; mean over the tokens that have the relation). Without a
  batch, one panel shows per layer and head how sharp the mixing can be, ``|Wk_h q_h| / sqrt(D)`` (0: the plain
  average, the fresh model).
- **Syntax heads** (method "gat"): the norm of each layer's injection weights ``syntax_proj[t]`` per target.
- **On a batch** (``batch=``), for the distance-bias layers: the share of attention each distance bucket
  receives, next to the same layer's attention without the bias (same queries and keys: "plain attention").

Sources (``source``):

- an ``nn.Module``: a transformers model after ``enable_syntax_attention``, an ``sk.nn`` module, or any model that
  holds them (their ``BucketSpec`` and ``MaskSpec`` are read from the modules);
- a directory written by ``save_pretrained`` of such a transformers model (``config.json`` gives the buckets
  and masks; the weights are read from ``model.safetensors``, its sharded index or ``pytorch_model.bin``);
- a file: ``*.safetensors``, or a ``torch.save`` of a state dict or of a checkpoint dict holding one under
  ``"state_dict"``, ``"model"``, ``"model_state_dict"`` or ``"module"`` (loaded with ``weights_only=True``; a
  pickled whole module needs ``trusted=True``, which unpickles it: only for files you trust);
- a state dict (a mapping of names to tensors).

A state dict does not record the ``BucketSpec``: pass ``buckets=``, or the default scheme is assumed
(``BucketSpec(max_distance=T - 2)``, clamp plus an unreachable bucket, from the table length T) and a note
says so.

This module is never imported by the ops or modules; matplotlib is needed only to draw (``pip install
matplotlib`` or the ``[plot]`` extra).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

import torch
from torch import nn

from .specs import BucketSpec, MaskSpec

__all__ = ["learned_syntax", "plot_learned", "LearnedSyntax", "BiasLayer", "TopicalLayer", "InjectionLayer",
           "DistanceMass", "attention_by_distance", "NEGLIGIBLE_BIAS", "bias_scale_limit"]

_CHECKPOINT_KEYS = ("state_dict", "model_state_dict", "model", "module")
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)(?:\.|$)")
_NUMBER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


#: A distance bias whose values (``c * table``) differ by less than this across the buckets (per head) is marked
#: as too small to change attention. Softmax ignores a common shift, so what a bias can do to a row of attention
#: weights is bounded by its spread ``s = max - min``: every weight is multiplied by a factor in ``[e^-s, e^s]``,
#: so with ``s < 0.01`` no weight (and no share of attention by distance) moves by more than ``e^0.01 - 1``, about
#: 1% of itself. The spread is taken over every bucket, also ones a batch may not have, so the bound holds for any
#: batch.
NEGLIGIBLE_BIAS = 0.01


@dataclass
class BiasLayer:
    """One distance-bias table. ``values`` (what is plotted) is ``bias_scale * table`` (``table`` when c is 1).

    ``spread``: ``max - min`` of ``values`` over the buckets (the largest over heads for a per-head table);
    ``negligible``: ``spread < NEGLIGIBLE_BIAS``, a bias too small to change any attention weight by more than
    about 1% of itself.
    """

    name: str  # the module's name (state-dict prefix)
    layer: Optional[int]
    table: torch.Tensor  # [T] or [H, T], the parameter distance_bias
    bias_scale: Optional[float]  # the parameter bias_scale, None when not learnable (c = 1)
    buckets: BucketSpec
    bucket_names: List[str]
    values: torch.Tensor  # c * table, [T] or [H, T]
    relation: Optional[int] = None  # with several relations per score: which one (its own table, c and buckets)

    @property
    def label(self) -> str:
        base = _label(self.name, self.layer)
        return base if self.relation is None else f"{base} relation {self.relation}"

    @property
    def per_head(self) -> bool:
        return self.table.dim() == 2

    @property
    def spread(self) -> float:
        rows = self.values if self.per_head else self.values[None]
        return float((rows.max(-1).values - rows.min(-1).values).max()) if rows.numel() else 0.0

    @property
    def negligible(self) -> bool:
        return self.spread < NEGLIGIBLE_BIAS


@dataclass
class TopicalLayer:
    """One topical attention (sub-network mixing)."""

    name: str
    layer: Optional[int]
    sharpness: torch.Tensor  # [H]: |Wk_h q_h| / sqrt(D), from the parameters
    relations: Optional[List[str]]  # MaskSpec.names when known
    # On a batch, per head and relation, over the tokens whose mask of that relation is non-empty (NaN for a
    # relation no token has): the mean mixing weight, and the mean of weight x (the token's number of non-empty
    # masks), i.e. the weight relative to a plain average (a fresh model: 1 everywhere).
    weights: Optional[torch.Tensor] = None  # [H, M]
    relative: Optional[torch.Tensor] = None  # [H, M]


@dataclass
class InjectionLayer:
    """One syntax-head injection: the Frobenius norm of ``syntax_proj[t].weight`` per target t."""

    name: str
    layer: Optional[int]
    norms: Dict[str, float]


@dataclass
class DistanceMass:
    """Share of attention per distance bucket on a batch (mean over valid query rows and heads)."""

    name: str
    layer: Optional[int]
    bucket_names: List[str]
    learned: torch.Tensor  # [T], with the learned bias
    plain: torch.Tensor  # [T], the same scores without the bias
    pairs: torch.Tensor  # [T], share of the allowed pairs in each bucket (what uniform attention would give)


@dataclass
class LearnedSyntax:
    """What :func:`learned_syntax` found (and :func:`plot_learned` draws)."""

    source: str
    bias: List[BiasLayer] = field(default_factory=list)
    topical: List[TopicalLayer] = field(default_factory=list)
    injection: List[InjectionLayer] = field(default_factory=list)
    mass: List[DistanceMass] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.bias or self.topical or self.injection)

    def summary(self) -> str:
        """A few lines of text: the figures of every panel."""
        lines = [f"{self.source}:"]
        for b in self.bias:
            scale = "1 (fixed)" if b.bias_scale is None else f"{b.bias_scale:.4g}"
            lines.append(f"  {b.label}: bias scale c = {scale}, spread {b.spread:.4g}"
                         + (f" (< {NEGLIGIBLE_BIAS}: too small to change attention)" if b.negligible else ""))
            rows = b.values[None] if not b.per_head else b.values
            for h, row in enumerate(rows):
                head = f"head {h}: " if b.per_head else ""
                lines.append("    " + head + ", ".join(f"{n} {v:+.3f}" for n, v in zip(b.bucket_names, row.tolist())))
        for t in self.topical:
            lines.append(f"  {_label(t.name, t.layer)}: topical sharpness per head "
                         + ", ".join(f"{v:.3f}" for v in t.sharpness.tolist()))
            if t.weights is not None:
                names = t.relations or [str(m) for m in range(t.weights.shape[1])]
                lines.append("    mixing weight (mean over heads; relative to a plain average): " + ", ".join(
                    f"{n} {w:.3f} ({r:.2f}x)" for n, w, r in zip(names, t.weights.mean(0).tolist(),
                                                                  t.relative.mean(0).tolist())))
        for g in self.injection:
            lines.append(f"  {_label(g.name, g.layer)}: injection |W| " + ", ".join(f"{k} {v:.4g}" for k, v in g.norms.items()))
        for m in self.mass:
            lines.append(f"  {_label(m.name, m.layer)}: attention share by distance (learned / without bias)")
            lines.append("    " + ", ".join(f"{n} {a:.3f}/{p:.3f}" for n, a, p in
                                            zip(m.bucket_names, m.learned.tolist(), m.plain.tolist())))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _layer_index(name: str) -> Optional[int]:
    match = _LAYER.search(name)
    if match is None:
        numbers = _NUMBER.findall(name)
        return int(numbers[-1]) if numbers else None
    return int(match.group(1))


def _label(name: str, layer: Optional[int]) -> str:
    if layer is not None:
        return f"layer {layer}"
    return name or "model"


def _prefix(name: str, suffix: str) -> str:
    return name[: -len(suffix)].rstrip(".") if name.endswith(suffix) else name


def _bias_layers(name: str, table: torch.Tensor, scale: Optional[torch.Tensor], buckets,
                 relations: Optional[int]) -> List[BiasLayer]:
    """One :class:`BiasLayer` per table: the layer's, or with ``relations`` (R, its tables ``[R, T_max]`` or ``[R, H,
    T_max]``, ``buckets`` one BucketSpec or R of them) each relation's first ``T_r`` entries with its strength."""
    if relations is None:
        return [_bias_layer(name, table, scale, buckets)]
    specs = (buckets,) * relations if isinstance(buckets, BucketSpec) else tuple(buckets)
    if table.shape[0] != relations or len(specs) != relations:
        raise ValueError(f"{name}.distance_bias {tuple(table.shape)} does not hold {relations} relations' tables "
                         f"({len(specs)} BucketSpecs)")
    scales = None if scale is None else scale.detach().reshape(-1)
    out = []
    for r, spec in enumerate(specs):
        layer = _bias_layer(name, table[r][..., :spec.num_buckets],
                            None if scales is None else scales[r if scales.numel() > 1 else 0], spec)
        layer.relation = r
        out.append(layer)
    return out


def _bias_layer(name: str, table: torch.Tensor, scale: Optional[torch.Tensor], buckets: BucketSpec) -> BiasLayer:
    table = table.detach().float().cpu()
    if table.shape[-1] != buckets.num_buckets:
        raise ValueError(f"{name}.distance_bias has {table.shape[-1]} entries but the buckets "
                         f"{buckets} have {buckets.num_buckets}: pass the BucketSpec it was trained with")
    c = None if scale is None else float(scale.detach().float().reshape(-1)[0])
    values = table * (1.0 if c is None else c)
    return BiasLayer(name, _layer_index(name), table, c, buckets, buckets.bucket_names(), values)


def _topical_u(query: torch.Tensor, key_weight: torch.Tensor) -> torch.Tensor:
    """``Wk q`` per mixing head: ``[H, D]`` for the package's per-head topical attention, ``[1, E]`` for the paper's
    (one query at full width, shared by all heads)."""
    if key_weight.dim() == 2:
        return (key_weight @ query[0])[None]
    return torch.matmul(key_weight, query[:, :, None])[:, :, 0]


def _sharpness(query: torch.Tensor, key_weight: torch.Tensor) -> torch.Tensor:
    u = _topical_u(query.detach().float().cpu(), key_weight.detach().float().cpu())
    return u.norm(dim=-1) / math.sqrt(u.shape[-1])


# -------------------------------------------------------------------------------------------- from modules


def _from_module(model: nn.Module, source: str) -> LearnedSyntax:
    from .nn import DistanceBias, Subnetworks, SyntaxHeads

    out = LearnedSyntax(source)
    for name, module in model.named_modules():
        if isinstance(module, DistanceBias):
            out.bias.extend(_bias_layers(name, module.distance_bias, module.bias_scale, module.buckets,
                                         module.relations))
        elif isinstance(module, Subnetworks) and module.variant != "release":  # the release: a fixed sum
            topical = module.topical
            out.topical.append(TopicalLayer(name, _layer_index(name), _sharpness(topical.query, topical.key_weight),
                                            list(module.masks.names)))
        elif isinstance(module, SyntaxHeads):
            norms = {t: float(p.weight.detach().float().norm()) for t, p in module.syntax_proj.items()}
            out.injection.append(InjectionLayer(name, _layer_index(name), norms))
    return out


# -------------------------------------------------------------------------------------------- from tensors


def _infer_buckets(table_length: int) -> BucketSpec:
    if table_length < 3:
        raise ValueError(f"cannot infer the BucketSpec of a table of {table_length} entries: pass buckets=")
    return BucketSpec(max_distance=table_length - 2)


def _from_state_dict(state: Mapping[str, torch.Tensor], source: str, buckets, masks: Optional[MaskSpec],
                     notes: List[str], relations: Optional[int] = None) -> LearnedSyntax:
    out = LearnedSyntax(source, notes=list(notes))
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    assumed = None
    for key in sorted(tensors):
        if not key.endswith("distance_bias"):
            continue
        prefix = _prefix(key, "distance_bias")
        table = tensors[key]
        spec = buckets
        if spec is None:
            spec = _infer_buckets(table.shape[-1])
            assumed = spec
        scale = tensors.get(f"{prefix}.bias_scale" if prefix else "bias_scale")
        out.bias.extend(_bias_layers(prefix, table, scale, spec, relations))
    if assumed is not None:
        out.notes.append(f"buckets assumed: {assumed} (the state dict does not record them; pass buckets= or "
                         "--max-distance/--log-distance)")
    for key in sorted(tensors):
        if not key.endswith("topical.query"):
            continue
        prefix = _prefix(key, "topical.query")
        key_weight = tensors.get(_prefix(key, "query") + ".key_weight")
        if key_weight is None:
            continue
        out.topical.append(TopicalLayer(prefix, _layer_index(prefix), _sharpness(tensors[key], key_weight),
                                        None if masks is None else list(masks.names)))
    injection: Dict[str, Dict[str, float]] = {}
    for key in sorted(tensors):
        match = re.match(r"^(.*?)\.?syntax_proj\.([qkv])\.weight$", key)
        if match:
            injection.setdefault(match.group(1), {})[match.group(2)] = float(tensors[key].float().norm())
    for prefix, norms in injection.items():
        out.injection.append(InjectionLayer(prefix, _layer_index(prefix), norms))
    for part in (out.bias, out.topical, out.injection):
        part.sort(key=lambda p: (p.layer is None, p.layer if p.layer is not None else 0, p.name))
    return out


def _unwrap_checkpoint(obj, where: str):
    """A state dict (or module) inside what torch.load returned."""
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, Mapping):
        if any(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        for key in _CHECKPOINT_KEYS:
            if key in obj:
                return _unwrap_checkpoint(obj[key], f"{where}[{key!r}]")
        raise ValueError(f"{where} holds no tensors and none of the keys {list(_CHECKPOINT_KEYS)} "
                         f"(its keys: {sorted(map(str, obj))[:8]})")
    raise ValueError(f"{where} is a {type(obj).__name__}, not a state dict, a checkpoint dict or a module")


def _read_directory(path: Path):
    """(state dict of the syntax tensors, BucketSpec (a tuple of R with per-relation buckets) or None, MaskSpec or
    None, relations or None) of a save_pretrained directory."""
    config_path = path / "config.json"
    spec = None
    if config_path.is_file():
        with open(config_path, encoding="utf-8") as f:
            spec = json.load(f).get("syntax_attention")
    if spec is None:
        raise ValueError(f"{path} is not a saved syntax model: its config.json has no 'syntax_attention' "
                         "(save a model with save_pretrained after enable_syntax_attention)")
    buckets = spec.get("buckets")
    if isinstance(buckets, list):  # several relations, one BucketSpec each
        buckets = tuple(BucketSpec(**b) for b in buckets)
    elif buckets:
        buckets = BucketSpec(**buckets)
    else:
        buckets = None
    masks = MaskSpec(**spec["masks"]) if spec.get("masks") else None
    index, single, binary = path / "model.safetensors.index.json", path / "model.safetensors", path / "pytorch_model.bin"
    state: Dict[str, torch.Tensor] = {}
    if index.is_file() or single.is_file():
        from safetensors.torch import load_file

        if index.is_file():
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = [single.name]
        for name in files:
            state.update(load_file(str(path / name)))
    elif binary.is_file():
        state = torch.load(binary, map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{path} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    return state, buckets, masks, spec.get("relations")


def _load_directory_model(path: Path) -> nn.Module:
    """The saved model, through ``load_syntax_model`` under the class it was saved from (else ``AutoModel``)."""
    import transformers

    from .integrations.transformers import load_syntax_model

    with open(path / "config.json", encoding="utf-8") as f:
        architectures = json.load(f).get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    return load_syntax_model(model_class or transformers.AutoModel, str(path))


def _load_file(path: Path, trusted: bool):
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the unpickler's errors have many types
        if trusted:
            return torch.load(path, map_location="cpu", weights_only=False)
        raise ValueError(f"{path} is not a plain state dict (torch.load(weights_only=True) failed: "
                         f"{str(exc).splitlines()[0][:200]}). If it is a pickled module you trust, pass "
                         "trusted=True (command line: --trust-pickle), which unpickles it") from None
    return obj


def learned_syntax(source, *, buckets: Optional[BucketSpec] = None, masks: Optional[MaskSpec] = None,
                   batch: Optional[Mapping[str, Any]] = None, trusted: bool = False) -> LearnedSyntax:
    """The learned syntax parameters of ``source`` (see the module docstring for what it may be).

    Args:
        source: an ``nn.Module``, a state dict, a directory saved by ``save_pretrained``, or a file.
        buckets: the :class:`BucketSpec` of a state dict's tables (ignored for modules and directories, which
            record it).
        masks: the :class:`MaskSpec` of a state dict's sub-networks (names the relations).
        batch: keyword arguments for one forward, ``model(**batch)`` (e.g. ``input_ids``, ``attention_mask``,
            ``syntax_trees`` for a transformers model; ``x`` and ``trees`` for an ``sk.nn`` module). Needs a module
            (a directory is loaded with ``load_syntax_model(AutoModel, ...)``). Adds the attention share per
            distance bucket of every distance-bias layer (:class:`DistanceMass`) and the mean topical mixing
            weights (``TopicalLayer.weights``).
        trusted: allow unpickling a file that holds a whole module (``torch.load(weights_only=False)``).

    Returns:
        a :class:`LearnedSyntax` (every tensor on the CPU, float32, detached).

    Raises:
        ``ValueError`` for a path that does not exist, a directory not saved from a syntax model, a file that is
        not a state dict (without ``trusted``), a table whose length does not match ``buckets``, ``batch`` with a
        source that is not a module or directory, and a source with no syntax parameters at all; ``TypeError``
        for a ``source`` of another kind or ``buckets``/``masks`` of the wrong type.
    """
    if buckets is not None and not isinstance(buckets, BucketSpec):
        raise TypeError(f"buckets must be a BucketSpec or None, got {type(buckets).__name__}")
    if masks is not None and not isinstance(masks, MaskSpec):
        raise TypeError(f"masks must be a MaskSpec or None, got {type(masks).__name__}")
    model = None
    if isinstance(source, nn.Module):
        model, name = source, type(source).__name__
        result = _from_module(source, name)
    elif isinstance(source, Mapping):
        if batch is not None and not any(isinstance(v, nn.Module) for v in source.values()):
            raise ValueError("batch= needs a model (an nn.Module or a save_pretrained directory), not a state dict")
        inner = _unwrap_checkpoint(source, "the state dict")
        if isinstance(inner, nn.Module):
            return learned_syntax(inner, batch=batch)
        result = _from_state_dict(inner, "state dict", buckets, masks, [])
    elif isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        if path.is_dir():
            state, dir_buckets, dir_masks, relations = _read_directory(path)
            result = _from_state_dict(state, str(path), dir_buckets or buckets, dir_masks or masks, [], relations)
            if batch is not None:
                model = _load_directory_model(path)
        elif path.is_file():
            obj = _unwrap_checkpoint(_load_file(path, trusted), str(path))
            if isinstance(obj, nn.Module):
                model = obj
                result = _from_module(obj, str(path))
            else:
                if batch is not None:
                    raise ValueError(f"batch= needs a model: {path} holds a state dict")
                result = _from_state_dict(obj, str(path), buckets, masks, [])
        else:
            raise ValueError(f"no such file or directory: {str(path)!r}")
    else:
        raise TypeError("source must be an nn.Module, a state dict, or the path of a save_pretrained directory or "
                        f"a checkpoint file; got {type(source).__name__}")
    if result.empty():
        raise ValueError(f"{result.source} has no syntax parameters (no distance_bias, topical or syntax_proj "
                         "weights): was it saved after enable_syntax_attention / built with sk.nn modules?")
    if batch is not None:
        measured = attention_by_distance(model, batch)
        result.mass = measured.mass
        # The loaded model may name its modules differently from the checkpoint (a head class's save loaded
        # as the base class): match by name, else by layer index.
        by_name = {t.name: t for t in measured.topical}
        by_layer = {t.layer: t for t in measured.topical}
        for t in result.topical:
            found = by_name.get(t.name) or (by_layer.get(t.layer) if len(by_layer) == len(measured.topical) else None)
            if found is not None:
                t.weights, t.relative, t.relations = found.weights, found.relative, found.relations
        result.notes += measured.notes
    return result


# -------------------------------------------------------------------------------------------- on a batch


def _valid_lengths(lengths, batch: int, n: int, device) -> torch.Tensor:
    if lengths is None:
        return torch.full((batch,), n, dtype=torch.int64, device=device)
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dtype == torch.bool:  # key-padding mask, True = padding (a suffix)
        return (~lengths).sum(-1)
    return lengths.to(torch.int64)


class _MassRecorder:
    """Wraps a DistanceBias's ``attend`` for one forward: records the attention share per bucket."""

    def __init__(self, module):
        self.module = module
        self.learned = torch.zeros(module.buckets.num_buckets, dtype=torch.float64)
        self.plain = torch.zeros_like(self.learned)
        self.pairs = torch.zeros_like(self.learned)
        self.rows = 0.0  # valid query rows x heads
        self.query_rows = 0.0  # valid query rows

    def __call__(self, q, k, v, trees, lengths=None, *, scale=None, window=None, causal=False, dropout_p=0.0,
                 position_window=None, position_buckets=None, position_table=None):
        from . import reference
        from .nn import _distance_and_lengths

        module = self.module
        distance, given = _distance_and_lengths(trees, lengths)
        B, H, N, D = q.shape
        valid = _valid_lengths(given, B, N, q.device)
        allowed = reference.allowed_pairs(distance, valid, window, causal, position_window)  # [B, N, N]
        (k_heads,) = reference.expand_kv_heads(q, k)  # (grouped-query k: one head per query head)
        scores = torch.matmul(q.float(), k_heads.float().transpose(-1, -2)) * (scale if scale is not None else D ** -0.5)
        if position_buckets is not None:  # T5's position term belongs to both arms (only the tree bias differs)
            scores = scores + position_buckets.bias(position_table.detach(), N)[None]
        bias = reference.gather_bias(distance, module.distance_bias.detach(), module.buckets,
                                     None if module.bias_scale is None else module.bias_scale.detach())
        bucket = module.buckets.lut(q.device)[distance.long()]  # [B, N, N]
        rows = allowed.any(-1)  # [B, N] query rows with a key
        for target, with_bias in ((self.learned, True), (self.plain, False)):
            s = (scores + bias) if with_bias else scores
            p = torch.softmax(s.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
            p = torch.nan_to_num(p, nan=0.0).sum(1)  # [B, N, N], summed over heads
            target += torch.zeros_like(target).scatter_add_(0, bucket.flatten().cpu(), p.flatten().double().cpu())
        per_row = allowed.double() / allowed.sum(-1, keepdim=True).clamp(min=1).double()
        self.pairs += torch.zeros_like(self.pairs).scatter_add_(0, bucket.flatten().cpu(), per_row.flatten().cpu())
        self.rows += float(rows.sum()) * H
        self.query_rows += float(rows.sum())
        return self._original(q, k, v, trees, lengths, scale=scale, window=window, causal=causal,
                              dropout_p=dropout_p, position_window=position_window,
                              position_buckets=position_buckets, position_table=position_table)


def attention_by_distance(model: nn.Module, batch: Mapping[str, Any]) -> LearnedSyntax:
    """Run ``model(**batch)`` once (eval mode, no gradients) and measure how it uses the trees.

    Returns a :class:`LearnedSyntax` whose ``mass`` holds, per distance-bias layer, the share of attention each
    bucket receives with the learned bias and without it (the same queries and keys), averaged over the valid
    query rows and heads, plus the share of the allowed pairs in each bucket; and whose ``topical`` holds per
    sub-network layer the mean mixing weight of each head and relation over the tokens with a non-empty mask.
    The model's training mode is restored afterwards.
    """
    from .nn import DistanceBias, Subnetworks

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of keyword arguments for model(**batch), got {type(batch).__name__}")
    recorders: Dict[str, _MassRecorder] = {}
    topical: Dict[str, list] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, DistanceBias):
            recorder = _MassRecorder(module)
            recorder._original = module.attend
            module.attend = recorder  # an instance attribute: found before the class's method
            recorders[name] = recorder
        elif isinstance(module, Subnetworks) and module.variant != "release":
            sums: list = [None, None, None]  # weight sums [H, M], relative sums [H, M], token counts [M]
            topical[name] = [module, sums]

            def hook(mod, inputs, output, sums=sums):
                outputs, nonempty = inputs[0].detach().float(), inputs[1]
                if mod.variant == "paper":  # one mix at full width over every m (empty rows were filled)
                    B, M, H, N, D = outputs.shape
                    outputs = outputs.permute(0, 1, 3, 2, 4).reshape(B, M, 1, N, H * D)
                    nonempty = torch.ones_like(nonempty)
                u = _topical_u(mod.query.float(), mod.key_weight.float())
                u = u / math.sqrt(outputs.shape[-1])
                s = torch.einsum("bmhnd,hd->bmhn", outputs, u)
                s = s.masked_fill(~nonempty[:, :, None, :], float("-inf"))
                w = torch.nan_to_num(torch.softmax(s, dim=1), nan=0.0)  # [B, M, H, N]
                present = nonempty[:, :, None, :].float()  # [B, M, 1, N]
                count = nonempty.sum(1, keepdim=True)[:, :, None, :].float()  # [B, 1, 1, N] non-empty masks
                parts = [(w * present).sum(dim=(0, 3)).t(), (w * count * present).sum(dim=(0, 3)).t(),
                         nonempty.sum(dim=(0, 2)).float()]
                for k, part in enumerate(parts):
                    part = part.double().cpu()
                    sums[k] = part if sums[k] is None else sums[k] + part

            handles.append(module.topical.register_forward_hook(hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for recorder in recorders.values():
            del recorder.module.attend
        for handle in handles:
            handle.remove()
        model.train(was_training)
    out = LearnedSyntax(type(model).__name__)
    for name, r in recorders.items():
        if r.rows == 0:
            out.notes.append(f"{name}: not called in the forward (no attention measured)")
            continue
        names = r.module.buckets.bucket_names()
        out.mass.append(DistanceMass(name, _layer_index(name), names, (r.learned / r.rows).float(),
                                     (r.plain / r.rows).float(), (r.pairs / r.query_rows).float()))
    for name, (module, (total, relative, count)) in topical.items():
        if total is None:
            out.notes.append(f"{name}: not called in the forward (no mixing weights measured)")
            continue
        count = torch.where(count > 0, count, torch.full_like(count, float("nan")))
        out.topical.append(TopicalLayer(name, _layer_index(name),
                                        _sharpness(module.topical.query, module.topical.key_weight),
                                        list(module.masks.names), (total / count).float(),
                                        (relative / count).float()))
    out.mass.sort(key=lambda m: (m.layer is None, m.layer or 0, m.name))
    return out


# -------------------------------------------------------------------------------------------- drawing


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] != "matplotlib":
            raise  # matplotlib is there but something it needs is not: its own message is the useful one
        raise ImportError("plot_learned needs matplotlib, which is not installed: pip install matplotlib "
                          "(or install syntaxkernels with its [plot] extra); learned_syntax() returns the same figures "
                          "without it") from exc
    return plt


def _panels(learned: LearnedSyntax) -> List[tuple]:
    panels: List[tuple] = [("bias", b) for b in learned.bias]
    if learned.bias:
        panels.append(("scale", learned.bias))
    panels += [("mass", m) for m in learned.mass]
    measured = [t for t in learned.topical if t.weights is not None]
    panels += [("topical", t) for t in measured]
    if learned.topical:
        panels.append(("sharpness", learned.topical))
    if learned.injection:
        panels.append(("injection", learned.injection))
    return panels


def bias_scale_limit(layers: List[BiasLayer]) -> float:
    """The one value range every distance-bias panel shares (``[-limit, limit]``): the largest ``|c * table|`` of
    any layer, at least :data:`NEGLIGIBLE_BIAS` (so layers that learned nothing look flat, not magnified)."""
    return max([NEGLIGIBLE_BIAS] + [float(b.values.abs().max()) for b in layers if b.values.numel()])


def _draw_bias(ax, fig, b: BiasLayer, limit: float) -> None:
    """One layer's bias on the shared range ``[-limit, limit]`` (y axis of the bars, colour scale of a heat map)."""
    x = list(range(len(b.bucket_names)))
    scale = "1 (fixed)" if b.bias_scale is None else f"{b.bias_scale:.3g}"
    if b.per_head:
        values = b.values.numpy()
        image = ax.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_yticks(range(values.shape[0]))
        ax.set_ylabel("head")
        fig.colorbar(image, ax=ax, label="c · bias (scale shared by the layers)")
    else:
        colors = ["#c0392b" if v < 0 else "#2471a3" for v in b.values.tolist()]
        ax.bar(x, b.values.numpy(), color=colors)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylim(-1.05 * limit, 1.05 * limit)
        ax.set_ylabel("bias added to the score (c · table)")
    ax.set_xticks(x)
    ax.set_xticklabels(b.bucket_names, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("tree distance (bucket)")
    title = f"{b.label}: distance bias, c = {scale}"
    if b.negligible:
        title += "\ntoo small to change attention"
        ax.set_facecolor("#eeeeee")
        ax.text(0.5, 0.03, f"spread {b.spread:.2g} < {NEGLIGIBLE_BIAS}: no attention weight moves by 1%",
                transform=ax.transAxes, ha="center", va="bottom", fontsize=7, color="#555555",
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
    ax.set_title(title, fontsize=10)


def _draw_scale(ax, layers: List[BiasLayer]) -> None:
    labels = [b.label.replace("layer ", "").replace(" relation ", ".r") for b in layers]
    values = [1.0 if b.bias_scale is None else b.bias_scale for b in layers]
    ax.bar(range(len(values)), values, color="#7d3c98")
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("bias scale c (init 1)")
    ax.set_title("learned bias scale per layer", fontsize=10)


def _draw_mass(ax, m: DistanceMass) -> None:
    x = torch.arange(len(m.bucket_names)).float()
    ax.bar((x - 0.2).numpy(), m.plain.numpy(), width=0.4, label="without the bias", color="#a6acaf")
    ax.bar((x + 0.2).numpy(), m.learned.numpy(), width=0.4, label="with the learned bias", color="#2471a3")
    ax.plot(x.numpy(), m.pairs.numpy(), "k_", markersize=10, label="share of pairs")
    ax.set_xticks(x.tolist())
    ax.set_xticklabels(m.bucket_names, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("tree distance (bucket)")
    ax.set_ylabel("share of attention")
    ax.legend(fontsize=7)
    ax.set_title(f"{_label(m.name, m.layer)}: attention by tree distance", fontsize=10)


def _draw_topical(ax, fig, t: TopicalLayer) -> None:
    relative = t.relative.numpy()
    finite = relative[relative == relative]  # NaN: a relation no token of the batch has
    spread = max(float(abs(finite - 1.0).max()) if finite.size else 0.0, 0.05)
    image = ax.imshow(relative, cmap="PuOr_r", vmin=1.0 - spread, vmax=1.0 + spread, aspect="auto")
    names = t.relations or [str(m) for m in range(relative.shape[1])]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(relative.shape[0]))
    ax.set_xlabel("relation (sub-network)")
    ax.set_ylabel("head")
    fig.colorbar(image, ax=ax, label="weight / plain average (1 = fresh)")
    ax.set_title(f"{_label(t.name, t.layer)}: topical mixing weights", fontsize=10)


def _draw_sharpness(ax, fig, layers: List[TopicalLayer]) -> None:
    values = torch.stack([t.sharpness for t in layers]).numpy()
    image = ax.imshow(values, cmap="magma", vmin=0.0, aspect="auto")
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels([_label(t.name, t.layer) for t in layers], fontsize=8)
    ax.set_xticks(range(values.shape[1]))
    ax.set_xlabel("head")
    fig.colorbar(image, ax=ax, label="|Wk q| / sqrt(D)")
    ax.set_title("topical query sharpness (0 = plain average)", fontsize=10)


def _draw_injection(ax, layers: List[InjectionLayer]) -> None:
    targets = sorted({t for g in layers for t in g.norms})
    width = 0.8 / max(len(targets), 1)
    for k, target in enumerate(targets):
        values = [g.norms.get(target, 0.0) for g in layers]
        ax.bar([i + (k - (len(targets) - 1) / 2) * width for i in range(len(layers))], values, width=width,
               label=f"W_{target}")
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels([_label(g.name, g.layer).replace("layer ", "") for g in layers], fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("|syntax_proj weight| (init 0)")
    ax.legend(fontsize=7)
    ax.set_title("syntax-head injection strength", fontsize=10)


def plot_learned(source, out: Union[str, os.PathLike, None] = None, *, buckets: Optional[BucketSpec] = None,
                 masks: Optional[MaskSpec] = None, batch: Optional[Mapping[str, Any]] = None, trusted: bool = False,
                 title: Optional[str] = None, columns: int = 3, dpi: int = 120):
    """Plot what a syntax model learned, one panel per layer, and return the plotted figures.

    ``source``, ``buckets``, ``masks``, ``batch`` and ``trusted`` are those of :func:`learned_syntax` (``source``
    may also be a :class:`LearnedSyntax`). ``out``: the image file to write (PNG, or any format matplotlib knows
    from the suffix); None writes nothing. ``columns``: panels per row.

    Returns ``(learned, figure)``: the :class:`LearnedSyntax` whose values are exactly what the panels show, and
    the matplotlib ``Figure``. Raises ``ImportError`` saying how to install matplotlib when it is missing, and
    what :func:`learned_syntax` raises.
    """
    learned = source if isinstance(source, LearnedSyntax) else learned_syntax(
        source, buckets=buckets, masks=masks, batch=batch, trusted=trusted)
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    plt = _pyplot()
    panels = _panels(learned)
    cols = min(columns, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.7 * rows), squeeze=False)
    limit = bias_scale_limit(learned.bias)
    for ax, (kind, item) in zip(axes.flat, panels):
        if kind == "bias":
            _draw_bias(ax, fig, item, limit)
        elif kind == "scale":
            _draw_scale(ax, item)
        elif kind == "mass":
            _draw_mass(ax, item)
        elif kind == "topical":
            _draw_topical(ax, fig, item)
        elif kind == "sharpness":
            _draw_sharpness(ax, fig, item)
        else:
            _draw_injection(ax, item)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    heading = title or f"learned syntax: {learned.source}"
    if learned.notes:
        heading += "\n" + "\n".join(learned.notes)
    fig.suptitle(heading, fontsize=11)
    top = 1.0 - (0.35 + 0.25 * heading.count("\n")) / (3.7 * rows)  # room for the heading's lines
    fig.tight_layout(rect=(0, 0, 1, top))
    if out is not None:
        fig.savefig(os.fspath(out), dpi=dpi)
    return learned, fig
