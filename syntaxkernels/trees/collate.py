"""DataLoader collation: items with token ids and heads (or parsed sentences) to padded tensors + TreeBatch.

``TreeCollator`` is a picklable callable, so it works as ``collate_fn`` with ``num_workers > 0``; the
``TreeBatch`` it returns has ``pin_memory()``, so ``pin_memory=True`` pins the trees along with the ids.

Items are either

- dicts with ``"heads"`` (token-level, 0-based, -1 for a root; a list, array or 1-D tensor) and usually
  ``"input_ids"``; any other key is collated too (see :class:`TreeCollator`); or
- :class:`~syntaxkernels.trees.Sentence` objects (anything with ``words`` and ``heads``): with a
  ``tokenizer`` they are tokenised (``is_split_into_words=True``) and their trees aligned to the tokens
  with :func:`~syntaxkernels.trees.align.align_batch`; without one the trees stay word-level; or
- rows of :func:`~syntaxkernels.trees.parse_dataset` (dicts with ``words`` and ``heads``, no ``input_ids``) with a
  ``tokenizer``: each row is read back as its text's Sentence (:func:`~syntaxkernels.trees.sentence_from_row`,
  which checks the heads against the row's ``sentence_lengths``) and collated as Sentence items are, so ``DataLoader(parsed, collate_fn=TreeCollator(tokenizer=tok))`` is the whole pipeline from a parsed
  corpus to a model's batch. Without a tokenizer such rows are dict items (word-level trees from ``heads``).
"""
from __future__ import annotations

import numbers
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from ..specs import MAX_PATH, MaskSpec
from ..variants import check_variant
from .align import align_batch
from .batch import TreeBatch
from .packed import PackedTreeBatch
from .parse import DATASET_COLUMNS, sentence_from_row
from .syntax_bert import syntax_bert_batch

__all__ = ["TreeCollator", "collate_trees", "TokenBudgetBatchSampler"]

_TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")
#: Keys of a collated batch of parsed rows that no other column of the rows may take.
_ROW_OUTPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "lengths", "trees",
                    "word_ids", "sentences", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                    "max_length_k", "cu_seqlens", "max_seqlen")


def _is_number_sequence(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.dtype.kind in "iufb"
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, numbers.Number) for v in value)
    return False


