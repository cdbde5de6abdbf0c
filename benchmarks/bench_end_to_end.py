"""End to end: one training step of a transformers BERT encoder with each syntax method against the unpatched
model, and the cost of building the trees in the data pipeline beside it.

    python benchmarks/bench_end_to_end.py                       # CPU: tiny encoder (about a minute)
    python benchmarks/bench_end_to_end.py --device cuda         # GPU: BERT-base shape, bf16 autocast
    python benchmarks/bench_end_to_end.py --json out.json       # also write the results as JSON
    python -m pytest benchmarks/bench_end_to_end.py --benchmark-only   # tiny steps under pytest-benchmark

Models: ``BertForTokenClassification`` (18 labels) built from a config, no download. "base" is the
BERT-base shape (12 layers, 768 wide, 12 heads, FFN 3072); "tiny" (the CPU default) is 2 layers, 128 wide,
4 heads, FFN 512, a 2000-word vocabulary (so the embedding update does not hide the attention). On CPU
torch runs 1 thread unless ``--threads`` says otherwise. Methods: ``plain`` (the unpatched model, transformers' SDPA attention), ``bias``
(shared distance-bias table), ``subnetwork`` (MaskSpec(): parent/child/sibling up to 3 + full, M = 10),
``gat`` (GAT 4 layers x 4 heads x 64, window 4, POS input, structural probe rank 64 -- 4 x 32 and rank 32
for "tiny" --, one syntax head per layer on Q and K). ``backend="auto"``: fused Triton kernels on CUDA, the PyTorch reference on CPU.

A step is forward + backward + AdamW step on a pre-built batch already on the device; tokens/s counts the
non-padding tokens. Peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps (GPU only).

Data: sequences packed from the UD English-EWT dev treebank when present (``$SYNTAXKERNELS_UD``, see
:mod:`syntaxkernels.data`; its word-level trees;
``[CLS]`` roots every sentence, ``[SEP]`` closes the sequence), generated forests otherwise. Pipeline:
``syntaxkernels.trees.TreeCollator`` (the C++ builder when built) collating those sequences, measured in
the main process (tree building alone, and the whole collate) and through a ``DataLoader`` with worker
processes.

Before anything is timed: the fresh "bias" and "gat" models must reproduce the unpatched model's logits
and gradients (non-padding tokens, fp32), and every method's first step must give a finite loss.
A missing GPU with ``--device cuda`` is reported and the script exits 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import _ext  # noqa: E402
from syntaxkernels.tools import workloads  # noqa: E402

SIZES = {
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512, vocab_size=2000),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=30522),
}
METHODS = ("plain", "bias", "subnetwork", "gat")
#: The GAT per size: the paper's shape for "base", half-width heads for "tiny" (128-wide encoder).
GAT = {
    "tiny": dict(num_layers=4, num_heads=4, head_dim=32, window=4, probe_rank=32),
    "base": dict(num_layers=4, num_heads=4, head_dim=64, window=4, probe_rank=64),
}
NUM_LABELS = 18


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------------------------- data


def packed_sequences(max_len: int, count: int, vocab_size: int, seed: int = 0):
    """``(source, items)``: ``count`` dicts with token-level ``heads``, ``input_ids`` and ``labels``.

    Sentences are packed in order into sequences of at most ``max_len`` tokens: token 0 is ``[CLS]`` (the
    root), each sentence's root attaches to it, the last token is ``[SEP]`` (attached to it).
    """
    try:
        sentences = workloads.treebank_heads()
        source = f"UD English-EWT dev ({len(sentences)} sentences), packed"
    except FileNotFoundError:
        from syntaxkernels.data import ENV_VAR

        sentences = workloads.generated_sentences(4000, seed=seed)
        source = f"generated forests (lengths 1-40), packed (no treebank: set {ENV_VAR})"
    sentences = [s for s in sentences if 0 < len(s) <= max_len - 2]
    g = torch.Generator().manual_seed(seed)
    items = []
    k = 0
    while len(items) < count:
        heads = [-1]
        while True:
            s = sentences[k % len(sentences)]
            if len(heads) + len(s) + 1 > max_len:
                break
            offset = len(heads)
            heads += [0 if h == -1 else h + offset for h in s]
            k += 1
        heads.append(0)
        n = len(heads)
        items.append({
            "input_ids": torch.randint(5, vocab_size, (n,), generator=g).tolist(),
            "labels": torch.randint(0, NUM_LABELS, (n,), generator=g).tolist(),
            "heads": heads,
        })
    return source, items


def make_batches(items, batch_size: int, device: torch.device):
    collate = sk.trees.TreeCollator(pad_token_id=0)
    batches = []
    for i in range(0, len(items) - batch_size + 1, batch_size):
        b = collate(items[i:i + batch_size])
        batches.append({
            "input_ids": b["input_ids"].to(device),
            "attention_mask": b["attention_mask"].to(device),
            "labels": b["labels"].to(device),
            "syntax_trees": b["trees"].to(device),
            "syntax_pos": torch.randint(0, 18, b["input_ids"].shape).to(device),
        })
    return batches


def pipeline_cost(items, batch_size: int, workers: int, batches: int) -> Dict:
    """Tree building and collation cost per batch: in-process, and through a DataLoader with workers."""
    collate = sk.trees.TreeCollator(pad_token_id=0)
    chunks = [items[i:i + batch_size] for i in range(0, batch_size * batches, batch_size)]
    heads = [collate(c)["trees"] for c in chunks[:1]]  # warm-up (loads the extension)
    t0 = time.perf_counter()
    for c in chunks:
        padded, lengths = sk.trees.normalize_heads([x["heads"] for x in c])
        heads = sk.TreeBatch.from_heads(padded, lengths)
    tree_ms = (time.perf_counter() - t0) / len(chunks) * 1e3
    t0 = time.perf_counter()
    for c in chunks:
        collate(c)
    collate_ms = (time.perf_counter() - t0) / len(chunks) * 1e3
    tokens = sum(len(x["heads"]) for c in chunks for x in c) / len(chunks)
    del heads

    loader = torch.utils.data.DataLoader(items[:batch_size * batches], batch_size=batch_size,
                                         num_workers=workers, collate_fn=collate, pin_memory=False,
                                         persistent_workers=False)
    it = iter(loader)
    next(it)  # worker start-up is not part of the steady state
    t0 = time.perf_counter()
    seen = 0
    for _ in it:
        seen += 1
    loader_ms = (time.perf_counter() - t0) / max(seen, 1) * 1e3
    return dict(builder="C++ extension" if _ext.available() else "Python/NumPy fallback",
                tokens_per_batch=tokens, tree_build_ms_per_batch=tree_ms, collate_ms_per_batch=collate_ms,
                dataloader_workers=workers, dataloader_ms_per_batch=loader_ms,
                dataloader_tokens_per_s=tokens / (loader_ms / 1e3))


# ----------------------------------------------------------------------------------------------- models


def build_model(method: str, size: str, device: torch.device, seed: int = 0, max_len: int = 512):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(seed)
    config = transformers.BertConfig(num_labels=NUM_LABELS, max_position_embeddings=max(512, max_len), **SIZES[size])
    model = transformers.BertForTokenClassification(config)
    model.set_attn_implementation("sdpa")
    # variant="package": the forms these figures were first measured with (benchmarks/RESULTS.md); the paper's and
    # the release's variants add a plain attention per layer ("subnetwork") or a dense GAT ("gat", release).
    if method == "bias":
        enable_syntax_attention(model, "bias")
    elif method == "subnetwork":
        enable_syntax_attention(model, "subnetwork", variant="package")
    elif method == "gat":
        enable_syntax_attention(model, "gat", gat_config=GAT[size], variant="package")
    return model.to(device)


def _inputs(method: str, batch: Dict) -> Dict:
    keys = ["input_ids", "attention_mask", "labels"]
    if method != "plain":
        keys.append("syntax_trees")
    if method == "gat":
        keys.append("syntax_pos")
    return {k: batch[k] for k in keys}


def check_equivalence(size: str, device: torch.device, batch: Dict) -> List[Dict]:
    """Fresh "bias" and "gat" models == the unpatched model: logits (non-padding tokens) and the gradient of
    the first layer's query weight, fp32, no dropout. Raises AssertionError when not."""
    plain = build_model("plain", size, device).float()
    plain.eval()
    small = {k: (v[:2] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    trees = batch["syntax_trees"]
    small["syntax_trees"] = sk.TreeBatch(trees.heads[:2], trees.lengths[:2], trees.distance[:2], trees.depth[:2],
                                         trees.segment[:2])
    valid = small["attention_mask"].bool()
    out = plain(**_inputs("plain", small))
    out.loss.backward()
    ref_logits = out.logits.detach()[valid]
    ref_grad = plain.bert.encoder.layer[0].attention.self.query.weight.grad.clone()
    atol = 1e-4 if device.type == "cpu" else 5e-3  # TF32 / kernel accumulation order on GPU
    rows = []
    for method in ("bias", "gat"):
        model = build_model(method, size, device).float().eval()
        got = model(**_inputs(method, small))
        got.loss.backward()
        logit_err = (got.logits.detach()[valid] - ref_logits).abs().max().item()
        grad = model.bert.encoder.layer[0].attention.self.query.weight.grad
        grad_err = ((grad - ref_grad).abs().max() / ref_grad.abs().max().clamp(min=1e-12)).item()
        ok = logit_err <= atol and grad_err <= atol * 10
        rows.append(dict(method=method, max_logit_error=logit_err, rel_grad_error=grad_err, tolerance=atol, ok=ok))
        if not ok:
            raise AssertionError(f"fresh {method} model differs from the unpatched model: logits {logit_err:.2e}, "
                                 f"grad {grad_err:.2e} (tolerance {atol:.0e})")
    return rows


def time_training(method: str, size: str, device: torch.device, batches: List[Dict], warmup: int, steps: int,
                  autocast_dtype) -> Dict:
    model = build_model(method, size, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    from syntaxkernels.integrations.transformers import syntax_aux_loss

    def step(batch):
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model(**_inputs(method, batch))
            loss = out.loss
            if method == "gat":
                loss = loss + 0.1 * syntax_aux_loss(model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    first = step(batches[0])
    if not torch.isfinite(first):
        raise AssertionError(f"{method}: first training step gave a non-finite loss {float(first)}")
    for i in range(1, warmup):
        step(batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tokens = 0
    t0 = time.perf_counter()
    for i in range(steps):
        batch = batches[(warmup + i) % len(batches)]
        step(batch)
        tokens += int(batch["attention_mask"].sum())
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    row = dict(method=method, step_ms=seconds / steps * 1e3, tokens_per_s=tokens / seconds,
               syntax_params=sum(p.numel() for n, p in model.named_parameters() if "syntax" in n))
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return row


# ----------------------------------------------------------------------------------------------- main


def run(args) -> Dict:
    device = torch.device(args.device)
    size = args.size or ("base" if device.type == "cuda" else "tiny")
    batch_size = args.batch or (32 if device.type == "cuda" else 8)
    max_len = args.seq or (256 if device.type == "cuda" else 64)
    autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    source, items = packed_sequences(max_len, batch_size * max(args.batches, 4), SIZES[size]["vocab_size"])
    batches = make_batches(items, batch_size, device)
    import transformers
    import triton

    conditions = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU: {_cpu_model()}",
        threads=torch.get_num_threads(),
        size=size, **SIZES[size], batch_size=batch_size, max_len=max_len,
        tokens_per_batch=sum(int(b["attention_mask"].sum()) for b in batches) / len(batches),
        dtype=args.dtype or ("bf16" if device.type == "cuda" else "fp32"),
        warmup=args.warmup, steps=args.steps, data=source,
        python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
        transformers=transformers.__version__, extension=_ext.status(), gat=GAT[size],
    )
    pipeline = pipeline_cost(items, batch_size, args.workers, args.batches)
    if args.pipeline_only:
        return dict(conditions=conditions, equivalence=[], training=[], pipeline=pipeline, complete=True)
    equivalence = check_equivalence(size, device, batches[0])
    rows = []

    def save_partial():  # a run cut short (the GPU suite's deadlines) keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(dict(conditions=conditions, equivalence=equivalence,
                                                       training=rows, pipeline=pipeline, complete=False), indent=1))
    save_partial()
    for method in args.methods:
        rows.append(time_training(method, size, device, batches, args.warmup, args.steps, autocast_dtype))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {method}: {rows[-1]['step_ms']:.1f} ms/step", file=sys.stderr, flush=True)
        save_partial()
    plain = next((r for r in rows if r["method"] == "plain"), None)
    for r in rows:
        r["vs_plain"] = plain["step_ms"] / r["step_ms"] if plain else None
    return dict(conditions=conditions, equivalence=equivalence, training=rows, pipeline=pipeline, complete=True)


def print_result(result: Dict) -> None:
    for key, value in result["conditions"].items():
        print(f"{key:>22}: {value}")
    print()
    for r in result["equivalence"]:
        print(f"check: fresh {r['method']} == unpatched: max logit error {r['max_logit_error']:.2e}, "
              f"relative grad error {r['rel_grad_error']:.2e} (tolerance {r['tolerance']:.0e}) -> ok")
    if result["training"]:
        print_training(result["training"])
    p = result["pipeline"]
    print()
    print(f"data pipeline ({p['builder']}, {p['tokens_per_batch']:.0f} tokens per batch): tree building "
          f"{p['tree_build_ms_per_batch']:.2f} ms/batch, whole collate {p['collate_ms_per_batch']:.2f} ms/batch "
          f"in-process; DataLoader with {p['dataloader_workers']} workers {p['dataloader_ms_per_batch']:.2f} "
          f"ms/batch ({p['dataloader_tokens_per_s']:.0f} tokens/s)")


def print_training(rows: List[Dict]) -> None:
    print()
    header = f"{'method':<12} {'ms/step':>9} {'tokens/s':>10} {'x plain speed':>13} {'peak GiB':>9} {'syntax params':>13}"
    print(header)
    print("-" * len(header))
    for r in rows:
        mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "n/a"
        ratio = f"{r['vs_plain']:.2f}" if r["vs_plain"] is not None else "n/a"
        print(f"{r['method']:<12} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10.0f} {ratio:>13} {mem:>9} "
              f"{r['syntax_params']:>13}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default: base on cuda, tiny on cpu")
    parser.add_argument("--batch", type=int, default=None, help="sequences per batch (default 32 cuda, 8 cpu)")
    parser.add_argument("--seq", type=int, default=None, help="max tokens per sequence (default 256 cuda, 64 cpu)")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None,
                        help="autocast dtype of the timed steps (default bf16 cuda, fp32 cpu)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches (also the pipeline sample)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the pipeline figure")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default 1 on cpu: steady figures on a shared machine)")
    parser.add_argument("--pipeline-only", action="store_true", help="measure the data pipeline only")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU on this machine: the GPU end-to-end benchmark was not run (nothing measured)")
        return 0
    result = run(args)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


# --------------------------------------------------------------------------------- pytest-benchmark


@pytest.fixture(scope="module")
def tiny_batches():
    torch.set_num_threads(1)
    device = torch.device("cpu")
    _, items = packed_sequences(64, 32, SIZES["tiny"]["vocab_size"])
    batches = make_batches(items, 8, device)
    check_equivalence("tiny", device, batches[0])
    return batches


@pytest.mark.parametrize("method", METHODS)
def test_training_step(benchmark, tiny_batches, method):
    from syntaxkernels.integrations.transformers import syntax_aux_loss

    model = build_model(method, "tiny", torch.device("cpu"))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batches = iter(tiny_batches * 100)

    def step():
        out = model(**_inputs(method, next(batches)))
        loss = out.loss + (0.1 * syntax_aux_loss(model) if method == "gat" else 0.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    benchmark.group = "end to end: tiny BERT training step (8 x 64 tokens, 1 thread)"
    benchmark.pedantic(step, rounds=5, warmup_rounds=1)


if __name__ == "__main__":
    sys.exit(main())
