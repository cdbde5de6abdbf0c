"""syntaxkernels: fast syntax-tree-aware attention for PyTorch.

Public API (DESIGN.md §3)::

    sk.tree_distance(heads, lengths=None) -> uint8 [B, N, N]
    sk.TreeBatch.from_heads(heads, lengths=None)
    sk.BucketSpec, sk.MaskSpec
    sk.syntax_bias_attention(q, k, v, distance, table, *, buckets, ...)
    sk.syntax_subnetwork_attention(q, k, v, trees, masks, *, ...)
    sk.reference.<same names>, sk.trees, sk.nn
"""
from . import reference, trees
from .ops import syntax_bias_attention, syntax_subnetwork_attention
from .specs import BucketSpec, MaskSpec
from .trees import TreeBatch, tree_distance

__version__ = "0.1.0"

__all__ = [
    "BucketSpec",
    "MaskSpec",
    "TreeBatch",
    "tree_distance",
    "syntax_bias_attention",
    "syntax_subnetwork_attention",
    "reference",
    "trees",
    "nn",
    "__version__",
]


def __getattr__(name):
    # nn and the integrations import torch.nn machinery; load them on first use.
    if name in ("nn", "integrations"):
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'syntaxkernels' has no attribute {name!r}")
