"""Syntax-BERT sub-network attention and the GAT's windowed attention on tree edge lists: CPU ratios and GPU times.

Data: real sentences from the CoNLL-U treebank ``$SYNTAXKERNELS_UD`` names, packed whole, one after another, into
documents of at most N tokens (one tree per sentence: a forest). Without the file the script says so and measures on
generated forests of 1-40 tokens packed the same way; the JSON's title says which.

CPU part (always; the machine is shared and noisy, so only ratios measured in one run are reported: every pair is
timed interleaved, round after round, and the medians compared). Edge lists are built before timing, as a
``TreeCollator(masks=...)`` does in the DataLoader workers; their build time is reported on its own.

1. ``subnetwork vs sdpa``: ``sk.syntax_subnetwork_attention`` forward + backward (``MaskSpec()``, M = 10: nine relation
   masks on the C++ edge kernels, ``full`` on SDPA; the op returns M outputs, so writing and reading them is part of
   its cost) against one plain ``F.scaled_dot_product_attention`` forward + backward on the same q, k, v; B = 8
   documents of N = 128, H = 4, D = 64, fp32. Target <= 3x. The reference (M dense masked attentions) for context.
2. ``relations N=4096 vs N=512``: the nine relation masks only, the same batch size at N = 512 and N = 4096
   (forward + backward). Target <= 12x the time for 8x the tokens (work proportional to the edges).
3. ``gat window``: ``sk.ops.syntax_window_attention`` (window 4, edge lists) forward + backward on N = 2048 documents
   against the dense masked reference (``reference.gat_attention``), and at N = 512 to show time following E.

GPU part (CUDA only; otherwise a message): bf16 forward and forward + backward of syntaxkernels (Triton edge kernels +
the fused dense kernel), FlexAttention with M block masks, SDPA with M boolean masks and the reference, N = 512 ..
4096, M = 10 and 11 (``--pairwise``). Every provider is checked against the fp64 reference before it is timed; the
JSON is rewritten after every GPU row, so a run cut short keeps what it measured.

Usage: ``python benchmarks/bench_subnetwork_attention.py [--json out.json] [--quick] [--threads 1] [--pairwise]``
"""
from __future__ import annotations

import os
import platform
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
BENCH = os.path.dirname(os.path.abspath(__file__))
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import reference  # noqa: E402
from syntaxkernels.tools import workloads  # noqa: E402
from syntaxkernels.ops.edge_attention import syntax_window_attention  # noqa: E402
from syntaxkernels.tools.checks.bias_attention_cpu import interleaved_ms as _interleaved_ms  # noqa: E402
from syntaxkernels.tools.testing import compare_to_reference  # noqa: E402
from _bench_utils import base_parser, conditions, save_rows, write_results  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------

def make_trees(sentences, n: int, batch: int, device="cpu") -> sk.TreeBatch:
    """A TreeBatch of ``batch`` packed documents padded to exactly N = n tokens."""
    docs = workloads.pack_sentences(sentences, n, rows=batch)
    heads = torch.full((batch, n), -1, dtype=torch.int64)
    for b, doc in enumerate(docs):
        heads[b, :len(doc)] = torch.tensor(doc)
    return sk.TreeBatch.from_heads(heads, torch.tensor([len(d) for d in docs])).to(device)


# ---------------------------------------------------------------------------------------------------------
# CPU timing: interleaved rounds, medians
# ---------------------------------------------------------------------------------------------------------

def interleaved_ms(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, float]:
    """Median milliseconds of each function, interleaved round after round, after two warm-up rounds."""
    return _interleaved_ms(fns, rounds, warmup=2)


