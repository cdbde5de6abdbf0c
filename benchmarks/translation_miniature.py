"""A tiny translation-style task on UD sentences: plain BART vs syntax BART (a tree-distance bias in the encoder,
gold trees) (CPU, minutes).

Task ("head-final reordering"): UD has no parallel text, so the target language is the source sentence reordered by
its gold tree, head-final: each head after all its dependents, the dependents in their source order (recursively, a
word's subtree is the subtrees of its dependents in order, then the word; the roots' subtrees in order). An
SVO -> SOV-style reordering, like English -> Japanese word order. The input is ``w1 .. wn </s>``, the target the
same word tokens reordered, then ``</s>``. The target is read off the gold tree that the syntax arm is given: the task
hands the model its structure, so it measures whether the encoder uses the trees, not a translation quality.

Data: read, split and tokenised as in ``benchmarks/t5_miniature.py`` (``causal_lm_miniature``'s ``load`` and
``build_vocab``): a CoNLL-U treebank (``--data``, default ``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`),
sentences of 1..``--max-words`` (default 20) words, the first 90 % (file order) train, the last 10 % held out, or
``--train`` / ``--held-out`` files; lower-cased words, one token per word; the vocabulary is the training words seen
at least twice (the rest ``<unk>``, in source and target alike) plus ``<pad>``, ``<bos>`` (the decoder start),
``<eos>`` and ``<unk>``. One example per sentence. Without the treebank the script prints how to provide it and exits 0.

Token tree of the encoder input (heads 0-based over the tokens): every word under its UD head, the UD root word(s)
roots, ``</s>`` under the (first) root word.

Model: ``BartForConditionalGeneration`` from a config, trained from scratch (no pre-trained weights): d_model 64,
2 encoder and 2 decoder layers, 4 heads, ffn 256 (GELU), learned absolute positions (64), dropout 0.1 on the residual
branches and embeddings, attention and activation dropout 0 (so that every arm of a seed draws the same dropout masks:
checked), tied embeddings.

Arms (same seed: same initial weights, batches, dropout masks, steps and learning rate on the shared weights; the
optimiser set-up of ``causal_lm_miniature.training``):

- ``plain``: the model as built (sdpa attention), AdamW(lr, weight_decay 0.01) on every parameter.
- ``syntax``: the same model after ``enable_syntax_attention(model, "bias")`` (``trees="given"``: one table shared
  by the heads, ``BucketSpec()``, learnable scale, every encoder layer; the decoder and the cross-attention plain),
  fed the gold token trees (``syntax_trees=`` to forward and generate); AdamW on ``sk.syntax_param_groups``.
- ``chain``: a positional control, the same syntax model fed the chain tree (each token under the one before it).

The training loop is ``t5_miniature.train_arm`` (``causal_lm_miniature.training``'s optimiser, schedule, clipping,
seeded batches and dropout masks). Before training the script checks, and exits non-zero otherwise: (1) every target
is the head-final order of its sentence's gold tree (a permutation of the source tokens, each word after its
dependents, siblings in source order, each word's subtree one contiguous span ending at the word); (2) a fresh syntax
model (both tree kinds) gives the plain model's encoder states (valid tokens) and logits (eval mode), its greedy
``generate`` output, and in training mode under the same seed the same loss (``t5_miniature.check_init_equal``).

Metrics on the held-out sentences, greedy ``generate`` (``num_beams=1``, at most the source length + 1 new tokens):
exact match (the output up to its first ``</s>`` is the target), the same on the sentences whose target differs from
the source order, and token accuracy (the output up to and including its first ``</s>`` against the target with its
``</s>``, position by position; the share of target positions right). Printed with the copy baseline (output = the
source). Mean ± sample s.d. over ``--seeds``. CPU, ``torch.set_num_threads(--threads)``, default 1 (see
t5_miniature.py). ``--quick``: a smoke run (the first 300 sentences, 40 steps, one seed).

    python benchmarks/translation_miniature.py [--steps 800] [--batch 32] [--seeds 0,1,2]
        [--arms plain,syntax,chain] [--quick] [--train F --held-out F] [--json out.json]
"""
from __future__ import annotations

import pathlib
import sys
import types

import torch

BENCH = pathlib.Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import t5_miniature as t5  # noqa: E402  (sets the import paths; its arms, checks and command line)
from causal_lm_miniature import BOS, EOS, PAD, UNK, build_vocab, load, summary  # noqa: E402

import syntaxkernels as sk  # noqa: E402

MODEL = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64, dropout=0.1,
             attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
             tie_word_embeddings=True)
ARMS = t5.ARMS


# ----------------------------------------------------------------------------------------------------- data


def head_final(heads):
    """Word indices in head-final order: a word's subtree is its dependents' subtrees (source order), then the word;
    the roots' subtrees in source order. ``heads``: 0-based, -1 for a root."""
    children = [[] for _ in heads]
    roots = []
    for i, h in enumerate(heads):
        (children[h] if h >= 0 else roots).append(i)
    order = []

    def visit(i):
        for c in children[i]:
            visit(c)
        order.append(i)

    for r in roots:
        visit(r)
    return order


