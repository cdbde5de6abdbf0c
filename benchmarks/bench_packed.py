"""Packed batches against padding to the batch's longest: a tiny BERT training step, the trees' bytes and the bias op.

    python benchmarks/bench_packed.py                      # CPU: training-step ratio and tree bytes (minutes)
    python benchmarks/bench_packed.py --quick              # CPU: fewer batches, one epoch per round
    python benchmarks/bench_packed.py --device cuda        # GPU: the bias op and the tiny model step, tokens/s
    python benchmarks/bench_packed.py --run packed --batches 60 --epochs 3   # one mode only, nothing else
                                                           # (for whole-process timers, A/B pairs)

Sentences: UD English-EWT dev (``$SYNTAXKERNELS_UD``, file order) when the file is there, else generated
sentence-like trees (named in the output); each is ``[CLS] words [SEP]`` (``syntaxkernels.tools.workloads``: one token
per word, ``[CLS]`` roots it), batches of 32 consecutive sentences, random ids (vocab 1,000) and labels (17).

*Padded*: ``TreeCollator()`` (input_ids / attention_mask ``[32, N]``, N the batch's longest; a ``TreeBatch``).
*Packed*: ``TreeCollator(packed=True)`` (input_ids / position_ids ``[1, T]``; a ``PackedTreeBatch``).

CPU (default): a tiny ``BertForTokenClassification`` (hidden 128, 2 layers, 2 heads of 64, intermediate 512,
dropout 0) with ``enable_syntax_attention(model, "bias")``, SGD; one model per mode, the same initial weights.
Before timing, the two models' first-batch losses and bias-table gradients must agree (fp32; a mode that
disagrees is reported, not timed). Then rounds, each one epoch over the batches of either mode in turn (padded,
packed, padded, ...); the figure is the packed / padded ratio of each round's thread CPU time (and wall time),
median and range over the rounds: within one process, so the machine's drift cancels pair by pair. torch
runs one thread. Besides, over every whole batch of 32 of the sentences (not only ``--batches``): the trees'
bytes per batch, padded ``TreeBatch`` (heads, lengths, distance buffer,
depth, segment) against ``PackedTreeBatch.nbytes``, and the distance alone; and building the trees,
``TreeBatch.from_heads(rows, packed=True)`` against ``TreeBatch.from_heads(rows)`` per batch (thread CPU time of
rounds in turn, the same ratio).

CUDA (``--device cuda``): the bias op (bf16, H = 12, D = 64, shared table) forward + backward on 256 sentences,
8 batches of 32, padded (``[32, 12, N, 64]`` with lengths) against packed (``[T, 12, 64]`` with cu_seqlens), the
same q, k, v; each mode's forward is checked against the fp64 reference first (a mode that disagrees is reported,
not timed); tokens/s counts the sentences' tokens. Then the tiny model's training step (fp32), padded against
packed, after the same loss check. Without a CUDA GPU it says so and exits 0. Only the ratios are meant to be
quoted.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.insert(0, path)

import torch  # noqa: E402

from _bench_utils import base_parser, require_cuda, save_rows, time_ms, write_results  # noqa: E402

BATCH = 32
VOCAB = 1000
LABELS = 17
MODES = ("padded", "packed")


def sentence_items(count: Optional[int], seed: int = 0):
    """``(items, source)``: ``count`` (None: all) collator items (``[CLS] words [SEP]`` heads, random ids and labels)."""
    from syntaxkernels.tools import workloads

    sentences, source = workloads.sentence_source()
    rows = [workloads._with_cls([[s]]) for s in sentences if len(s) > 0][:count]
    g = torch.Generator().manual_seed(seed)
    items = [dict(input_ids=torch.randint(5, VOCAB, (len(r),), generator=g).tolist(), heads=r,
                  labels=torch.randint(0, LABELS, (len(r),), generator=g).tolist()) for r in rows]
    return items, source


def collated(items, mode: str, device="cpu"):
    import syntaxkernels as sk

    collate = sk.trees.TreeCollator(packed=mode == "packed")
    out = []
    for i in range(0, len(items) - BATCH + 1, BATCH):
        b = collate(items[i:i + BATCH])
        out.append({k: (v.to(device) if hasattr(v, "to") else v) for k, v in b.items()})
    return out


def tiny_model(device="cpu"):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, vocab_size=VOCAB, num_labels=LABELS,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForTokenClassification(config)
    enable_syntax_attention(model, "bias")
    return model.to(device).train()


def model_inputs(b, mode: str):
    if mode == "packed":
        return dict(input_ids=b["input_ids"], position_ids=b["position_ids"], syntax_trees=b["trees"],
                    labels=b["labels"])
    return dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], syntax_trees=b["trees"],
                labels=b["labels"])


def trainer(model, batches, mode: str):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def epoch():
        for b in batches:
            model(**model_inputs(b, mode)).loss.backward()
            opt.step()
            opt.zero_grad()
    return epoch


def syntax_grads(model):
    return torch.cat([p.grad.flatten() for n, p in model.named_parameters() if "syntax" in n and p.grad is not None])


def check_models(models, batches, loss_tol=1e-5, grad_tol=1e-3):
    """``(ok, detail)``: the first batch's loss and syntax-parameter gradients, padded against packed (fp32), within
    ``loss_tol`` and ``grad_tol`` relative (on CUDA looser: the kernels may run fp32 products as TF32)."""
    losses, grads = {}, {}
    for mode in MODES:
        model = models[mode]
        loss = model(**model_inputs(batches[mode][0], mode)).loss
        loss.backward()
        losses[mode], grads[mode] = loss.item(), syntax_grads(model).double()
        model.zero_grad()
    dl = abs(losses["packed"] - losses["padded"])
    dg = (grads["packed"] - grads["padded"]).abs().max().item() if grads["padded"].numel() else 0.0
    gmax = grads["padded"].abs().max().item() if grads["padded"].numel() else 0.0
    ok = grads["padded"].numel() > 0 and dl <= loss_tol * max(1.0, abs(losses["padded"])) and dg <= grad_tol * gmax + 1e-12
    return ok, (f"loss {losses['padded']:.6f} padded, {losses['packed']:.6f} packed; syntax-grad diff {dg:.1e} "
                f"of {gmax:.1e}")


def tree_bytes(items):
    import syntaxkernels as sk

    rows = [it["heads"] for it in items]
    pad = pack = dist_pad = dist_pack = n = 0
    for i in range(0, len(rows) - BATCH + 1, BATCH):
        chunk = rows[i:i + BATCH]
        a = sk.TreeBatch.from_heads(chunk)
        b = sk.trees.PackedTreeBatch.from_heads(chunk)
        pad += sum(x.untyped_storage().nbytes() for x in (a.heads, a.lengths, a.distance, a.depth, a.segment))
        pack += b.nbytes
        dist_pad += a.distance.untyped_storage().nbytes()
        dist_pack += b.distance.numel() * b.distance.element_size()
        n += 1
    return dict(batches=n, padded_bytes=pad / n, packed_bytes=pack / n, ratio=round(pad / pack, 2),
                distance_padded=dist_pad / n, distance_packed=dist_pack / n, distance_ratio=round(dist_pad / dist_pack, 2))


def tree_building(items, rounds: int, passes: int):
    """Per-round thread CPU time of building every batch's trees, ``TreeBatch.from_heads(rows)`` against
    ``TreeBatch.from_heads(rows, packed=True)`` (one C++ call each, reading the ragged lists), in turn."""
    import syntaxkernels as sk

    rows = [it["heads"] for it in items]
    chunks = [rows[i:i + BATCH] for i in range(0, len(rows) - BATCH + 1, BATCH)]
    times = {m: [] for m in MODES}
    for r in range(rounds + 1):  # the first round warms up
        for m in MODES:
            c0 = time.thread_time()
            for _ in range(passes):
                for chunk in chunks:
                    sk.TreeBatch.from_heads(chunk, packed=m == "packed")
            if r:
                times[m].append((time.thread_time() - c0) / (passes * len(chunks)))
    ratios = [p / q for p, q in zip(times["packed"], times["padded"])]
    return dict(batches=len(chunks), ratio=round(statistics.median(ratios), 3),
                ratio_range=f"{min(ratios):.2f}-{max(ratios):.2f}")


def run_cpu(args) -> int:
    torch.set_num_threads(1)
    count = BATCH * args.batches
    items, source = sentence_items(count)
    title = f"packed vs padded, CPU, tiny BERT bias step, {source}"
    rows = []

    def add(row):
        rows.append(row)
        print(row, flush=True)
        save_rows(rows, args.json, title)

    batches = {m: collated(items, m) for m in MODES}
    tokens = sum(len(it["heads"]) for it in items[:BATCH * len(batches["padded"])])
    padded_slots = sum(int(b["input_ids"].numel()) for b in batches["padded"])
    models = {m: tiny_model() for m in MODES}
    ok, detail = check_models(models, batches)
    base = dict(what="train step", batches=len(batches["padded"]), tokens=tokens, padded_slots=padded_slots)
    if not ok:
        add(dict(base, note=f"PADDED AND PACKED DISAGREE, not timed: {detail}"))
    else:
        epochs = {m: trainer(models[m], batches[m], m) for m in MODES}
        for m in MODES:  # warm-up: first-call costs (allocator, caches)
            epochs[m]()
        cpu = {m: [] for m in MODES}
        wall = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for m in MODES:
                c0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(args.epochs):
                    epochs[m]()
                cpu[m].append(time.thread_time() - c0)
                wall[m].append(time.perf_counter() - w0)
        r_cpu = [p / q for p, q in zip(cpu["packed"], cpu["padded"])]
        r_wall = [p / q for p, q in zip(wall["packed"], wall["padded"])]
        add(dict(base, rounds=args.rounds, epochs=args.epochs, ratio_cpu=round(statistics.median(r_cpu), 3),
                 ratio_cpu_range=f"{min(r_cpu):.2f}-{max(r_cpu):.2f}", ratio_wall=round(statistics.median(r_wall), 3),
                 ratio_wall_range=f"{min(r_wall):.2f}-{max(r_wall):.2f}",
                 packed_tok_s=round(tokens * args.epochs / statistics.median(cpu["packed"])),
                 padded_tok_s=round(tokens * args.epochs / statistics.median(cpu["padded"])), note=detail))
    every, _ = sentence_items(None)  # the trees' figures: every whole batch of 32 of the sentences
    tb = tree_bytes(every)
    add(dict(what="tree bytes / batch", batches=tb["batches"], padded_bytes=round(tb["padded_bytes"]),
             packed_bytes=round(tb["packed_bytes"]), bytes_ratio=tb["ratio"],
             note=f"distance alone {tb['distance_padded']:.0f} padded / {tb['distance_packed']:.0f} packed "
                  f"= {tb['distance_ratio']}x"))
    tb = tree_building(every, args.rounds, 10 if args.quick else 50)
    add(dict(what="tree building", batches=tb["batches"], rounds=args.rounds, ratio_cpu=tb["ratio"],
             ratio_cpu_range=tb["ratio_range"], note="from_heads(rows, packed=True) / from_heads(rows), per batch"))
    write_results(rows, args.json, title,
                  ["what", "batches", "tokens", "padded_slots", "rounds", "ratio_cpu", "ratio_cpu_range", "ratio_wall",
                   "ratio_wall_range", "padded_bytes", "packed_bytes", "bytes_ratio", "note"])
    return 0


def bias_inputs(items, device="cuda", H=12, D=64, dtype=torch.bfloat16, seed=0):
    """Per batch of 32: the same packed q, k, v ``[T, H, D]`` and laid out padded ``[32, H, N, D]``."""
    import syntaxkernels as sk

    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i in range(0, len(items) - BATCH + 1, BATCH):
        rows = [it["heads"] for it in items[i:i + BATCH]]
        packed = sk.trees.PackedTreeBatch.from_heads(rows).to(device)
        padded = sk.TreeBatch.from_heads(rows).to(device)
        T, N = packed.num_tokens, padded.distance.shape[1]
        qkv = [torch.randn(T, H, D, device=device, dtype=dtype, generator=gen) for _ in range(3)]
        seq, pos = packed.sequence.long(), packed.positions.long()

        def lay_out(x):
            y = x.new_zeros((BATCH, N, H, D))
            y[seq, pos] = x
            return y.transpose(1, 2).contiguous()
        out.append(dict(packed=packed, padded=padded, qkv=qkv, qkv_padded=[lay_out(x) for x in qkv], seq=seq, pos=pos))
    return out


def bias_call(mode, b, table, buckets, q, k, v):
    import syntaxkernels as sk

    if mode == "packed":
        return sk.syntax_bias_attention(q, k, v, b["packed"].distance, table, buckets=buckets,
                                        cu_seqlens=b["packed"].cu_seqlens, max_seqlen=b["packed"].max_seqlen)
    return sk.syntax_bias_attention(q, k, v, b["padded"].distance, table, buckets=buckets, lengths=b["padded"].lengths)


def check_bias(mode, data, table, buckets):
    """``(ok, detail)``: every batch's forward against the fp64 reference (valid rows)."""
    from syntaxkernels.ops.bias_attention._varlen import reference_bias_attention_varlen
    from syntaxkernels.tools.testing import compare_to_reference

    all_ok, worst = True, (0.0, 1.0)
    for b in data:
        q, k, v = b["qkv"] if mode == "packed" else b["qkv_padded"]
        with torch.no_grad():
            out = bias_call(mode, b, table, buckets, q, k, v)
        if mode == "padded":
            out = out.transpose(1, 2)[b["seq"], b["pos"]]  # the valid rows, in packed order
        p, pk = b["packed"], b["qkv"]

        def ref(dtype):
            return reference_bias_attention_varlen(*(y.to(dtype) for y in pk), p.distance, table.detach().to(dtype),
                                                   buckets=buckets, cu_seqlens=p.cu_seqlens)
        ok, err, bound = compare_to_reference(out, ref(torch.float64), ref(pk[0].dtype))
        all_ok = all_ok and ok
        if err / max(bound, 1e-30) >= worst[0] / max(worst[1], 1e-30):
            worst = (err, bound)
    return all_ok, f"max err {worst[0]:.3e} (bound {worst[1]:.3e})"


