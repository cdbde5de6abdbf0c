"""Syntax-BERT sub-network attention: syntaxkernels vs the reference, SDPA and FlexAttention.

Workload: documents of N tokens (128..4096) packed from the shared UD English-EWT dev treebank (whole sentences,
one tree per sentence: a forest), or generated sentences when the treebank is absent. M masks
(``MaskSpec()``: parent/child/sibling at distances 1..3 and full, M = 10; ``--pairwise`` adds pairwise).

Providers (each computes all M outputs ``[B, M, H, N, D]``):
- ``syntaxkernels``: the fused block-sparse Triton kernels;
- ``reference``: M dense masked attentions over one score matrix (as the authors' code does);
- ``sdpa``: ``F.scaled_dot_product_attention`` once per mask with a boolean ``[B, 1, N, N]`` mask (masks built
  before timing; fully masked rows set to 0);
- ``flex``: ``flex_attention`` once per mask, with a block mask per mask whose ``mask_mod`` reads the distance,
  depth and segment tensors (block masks built before timing).

Every provider is checked against the fp64 reference before it is timed (``syntaxkernels.testing``).
TFLOP/s follow the FlashAttention convention scaled by the visited density: forward ``4 B H N^2 D * M * f``,
forward+backward 3.5x that, with f = ``visited_mask_fraction`` of the syntaxkernels tiling (the same FLOP count
for every provider, so the figures compare times).

Without CUDA it prints that a GPU is needed for timings, still reports the visited-block fractions of the
treebank documents (a property of the trees and the tiling) and exits 0.

Usage: ``python benchmarks/bench_subnetwork_attention.py [--json out.json] [--quick] [--pairwise]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import reference  # noqa: E402
from syntaxkernels.ops import subnetwork_attention as subnet  # noqa: E402
from syntaxkernels.testing import compare_to_reference  # noqa: E402

UD_DEV = os.path.join(os.path.dirname(ROOT), "shared", "data", "ud", "en_ewt-ud-dev.conllu")
SIZES = [128, 256, 512, 1024, 2048, 4096]


# ---------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------

def load_sentences() -> (List[List[int]], str):
    """Head lists of the treebank's sentences, or generated ones; and where they came from."""
    if os.path.exists(UD_DEV):
        sentences = sk.trees.read_conllu(UD_DEV)
        return [list(s.heads) for s in sentences if len(s.heads)], "UD English-EWT dev"
    rng = random.Random(0)
    out = []
    for _ in range(2000):
        length = rng.randint(3, 40)
        order = list(range(length))
        rng.shuffle(order)
        heads = [0] * length
        heads[order[0]] = -1
        for pos in range(1, length):
            heads[order[pos]] = order[rng.randrange(pos)]
        out.append(heads)
    return out, "generated trees (treebank absent)"


def pack_documents(sentences: List[List[int]], n: int, batch: int) -> List[List[int]]:
    """``batch`` documents of at most ``n`` tokens: whole consecutive sentences, one tree each (a forest)."""
    docs, current, cursor = [], [], 0
    while len(docs) < batch:
        heads = sentences[cursor % len(sentences)][:n]
        cursor += 1
        if len(current) + len(heads) > n:
            docs.append(current)
            current = []
        offset = len(current)
        current += [h + offset if h >= 0 else -1 for h in heads]
    return docs


def make_trees(sentences, n: int, batch: int, device) -> sk.TreeBatch:
    docs = pack_documents(sentences, n, batch)
    heads = torch.full((batch, n), -1, dtype=torch.int64)
    for b, doc in enumerate(docs):
        heads[b, :len(doc)] = torch.tensor(doc)
    return sk.TreeBatch.from_heads(heads, lengths=[len(d) for d in docs]).to(device)


def block_fraction_rows(sentences, source: str, masks: sk.MaskSpec, sizes, blocks, batch: int = 4) -> List[Dict]:
    rows = []
    for n in sizes:
        trees = make_trees(sentences, n, batch, "cpu")
        for block_m, block_n in blocks:
            stats = subnet.subnetwork_block_stats(trees, masks, block_m, block_n)
            rows.append(dict(N=n, batch=batch, block=f"{block_m}x{block_n}", masks=masks.num_masks,
                             mean_length=float(trees.lengths.float().mean()), source=source,
                             valid=round(stats["valid_fraction"], 4), syntax=round(stats["syntax_fraction"], 4),
                             visited=round(stats["visited_fraction"], 4),
                             visited_mask=round(stats["visited_mask_fraction"], 4)))
    return rows


def print_table(rows: List[Dict], columns: List[str]) -> None:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


# ---------------------------------------------------------------------------------------------------------
# Providers (CUDA)
# ---------------------------------------------------------------------------------------------------------