def fwd_bwd(fn: Callable, inputs: Sequence[torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    def run():
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(grad)
    return run


def qkv(B: int, H: int, N: int, D: int, dtype=torch.float32, device="cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
            for _ in range(3)]


def check_close(name: str, got, want64, wantlow) -> None:
    ok, err, bound = compare_to_reference(got, want64, wantlow)
    if not ok:
        raise SystemExit(f"{name}: output differs from the float64 reference ({err:.2e} > {bound:.2e})")


def cpu_subnetwork_vs_sdpa(sentences, rounds: int) -> Dict:
    B, H, N, D = 8, 4, 128, 64
    masks = sk.MaskSpec()
    trees = make_trees(sentences, N, B)
    start = time.perf_counter()
    lists = trees.relation_lists(masks)  # what TreeCollator(masks=...) does in a DataLoader worker
    build_ms = (time.perf_counter() - start) * 1e3
    q, k, v = qkv(B, H, N, D)
    check_close("subnetwork", sk.syntax_subnetwork_attention(q, k, v, trees, masks)[0],
                reference.syntax_subnetwork_attention(q.double(), k.double(), v.double(), trees, masks)[0],
                reference.syntax_subnetwork_attention(q, k, v, trees, masks)[0])
    grad = torch.randn(B, masks.num_masks, H, N, D)
    grad1 = torch.randn(B, H, N, D)
    times = interleaved_ms({
        "sdpa": fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), (q, k, v), grad1),
        "subnetwork": fwd_bwd(lambda a, b, c: sk.syntax_subnetwork_attention(a, b, c, trees, masks), (q, k, v), grad),
        "relations only": fwd_bwd(lambda a, b, c: sk.syntax_subnetwork_attention(a, b, c, trees,
                                                                               sk.MaskSpec(full=False)),
                                  (q, k, v), grad[:, :9]),
        "reference": fwd_bwd(lambda a, b, c: reference.syntax_subnetwork_attention(a, b, c, trees, masks),
                             (q, k, v), grad),
    }, rounds)
    return dict(test="subnetwork vs sdpa", B=B, H=H, N=N, D=D, M=masks.num_masks,
                tokens=int(trees.lengths.sum()), edges=lists.num_edges, list_build_ms=round(build_ms, 3),
                **{f"{k}_ms": round(v, 3) for k, v in times.items()},
                ratio=round(times["subnetwork"] / times["sdpa"], 2), target="<= 3",
                relations_only_ratio=round(times["relations only"] / times["sdpa"], 2),
                reference_ratio=round(times["reference"] / times["sdpa"], 2))


def cpu_relation_scaling(sentences, rounds: int, batch: int = 4) -> Dict:
    H, D = 4, 64
    masks = sk.MaskSpec(full=False)
    fns, edges, tokens = {}, {}, {}
    for n in (512, 4096):
        trees = make_trees(sentences, n, batch)
        lists = trees.relation_lists(masks)
        edges[n], tokens[n] = lists.num_edges, int(trees.lengths.sum())
        q, k, v = qkv(batch, H, trees.max_len, D)
        grad = torch.randn(batch, masks.num_masks, H, trees.max_len, D)
        fns[f"N={n}"] = fwd_bwd(lambda a, b, c, t=trees: sk.syntax_subnetwork_attention(a, b, c, t, masks),
                                (q, k, v), grad)
    times = interleaved_ms(fns, rounds)
    return dict(test="relations N=4096 vs N=512", B=batch, H=H, D=D, M=masks.num_masks,
                tokens_512=tokens[512], tokens_4096=tokens[4096], edges_512=edges[512], edges_4096=edges[4096],
                ms_512=round(times["N=512"], 3), ms_4096=round(times["N=4096"], 3),
                token_ratio=round(tokens[4096] / tokens[512], 2),
                ratio=round(times["N=4096"] / times["N=512"], 2), target="<= 12")


