"""Learning check (CPU, minutes): do the syntax modules let a tiny encoder use the tree it is given?

Task: dependency-head prediction on the UD English-EWT dev treebank (``--data``, default ``$SYNTAXKERNELS_UD``,
see :mod:`syntaxkernels.data`). Each sentence gets a ROOT token
in front (the head of the sentence root); a small encoder (word + UPOS + position embeddings, two encoder
layers, d_model 64, 4 heads) reads the sentence *and its gold tree*, and a biaffine scorer picks each word's
head among the positions. A model that really feeds the tree into attention can read the answer off it;
plain attention has to learn parsing from ~1,600 sentences. Same data, same order, same seed, same number
of steps for every variant:

- ``plain``: ``SyntaxTransformerEncoderLayer(method="bias")`` with the table frozen at zero (exactly
  ``nn.TransformerEncoderLayer``; the tree is ignored);
- ``bias``: the distance-bias layer (shared table, ``BucketSpec()``);
- ``subnetwork``: the Syntax-BERT layer (``MaskSpec()``: parent/child/sibling up to 3, full; M = 10);
- ``gat``: a ``SyntaxGAT`` (2 layers, 4 heads of 16, window 4, no POS embedding of its own since the input
  already has one) injected into the first head's Q and K of both layers, plus the structural-probe loss
  (weight ``--probe-weight``).

``--variant`` chooses the form of "subnetwork" and "gat" (docs/semantics.md, "Paper, release and package"); the
default, ``package``, is the form the recorded figures were measured with.

Reports held-out unlabelled attachment score (all words, punctuation included), held-out loss, the mean
training loss over the last 20 steps, and the wall time. Without the treebank it falls back to random
trees with random words (the numbers then only show that the tree is used) and says how to provide it.

    python benchmarks/learning_check.py [--steps 300] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import random
import sys
import time
from collections import Counter

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.nn import StructuralProbeLoss, SyntaxGAT, SyntaxTransformerEncoderLayer  # noqa: E402

UPOS = ["ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X"]
METHODS = ("plain", "bias", "subnetwork", "gat")


def load_sentences(path: pathlib.Path):
    """``[(words, heads 0-based with -1 root, upos)]`` from CoNLL-U (or random trees when absent)."""
    if path is not None and pathlib.Path(path).is_file():
        path = pathlib.Path(path)
        try:
            from syntaxkernels.trees import read_conllu

            return [(s.words, s.heads, s.upos) for s in read_conllu(path)], f"{path.name} (read_conllu)"
        except ImportError:
            return _minimal_conllu(path), f"{path.name} (minimal reader)"
    rng = random.Random(0)
    from syntaxkernels.tools.workloads import random_forest

    sentences = []
    for _ in range(2000):
        n = rng.randint(3, 30)
        sentences.append(([f"w{rng.randrange(500)}" for _ in range(n)], random_forest(rng, n, 1),
                          [rng.choice(UPOS) for _ in range(n)]))
    from syntaxkernels.data import missing_message

    print(f"learning_check: {missing_message(path)}; using random trees instead", file=sys.stderr)
    return sentences, "random trees (treebank absent)"


def _minimal_conllu(path: pathlib.Path):
    sentences, words, heads, upos = [], [], [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip():
            if words:
                sentences.append((words, heads, upos))
            words, heads, upos = [], [], []
        elif not line.startswith("#"):
            cols = line.split("\t")
            if cols[0].isdigit():
                words.append(cols[1])
                heads.append(int(cols[6]) - 1)
                upos.append(cols[3])
    return sentences


class Data:
    """Encodes sentences with a leading ROOT token; ``batch(ids)`` gives tensors and a TreeBatch."""

    def __init__(self, train, max_len):
        counts = Counter(w.lower() for words, _, _ in train for w in words)
        self.vocab = {"<pad>": 0, "<unk>": 1, "<root>": 2}
        for word, count in counts.items():
            if count >= 2:
                self.vocab[word] = len(self.vocab)
        self.upos = {tag: i + 1 for i, tag in enumerate(UPOS)}  # 0 = ROOT/unknown
        self.max_len = max_len

    def encode(self, sentence):
        words, heads, upos = sentence
        word_ids = [2] + [self.vocab.get(w.lower(), 1) for w in words]
        pos_ids = [0] + [self.upos.get(t, 0) for t in upos]
        tree = [-1] + [h + 1 if h >= 0 else 0 for h in heads]  # sentence roots attach to ROOT
        return word_ids, pos_ids, tree

    def batch(self, encoded):
        n = max(len(w) for w, _, _ in encoded)
        words = torch.zeros(len(encoded), n, dtype=torch.long)
        pos = torch.zeros(len(encoded), n, dtype=torch.long)
        for b, (w, p, _) in enumerate(encoded):
            words[b, : len(w)] = torch.tensor(w)
            pos[b, : len(p)] = torch.tensor(p)
        trees = sk.TreeBatch.from_heads([t for _, _, t in encoded])
        return words, pos, trees


class HeadPredictor(nn.Module):
    """Embeddings -> 2 encoder layers -> biaffine head scores ``[B, N, N]`` (dependent i, candidate head j)."""

    def __init__(self, method, vocab_size, d_model=64, nhead=4, layers=2, max_len=128, backend="auto", window=4,
                 syntax_heads=1, variant="package"):
        super().__init__()
        self.method = method
        self.words = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(len(UPOS) + 1, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.gat = None
        if method == "gat":
            self.gat = SyntaxGAT(d_model, num_layers=2, num_heads=4, head_dim=16, window=window, num_pos_tags=0,
                                 backend=backend, variant=variant)
            self.probe = StructuralProbeLoss(self.gat.output_dim, rank=16, variant=variant)
        self.layers = nn.ModuleList(
            SyntaxTransformerEncoderLayer(d_model, nhead, 2 * d_model, dropout=0.1,
                                          method="bias" if method == "plain" else method,
                                          syntax_dim=64, syntax_heads=syntax_heads, syntax_targets=("q", "k"),
                                          backend=backend, variant=variant)
            for _ in range(layers)
        )
        if method == "plain":
            for layer in self.layers:
                layer.self_attn.distance_bias.requires_grad_(False)
                layer.self_attn.bias_scale.requires_grad_(False)
        self.dep = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, d_model)
        self.head_prior = nn.Linear(d_model, 1)

    def forward(self, words, pos, trees):
        N = words.shape[1]
        x = self.words(words) + self.pos(pos) + self.position(torch.arange(N))[None]
        syntax = self.gat(x, trees) if self.gat is not None else None
        for layer in self.layers:
            x = layer(x, trees, syntax=syntax)
        scores = self.dep(x) @ self.head(x).transpose(1, 2) / math.sqrt(x.shape[-1])
        scores = scores + self.head_prior(x).transpose(1, 2)
        aux = None
        if self.gat is not None:
            distance_loss, depth_loss = self.probe(syntax, trees)
            aux = distance_loss + depth_loss
        return scores, aux


def head_loss(scores, trees):
    """Cross-entropy over candidate heads (valid positions other than itself) and the number correct."""
    B, N, _ = scores.shape
    valid = ~trees.key_padding_mask()
    candidates = valid[:, None, :] & ~torch.eye(N, dtype=torch.bool)[None]
    scores = scores.masked_fill(~candidates, float("-inf"))
    targets = trees.heads.clamp(min=0)
    words = valid.clone()
    words[:, 0] = False  # the ROOT token has no head
    loss = F.cross_entropy(scores[words], targets[words])
    correct = (scores.argmax(-1) == targets)[words].sum().item()
    return loss, correct, int(words.sum())


def run(method, data, train, held_out, args):
    torch.manual_seed(args.seed)
    model = HeadPredictor(method, len(data.vocab), max_len=data.max_len + 1, backend=args.backend,
                          window=args.gat_window, syntax_heads=args.syntax_heads, variant=args.variant)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=args.lr)
    order = random.Random(args.seed)
    losses = []
    start = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        words, pos, trees = data.batch(order.sample(train, args.batch))
        scores, aux = model(words, pos, trees)
        loss, _, _ = head_loss(scores, trees)
        total = loss + (args.probe_weight * aux if aux is not None else 0.0)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        losses.append(loss.item())
    train_seconds = time.perf_counter() - start
    model.eval()
    correct = total_words = 0
    loss_sum = 0.0
    with torch.no_grad():
        for i in range(0, len(held_out), 64):
            words, pos, trees = data.batch(held_out[i: i + 64])
            scores, _ = model(words, pos, trees)
            loss, c, n = head_loss(scores, trees)
            correct += c
            total_words += n
            loss_sum += loss.item() * n
    tail = losses[-20:]
    return dict(method=method, uas=correct / total_words, held_out_loss=loss_sum / total_words,
                train_loss_last20=sum(tail) / len(tail), first_loss=losses[0], train_seconds=train_seconds,
                held_out_words=total_words)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=None,
                        help="a CoNLL-U file (default: $SYNTAXKERNELS_UD; generated trees without it)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--max-len", type=int, default=40, help="drop sentences with more words")
    parser.add_argument("--probe-weight", type=float, default=0.01)
    parser.add_argument("--gat-window", type=int, default=4, help="delta of the GAT")
    parser.add_argument("--syntax-heads", type=int, default=1, help="heads per layer receiving the GAT output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--variant", default="package", choices=("paper", "release", "package"),
                        help="the form of 'subnetwork' and 'gat' (the recorded figures: package)")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from syntaxkernels.data import treebank_path

    sentences, source = load_sentences(args.data or treebank_path())
    sentences = [s for s in sentences if 1 <= len(s[0]) <= args.max_len]
    split = int(0.8 * len(sentences))  # document order: the held-out sentences come from other documents
    data = Data(sentences[:split], args.max_len)
    train = [data.encode(s) for s in sentences[:split]]
    held_out = [data.encode(s) for s in sentences[split:]]
    conditions = dict(data=source, train_sentences=len(train), held_out_sentences=len(held_out),
                      max_words=args.max_len, vocab=len(data.vocab), steps=args.steps, batch=args.batch, lr=args.lr,
                      probe_weight=args.probe_weight, gat_window=args.gat_window,
                      syntax_heads=args.syntax_heads, seed=args.seed, threads=args.threads,
                      torch=torch.__version__, python=platform.python_version(), machine=platform.machine())
    print(json.dumps(conditions))
    rows = []
    for method in args.methods.split(","):
        row = run(method, data, train, held_out, args)
        rows.append(row)
        print(f"{method:<11} UAS {row['uas']:.3f}  held-out loss {row['held_out_loss']:.3f}  "
              f"train loss {row['first_loss']:.3f} -> {row['train_loss_last20']:.3f}  ({row['train_seconds']:.0f} s)",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(conditions=conditions, results=rows), indent=2))


if __name__ == "__main__":
    main()
