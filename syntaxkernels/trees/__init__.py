"""Tree inputs: batches and distances, CoNLL-U and stanza readers, subword alignment, DataLoader collation."""
from .batch import TreeBatch, build_tree_tensors, normalize_heads, python_tree_tensors, tree_distance

__all__ = ["TreeBatch", "tree_distance", "build_tree_tensors", "normalize_heads", "python_tree_tensors"]

try:  # the readers are added module by module; each is optional until it lands
    from .conllu import Sentence, from_conllu_heads, from_self_root, read_conllu  # noqa: F401

    __all__ += ["Sentence", "read_conllu", "from_conllu_heads", "from_self_root"]
except ImportError:  # pragma: no cover
    pass
try:
    from .stanza import StanzaModelsNotFoundError, from_stanza, parse_with_stanza  # noqa: F401

    __all__ += ["from_stanza", "parse_with_stanza", "StanzaModelsNotFoundError"]
except ImportError:  # pragma: no cover
    pass
try:
    from .align import align_batch, align_to_tokens  # noqa: F401

    __all__ += ["align_to_tokens", "align_batch"]
except ImportError:  # pragma: no cover
    pass
try:
    from .collate import TreeCollator, collate_trees  # noqa: F401

    __all__ += ["TreeCollator", "collate_trees"]
except ImportError:  # pragma: no cover
    pass