def _is_scalar(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 0
    return isinstance(value, (numbers.Number, np.generic))


def _pad(rows: List[Any], width: int, value) -> torch.Tensor:
    tensors = [r if isinstance(r, torch.Tensor) else torch.as_tensor(np.asarray(r)) for r in rows]
    dtype = tensors[0].dtype if tensors else torch.int64
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for b, t in enumerate(tensors):
        out[b, : t.shape[0]] = t
    return out


class TreeCollator:
    """Collate tree items into a dict of padded tensors with a ``"trees"`` :class:`TreeBatch`.

    Args:
        pad_token_id: padding value of ``input_ids``.
        pad_values: padding value per key for the other per-token keys (default 0; ``"labels"`` -100).
        heads_key: the key of the token-level heads in dict items.
        tokenizer: a fast tokenizer, for :class:`Sentence` items and ``parse_dataset`` rows (ignored for other
            dict items).
        max_length: with a tokenizer, truncate to this many tokens (words cut off are dropped from the
            trees and their dependents re-attach to the nearest remaining ancestor).
        connect: with a tokenizer, one tree per sequence rooted at ``[CLS]`` (see ``align_to_tokens``).
        backend: tree builder ("auto", "cpp", "python"; see ``build_tree_tensors``).
        masks: a :class:`MaskSpec`: also build the edge lists of its parent/child/sibling masks
            (``TreeBatch.relation_lists``) here, in the DataLoader worker, so the sub-network attention finds
            them cached (and, after ``.to('cuda')``, never reads the trees back from the GPU).
        windows: tree windows (ints 0..254) whose edge lists to build likewise (``TreeBatch.window_lists``,
            the syntax GAT's attention).
        packed: return a padding-free packed batch (below) with a
            :class:`~syntaxkernels.trees.PackedTreeBatch` instead of padded tensors and a ``TreeBatch``.
        max_tokens: with ``packed``, the token budget of one batch: more tokens raise ``ValueError`` (use
            :class:`TokenBudgetBatchSampler` as the DataLoader's ``batch_sampler`` to form batches within it).
        variant: with a tokenizer, the layout of the token trees (``align_to_tokens(variant=...)``: "paper", the
            default, and "package" the same; "release": syntax-augmented mBERT's data processors).
        word_level: with a tokenizer, build Syntax-BERT's word-level batch instead of a token tree
            (:func:`~syntaxkernels.trees.syntax_bert_batch` with ``variant``: every piece of a word stands for the
            word); padded batches only.
        leak_free: build leak-free distances for causal models (``TreeBatch.from_heads(..., leak_free=True)``,
            padded or packed); not with ``masks``, ``windows`` or ``word_level`` (ValueError: those come from the
            whole tree).
        text_column: for ``parse_dataset`` rows, the column holding the text (kept as ``Sentence.text``).

    Packed batches (``packed=True``), the layout of transformers' ``DataCollatorWithFlattening``
    (``return_flash_attn_kwargs=True``): every per-token key concatenated to ``[1, T]`` (``labels`` as given:
    nothing is replaced at sequence starts), ``attention_mask`` dropped, ``"position_ids" [1, T]`` restarting at
    every sequence, ``"cu_seq_lens_q"`` / ``"cu_seq_lens_k"`` (int32 ``[S + 1]``), ``"max_length_q"`` /
    ``"max_length_k"`` (ints), plus ``"cu_seqlens"``, ``"max_seqlen"``, ``"lengths" int64 [S]`` and ``"trees"``
    (the ``PackedTreeBatch``, edge lists of ``masks`` / ``windows`` built in packed numbering).

    Returns (``__call__``) a dict:

    - dict items: every per-token key (a 1-D sequence of numbers as long as the heads, e.g. ``input_ids``,
      ``token_type_ids``, ``labels``) padded to ``[B, N]`` (``labels`` with -100); numeric scalars stacked to
      ``[B]`` (``labels`` of sequence classification too); anything else as a list. ``input_ids``,
      ``attention_mask``, ``token_type_ids``, ``special_tokens_mask`` and non-scalar ``labels`` must have one
      entry per token (``ValueError`` naming the batch item otherwise); plus ``"attention_mask" [B, N]`` (if
      not given), ``"lengths" int64 [B]`` and
      ``"trees"`` (``TreeBatch`` of ``[B, N]``).
    - Sentence items without a tokenizer: ``"trees"`` (word-level), ``"lengths"``, ``"words"`` (lists)
      and ``"sentences"``.
    - Sentence items with a tokenizer: the tokenizer's tensors (``input_ids``, ``attention_mask``, ...),
      ``"trees"`` (token-level), ``"lengths"``, ``"word_ids"`` (lists) and ``"sentences"``.
    - ``parse_dataset`` rows with a tokenizer (dicts with ``words`` and ``heads`` and no ``input_ids``): what
      Sentence items give (``"sentences"``: each row as :func:`~syntaxkernels.trees.sentence_from_row` reads it, one
      forest per text; a head outside the sentence ``sentence_lengths`` puts it in is a ``ValueError`` naming the
      batch item), plus ``"sentence_lengths"`` (lists of the words per sentence; ``[L]`` for a row without the
      column) and every other column of the rows (not the text nor the parse columns): numeric scalars stacked to
      ``[B]`` (a ``label`` column), anything else a list. A column named like an output key (``input_ids``,
      ``trees``, ...) is a ``ValueError``. The token trees are those of the forest: where a sentence ends changes
      no token head (every sentence root hangs from ``[CLS]``, or with ``connect=False`` is a root of its own).
    """

    def __init__(
        self,
        *,
        pad_token_id: int = 0,
        pad_values: Optional[Mapping[str, Any]] = None,
        heads_key: str = "heads",
        tokenizer=None,
        max_length: Optional[int] = None,
        connect: bool = True,
        backend: str = "auto",
        masks: Optional[MaskSpec] = None,
        windows: Sequence[int] = (),
        packed: bool = False,
        max_tokens: Optional[int] = None,
        variant: str = "paper",
        word_level: bool = False,
        leak_free: bool = False,
        text_column: str = "text",
    ) -> None:
        check_variant(variant)
        self.leak_free = bool(leak_free)
        if self.leak_free and (word_level or masks is not None or tuple(windows)):
            raise ValueError("TreeCollator: leak_free does not combine with masks, windows or word_level (their "
                             "edge lists and word-level batches come from the whole tree)")
        if word_level and packed:
            raise ValueError("TreeCollator: word_level (Syntax-BERT's word-level batches) has no packed form")
        self.variant = variant
        self.word_level = bool(word_level)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"TreeCollator: max_tokens must be a positive int or None, got {max_tokens!r}")
        if max_tokens is not None and not packed:
            raise ValueError("TreeCollator: max_tokens applies to packed batches (packed=True)")
        self.packed = bool(packed)
        self.max_tokens = max_tokens
        if masks is not None and not isinstance(masks, MaskSpec):
            raise TypeError(f"TreeCollator: masks must be a MaskSpec or None, got {type(masks).__name__}")
        windows = tuple(windows)
        for window in windows:
            if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= MAX_PATH:
                raise ValueError(f"TreeCollator: windows must be ints in 0..{MAX_PATH}, got {window!r}")
        self.pad_token_id = pad_token_id
        self.pad_values: Dict[str, Any] = {"labels": -100}
        self.pad_values.update(pad_values or {})
        self.heads_key = heads_key
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.connect = connect
        self.backend = backend
        self.masks = masks
        self.windows = windows
        self.text_column = text_column

    def __repr__(self) -> str:
        return (f"TreeCollator(pad_token_id={self.pad_token_id}, heads_key={self.heads_key!r}, "
                f"tokenizer={type(self.tokenizer).__name__ if self.tokenizer is not None else None}, "
                f"max_length={self.max_length}, connect={self.connect}, backend={self.backend!r}, "
                f"masks={self.masks}, windows={self.windows}, packed={self.packed}, max_tokens={self.max_tokens}, "
                f"variant={self.variant!r}, word_level={self.word_level}, leak_free={self.leak_free}, "
                f"text_column={self.text_column!r})")

    def __call__(self, items: Sequence) -> Dict[str, Any]:
        items = list(items)
        if not items:
            raise ValueError("TreeCollator: empty batch")
        if all(isinstance(item, Mapping) for item in items):
            if self.tokenizer is not None and "words" in items[0] and "input_ids" not in items[0]:
                out = self._collate_rows(items)
            else:
                out = self._collate_dicts(items)
            return self._flatten(out) if self.packed else out
        if all(hasattr(item, "heads") and hasattr(item, "words") for item in items):
            out = self._collate_sentences(items)
            return self._flatten(out) if self.packed else out
        raise ValueError("TreeCollator: items must all be dicts with a "
                         f"{self.heads_key!r} key or all Sentence objects, got "
                         f"{sorted({type(i).__name__ for i in items})}")

    def _collate_dicts(self, items: List[Mapping]) -> Dict[str, Any]:
        heads = []
        for b, item in enumerate(items):
            if self.heads_key not in item:
                raise ValueError(f"TreeCollator: batch item {b} has no {self.heads_key!r} key")
            value = item[self.heads_key]
            if not _is_number_sequence(value):
                raise ValueError(f"TreeCollator: batch item {b}: {self.heads_key!r} must be a 1-D sequence of ints")
            heads.append([int(h) for h in (value.tolist() if hasattr(value, "tolist") else value)])
        lengths = [len(h) for h in heads]
        width = max(lengths)
        out: Dict[str, Any] = {}
        keys = [k for k in items[0] if k != self.heads_key]
        for b, item in enumerate(items[1:], start=1):
            if set(item) != set(items[0]):
                raise ValueError(f"TreeCollator: batch item {b} has keys {sorted(item)}, item 0 has {sorted(items[0])}")
        for key in keys:
            values = [item[key] for item in items]
            per_token = all(_is_number_sequence(v) and len(v) == n for v, n in zip(values, lengths))
            # Token keys are always per token; "labels" are per token (token classification) unless every item
            # has a single number (sequence classification), and then they are stacked.
            must_be_per_token = key in _TOKEN_KEYS or (key == "labels" and not all(_is_scalar(v) for v in values))
            if must_be_per_token and not per_token:
                for b, (v, n) in enumerate(zip(values, lengths)):
                    if not (_is_number_sequence(v) and len(v) == n):
                        if hasattr(v, "__len__") and len(v) == n:
                            raise ValueError(f"TreeCollator: batch item {b}: {key!r} must be a 1-D sequence of "
                                             f"numbers (ids, not names), got {type(v).__name__} {v!r:.60}")
                        size = (f"{len(v)} entries" if hasattr(v, "__len__")
                                else f"no entries (it is the {type(v).__name__} {v!r})")
                        raise ValueError(f"TreeCollator: batch item {b}: {key!r} has {size} but "
                                         f"{self.heads_key!r} has {n} (expected one entry per token)")
            if per_token:
                pad = self.pad_token_id if key == "input_ids" else self.pad_values.get(key, 0)
                out[key] = _pad(values, width, pad)
            elif all(_is_scalar(v) for v in values):
                out[key] = torch.as_tensor([v.item() if hasattr(v, "item") else v for v in values])
            else:
                out[key] = values
        positions = torch.arange(width)
        lengths_t = torch.tensor(lengths, dtype=torch.int64)
        if "attention_mask" not in out:
            out["attention_mask"] = (positions[None, :] < lengths_t[:, None]).to(torch.int64)
        out["lengths"] = lengths_t
        out["trees"] = self._trees(heads, lengths_t, width)
        return out

    def _flatten(self, out: Dict[str, Any]) -> Dict[str, Any]:
        """A padded collation as a packed one (see the class docstring): no padding anywhere."""
        packed: PackedTreeBatch = out["trees"]  # built packed by _trees (no padded distance)
        lengths = out["lengths"]
        total = int(lengths.sum())
        if self.max_tokens is not None and total > self.max_tokens:
            raise ValueError(f"TreeCollator: the batch has {total} tokens ({len(lengths)} sequences), more than "
                             f"max_tokens = {self.max_tokens} (TokenBudgetBatchSampler forms batches within it)")
        width = int(lengths.max()) if lengths.numel() else 0
        keep = torch.arange(width)[None, :] < lengths[:, None]
        packed = self._with_lists(packed)
        flat: Dict[str, Any] = {}
        for key, value in out.items():
            if key in ("trees", "lengths", "attention_mask"):
                continue
            if isinstance(value, torch.Tensor) and value.dim() == 2 and tuple(value.shape) == (len(lengths), width):
                flat[key] = value[keep][None, :]
            else:
                flat[key] = value
        cu = packed.cu_seqlens
        flat["position_ids"] = packed.positions.to(torch.int64)[None, :]
        flat["cu_seq_lens_q"] = flat["cu_seq_lens_k"] = cu
        flat["max_length_q"] = flat["max_length_k"] = packed.max_seqlen
        flat["cu_seqlens"], flat["max_seqlen"] = cu, packed.max_seqlen
        flat["lengths"] = lengths
        flat["trees"] = packed
        return flat

    def _trees(self, heads: List[List[int]], lengths: torch.Tensor, width: int):
        if self.packed:
            return PackedTreeBatch.from_heads([list(row) for row in heads], backend=self.backend,
                                              leak_free=self.leak_free)
        padded = torch.full((len(heads), width), -1, dtype=torch.int64)
        for b, row in enumerate(heads):
            if row:
                padded[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
        trees = TreeBatch.from_heads(padded, lengths, backend=self.backend, leak_free=self.leak_free)
        return trees if self.packed else self._with_lists(trees)

    def _with_lists(self, trees):
        """Build (and cache on ``trees``) the edge lists asked for by ``masks`` and ``windows``."""
        if self.masks is not None and self.masks.num_relations:
            trees.relation_lists(self.masks)
        for window in self.windows:
            trees.window_lists(window)
        return trees

    def _collate_rows(self, rows: List[Mapping]) -> Dict[str, Any]:
        """``parse_dataset`` rows with a tokenizer: collated as their Sentences, the other columns kept."""
        keys = set(rows[0])
        for b, row in enumerate(rows):
            if set(row) != keys:
                raise ValueError(f"TreeCollator: batch item {b} has keys {sorted(row)}, item 0 has {sorted(rows[0])}")
            if self.heads_key not in row:
                raise ValueError(f"TreeCollator: batch item {b} has 'words' but no {self.heads_key!r} key (rows of "
                                 "sk.trees.parse_dataset have both)")
        sentences, sentence_lengths = [], []
        for b, row in enumerate(rows):
            if self.heads_key != "heads":
                row = {**row, "heads": row[self.heads_key]}
            try:  # checks every head within its sentence (sentence_lengths)
                sentence = sentence_from_row(row, self.text_column)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"TreeCollator: batch item {b}: {exc}") from None
            sentences.append(sentence)
            lengths = row.get("sentence_lengths")
            sentence_lengths.append([int(n) for n in lengths] if lengths is not None and len(lengths)
                                    else [len(sentence.words)])
        # The token trees do not depend on where the sentences end (each sentence root attaches to the sequence
        # root, or with connect=False is a root of its own, either way), so the forest is aligned as it is.
        out = self._collate_sentences(sentences)
        out["sentence_lengths"] = sentence_lengths
        skip = {self.text_column, self.heads_key, *DATASET_COLUMNS}
        for key in rows[0]:
            if key in skip:
                continue
            if key in _ROW_OUTPUT_KEYS:
                raise ValueError(f"TreeCollator: the rows have a column {key!r}, which the collated batch of parsed "
                                 "rows has as a key of its own: rename or remove it (dataset.remove_columns)")
            values = [row[key] for row in rows]
            if all(_is_scalar(v) and not isinstance(v, str) for v in values):
                out[key] = torch.as_tensor([v.item() if hasattr(v, "item") else v for v in values])
            else:
                out[key] = values
        return out

    def _collate_sentences(self, items: List) -> Dict[str, Any]:
        if self.tokenizer is None:
            heads = [list(s.heads) for s in items]
            lengths = torch.tensor([len(h) for h in heads], dtype=torch.int64)
            width = int(lengths.max())
            return {"trees": self._trees(heads, lengths, width), "lengths": lengths,
                    "words": [list(s.words) for s in items], "sentences": items}
        truncate = self.max_length is not None
        encoding = self.tokenizer(
            [list(s.words) for s in items], is_split_into_words=True, padding=True, truncation=truncate,
            max_length=self.max_length, return_tensors="pt",
        )
        if not _is_batch_encoding_with_word_ids(encoding):
            raise ValueError("TreeCollator: the tokenizer must be a fast tokenizer (its output needs word_ids())")
        out: Dict[str, Any] = {key: value for key, value in encoding.items()}
        if self.word_level:
            trees = syntax_bert_batch(items, encoding, variant=self.variant, backend=self.backend,
                                      missing_words="reattach" if truncate else "error")
            lengths = trees.lengths
        else:
            heads, lengths = align_batch(items, encoding, connect=self.connect,
                                         missing_words="reattach" if truncate else "error", variant=self.variant)
            trees = TreeBatch.from_heads(heads, lengths, backend=self.backend, packed=self.packed,
                                         leak_free=self.leak_free)
        out["lengths"] = lengths
        out["trees"] = trees if self.packed else self._with_lists(trees)
        out["word_ids"] = [encoding.word_ids(b) for b in range(len(items))]
        out["sentences"] = items
        return out