def cpu_gat_window(sentences, rounds: int, batch: int = 2) -> Dict:
    H, D, window = 4, 64, 4
    row: Dict = dict(test="gat window", B=batch, H=H, D=D, window=window)
    for n in (512, 2048):
        trees = make_trees(sentences, n, batch)
        lists = trees.window_lists(window)
        q, k, v = qkv(batch, H, trees.max_len, D)
        check_close(f"window N={n}", syntax_window_attention(q, k, v, trees, window=window),
                    reference.gat_attention(q.double(), k.double(), v.double(), trees.distance, window=window,
                                            lengths=trees.lengths),
                    reference.gat_attention(q, k, v, trees.distance, window=window, lengths=trees.lengths))
        grad = torch.randn(batch, H, trees.max_len, D)
        times = interleaved_ms({
            "edges": fwd_bwd(lambda a, b, c: syntax_window_attention(a, b, c, trees, window=window), (q, k, v), grad),
            "reference": fwd_bwd(lambda a, b, c: reference.gat_attention(a, b, c, trees.distance, window=window,
                                                                       lengths=trees.lengths), (q, k, v), grad),
        }, rounds if n == 512 else max(3, rounds // 3))
        row.update({f"edges_{n}": lists.num_edges, f"pairs_{n}": int((trees.lengths ** 2).sum()),
                    f"edge_ms_{n}": round(times["edges"], 3), f"reference_ms_{n}": round(times["reference"], 3),
                    f"speedup_{n}": round(times["reference"] / times["edges"], 1)})
    row["edge_ratio_2048_vs_512"] = round(row["edges_2048"] / row["edges_512"], 2)
    row["time_ratio_2048_vs_512"] = round(row["edge_ms_2048"] / row["edge_ms_512"], 2)
    return row


def run_cpu(sentences, args) -> List[Dict]:
    rounds = 5 if args.quick else 15
    rows = []
    for bench in (cpu_subnetwork_vs_sdpa, cpu_relation_scaling, cpu_gat_window):
        row = bench(sentences, rounds)
        print(row, flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------
# GPU part
# ---------------------------------------------------------------------------------------------------------

def gpu_providers(q, k, v, trees, masks) -> Dict[str, Callable]:
    fns: Dict[str, Callable] = {
        "syntaxkernels": lambda q, k, v: sk.syntax_subnetwork_attention(q, k, v, trees, masks)[0],
        "reference": lambda q, k, v: reference.syntax_subnetwork_attention(q, k, v, trees, masks)[0],
    }
    allowed = reference.syntax_masks(trees, masks)  # built once, outside the timed region

    def sdpa(q, k, v):
        return torch.stack([torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, m, None]))
                            for m in range(masks.num_masks)], dim=1)

    fns["sdpa"] = sdpa
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        dist, depth, seg = trees.distance, trees.depth, trees.segment
        B, _, N, _ = q.shape

        def make_mod(kind, d):
            def mask_mod(b, h, qi, kj):
                dd = dist[b, qi, kj].to(torch.int32)
                valid = (seg[b, qi] >= 0) & (seg[b, kj] >= 0)
                same = valid & (seg[b, qi] == seg[b, kj])
                gap = depth[b, kj] - depth[b, qi]
                if kind == "parent":
                    return same & (gap == dd) & (dd == d)
                if kind == "child":
                    return same & (-gap == dd) & (dd == d)
                if kind == "sibling":
                    return same & (gap != dd) & (-gap != dd) & (dd == d)
                if kind == "pairwise":
                    return valid & ~same
                return valid
            return mask_mod

        block_masks = [create_block_mask(make_mod(kind, d), B, None, N, N, device=q.device)
                       for kind, d in masks.kinds()]
        fns["flex"] = lambda q, k, v: torch.stack([flex(q, k, v, block_mask=bm) for bm in block_masks], dim=1)
    except Exception as exc:  # noqa: BLE001 - reported, the other providers still run
        print(f"flex: unavailable ({exc!r})")
    return fns