def example(sentence, vocab):
    """One sentence's example: ``ids`` (encoder tokens ``w1 .. wn </s>``), ``heads`` (their tree, 0-based, -1 for a
    root), ``target`` (the words in head-final order, then ``</s>``), ``order`` (the word indices of the target)."""
    words = [vocab.get(w.lower(), UNK) for w in sentence.words]
    roots = [i for i, h in enumerate(sentence.heads) if h < 0]
    heads = list(sentence.heads) + [roots[0]]
    order = head_final(sentence.heads)
    return dict(ids=words + [EOS], heads=heads, target=[words[i] for i in order] + [EOS], order=order)


def make_batch(items, kind):
    """items: example dicts -> (input_ids [B, N], attention_mask [B, N], labels [B, N] (-100 past the end), trees
    or None (kind "plain"))."""
    n = max(len(x["ids"]) for x in items)
    input_ids = torch.full((len(items), n), PAD, dtype=torch.int64)
    mask = torch.zeros((len(items), n), dtype=torch.int64)
    labels = torch.full((len(items), n), -100, dtype=torch.int64)
    for b, x in enumerate(items):
        input_ids[b, :len(x["ids"])] = torch.tensor(x["ids"])
        mask[b, :len(x["ids"])] = 1
        labels[b, :len(x["target"])] = torch.tensor(x["target"])
    trees = None
    if kind == "syntax":
        trees = sk.TreeBatch.from_heads([x["heads"] for x in items])
    elif kind == "chain":
        trees = sk.TreeBatch.from_heads([t5.chain_heads(len(x["heads"])) for x in items])
    return input_ids, mask, labels, trees


# ----------------------------------------------------------------------------------------------------- models


def new_model(vocab_size, seed, arm):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(seed)
    config = transformers.BartConfig(vocab_size=vocab_size, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                                     decoder_start_token_id=BOS, forced_bos_token_id=None, forced_eos_token_id=None,
                                     **MODEL)
    model = transformers.BartForConditionalGeneration(config)
    model.set_attn_implementation("sdpa")
    if arm != "plain":
        enable_syntax_attention(model, "bias")
    return model


loss_and_logits = t5.loss_and_logits


def greedy(model, batch):
    """Greedy outputs: one list of token ids per row, up to (not including) its first </s>."""
    input_ids, mask, _, trees = batch
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=input_ids.shape[1] + 1,
                         do_sample=False, num_beams=1, **t5.extra(trees))
    answers = []
    for row in out[:, 1:].tolist():  # after the decoder start token
        answers.append(row[:row.index(EOS)] if EOS in row else row)
    return answers


# ----------------------------------------------------------------------------------------------------- checks


def check_examples(items):
    """(1): every target is its tree's head-final order (checked against the tree, not against ``head_final``)."""
    for k, x in enumerate(items):
        heads, order = x["heads"][:-1], x["order"]
        n = len(heads)
        at = {w: p for p, w in enumerate(order)}
        size = [1] * n
        for i in range(n):  # every word counts in the subtree of each of its ancestors
            j = heads[i]
            while j >= 0:
                size[j] += 1
                j = heads[j]

        def under(i, j):  # i in j's subtree
            while i >= 0 and i != j:
                i = heads[i]
            return i == j

        ok = sorted(order) == list(range(n)) and x["target"] == [x["ids"][w] for w in order] + [EOS]
        ok = ok and all(heads[i] < 0 or at[i] < at[heads[i]] for i in range(n))
        ok = ok and all(at[i] < at[j] for i in range(n) for j in range(i + 1, n) if heads[i] == heads[j])
        ok = ok and all(under(order[p], j) for j in range(n) for p in range(at[j] - size[j] + 1, at[j] + 1))
        if not ok:
            raise SystemExit(f"CHECK FAILED: example {k}: the target is not the head-final order of its tree")
    return len(items)


def loss_and_states(model, batch):
    """(loss, the encoder's last states on valid tokens [n_valid * d_model] then the logits, flattened). BART's
    initialisation (std 0.02) lets the encoder move the logits at init by only ~1e-5 (syntax tables of -9..9 moved
    them by 3e-5), so the check compares the encoder states (order 1) as well."""
    out = model(input_ids=batch[0], attention_mask=batch[1], labels=batch[2], **t5.extra(batch[3]))
    return out.loss, torch.cat([out.encoder_last_hidden_state[batch[1].bool()].flatten(), out.logits.flatten()])


def check_init_equal(vocab_size, items):
    """(2), t5_miniature's check on this task's model and batches, encoder states included."""
    return t5.check_init_equal(vocab_size, items, task=types.SimpleNamespace(
        new_model=new_model, make_batch=make_batch, loss_and_logits=loss_and_states, greedy=greedy))


