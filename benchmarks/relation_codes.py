"""How many buckets the table gradient walks per tile when a batch holds several relations (a model, CPU only).

The distance-bias backward's table gradient walks, for every tile, the bucket range of its allowed pairs
(``lowest .. highest``) when a table has more than 31 buckets, as the 256 codes of a ``sk.RelationBatch`` do; one
relation with the default ``BucketSpec()`` (12 buckets) walks only the buckets a tile holds (a bit set). This script
counts, on UD English-EWT sentences (``$SYNTAXKERNELS_UD``; generated trees otherwise) as the ``sentences`` workload
builds them (32 ``[CLS] s [SEP]`` rows, one 64 x 64 tile per row), the trips per tile of:

- one relation: the gold tree, ``BucketSpec()`` (distinct buckets per tile);
- two parses: the gold tree and a right-branching chain over the same tokens (each token's head the previous
  one: a stand-in for a second, different parse), ``BucketSpec(max_distance=5)`` each: 7 x 7 = 49 codes;
- directed tree: ``RelationBatch.directed_tree(gold, max_steps=7)`` (steps up, steps down): 9 x 9 = 81 codes;

each as the codes' range per tile (what the kernels walk) and as the distinct codes per tile. Multiply by the table
kernel's instructions per trip and score element (``python -m syntaxkernels inspect --buckets 254``, column
``other`` of the table kernels) for a modelled cost. A model of the work, not a measurement.

    python benchmarks/relation_codes.py [--workload sentences]
"""
from __future__ import annotations

import argparse
import sys

import torch

import syntaxkernels as sk
from syntaxkernels.tools.workloads import named_workload


def tile_stats(codes: torch.Tensor, lengths: torch.Tensor, block: int):
    """(mean range, mean distinct) of the codes over each tile's allowed pairs, tiles with a pair only."""
    B, N, _ = codes.shape
    nb = -(-N // block)
    ranges, distinct = [], []
    for b in range(B):
        n = int(lengths[b])
        for qi in range(nb):
            for ki in range(nb):
                tile = codes[b, qi * block:min((qi + 1) * block, n), ki * block:min((ki + 1) * block, n)]
                if tile.numel() == 0:
                    continue
                values = tile.flatten().long()
                ranges.append(int(values.max() - values.min()) + 1)
                distinct.append(int(values.unique().numel()))
    return sum(ranges) / len(ranges), sum(distinct) / len(distinct), len(ranges)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="sentences")
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args(argv)
    workload = named_workload(args.workload)
    gold = workload.tree_batch()
    chain = sk.TreeBatch.from_heads([[-1] + list(range(len(h) - 1)) for h in workload.heads],
                                    torch.tensor(workload.lengths))
    lengths = gold.kernel_lengths
    one = sk.BucketSpec().lut()[gold.distance.long()]
    cases = [("one relation (tree, BucketSpec(): 12 buckets)", one, 12),
             ("two parses (tree + chain, 7 x 7 codes)",
              sk.RelationBatch.from_plans([gold, chain], sk.BucketSpec(max_distance=5)).distance, 49),
             ("directed tree (up x down, 9 x 9 codes)", sk.RelationBatch.directed_tree(gold, max_steps=7).distance,
              81)]
    print(f"{workload.summary()}; tiles {args.block} x {args.block}")
    print(f"{'case':<48} {'codes':>5} {'range/tile':>10} {'distinct/tile':>13} {'tiles':>5}")
    for name, codes, size in cases:
        mean_range, mean_distinct, tiles = tile_stats(codes, lengths, args.block)
        print(f"{name:<48} {size:>5} {mean_range:>10.1f} {mean_distinct:>13.1f} {tiles:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
