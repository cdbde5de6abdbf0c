"""The two papers' experiments in miniature (CPU, minutes): each variant of each method on a real treebank.

Data: UD English-EWT dev (``--data``, default ``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`), projective
sentences of 3..40 words, shuffled once (seed 0) and split 80 / 20 into a training and a held-out part. A
WordPiece vocabulary is trained on the training part; the models are tiny BERTs built from a config (hidden 64,
2 layers, 4 heads, feed-forward 128, dropout 0.1) trained from scratch with AdamW (no pre-trained weights are
available offline, so these are models that learn the task and the syntax together, not fine-tuned BERTs).

- ``tagging``, syntax-augmented mBERT: token classification of each word's dependency relation (UD deprel without
  subtype, first piece; 36 labels) with ``enable_syntax_attention(method="gat", variant=...)``, gold token trees
  and UPOS ids of the variant (``TreeCollator(tokenizer=..., variant=...)``, ``token_pos_ids``). The paper's
  Appendix B hyper-parameters scaled to the tiny model: L_G = 2 (4), k = 4, d_g = 16 (64: the GAT keeps the
  paper's ratio to the hidden width), delta = 1 (NER, semantic parsing), one syntax head in every layer, the
  structural probe with rank 16 and alpha = 0.5 (Wikiann, MLQA, PAWS-X). Against the same BERT without syntax.
- ``sentence``, Syntax-BERT: sentence classification (the UPOS class of the sentence's root word: VERB,
  NOUN/PROPN/PRON, ADJ, other; read from [CLS]) with ``enable_syntax_attention(method="subnetwork",
  variant=...)`` and ``MaskSpec(max_distance=2)`` (M = 7), Syntax-BERT's word-level masks
  (``TreeCollator(word_level=True)``) from the dependency trees or from constituency trees. No constituency
  treebank or parser model is available offline, so the constituency trees are derived from the UD trees
  (every head word with its dependents a phrase, labelled from the head's UPOS; PTB tags from XPOS), read back
  with ``sk.trees.read_brackets`` and lexicalised by Collins's head rules (``PhraseTree.to_sentence()``): their
  dependency trees are the head rules' reading, not UD's (the script reports how often they agree).

Reports held-out accuracy (first pieces / sentences), the mean training loss over the last 20 steps and the wall
time per run, for every variant and seed (``--seeds``). ``--json`` writes everything.

    python benchmarks/papers_in_miniature.py [tagging|sentence|all] [--steps 400] [--seeds 0,1] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402

HIDDEN = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=160)
GAT = dict(num_layers=2, num_heads=4, head_dim=16, window=1, probe_rank=16)
ALPHA = 0.5
ROOT_CLASSES = {"VERB": 0, "NOUN": 1, "PROPN": 1, "PRON": 1, "ADJ": 2}
PHRASE = {"VERB": "VP", "AUX": "VP", "NOUN": "NP", "PROPN": "NP", "PRON": "NP", "NUM": "NP", "SYM": "NP",
          "DET": "NP", "ADJ": "ADJP", "ADV": "ADVP", "ADP": "PP", "SCONJ": "SBAR", "CCONJ": "CONJP",
          "INTJ": "INTJ", "PART": "PRT"}


# ----------------------------------------------------------------------------------------------------- data


def projective(heads):
    for i, h in enumerate(heads):
        if h < 0:
            continue
        for k in range(min(i, h) + 1, max(i, h)):
            x = k
            while x not in (-1, h):
                x = heads[x]
            if x != h:
                return False
    return True


def load(path, limit=None):
    sentences = [s for s in sk.trees.read_conllu(path) if 3 <= len(s) <= 40 and projective(s.heads)
                 and s.heads.count(-1) == 1]
    random.Random(0).shuffle(sentences)
    if limit:
        sentences = sentences[:limit]
    cut = int(0.8 * len(sentences))
    return sentences[:cut], sentences[cut:]


def tokenizer_for(train, folder):
    from syntaxkernels.tools.testing import wordpiece_tokenizer

    return wordpiece_tokenizer([" ".join(s.words) for s in train], folder, vocab_size=1500, min_frequency=2)


def _escape(text: str) -> str:
    return text.replace("(", "-LRB-").replace(")", "-RRB-")


def to_brackets(s) -> str:
    """A constituency tree from a projective UD tree: each head word and its dependents form a phrase labelled from
    the head's UPOS (PHRASE, else FRAG), words under their XPOS."""
    children = collections.defaultdict(list)
    for i, h in enumerate(s.heads):
        children[h].append(i)

    def leaf(i):
        tag = s.xpos[i] if s.xpos and s.xpos[i] != "_" else s.upos[i]
        return f"({_escape(tag)} {_escape(s.words[i])})"

    def phrase(i):
        if not children[i]:
            return leaf(i)
        parts = [phrase(d) for d in children[i] if d < i] + [leaf(i)] + [phrase(d) for d in children[i] if d > i]
        return f"({PHRASE.get(s.upos[i], 'FRAG')} " + " ".join(parts) + ")"

    return phrase(children[-1][0])