def run_cuda(args) -> int:
    if not require_cuda("bench_packed.py"):
        return 0
    import syntaxkernels as sk

    device = args.device
    items, source = sentence_items(BATCH * 8)
    title = f"packed vs padded, CUDA, {source}"
    rows = []

    def add(row):
        rows.append(row)
        print(row, flush=True)
        save_rows(rows, args.json, title)

    data = bias_inputs(items, device)
    tokens = sum(b["packed"].num_tokens for b in data)
    buckets = sk.BucketSpec()
    table = (0.5 * torch.randn(buckets.num_buckets, device=device)).requires_grad_()
    for mode in MODES:
        base = dict(what="bias fwd+bwd bf16 H12 D64", mode=mode, batches=len(data), tokens=tokens)
        try:
            ok, detail = check_bias(mode, data, table, buckets)
        except Exception as exc:  # noqa: BLE001 - one mode failing must not stop the other
            add(dict(base, note=f"error: {exc!r}"[:200]))
            continue
        if not ok:
            add(dict(base, note=f"WRONG RESULT, not timed: {detail}"))
            continue
        grads = [[x.detach().requires_grad_() for x in (b["qkv"] if mode == "packed" else b["qkv_padded"])]
                 for b in data]

        def step():
            for b, (q, k, v) in zip(data, grads):
                out = bias_call(mode, b, table, buckets, q, k, v)
                out.backward(torch.ones_like(out))
        try:
            timing = time_ms(step, warmup=10, rep=50 if args.quick else 200)
            add(dict(base, **timing, tok_s=round(tokens / (timing["ms"] * 1e-3)), note=detail))
        except Exception as exc:  # noqa: BLE001
            add(dict(base, note=f"error: {exc!r}"[:200]))
    # the tiny model's training step, fp32
    batches = {m: collated(items, m, device) for m in MODES}
    models = {m: tiny_model(device) for m in MODES}
    try:
        ok, detail = check_models(models, batches, loss_tol=1e-3, grad_tol=5e-2)
    except Exception as exc:  # noqa: BLE001
        ok, detail = False, f"error: {exc!r}"[:200]
    for mode in MODES:
        base = dict(what="tiny BERT train step fp32", mode=mode, batches=len(batches[mode]), tokens=tokens)
        if not ok:
            add(dict(base, note=f"not timed: {detail}"))
            continue
        try:
            timing = time_ms(trainer(models[mode], batches[mode], mode), warmup=3, rep=50 if args.quick else 200)
            add(dict(base, **timing, tok_s=round(tokens / (timing["ms"] * 1e-3)), note=detail))
        except Exception as exc:  # noqa: BLE001
            add(dict(base, note=f"error: {exc!r}"[:200]))
    by = {(r["what"], r["mode"]): r for r in rows if "ms" in r}
    for what in dict.fromkeys(r["what"] for r in rows):
        if (what, "packed") in by and (what, "padded") in by:
            add(dict(what=what, mode="packed / padded", ratio=round(by[(what, "packed")]["ms"] /
                                                                  by[(what, "padded")]["ms"], 3),
                     note="time ratio of the medians (tokens/s: its inverse)"))
    write_results(rows, args.json, title, ["what", "mode", "batches", "tokens", "ms", "tok_s", "ratio", "note"])
    return 0