def _is_batch_encoding_with_word_ids(encoding) -> bool:
    try:
        encoding.word_ids(0)
    except (AttributeError, ValueError, IndexError):
        return False
    return True


class TokenBudgetBatchSampler:
    """A DataLoader ``batch_sampler`` for packed batches: consecutive items (in ``order``, default 0..n-1) grouped
    while their tokens fit ``max_tokens``; an item longer than the budget alone raises ValueError naming it.

    ``DataLoader(dataset, batch_sampler=TokenBudgetBatchSampler(lengths, 4096),
    collate_fn=TreeCollator(packed=True, max_tokens=4096))``."""

    def __init__(self, lengths: Sequence[int], max_tokens: int, order: Optional[Sequence[int]] = None) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        self.lengths = [int(n) for n in lengths]
        self.max_tokens = max_tokens
        self.order = list(range(len(self.lengths))) if order is None else [int(i) for i in order]
        for i in self.order:
            if self.lengths[i] > max_tokens:
                raise ValueError(f"item {i} has {self.lengths[i]} tokens, more than max_tokens = {max_tokens}")

    def __iter__(self):
        batch, used = [], 0
        for i in self.order:
            n = self.lengths[i]
            if batch and used + n > self.max_tokens:
                yield batch
                batch, used = [], 0
            batch.append(i)
            used += n
        if batch:
            yield batch

    def __len__(self) -> int:
        return sum(1 for _ in self)


def collate_trees(items: Sequence, **options) -> Dict[str, Any]:
    """Collate ``items`` with a :class:`TreeCollator` built from ``options`` (``collate_fn=collate_trees``)."""
    return TreeCollator(**options)(items)