# ----------------------------------------------------------------------------------------------------- runs


def score(outputs, held):
    """(exact match, exact match where the target is not the source order, token accuracy) of outputs (lists of
    token ids up to their first </s>) against the held-out targets."""
    exact, moved, right, total = [], [], 0, 0
    for out, x in zip(outputs, held):
        exact.append(out == x["target"][:-1])
        if x["target"][:-1] != x["ids"][:-1]:
            moved.append(exact[-1])
        tokens = out + [EOS]
        right += sum(a == b for a, b in zip(tokens, x["target"]))
        total += len(x["target"])
    return sum(exact) / len(exact), sum(moved) / max(len(moved), 1), right / total


def evaluate(model, held, kind, size=128):
    model.eval()
    outputs = []
    with torch.no_grad():
        for start in range(0, len(held), size):
            outputs += greedy(model, make_batch(held[start:start + size], kind))
    model.train()
    return score(outputs, held)


def run(arm, seed, train, held, vocab_size, args):
    task = types.SimpleNamespace(new_model=new_model, make_batch=make_batch, loss_and_logits=loss_and_logits,
                                 evaluate=evaluate)
    model, losses, curve, seconds = t5.train_arm(arm, seed, train, held, vocab_size, args, task=task)
    exact, moved, tokens = evaluate(model, held, arm)
    curve.append((args.steps, round(exact, 4)))
    result = dict(arm=arm, seed=seed, exact=exact, exact_reordered=moved, token_accuracy=tokens, seconds=seconds,
                  curve=curve, train_loss_last50=sum(losses[-50:]) / len(losses[-50:]))
    if arm != "plain":
        result["syntax_bias"] = t5.bias_tables(model)
    return result


def main(argv=None):
    args = t5.arguments(__doc__, argv, max_words=20, steps=800, eval_every=400, quick_steps=40)

    train_s, held_s, where = load(args)
    vocab = build_vocab(train_s)
    train = [example(s, vocab) for s in train_s]
    held = [example(s, vocab) for s in held_s]
    seeds, arms = args.seed_list, args.arm_list
    if not train or not held:
        raise SystemExit("no examples: the training or the held-out part is empty")
    words = {i: w for w, i in vocab.items()}
    copy = score([x["ids"][:-1] for x in held], held)
    reordered = sum(x["target"][:-1] != x["ids"][:-1] for x in held) / len(held)
    x = max(held[:20], key=lambda x: len(x["ids"]))
    print(f"data: {where}; {len(train)} training sentences, {len(held)} held-out ({reordered:.1%} of their targets "
          f"not in source order; copying the source: exact match {copy[0]:.1%}, token accuracy {copy[2]:.1%}); "
          f"vocabulary {len(vocab)}; steps {args.steps}, batch {args.batch}, lr {args.lr}, seeds {seeds}, "
          f"arms {arms}, {torch.get_num_threads()} thread(s)\n"
          f"example: {' '.join(words[i] for i in x['ids'])}  ->  {' '.join(words[i] for i in x['target'])}")
    worst = check_init_equal(len(vocab), held[:16])
    print(f"checks passed: {check_examples(train + held)} targets are their tree's head-final order; fresh syntax / "
          f"chain models = plain (encoder states and logits max |diff| {worst:.2g}, the same greedy outputs, the "
          f"same training-mode loss under one seed)")

    results = t5.run_arms(
        args, arms, seeds, lambda arm, seed: run(arm, seed, train, held, len(vocab), args),
        lambda r: f"held-out exact match {r['exact']:.4f} (reordered targets {r['exact_reordered']:.4f}), token "
                  f"accuracy {r['token_accuracy']:.4f}",
        t5.conditions(args, where, seeds, MODEL, train_sentences=len(train), held_out_sentences=len(held),
                      vocab=len(vocab), baselines=dict(copy_exact=copy[0], copy_token_accuracy=copy[2],
                                                       reordered_share=reordered),
                      checks=dict(init_max_diff=worst)))
    print("\narm     exact match mean ± sd [min, max]    reordered   token accuracy mean ± sd   train loss   s/run")
    for arm in arms:
        rs = [r for r in results["runs"] if r["arm"] == arm]
        m, sd, lo, hi = summary([r["exact"] for r in rs])
        tm, tsd = summary([r["token_accuracy"] for r in rs])[:2]
        moved, loss, sec = (summary([r[k] for r in rs])[0] for k in ("exact_reordered", "train_loss_last50",
                                                                      "seconds"))
        print(f"{arm:6s}  {m:.4f} ± {sd:.4f} [{lo:.4f}, {hi:.4f}]   {moved:.4f}      {tm:.4f} ± {tsd:.4f}          "
              f"{loss:.3f}      {sec:.0f}")
    t5.differences_and_tables(results, arms, ("exact", "token_accuracy"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
