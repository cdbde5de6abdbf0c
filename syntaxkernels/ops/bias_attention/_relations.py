"""Several relations per score (:class:`~syntaxkernels.RelationBatch`, or a bare ``uint8 [B, R, N, N]``) on the
distance-bias op: the R relations' tables and strengths gathered into one table per code value (``[256]`` or
``[H, 256]``, :meth:`~syntaxkernels.RelationBatch.code_table`), then the op on the batch's code with one bucket per
code (:data:`~syntaxkernels.trees.relations.CODE_BUCKETS`): every backend, padded and packed, with no kernel of its
own. The tables' and strengths' gradients are the code table's, taken back through the gather by autograd."""

import torch

from ...specs import BucketSpec
from ...trees.relations import CODE_BUCKETS, RelationBatch


def is_relations(distance, buckets) -> bool:
    """Whether a call's structure holds several relations whose tables the call gathers: a 4-D distance tensor, or a
    RelationBatch with the relations' buckets (with :data:`CODE_BUCKETS` a RelationBatch's table is already one
    entry per code, and the call is the op on one distance, the code)."""
    if isinstance(distance, RelationBatch):
        return buckets != CODE_BUCKETS
    return isinstance(distance, torch.Tensor) and distance.dim() == 4


def relation_bias_attention(attend, q, k, v, relations, table, *, buckets, scale, bias_scale, lengths, window,
                            symmetric, cu_seqlens, backend, **rest) -> torch.Tensor:
    """``attend`` (the public op) on the relations' code (module docstring). ``relations``: a RelationBatch
    (``buckets`` its specs: one BucketSpec equal to each, or the sequence), or uint8 ``[B, R, N, N]`` with ``buckets``
    one spec or R and ``lengths`` / ``symmetric`` as for one distance. ``table``: ``[R, T]`` / ``[R, H, T]`` or R
    tables; ``bias_scale``: None, a float, or 1 or R elements. ``window`` is refused (it applies to one distance)."""
    if window is not None:
        raise ValueError("window applies to one distance: with several relations pass window=None (a positional "
                         "window, position_window=, combines with them)")
    if cu_seqlens is not None:
        raise ValueError("several relations of a packed batch come as a RelationBatch.from_plans of its packed "
                         "plans, not with cu_seqlens")
    if backend == "reference" and isinstance(relations, torch.Tensor):  # the specification, relation by relation
        from ... import reference

        return reference.syntax_bias_attention(q, k, v, relations, table, buckets=buckets, scale=scale,
                                               bias_scale=bias_scale, lengths=lengths, **rest)
    if isinstance(relations, torch.Tensor):
        relations = RelationBatch.from_distances(relations, buckets, lengths, symmetric=symmetric)
        lengths = None
    elif buckets is not None and _specs(buckets, relations.num_relations) != relations.buckets:
        raise ValueError(f"buckets {buckets!r} differ from the RelationBatch's {relations.buckets!r} (the codes "
                         "were made with those)")
    code_table = relations.code_table(table, bias_scale)
    return attend(q, k, v, relations, code_table, buckets=CODE_BUCKETS, scale=scale, bias_scale=None, lengths=lengths,
                  backend=backend, **rest)


def _specs(buckets, R: int):
    if isinstance(buckets, BucketSpec):
        return (buckets,) * R
    return tuple(buckets)


__all__ = ["is_relations", "relation_bias_attention"]
