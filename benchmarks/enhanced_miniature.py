"""Enhanced vs basic dependencies in a fine-tuned MiniLM (CPU, minutes): does the enhanced UD graph's distance help
the deprel task more than the basic tree's?

The setting of ``benchmarks/relations_miniature.py`` (all-MiniLM-L6-v2, each word's universal relation to its head,
the distance bias on layers 3-5, UD English-EWT dev, the same split, batches, optimiser and head initialisation),
with the structure given three ways:

- ``basic``: the gold basic tree's distance (``BucketSpec()``), the collator's ``TreeBatch``: the arm ``tree`` of
  ``relations_miniature.py``;
- ``enhanced``: the enhanced UD graph's (DEPS column) undirected distance over the tokens (``BucketSpec()``), a
  ``GraphBatch`` from :func:`syntaxkernels.trees.align_edges_batch`: each word's node on its first piece, the other
  pieces of a word hanging from it, ``[CLS]`` attached to the ``0:root`` words and to ``[SEP]`` -- the special-token
  structure of the basic arm; the empty nodes (elided predicates, 3 sentences of the file) have no tokens and are
  contracted (``a -> e -> b`` gives ``a -> b``), which keeps the words they head connected;
- ``both``: two relations, ``sk.RelationBatch.from_plans([tree, graph], BucketSpec(max_distance=7))`` (9 x 9 codes),
  a table and a strength each.

Undirected: the basic arm's tree distance is symmetric, so the enhanced arm is too; the two differ only in the edges.

    python benchmarks/enhanced_miniature.py [--steps 200] [--runs basic,enhanced] [--seed 0] [--json out.json]
"""
from __future__ import annotations

import pathlib
import sys

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))
sys.path.insert(0, str(ROOT_DIR / "benchmarks"))

import syntaxkernels as sk  # noqa: E402

import relations_miniature as RM  # noqa: E402  (cli: the arguments, the runs)


def enhanced_roots(sentence):
    """The nodes the DEPS column attaches to the root (``0:root``); an enhanced graph can give them incoming edges
    (a relative clause's subject pointing back), so they are named, not inferred."""
    return [w for w, deps in enumerate(sentence.deps) if any(d.split(":")[0] == "0" for d in deps.split("|"))]


def enhanced_graph(batch):
    """The enhanced graphs of a collated batch (read with ``enhanced=True``) on its tokens: a ``GraphBatch``
    ``[B, N, N]`` with the batch's lengths and width, undirected."""
    graphs = [dict(edges=s.enhanced_edges, num_nodes=s.num_nodes, num_words=len(s.words), roots=enhanced_roots(s))
              for s in batch["sentences"]]
    edges, lengths = sk.trees.align_edges_batch(graphs, batch["word_ids"], attention_mask=batch["attention_mask"])
    return sk.GraphBatch.from_edges(edges, lengths, directed=False, size=batch["input_ids"].shape[1])


ARMS = {  # kind -> (the plan of a collated batch, relations, buckets)
    "basic": (lambda batch: batch["trees"], None, sk.BucketSpec()),
    "enhanced": (enhanced_graph, None, sk.BucketSpec()),
    "both": (lambda batch: sk.RelationBatch.from_plans([batch["trees"], enhanced_graph(batch)],
                                                       sk.BucketSpec(max_distance=7)), 2,
             sk.BucketSpec(max_distance=7)),
}


def main(argv=None):
    return RM.cli(argv, ARMS, "basic,enhanced", __doc__.split("\n")[0], "enhanced_miniature", enhanced=True)


if __name__ == "__main__":
    sys.exit(main())
