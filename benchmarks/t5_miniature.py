"""A tiny T5 text-to-text task on UD sentences: plain T5 vs Syntax-T5 (a tree-distance bias in the encoder, gold
trees) (CPU, minutes).

Task ("head of the marked word"): the input is a sentence with one word marked, ``w1 .. <m> wk .. wn </s>``; the
answer is the marked word's UD head word, ``h </s>``. The answer is read off the gold tree, so it depends on the
sentence's syntax, not only on positions. Marked words: every word that is not a root, not ``punct``, and whose
head word is in the vocabulary (the answer is never ``<unk>``); every such word of a training sentence is one
training example, every such word of a held-out sentence one held-out example.

Data: read, split and tokenised as in ``benchmarks/causal_lm_miniature.py`` (its ``load``, ``build_vocab``):
a CoNLL-U treebank (``--data``, default ``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`), sentences of
1..``--max-words`` words, the first 90 % (file order) train, the last 10 % held out, or ``--train`` / ``--held-out``
files. Lower-cased words, one token per word; the vocabulary is the training words seen at least twice (the rest
``<unk>``) plus ``<pad>`` (T5's decoder start), ``<eos>`` (T5's ``</s>``), ``<unk>``, an unused ``<bos>`` and the
marker ``<m>``. Without the treebank the script prints how to provide it and exits 0.

Token tree of the encoder input (heads 0-based over the tokens): every word under its UD head, the UD root word
(every root, if several) a root, the marker ``<m>`` under the marked word, ``</s>`` under the (first) root word.

Model: ``T5ForConditionalGeneration`` from a config, trained from scratch (no pre-trained weights): d_model 64,
d_kv 16, 4 heads, d_ff 256 (ReLU), 2 encoder and 2 decoder layers, T5's 32 relative-position buckets (max distance
128), dropout 0.1 on the residual branches and embeddings; attention-probability dropout set to 0 in every attention
module, so that every arm of a seed draws the same dropout masks (checked). Tied embeddings, as in T5.

Arms (same seed: same initial weights, same batches in the same order, same dropout masks, same steps, same learning
rate on the shared weights):

- ``plain``: the model as built (sdpa attention), AdamW(lr, weight_decay 0.01) on every parameter.
- ``syntax`` (Syntax-T5): the same model after ``enable_syntax_attention(model, "bias")`` (``trees="given"``: one
  table shared by the heads, ``BucketSpec()``, learnable scale, every encoder layer; on top of T5's relative-position
  bias; the decoder untouched), fed the gold token trees (``syntax_trees=`` to forward and generate). AdamW on
  ``sk.syntax_param_groups(model, lr, weight_decay=0.01)`` (the syntax table and scale at ``max(lr, 1e-2)``, no
  decay; everything else as ``plain``).
- ``chain``: a positional control, the same syntax model fed the chain tree (each token's head is the token before
  it), so the extra bias is a learned function of ``|i - j|`` alone, which T5's position buckets already give.

Before training the script checks, and exits non-zero otherwise: (1) in every held-out and training example the
target is the token of the marked word's head and is at tree distance 1 from the marked word (and the marker at
distance 1 from it) in the token tree (``sk.TreeBatch``); (2) a fresh syntax model (both tree kinds) gives the plain
model's logits (eval mode), its greedy ``generate`` output, and in training mode under the same seed the same loss
(the same dropout masks).

Metric: held-out exact-match accuracy of greedy ``generate`` (``num_beams=1``, at most 3 new tokens): the output up
to its first ``</s>`` is exactly the head word. Printed with two baselines that read no model (the word right after /
right before the marked word is the answer) and the share of held-out heads next to their word. Mean ± sample s.d.
over ``--seeds``. CPU, ``torch.set_num_threads(--threads)``, default 1: on the shared 2-core machine with other jobs
running (load 5-6), a training step took 0.73-2.3 s with two threads against 0.08-0.23 s with one (the two threads
wait on each other whenever one is descheduled). ``--quick``: a smoke run (the first 300 sentences, 60 steps, one
seed).

    python benchmarks/t5_miniature.py [--steps 1500] [--batch 32] [--seeds 0,1,2] [--arms plain,syntax,chain]
        [--quick] [--train F --held-out F] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys
import time
import types

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = pathlib.Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import syntaxkernels as sk  # noqa: E402
from causal_lm_miniature import build_vocab, load, summary, training  # noqa: E402  (data, training, statistics)

# causal_lm_miniature's specials: <pad> 0 (T5's decoder start), <bos> 1 (unused), <eos> 2 (T5's </s>), <unk> 3
PAD, EOS, UNK = 0, 2, 3
MARK = "<m>"
MODEL = dict(d_model=64, d_kv=16, num_heads=4, d_ff=256, num_layers=2, num_decoder_layers=2,
             relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
             feed_forward_proj="relu", tie_word_embeddings=True)
ARMS = ("plain", "syntax", "chain")


# ----------------------------------------------------------------------------------------------------- data


def task_vocab(train):
    """causal_lm_miniature's vocabulary (training words seen twice, lower-cased) plus the marker ``<m>``."""
    vocab = build_vocab(train)
    vocab[MARK] = len(vocab)
    return vocab