def run_one(args) -> int:
    """``--run MODE``: collate, build the model, run ``--epochs`` epochs over ``--batches`` batches; nothing else."""
    torch.set_num_threads(1)
    items, _ = sentence_items(BATCH * args.batches)
    batches = collated(items, args.run)
    epoch = trainer(tiny_model(), batches, args.run)
    start = time.perf_counter()
    for _ in range(args.epochs):
        epoch()
    tokens = args.epochs * sum(len(it["heads"]) for it in items[:BATCH * len(batches)])
    print(f"{args.run}: {len(batches)} batches x {args.epochs} epochs, {tokens} tokens, step loop "
          f"{time.perf_counter() - start:.3f} s", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batches", type=int, default=None, help="batches of 32 sentences (default 60, quick 12)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per timed round (default 3, quick 1)")
    parser.add_argument("--rounds", type=int, default=None, help="CPU: timed rounds per mode (default 5, quick 3)")
    parser.add_argument("--run", choices=MODES, default=None,
                        help="CPU: only train this mode (no check, no timing: for whole-process timers)")
    args = parser.parse_args(argv)
    if args.batches is None:
        args.batches = 12 if args.quick else 60
    if args.epochs is None:
        args.epochs = 1 if args.quick else 3
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.run:
        return run_one(args)
    if args.device == "cuda":
        return run_cuda(args)
    return run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())
