"""Held-out UAS of sk.nn.TreePredictor on the UD treebank named by SYNTAXKERNELS_UD (skips when unset).

What the figure is: a tiny parser trained from scratch on the CPU, not a pre-trained encoder's probe. Features are
trainable embeddings of the lower-cased word form (words seen twice or more in the training part; the rest share
an unknown vector) and of the UPOS tag (gold tags from the file), a one-layer BiLSTM over them, and the
TreePredictor's biaffine scorer on its states; trees decoded with sk.trees.decode_tree (one root word, non-projective).
The treebank's sentences are split by position: the first 80 % train, the last 20 % are held out. UAS counts every
word (punctuation included) whose predicted head equals the gold head, over the held-out words.

    SYNTAXKERNELS_UD=/path/to/en_ewt-ud-dev.conllu python benchmarks/tree_predictor.py [--epochs 4] [--seed 0]
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time

import torch
from torch import nn

from syntaxkernels import data
from syntaxkernels.nn import TreePredictor
from syntaxkernels.trees import read_conllu


class Encoder(nn.Module):
    def __init__(self, words: int, tags: int, width: int = 100, tag_width: int = 32):
        super().__init__()
        self.word = nn.Embedding(words, width, padding_idx=0)
        self.tag = nn.Embedding(tags, tag_width, padding_idx=0)
        self.lstm = nn.LSTM(width + tag_width, width, batch_first=True, bidirectional=True)

    def forward(self, word_ids, tag_ids, lengths):
        x = torch.cat([self.word(word_ids), self.tag(tag_ids)], dim=-1)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=word_ids.shape[1])[0]


def batches(sentences, size, shuffle, rng):
    order = list(range(len(sentences)))
    if shuffle:
        rng.shuffle(order)
    for start in range(0, len(order), size):
        yield [sentences[i] for i in order[start:start + size]]


def tensors(batch, word_index, tag_index):
    N = max(len(s.words) for s in batch)
    words = torch.zeros(len(batch), N, dtype=torch.long)
    tags = torch.zeros(len(batch), N, dtype=torch.long)
    heads = torch.full((len(batch), N), -1, dtype=torch.long)
    for b, s in enumerate(batch):
        n = len(s.words)
        words[b, :n] = torch.tensor([word_index.get(w.lower(), 1) for w in s.words])
        tags[b, :n] = torch.tensor([tag_index.get(t, 1) for t in s.upos])
        heads[b, :n] = torch.tensor(s.heads)
    lengths = torch.tensor([len(s.words) for s in batch])
    return words, tags, heads, lengths


def train_parser(train, epochs: int, seed: int, batch_size: int = 32, log=print):
    """The parser of this script trained on ``train`` (Sentences): ``parse(sentences) -> heads per sentence``
    (0-based, -1 root; eval mode, no gradients), a callable other benchmarks use as an external parser."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    counts = collections.Counter(w.lower() for s in train for w in s.words)
    word_index = {w: i + 2 for i, w in enumerate(sorted(w for w, c in counts.items() if c >= 2))}
    tag_index = {t: i + 2 for i, t in enumerate(sorted({t for s in train for t in s.upos}))}
    encoder = Encoder(len(word_index) + 2, len(tag_index) + 2)
    predictor = TreePredictor(200, 128, dropout=0.2)
    params = list(encoder.parameters()) + list(predictor.parameters())
    optimizer = torch.optim.Adam(params, lr=2e-3, betas=(0.9, 0.9))
    start = time.perf_counter()
    for epoch in range(epochs):
        encoder.train()
        predictor.train()
        total = 0.0
        for batch in batches(train, batch_size, True, rng):
            words, tags, heads, lengths = tensors(batch, word_index, tag_index)
            loss = predictor.loss(encoder(words, tags, lengths), heads, lengths)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 5.0)
            optimizer.step()
            total += loss.item() * len(batch)
        log(f"epoch {epoch + 1}: train loss {total / len(train):.3f} ({time.perf_counter() - start:.0f} s)")
    encoder.eval()
    predictor.eval()

    def parse(sentences):
        out = []
        with torch.no_grad():
            for batch in batches(sentences, 64, False, rng):
                words, tags, _, lengths = tensors(batch, word_index, tag_index)
                trees = predictor.predict(encoder(words, tags, lengths), lengths)
                out += [trees.heads[b, :len(s.words)].tolist() for b, s in enumerate(batch)]
        return out
    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = data.treebank_path()
    if path is None or not path.is_file():
        print("tree_predictor: skipped, " + data.missing_message(path))
        return 0
    torch.set_num_threads(args.threads)
    sentences = [s for s in read_conllu(path) if s.words]
    cut = int(0.8 * len(sentences))
    train, held_out = sentences[:cut], sentences[cut:]
    start = time.perf_counter()
    parse = train_parser(train, args.epochs, args.seed, args.batch_size,
                         log=lambda line: print(line, flush=True))
    correct = words_total = 0
    for s, heads in zip(held_out, parse(held_out)):
        correct += sum(int(a == b) for a, b in zip(heads, s.heads))
        words_total += len(s.words)
    print(f"treebank {path.name}: {len(train)} training sentences, {len(held_out)} held out ({words_total} words)")
    print(f"held-out UAS {100.0 * correct / words_total:.2f} % (punctuation included; {args.epochs} epochs, seed "
          f"{args.seed}, {time.perf_counter() - start:.0f} s on {args.threads} CPU threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