def examples(sentence, vocab):
    """Every example of one sentence: dicts with ``ids`` (encoder tokens), ``heads`` (their tree, 0-based, -1 for a
    root), ``target`` (the head word's id), ``mark`` (the marker's token index), ``head_at`` (the head's token
    index) and ``offset`` (head word index - marked word index)."""
    words = [vocab.get(w.lower(), UNK) for w in sentence.words]
    n = len(words)
    roots = [i for i, h in enumerate(sentence.heads) if h < 0]
    out = []
    for k, h in enumerate(sentence.heads):
        rel = sentence.deprel[k].split(":")[0] if sentence.deprel else "_"
        if h < 0 or rel in ("punct", "root") or words[h] == UNK:
            continue

        def tok(i):  # word index -> token index (the marker sits before word k)
            return i if i < k else i + 1

        ids = words[:k] + [vocab[MARK]] + words[k:] + [EOS]
        heads = [0] * (n + 2)
        for i, hi in enumerate(sentence.heads):
            heads[tok(i)] = tok(hi) if hi >= 0 else -1
        heads[k] = tok(k)              # the marker under the marked word
        heads[n + 1] = tok(roots[0])   # </s> under the (first) root word
        out.append(dict(ids=ids, heads=heads, target=words[h], mark=k, head_at=tok(h), offset=h - k))
    return out


def chain_heads(n):
    return [-1] + list(range(n - 1))


def make_batch(items, kind):
    """items: example dicts -> (input_ids [B, N], attention_mask [B, N], labels [B, 2] (head word, </s>), trees or
    None (kind "plain"))."""
    n = max(len(x["ids"]) for x in items)
    input_ids = torch.full((len(items), n), PAD, dtype=torch.int64)
    mask = torch.zeros((len(items), n), dtype=torch.int64)
    for b, x in enumerate(items):
        input_ids[b, :len(x["ids"])] = torch.tensor(x["ids"])
        mask[b, :len(x["ids"])] = 1
    labels = torch.tensor([[x["target"], EOS] for x in items], dtype=torch.int64)
    trees = None
    if kind == "syntax":
        trees = sk.TreeBatch.from_heads([x["heads"] for x in items])
    elif kind == "chain":
        trees = sk.TreeBatch.from_heads([chain_heads(len(x["heads"])) for x in items])
    return input_ids, mask, labels, trees


# ----------------------------------------------------------------------------------------------------- models


def new_model(vocab_size, seed, arm):
    import transformers
    from transformers.models.t5.modeling_t5 import T5Attention

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=vocab_size, pad_token_id=PAD, eos_token_id=EOS,
                                   decoder_start_token_id=PAD, **MODEL)
    model = transformers.T5ForConditionalGeneration(config)
    model.set_attn_implementation("sdpa")
    for module in model.modules():
        if isinstance(module, T5Attention):
            module.dropout = 0.0  # no dropout on attention probabilities: the same masks in every arm
    if arm != "plain":
        enable_syntax_attention(model, "bias")
    return model


def extra(trees):
    return {} if trees is None else dict(syntax_trees=trees)


def loss_and_logits(model, batch):
    input_ids, mask, labels, trees = batch
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels, **extra(trees))
    return out.loss, out.logits


