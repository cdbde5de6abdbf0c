"""Tree inputs (and graphs: ``graph_distance``, ``GraphBatch``; source code: ``from_tree_sitter``, ``CodeTreeBatch``,
its code-model relations ``code_relation_distances``;
several relations per score: ``RelationBatch``;
trees decoded from arc scores: ``decode_tree``): batches and distances, CoNLL-U, stanza and spaCy readers,
constituency trees (PTB brackets,
stanza), a cached parsing front (``parse``; ``parse_dataset`` for 🤗 datasets),
subword alignment, DataLoader collation.

Every module here is part of the package and imported eagerly: an error inside one of them propagates (it is
never turned into a missing name). Optional third-party libraries are imported where they are used: the
stanza helpers need ``stanza`` and ``from_tree_sitter`` needs ``tree-sitter`` only when called, and say how to
install it when it is missing; ``from_spacy``
and ``parse`` never import spaCy or stanza themselves (they read the objects they are given).
"""
from .align import align_batch, align_edges_batch, align_edges_to_tokens, align_to_tokens
from .batch import (TreeBatch, aligned_distance, build_tree_tensors, normalize_heads, python_tree_tensors,
                    tree_distance)
from .collate import TokenBudgetBatchSampler, TreeCollator, collate_trees
from .conllu import Sentence, from_conllu_heads, from_self_root, read_conllu
from .decode import decode_tree
from .graph import GraphBatch, graph_distance
from .relations import RelationBatch
from .code import CodeTreeBatch, from_tree_sitter
from .code_relations import code_relation_buckets, code_relation_distances
from .constituency import PhraseTree, constituency_distance, from_stanza_constituency, read_brackets
from .packed import PackedTreeBatch, pack_padded
from .parse import join_sentences, parse, parse_dataset, parser_identity, sentence_from_row
from .spacy import from_spacy
from .stanza import StanzaModelsNotFoundError, from_stanza, parse_with_stanza
from .syntax_bert import WordTreeBatch, syntax_bert_batch

__all__ = [
    "TreeBatch",
    "PackedTreeBatch",
    "pack_padded",
    "tree_distance",
    "GraphBatch",
    "graph_distance",
    "RelationBatch",
    "CodeTreeBatch",
    "from_tree_sitter",
    "code_relation_distances",
    "code_relation_buckets",
    "decode_tree",
    "build_tree_tensors",
    "normalize_heads",
    "python_tree_tensors",
    "aligned_distance",
    "Sentence",
    "read_conllu",
    "PhraseTree",
    "read_brackets",
    "from_stanza_constituency",
    "constituency_distance",
    "from_conllu_heads",
    "from_self_root",
    "from_stanza",
    "parse_with_stanza",
    "StanzaModelsNotFoundError",
    "from_spacy",
    "parse",
    "parse_dataset",
    "sentence_from_row",
    "parser_identity",
    "join_sentences",
    "align_to_tokens",
    "align_batch",
    "align_edges_to_tokens",
    "align_edges_batch",
    "syntax_bert_batch",
    "WordTreeBatch",
    "TreeCollator",
    "collate_trees",
    "TokenBudgetBatchSampler",
]
