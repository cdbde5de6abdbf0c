"""Several relations in a fine-tuned MiniLM (CPU, minutes): does the tree's direction help a task that needs it?

Each word's universal relation to its head (``--task deprel`` of ``benchmarks/predicted_trees.py``, whose model, data,
split, batches and optimiser settings this script shares) with the distance bias on layers 3-5 of all-MiniLM-L6-v2
and the gold token trees given, two ways:

- ``tree``: one relation, the tree distance (``BucketSpec()``): "my head" and "my dependent" are both distance 1;
- ``directed``: two relations, ``sk.RelationBatch.directed_tree(trees, max_steps=7)``: steps up to the lowest common
  ancestor and steps down from it, each with its own table and strength (9 x 9 codes), so they differ.

Same seed, same batches, same head initialisation; held-out accuracy on the words' first pieces. The unpatched model
on the same batches is ``predicted_trees.py --task deprel --runs unpatched``.

    python benchmarks/relations_miniature.py [--steps 200] [--runs tree,directed] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))
sys.path.insert(0, str(ROOT_DIR / "benchmarks"))

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402

import papers_in_miniature as PM  # noqa: E402  (DEPRELS, tagging_labels)
import syntax_lr as SL  # noqa: E402  (model_dir, sentence_split)


ARMS = {  # kind -> (the plan of a collated batch, relations, buckets)
    "tree": (lambda batch: batch["trees"], None, sk.BucketSpec()),
    "directed": (lambda batch: sk.RelationBatch.directed_tree(batch["trees"], max_steps=7), 2,
                 sk.BucketSpec(max_distance=7)),
}


def run(kind, arms, path, train_sentences, held, collate, args):
    """Fine-tune one arm (``arms[kind]``: the plan of a batch, relations, buckets); its held-out figures."""
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    plans_of, relations, spec = arms[kind]
    torch.manual_seed(args.seed)
    model = transformers.BertForTokenClassification.from_pretrained(str(path), num_labels=len(PM.DEPRELS))
    enable_syntax_attention(model, "bias", buckets=spec, layers=[3, 4, 5], relations=relations)
    optimizer = torch.optim.AdamW(sk.syntax_param_groups(model, lr=args.lr, syntax_lr=args.syntax_lr,
                                                         weight_decay=args.weight_decay))
    order = random.Random(args.seed)
    model.train()
    losses = []
    start = time.perf_counter()
    for _ in range(args.steps):
        batch = collate(order.sample(train_sentences, args.batch))
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    labels=PM.tagging_labels(batch), syntax_trees=plans_of(batch))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    seconds = time.perf_counter() - start
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch, labels in held:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           syntax_trees=plans_of(batch)).logits
            keep = labels != -100
            correct += int((logits.argmax(-1) == labels)[keep].sum())
            total += int(keep.sum())
    return dict(accuracy=correct / total, words=total, first_loss=losses[0],
                last10_loss=sum(losses[-10:]) / len(losses[-10:]), train_seconds=seconds,
                bias_max_and_scales_per_syntax_layer=bias_figures(model))


def bias_figures(model):
    """Per syntax layer ``(max |c_r * table_r| over the relations, [c_r])``."""
    from syntaxkernels.nn import DistanceBias

    rows = []
    for module in model.modules():
        if isinstance(module, DistanceBias):
            table = module.distance_bias.detach()
            scales = module.bias_scale.detach().reshape(-1)
            if table.dim() == 1:
                table = table[None]
            rows.append((float((table * scales[:, None]).abs().max()), [round(float(c), 4) for c in scales]))
    return rows


def measure(args, arms, name, enhanced=False):
    """Load the model and the treebank, fine-tune each arm of ``args.runs`` (printed, and written to ``args.json``
    after each); 0, or 0 with a message when the model or the treebank is missing (nothing measured).
    ``enhanced``: read the enhanced graphs too (``Sentence.enhanced_edges``; the same sentences)."""
    torch.set_num_threads(args.threads)
    data = args.data or sk_data.treebank_path()
    if data is None or not pathlib.Path(data).is_file():
        print(f"{name}: {sk_data.missing_message(data)}; nothing measured", file=sys.stderr)
        return 0
    path = SL.model_dir(args.model)
    if path is None:
        return 0
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    collate = sk.trees.TreeCollator(tokenizer=tokenizer, max_length=128)
    train_sentences, held_sentences = SL.sentence_split(data, args.held_out, enhanced=enhanced)
    held = [(b, PM.tagging_labels(b)) for b in (collate(held_sentences[i:i + 64])
                                                for i in range(0, len(held_sentences), 64))]
    results = dict(conditions=dict(vars(args), model=str(path), data=pathlib.Path(data).name,
                                   train_sentences=len(train_sentences), held_out_sentences=len(held_sentences),
                                   torch=torch.__version__, transformers=transformers.__version__), results={})
    for kind in args.runs.split(","):
        row = run(kind, arms, path, train_sentences, held, collate, args)
        results["results"][kind] = row
        print(kind, json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


def cli(argv, arms, runs, description, name, enhanced=False):
    """Parse the command line (the shared arguments and ``--runs``, a comma list of ``arms``' keys, default
    ``runs``), then :func:`measure`."""
    parser = SL.common_arguments(argparse.ArgumentParser(description=description), steps=200)
    parser.add_argument("--runs", default=runs, help="which of " + ", ".join(arms))
    args = parser.parse_args(argv)
    for kind in args.runs.split(","):
        if kind not in arms:
            parser.error(f"--runs: unknown run {kind!r} ({', '.join(arms)})")
    return measure(args, arms, name, enhanced=enhanced)


def main(argv=None):
    return cli(argv, ARMS, "tree,directed", __doc__.split("\n")[0], "relations_miniature")


if __name__ == "__main__":
    sys.exit(main())