def greedy(model, batch):
    """Greedy answers: one list of token ids per row, up to (not including) its first </s>."""
    input_ids, mask, _, trees = batch
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=3, do_sample=False, num_beams=1,
                         **extra(trees))
    answers = []
    for row in out[:, 1:].tolist():  # after the decoder start token
        answers.append(row[:row.index(EOS)] if EOS in row else row)
    return answers


# ----------------------------------------------------------------------------------------------------- checks


def check_examples(items):
    """(1): the target is the head's token, at tree distance 1 from the marked word, as is the marker."""
    for start in range(0, len(items), 256):
        part = items[start:start + 256]
        trees = sk.TreeBatch.from_heads([x["heads"] for x in part])
        n = trees.max_len
        d = trees.distance.reshape(len(part), n, n)
        for b, x in enumerate(part):
            word = x["mark"] + 1
            if x["ids"][x["head_at"]] != x["target"] or int(d[b, word, x["head_at"]]) != 1 \
                    or int(d[b, x["mark"], word]) != 1 or x["heads"][word] != x["head_at"]:
                raise SystemExit(f"CHECK FAILED: example {start + b}: the target is not the marked word's head")
    return len(items)


def check_init_equal(vocab_size, items, task=None):
    """(2): a fresh syntax model is the plain model: logits and generate in eval mode, the loss in training mode
    under the same seed (the same dropout masks). ``task``: a namespace with this module's ``new_model``,
    ``make_batch``, ``loss_and_logits`` and ``greedy`` (another miniature's; default this module's)."""
    t = task if task is not None else types.SimpleNamespace(**globals())
    plain = t.new_model(vocab_size, 0, "plain")
    worst = 0.0
    for kind in ARMS[1:]:
        patched = t.new_model(vocab_size, 0, kind)
        for model in (plain, patched):
            model.eval()
        ref_batch, batch = t.make_batch(items, "plain"), t.make_batch(items, kind)
        with torch.no_grad():
            ref, out = t.loss_and_logits(plain, ref_batch)[1], t.loss_and_logits(patched, batch)[1]
            worst = max(worst, float((out - ref).abs().max()))
            same_answers = t.greedy(plain, ref_batch) == t.greedy(patched, batch)
            losses = []
            for model, b in ((plain, ref_batch), (patched, batch)):
                model.train()
                torch.manual_seed(7)
                losses.append(float(t.loss_and_logits(model, b)[0]))
        if worst > 1e-4:
            raise SystemExit(f"CHECK FAILED: fresh {kind} model differs from the plain model at init by {worst:.3g}")
        if not same_answers:
            raise SystemExit(f"CHECK FAILED: fresh {kind} model generates other answers than the plain model")
        if abs(losses[0] - losses[1]) > 1e-4:
            raise SystemExit(f"CHECK FAILED: training-mode loss of a fresh {kind} model differs from the plain "
                             f"model's under the same seed ({losses[1]:.6f} vs {losses[0]:.6f}): other dropout masks")
    return worst


# ----------------------------------------------------------------------------------------------------- runs


def evaluate(model, held, kind, size=128):
    """Held-out exact-match accuracy of greedy generation (and per example whether it was right)."""
    model.eval()
    right = []
    with torch.no_grad():
        for start in range(0, len(held), size):
            items = held[start:start + size]
            for x, answer in zip(items, greedy(model, make_batch(items, kind))):
                right.append(answer == [x["target"]])
    model.train()
    return sum(right) / len(right), right