def run_gpu(sentences, args, on_row: Callable[[Dict], None] = lambda row: None) -> List[Dict]:
    """The GPU grid; ``on_row(row)`` after every row. Every provider's output is checked against the fp64
    reference before it is timed: on the whole batch up to N = 1024, on the first document above (the
    reference's N x N tensors in fp64)."""
    from _bench_utils import time_ms

    rows = []
    H, D = args.heads, args.head_dim
    for pairwise in ((False, True) if not args.quick else (args.pairwise,)):
        masks = sk.MaskSpec(pairwise=pairwise)
        for n in ([512, 2048] if args.quick else [512, 1024, 2048, 4096]):
            batch = max(1, args.tokens // n)
            trees = make_trees(sentences, n, batch)
            trees.relation_lists(masks)  # as the DataLoader workers would
            trees = trees.to("cuda")
            n_real = trees.max_len
            q, k, v = (torch.randn(batch, H, n_real, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            grad = torch.randn(batch, masks.num_masks, H, n_real, D, device="cuda", dtype=torch.bfloat16)
            fns = gpu_providers(q, k, v, trees, masks)
            checked = batch if n <= 1024 else 1  # make_trees packs the same first document for any batch
            check_trees = trees if checked == batch else make_trees(sentences, n, 1).to("cuda")
            cq, ck, cv = (t[:checked] for t in (q, k, v))
            ref64 = reference.syntax_subnetwork_attention(cq.double(), ck.double(), cv.double(), check_trees,
                                                          masks)[0]
            reflow = reference.syntax_subnetwork_attention(cq, ck, cv, check_trees, masks)[0]
            for name, fn in fns.items():
                row = dict(provider=name, N=n_real, B=batch, H=H, D=D, M=masks.num_masks, dtype="bf16")
                try:
                    out = fn(q, k, v)
                    ok, err, bound = compare_to_reference(out[:checked], ref64, reflow)
                    del out
                    row["checked"] = f"{err:.2e}/{bound:.2e} on {checked} of {batch} documents"
                    if not ok:
                        row["error"] = f"correctness check failed, not timed: {err:.3e} > {bound:.3e}"
                    else:
                        row.update({f"fwd_{key}": value for key, value in time_ms(lambda: fn(q, k, v)).items()})
                        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
                        row.update({f"fwd_bwd_{key}": value
                                    for key, value in time_ms(lambda: fn(qg, kg, vg).backward(grad)).items()})
                except torch.cuda.OutOfMemoryError:
                    row["error"] = "out of memory"
                    torch.cuda.empty_cache()
                except Exception as exc:  # noqa: BLE001 - one provider failing does not stop the others
                    row["error"] = repr(exc)[:200]
                rows.append(row)
                on_row(row)
                print(row, flush=True)
            del ref64, reflow
            torch.cuda.empty_cache()
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for the CPU part (default 1)")
    parser.add_argument("--pairwise", action="store_true", help="GPU --quick: M = 11 (pairwise) instead of 10")
    parser.add_argument("--heads", type=int, default=12, help="GPU heads")
    parser.add_argument("--head-dim", type=int, default=64, help="GPU head dim")
    parser.add_argument("--tokens", type=int, default=16384, help="GPU batch * N per step")
    parser.add_argument("--skip-cpu", action="store_true", help="only the GPU part")
    args = parser.parse_args(argv)
    from syntaxkernels import data

    if data.treebank_available():
        sentences, source = workloads.treebank_heads(data.treebank_path()), "treebank sentences, packed"
    else:  # the measurement still runs, on trees of the same shape; every row says which
        sentences = workloads.generated_sentences(20000, seed=0)
        source = "generated forests (lengths 1-40), packed: no treebank"
        print(f"bench_subnetwork_attention: {data.missing_message()}; measuring on {source}.")
    torch.set_num_threads(args.threads)
    rows: List[Dict] = []
    if not args.skip_cpu:
        rows += run_cpu(sentences, args)
        write_results(rows, None, f"sub-network / edge attention, CPU ({args.threads} thread(s), "
                      f"{platform.processor() or platform.machine()})",
                      ["test", "ratio", "target", "relations_only_ratio", "reference_ratio", "token_ratio",
                       "speedup_512", "speedup_2048", "time_ratio_2048_vs_512", "edge_ratio_2048_vs_512"])
    title = f"sub-network / edge attention ({source})"
    if torch.cuda.is_available():
        done = list(rows)
        rows += run_gpu(sentences, args, on_row=lambda row: (done.append(row), save_rows(done, args.json, title)))
    else:
        print("\nNo CUDA device: the GPU part (FlexAttention with M block masks, SDPA with M boolean masks, the "
              "reference) needs one; nothing was measured there.")
    if args.json:
        write_results(rows, args.json, title, ["test", "provider", "N", "ratio"])
    info = conditions()
    info["threads"] = torch.get_num_threads()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
