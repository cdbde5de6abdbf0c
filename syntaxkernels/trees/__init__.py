"""Tree inputs: batches and distances, CoNLL-U and stanza readers, subword alignment, DataLoader collation."""
from .batch import TreeBatch, build_tree_tensors, normalize_heads, python_tree_tensors, tree_distance

__all__ = ["TreeBatch", "tree_distance", "build_tree_tensors", "normalize_heads", "python_tree_tensors"]

try:  # the readers are added module by module; each is optional until it lands
    from .conllu import Sentence, read_conllu  # noqa: F401

    __all__ += ["Sentence", "read_conllu"]
except ImportError:  # pragma: no cover
    pass
try:
    from .stanza import from_stanza, parse_with_stanza  # noqa: F401

    __all__ += ["from_stanza", "parse_with_stanza"]
except ImportError:  # pragma: no cover
    pass
try:
    from .align import align_to_tokens  # noqa: F401

    __all__ += ["align_to_tokens"]
except ImportError:  # pragma: no cover
    pass
try:
    from .collate import TreeCollator, collate_trees  # noqa: F401

    __all__ += ["TreeCollator", "collate_trees"]
except ImportError:  # pragma: no cover
    pass