def train_arm(arm, seed, train, held, vocab_size, args, task=None):
    """One arm's training run: ``(model, losses, curve, seconds)``, the held-out exact match (``evaluate(...)[0]``)
    printed and put in ``curve`` every ``args.eval_every`` steps but the last. ``task``: as in
    :func:`check_init_equal` (``new_model``, ``make_batch``, ``loss_and_logits``, ``evaluate``)."""
    t = task if task is not None else types.SimpleNamespace(**globals())
    model = t.new_model(vocab_size, seed, arm)
    take_step, stream = training(model, arm, seed, len(train), args)
    losses, curve = [], []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        losses.append(take_step(t.loss_and_logits(model, t.make_batch([train[i] for i in next(stream)], arm))[0]))
        if step % args.eval_every == 0 and step != args.steps:
            state = torch.random.get_rng_state()
            accuracy = t.evaluate(model, held, arm)[0]
            torch.random.set_rng_state(state)  # evaluation draws nothing, but keep the masks aligned regardless
            curve.append((step, round(accuracy, 4)))
            print(f"  {arm:6s} seed {seed} step {step:5d}: train loss (last 50) "
                  f"{sum(losses[-50:]) / len(losses[-50:]):.3f}, held-out exact match {accuracy:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return model, losses, curve, time.perf_counter() - start


def run(arm, seed, train, held, vocab_size, args):
    model, losses, curve, seconds = train_arm(arm, seed, train, held, vocab_size, args)
    accuracy, right = evaluate(model, held, arm)
    curve.append((args.steps, round(accuracy, 4)))
    tail = losses[-50:]
    result = dict(arm=arm, seed=seed, accuracy=accuracy, correct=sum(right), evaluated=len(right), seconds=seconds,
                  curve=curve, train_loss_last50=sum(tail) / len(tail),
                  adjacent_accuracy=_share(right, [abs(x["offset"]) == 1 for x in held]),
                  distant_accuracy=_share(right, [abs(x["offset"]) > 1 for x in held]))
    if arm != "plain":
        result["syntax_bias"] = bias_tables(model)
    return result


def bias_tables(model):
    """``{layer index: c * table}``: the bias each distance bucket adds in each syntax layer (rounded)."""
    from syntaxkernels.integrations.transformers import syntax_parameters

    params = syntax_parameters(model)
    out = {}
    for name, table in params.items():
        if name.endswith("distance_bias"):
            scale = params[name[:-len("distance_bias")] + "bias_scale"]
            layer = next(part for part in name.split(".") if part.isdigit())
            out[layer] = [round(x, 3) for x in (scale * table).detach().flatten().tolist()]
    return out


def _share(right, keep):
    chosen = [r for r, k in zip(right, keep) if k]
    return sum(chosen) / max(len(chosen), 1)


def arguments(doc, argv, max_words=40, steps=1500, eval_every=500, quick_limit=300, quick_steps=60):
    """The miniatures' command line (this one's defaults unless given); ``--quick``: the first ``quick_limit``
    sentences, ``quick_steps`` steps, seed 0. Adds ``seed_list`` and ``arm_list`` (checked against ``ARMS``); sets the
    thread count."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=None, help="one CoNLL-U file, split 90 / 10")
    parser.add_argument("--train", type=pathlib.Path, default=None, help="a training split (with --held-out)")
    parser.add_argument("--held-out", type=pathlib.Path, default=None)
    parser.add_argument("--max-words", type=int, default=max_words)
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences of --data only (a smoke run)")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=eval_every)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {quick_limit} sentences, {quick_steps} steps, seed 0")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.limit, args.steps, args.seeds = args.limit or quick_limit, quick_steps, "0"
        args.eval_every, args.warmup = quick_steps // 2, 20
    args.seed_list, args.arm_list = [int(s) for s in args.seeds.split(",")], args.arms.split(",")
    if any(a not in ARMS for a in args.arm_list):
        raise SystemExit(f"--arms: choose from {ARMS}")
    torch.set_num_threads(args.threads)
    return args


def main(argv=None):
    args = arguments(__doc__, argv)
    train_s, held_s, where = load(args)
    vocab = task_vocab(train_s)
    train = [x for s in train_s for x in examples(s, vocab)]
    held = [x for s in held_s for x in examples(s, vocab)]
    seeds, arms = args.seed_list, args.arm_list
    if not train or not held:
        raise SystemExit("no examples: the training or the held-out part has no eligible marked word")
    words = {i: w for w, i in vocab.items()}
    after = sum(x["ids"][x["mark"] + 2] == x["target"] for x in held) / len(held)  # the word after the marked one
    before = sum(x["mark"] > 0 and x["ids"][x["mark"] - 1] == x["target"] for x in held) / len(held)
    adjacent = sum(abs(x["offset"]) == 1 for x in held) / len(held)
    print(f"data: {where}; {len(train_s)} training sentences ({len(train)} examples), {len(held_s)} held-out "
          f"({len(held)} examples); vocabulary {len(vocab)}; steps {args.steps}, batch {args.batch}, lr {args.lr}, "
          f"seeds {seeds}, arms {arms}, {torch.get_num_threads()} thread(s)")
    x = held[0]
    print(f"example: {' '.join(words[i] for i in x['ids'])}  ->  {words[x['target']]}")
    print(f"held-out: the head is next to the marked word in {adjacent:.1%} of the examples; baselines without a "
          f"model: 'the word after' {after:.1%}, 'the word before' {before:.1%} exact match")
    n_checked = check_examples(train) + check_examples(held)
    worst = check_init_equal(len(vocab), held[:16])
    print(f"checks passed: {n_checked} examples' targets are their marked word's head at tree distance 1; fresh "
          f"syntax / chain models = plain (logits max |diff| {worst:.2g}, the same greedy answers, the same "
          f"training-mode loss under one seed)")

    results = run_arms(args, arms, seeds, lambda arm, seed: run(arm, seed, train, held, len(vocab), args),
                       lambda r: f"held-out exact match {r['accuracy']:.4f} ({r['correct']}/{r['evaluated']}; head "
                                 f"next to the word {r['adjacent_accuracy']:.3f}, farther {r['distant_accuracy']:.3f})",
                       conditions(args, where, seeds, MODEL, train_sentences=len(train_s),
                                  held_out_sentences=len(held_s), train_examples=len(train),
                                  held_out_examples=len(held), vocab=len(vocab),
                                  baselines=dict(word_after=after, word_before=before, head_adjacent=adjacent),
                                  checks=dict(init_max_diff=worst)))
    print("\narm     exact match mean ± sd [min, max]    adjacent head   farther head   train loss   seconds/run")
    for arm in arms:
        rs = [r for r in results["runs"] if r["arm"] == arm]
        m, sd, lo, hi = summary([r["accuracy"] for r in rs])
        near, far, loss, sec = (summary([r[k] for r in rs])[0] for k in ("adjacent_accuracy", "distant_accuracy",
                                                                          "train_loss_last50", "seconds"))
        print(f"{arm:6s}  {m:.4f} ± {sd:.4f} [{lo:.4f}, {hi:.4f}]   {near:.4f}          {far:.4f}         "
              f"{loss:.3f}      {sec:.0f}")
    differences_and_tables(results, arms, ("accuracy",))
    return 0


def conditions(args, where, seeds, model, **own):
    """The conditions a miniature records: the shared ones (command line, versions) and its ``own``."""
    import transformers

    return dict(data=where, **own, steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                max_words=args.max_words, seeds=seeds, model=model, threads=torch.get_num_threads(),
                torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version())


def run_arms(args, arms, seeds, run_one, describe, conditions):
    """Every arm of every seed (``run_one(arm, seed) -> result``), one line each (``describe(result)``), the results
    rewritten to ``args.json`` after each run; returns ``{"conditions": ..., "runs": [...]}``."""
    results = dict(conditions=conditions, runs=[])
    for seed in seeds:
        for arm in arms:
            r = run_one(arm, seed)
            results["runs"].append(r)
            print(f"{arm:6s} seed {seed}: {describe(r)}; train loss {r['train_loss_last50']:.3f}; "
                  f"{r['seconds']:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    return results


def differences_and_tables(results, arms, keys):
    """Prints each syntax arm's difference from ``plain`` in ``keys``, seed by seed, and the learned bias tables."""
    if "plain" in arms:
        base = {r["seed"]: r for r in results["runs"] if r["arm"] == "plain"}
        for arm in arms:
            if arm != "plain":
                d = [[r[k] - base[r["seed"]][k] for k in keys] for r in results["runs"]
                     if r["arm"] == arm and r["seed"] in base]
                print(f"{arm} - plain, same seed ({', '.join(keys)}): "
                      + ", ".join("(" + ", ".join(f"{v:+.4f}" for v in row) + ")" for row in d))
    for r in results["runs"]:
        if "syntax_bias" in r:
            print(f"{r['arm']:6s} seed {r['seed']}: c * table (distance buckets 0..10, unreachable) "
                  + "; ".join(f"layer {k}: {v}" for k, v in r["syntax_bias"].items()))


if __name__ == "__main__":
    sys.exit(main())
