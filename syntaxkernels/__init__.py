"""syntaxkernels: fast syntax-tree-aware attention for PyTorch.

Public API (docs/api.md)::

    sk.tree_distance(heads, lengths=None) -> uint8 [B, N, N]
    sk.graph_distance(edges, lengths=None, *, directed=False) -> uint8 [B, N, N]
    sk.GraphBatch.from_edges(edges, lengths=None, *, directed=False, packed=False)
    sk.RelationBatch.from_plans(plans, buckets) / .from_distances(distances [B, R, N, N], buckets, lengths)
    sk.TreeBatch.from_heads(heads, lengths=None)
    sk.BucketSpec, sk.MaskSpec
    sk.syntax_bias_attention(q, k, v, distance, table, *, buckets, ...)
    sk.syntax_subnetwork_attention(q, k, v, trees, masks, *, ...)
    sk.syntax_param_groups(model, lr, syntax_lr=None, weight_decay=0.0, *, predictor_lr=None, ...)
    sk.reference.<same names>, sk.trees, sk.nn

Names load on first use (PEP 562), so ``import syntaxkernels`` and ``python -m syntaxkernels --help`` do not
import torch or Triton; the first use of an op imports them (and, without Triton, warns once that only the C++
kernels and the reference run).
"""
import importlib

# The one place the version is written: setup.py reads this line, `python -m syntaxkernels info` prints it.
__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "BucketSpec": (".specs", "BucketSpec"),
    "RelativePositionSpec": (".specs", "RelativePositionSpec"),
    "MaskSpec": (".specs", "MaskSpec"),
    "TreeBatch": (".trees", "TreeBatch"),
    "PackedTreeBatch": (".trees", "PackedTreeBatch"),
    "tree_distance": (".trees", "tree_distance"),
    "graph_distance": (".trees", "graph_distance"),
    "GraphBatch": (".trees", "GraphBatch"),
    "RelationBatch": (".trees", "RelationBatch"),
    "syntax_bias_attention": (".ops", "syntax_bias_attention"),
    "syntax_subnetwork_attention": (".ops", "syntax_subnetwork_attention"),
    "reference": (".reference", None),
    "trees": (".trees", None),
    "nn": (".nn", None),
    "integrations": (".integrations", None),
    "ops": (".ops", None),
    "syntax_param_groups": (".nn", "syntax_param_groups"),
}

__all__ = [
    "BucketSpec",
    "RelativePositionSpec",
    "MaskSpec",
    "TreeBatch",
    "PackedTreeBatch",
    "tree_distance",
    "graph_distance",
    "GraphBatch",
    "RelationBatch",
    "syntax_bias_attention",
    "syntax_subnetwork_attention",
    "reference",
    "trees",
    "nn",
    "syntax_param_groups",
    "__version__",
]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'syntaxkernels' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