def constituency_sentences(sentences):
    """The derived constituency trees, lexicalised by Collins's head rules: Sentences (UD upos kept), and the share
    of words whose head-rule head is UD's."""
    out, same, total = [], 0, 0
    for s in sentences:
        (tree,) = sk.trees.read_brackets(to_brackets(s))
        heads = tree.heads("collins")
        same += sum(a == b for a, b in zip(heads, s.heads))
        total += len(heads)
        out.append(sk.trees.Sentence(words=s.words, heads=heads, upos=s.upos, deprel=s.deprel, sent_id=s.sent_id))
    return out, same / max(total, 1)


# ----------------------------------------------------------------------------------------------------- runs


def batches(items, size, rng):
    order = list(range(len(items)))
    rng.shuffle(order)
    while True:
        for start in range(0, len(order) - size + 1, size):
            yield [items[i] for i in order[start:start + size]]
        rng.shuffle(order)


DEPRELS = sorted({"acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound", "conj",
                  "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat", "goeswith",
                  "iobj", "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan", "parataxis", "punct",
                  "reparandum", "root", "vocative", "xcomp"})


def tagging_labels(batch):
    ids = torch.full(batch["input_ids"].shape, -100, dtype=torch.int64)
    for b, (s, word_ids) in enumerate(zip(batch["sentences"], batch["word_ids"])):
        seen = set()
        for p, w in enumerate(word_ids):
            if w is not None and w not in seen:
                seen.add(w)
                ids[b, p] = DEPRELS.index(s.deprel[w].split(":")[0])
    return ids


LABELS = {}  # sent_id -> the class of the UD root's UPOS (the same label whichever trees a model reads)


def sentence_labels(sentences):
    return torch.tensor([LABELS[s.sent_id] for s in sentences])


def run_tagging(variant, seed, train, held_out, tok, args):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_aux_loss, token_pos_ids

    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tok), num_labels=len(DEPRELS), **HIDDEN)
    model = transformers.BertForTokenClassification(config)
    if variant != "none":
        enable_syntax_attention(model, "gat", variant=variant, gat_config=GAT, syntax_heads=1)
    collate = sk.trees.TreeCollator(tokenizer=tok, variant="paper" if variant == "none" else variant)

    def inputs(batch):
        extra = {}
        if variant != "none":
            extra = dict(syntax_trees=batch["trees"],
                         syntax_pos=token_pos_ids(batch["sentences"], batch["word_ids"], variant=variant,
                                                  lengths=batch["lengths"]))
        return dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra)

    def loss_of(batch, labels):
        out = model(**inputs(batch), labels=labels)
        aux = syntax_aux_loss(model) if variant != "none" else None
        return out.loss, (out.loss + ALPHA * aux) if aux is not None else out.loss

    return _train_and_eval(model, collate, train, held_out, tagging_labels, loss_of, inputs, seed, args,
                           token_level=True)


def run_sentence(variant, trees_kind, seed, train, held_out, tok, args):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tok), num_labels=4, **HIDDEN)
    model = transformers.BertForSequenceClassification(config)
    masks = sk.MaskSpec(max_distance=2)
    if variant != "none":
        enable_syntax_attention(model, "subnetwork", variant=variant, masks=masks)
    collate = sk.trees.TreeCollator(tokenizer=tok, word_level=variant in ("paper", "release"),
                                    variant="paper" if variant == "none" else variant)

    def inputs(batch):
        extra = {} if variant == "none" else dict(syntax_trees=batch["trees"])
        return dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra)

    def loss_of(batch, labels):
        out = model(**inputs(batch), labels=labels)
        return out.loss, out.loss

    def labels_of(batch):
        return sentence_labels(batch["sentences"])

    return _train_and_eval(model, collate, train, held_out, labels_of, loss_of, inputs, seed, args,
                           token_level=False)