def provider_fns(q, k, v, trees, masks):
    import torch.nn.functional as F

    M = masks.num_masks
    fns = {
        "syntaxkernels": lambda q, k, v: sk.syntax_subnetwork_attention(q, k, v, trees, masks, backend="triton")[0],
        "reference": lambda q, k, v: reference.syntax_subnetwork_attention(q, k, v, trees, masks)[0],
    }
    allowed = reference.syntax_masks(trees, masks)  # built once, outside the timed region

    def sdpa(q, k, v):
        outs = [torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, m, None]))
                for m in range(M)]
        return torch.stack(outs, dim=1)

    fns["sdpa"] = sdpa
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        codes, _, _ = subnet.mask_codes(masks)
        dist, depth, seg = trees.distance, trees.depth, trees.segment
        B, H, N, _ = q.shape

        def make_mod(code):
            def mask_mod(b, h, qi, kj):
                d = dist[b, qi, kj].to(torch.int32)
                valid = (seg[b, qi] >= 0) & (seg[b, kj] >= 0)
                same = valid & (seg[b, qi] == seg[b, kj])
                gap = depth[b, kj] - depth[b, qi]
                rel = torch.where(gap == d, 0, torch.where(gap == -d, 1, 2))
                pair = torch.where(same, torch.where(d == 0, 2, 4 * d + rel), torch.where(valid, 1, 0))
                return (pair == code) if code >= 0 else (pair > 0)
            return mask_mod

        block_masks = [create_block_mask(make_mod(c), B, None, N, N, device=q.device) for c in codes]

        def flex_provider(q, k, v):
            return torch.stack([flex(q, k, v, block_mask=bm) for bm in block_masks], dim=1)

        fns["flex"] = flex_provider
    except Exception as exc:  # noqa: BLE001 - reported, the other providers still run
        print(f"flex: unavailable ({exc!r})")
    return fns


def run_cuda(args, sentences, source, masks) -> List[Dict]:
    from triton.testing import do_bench

    device = "cuda"
    dtype = torch.bfloat16
    H, D = args.heads, args.head_dim
    rows = []
    sizes = [512, 1024] if args.quick else SIZES
    for n in sizes:
        batch = max(1, args.tokens // n)
        trees = make_trees(sentences, n, batch, device)
        stats = subnet.subnetwork_block_stats(trees, masks, *_tiles(dtype, D))
        q, k, v = (torch.randn(batch, H, n, D, device=device, dtype=dtype) for _ in range(3))
        grad = torch.randn(batch, masks.num_masks, H, n, D, device=device, dtype=dtype)
        fns = provider_fns(q, k, v, trees, masks)
        ref64 = reference.syntax_subnetwork_attention(q.double(), k.double(), v.double(), trees, masks)[0] \
            if n <= 1024 else None
        reflow = fns["reference"](q, k, v) if ref64 is not None else None
        flops = 4.0 * batch * H * n * n * D * masks.num_masks * stats["visited_mask_fraction"]
        for name, fn in fns.items():
            row = dict(provider=name, N=n, batch=batch, heads=H, head_dim=D, masks=masks.num_masks,
                       dtype="bf16", visited_mask_fraction=stats["visited_mask_fraction"], source=source)
            try:
                out = fn(q, k, v)
                if ref64 is not None:
                    ok, err, bound = compare_to_reference(out, ref64, reflow)
                    row["max_error"] = err
                    if not ok:
                        row["error"] = f"correctness check failed: {err:.3e} > {bound:.3e}"
                        rows.append(row)
                        continue
                del out
                qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fwd_ms = do_bench(lambda: fn(q, k, v), quantiles=[0.5])
                row["fwd_ms"] = fwd_ms
                row["fwd_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20

                def fwd_bwd():
                    fn(qg, kg, vg).backward(grad)

                torch.cuda.reset_peak_memory_stats()
                fb_ms = do_bench(fwd_bwd, quantiles=[0.5], grad_to_none=[qg, kg, vg])
                row["fwd_bwd_ms"] = fb_ms
                row["fwd_bwd_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                row["fwd_tflops"] = flops / fwd_ms * 1e-9
                row["fwd_bwd_tflops"] = 3.5 * flops / fb_ms * 1e-9
            except torch.cuda.OutOfMemoryError:
                row["error"] = "out of memory"
                torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001 - one provider failing does not stop the others
                row["error"] = repr(exc)[:200]
            rows.append(row)
            print(row, flush=True)
    return rows


def _tiles(dtype, head_dim):
    cfg = subnet.forward_config(dtype, subnet._block_d(head_dim, dtype))
    return cfg["BLOCK_M"], cfg["BLOCK_N"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--pairwise", action="store_true", help="add the pairwise mask (M = 11)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16384, help="batch * N per step")
    args = parser.parse_args()
    if args.quick:  # fits the GPU suite's time slot
        args.tokens = min(args.tokens, 4096)

    masks = sk.MaskSpec(pairwise=args.pairwise)
    sentences, source = load_sentences()
    conditions = dict(python=platform.python_version(), torch=torch.__version__, masks=masks.names,
                      source=source)
    try:
        import triton

        conditions["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    # Visited-block fractions: a CPU property of the trees and the tiling.
    blocks = sorted({_tiles(torch.bfloat16, 32), _tiles(torch.bfloat16, 64), _tiles(torch.bfloat16, 128), (64, 64)})
    fraction_rows = block_fraction_rows(sentences, source, masks, [128, 512, 1024, 4096] if args.quick else SIZES,
                                        blocks)
    print(f"Visited block fractions ({source}, documents of whole sentences, masks {masks.names}):")
    print_table(fraction_rows, ["N", "batch", "mean_length", "block", "masks", "valid", "syntax", "visited",
                                "visited_mask"])
    result = dict(conditions=conditions, block_fractions=fraction_rows, timings=[])
    if not torch.cuda.is_available():
        print("\nNo CUDA device: a GPU is needed for the timings (the block fractions above need none).")
    else:
        conditions["gpu"] = torch.cuda.get_device_name()
        result["timings"] = run_cuda(args, sentences, source, masks)
        print_table(result["timings"], ["provider", "N", "batch", "fwd_ms", "fwd_bwd_ms", "fwd_tflops",
                                        "fwd_bwd_tflops", "fwd_bwd_peak_mib", "error"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