def _train_and_eval(model, collate, train, held_out, labels_of, loss_of, inputs, seed, args, token_level):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    stream = batches(train, args.batch, random.Random(seed))
    losses = []
    start = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        batch = collate(next(stream))
        task, total = loss_of(batch, labels_of(batch))
        optimizer.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(task.detach()))
    seconds = time.perf_counter() - start
    model.eval()
    correct = count = 0
    with torch.no_grad():
        for i in range(0, len(held_out), 64):
            batch = collate(held_out[i:i + 64])
            labels = labels_of(batch)
            logits = model(**inputs(batch)).logits
            predicted = logits.argmax(-1)
            keep = labels != -100
            correct += int((predicted[keep] == labels[keep]).sum())
            count += int(keep.sum())
    tail = losses[-20:]
    return dict(accuracy=correct / max(count, 1), evaluated=count, train_loss_last20=sum(tail) / len(tail),
                seconds=seconds)


# ----------------------------------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task", nargs="?", default="all", choices=("tagging", "sentence", "all"))
    parser.add_argument("--data", type=pathlib.Path, default=None)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--limit", type=int, default=None, help="use only this many sentences (a smoke run)")
    parser.add_argument("--variants", default="none,paper,release,package")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    path = args.data or (sk_data.treebank_path() if sk_data.treebank_available() else None)
    if path is None:
        print(sk_data.missing_message())
        return 1
    train, held_out = load(path, args.limit)
    for s in train + held_out:
        LABELS[s.sent_id] = ROOT_CLASSES.get(s.upos[s.heads.index(-1)], 3)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    print(f"data: {path}: {len(train)} training / {len(held_out)} held-out sentences; steps {args.steps}, "
          f"batch {args.batch}, lr {args.lr}, seeds {seeds}, {args.threads} thread(s)")
    results = dict(conditions=dict(steps=args.steps, batch=args.batch, lr=args.lr, seeds=seeds,
                                   train=len(train), held_out=len(held_out), model=HIDDEN, gat=GAT, alpha=ALPHA,
                                   threads=args.threads, torch=torch.__version__), runs=[])
    with tempfile.TemporaryDirectory() as folder:
        tok = tokenizer_for(train, pathlib.Path(folder))
        if args.task in ("tagging", "all"):
            for variant in variants:
                for seed in seeds:
                    r = run_tagging(variant, seed, train, held_out, tok, args)
                    r.update(task="tagging", variant=variant, seed=seed)
                    results["runs"].append(r)
                    print(f"tagging   gat {variant:8s} seed {seed}: accuracy {r['accuracy']:.3f} "
                          f"(train loss {r['train_loss_last20']:.3f}, {r['seconds']:.0f} s)", flush=True)
        if args.task in ("sentence", "all"):
            const_train, agree_train = constituency_sentences(train)
            const_held, agree_held = constituency_sentences(held_out)
            results["conditions"]["head_rules_agree_with_ud"] = (agree_train * len(train) + agree_held *
                                                                  len(held_out)) / (len(train) + len(held_out))
            print(f"constituency trees: Collins's head rules give UD's head for "
                  f"{results['conditions']['head_rules_agree_with_ud']:.1%} of the words")
            for trees_kind, (tr, ho) in (("dependency", (train, held_out)), ("constituency", (const_train, const_held))):
                for variant in variants:
                    if variant == "none" and trees_kind == "constituency":
                        continue  # the baseline reads no tree
                    for seed in seeds:
                        r = run_sentence(variant, trees_kind, seed, tr, ho, tok, args)
                        r.update(task="sentence", variant=variant, trees=trees_kind, seed=seed)
                        results["runs"].append(r)
                        print(f"sentence  subnetwork {variant:8s} {trees_kind:12s} seed {seed}: accuracy "
                              f"{r['accuracy']:.3f} (train loss {r['train_loss_last20']:.3f}, {r['seconds']:.0f} s)",
                              flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
