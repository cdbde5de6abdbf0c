"""A tiny causal language model on UD sentences, plain vs syntax bias with leak-free gold trees (CPU, minutes).

Data: a CoNLL-U treebank (``--data``, default ``$SYNTAXKERNELS_UD``, see :mod:`syntaxkernels.data`; read with
``sk.trees.read_conllu``). With one file, its sentences of 1..``--max-words`` words are split by index in file
order: the first 90 % train, the last 10 % are held out (other documents). With a directory holding the UD
train and dev splits, point ``--train`` at ``*-ud-train.conllu`` and ``--held-out`` at ``*-ud-dev.conllu``
(then nothing is split). Words are lower-cased; the vocabulary is the training words seen at least twice, the
rest ``<unk>``, plus ``<pad>``, ``<bos>``, ``<eos>``. One token per word, so the gold trees apply directly: a
sentence is ``<bos> w1 .. wn <eos>``, the token tree has ``<bos>`` as its root, the UD root word (every root word,
if several) attached to ``<bos>``, every other word to its UD head, ``<eos>`` to ``<bos>``.

Model: ``GPT2LMHeadModel`` from a config, trained from scratch (no pre-trained weights): 2 layers, hidden 64,
4 heads, feed-forward 256, positions 128, residual and embedding dropout 0.1, attention dropout 0 (so every arm
draws the same dropout masks); the LM head is tied to the input embedding, as in GPT-2.

Arms (same seed: same initial weights, same batches in the same order, same steps, same learning rate on the
shared weights):

- ``plain``: the model as built, AdamW(lr, weight_decay 0.01) on every parameter.
- ``leakfree``: the same model after ``enable_syntax_attention(model, "bias")`` (one table shared by the heads,
  ``BucketSpec()``, learnable scale, every layer), fed ``TreeBatch.from_heads(heads, leak_free=True)``: row i uses
  the tree induced on tokens 0..i. AdamW on ``sk.syntax_param_groups(model, lr, weight_decay=0.01)`` (the syntax
  table and scale at the package default ``max(lr, 1e-2)``, no decay; everything else as ``plain``).
- ``chain``: a positional control, the same syntax model fed the chain tree (each token's head is the token before
  it), so the bias is a learned function of ``i - j`` alone and carries no syntax.
- ``wholetree`` (**invalid for language-model evaluation**): whole-tree distances (``leak_free=False``), which tell
  a position about the heads of later words. Shown only to measure what the leak buys.

Even the leak-free trees carry information an incremental reader lacks: they are the whole-sentence parse masked
per prefix (docs/semantics.md), so at row i an earlier word whose head comes later is visibly unattached in the
induced forest (distance 255, which has a bucket of its own: e.g. the root verb or a noun's head is still to come;
after such an "open" prefix the next token is never ``<eos>``). Perplexity with gold prefix trees is therefore an
optimistic figure, not what a model with a real incremental parser would get. The script reports, besides the
perplexity over every target, ``ppl_words`` (without the ``<eos>`` targets) and the word targets split into those
after an open prefix (``ppl_open``) and after a complete one (``ppl_closed``); the split is read off the gold
trees, the same for every arm.

Before training the script checks, and exits non-zero otherwise: (1) on a real sentence with later-attaching
words, the leak-free distance rows 0..i equal those of the same sentence with every token after i re-attached,
for every i, and equal ``sk.reference.leak_free_distance`` (the whole-tree batch is checked to differ, so the check
can fail); (2) a fresh syntax model's logits equal the plain model's on a real batch (every tree kind); (3) with
random syntax parameters, changing the words and heads after position i leaves the leak-free model's logits at
positions 0..i unchanged.

Metric: held-out per-word perplexity ``exp(sum NLL / targets)`` over every predicted token (the words, ``<unk>``
targets included, and ``<eos>``; ``<bos>`` is never a target) and the mean loss, after ``--steps`` steps, for each
arm and seed; also without the ``<eos>`` targets. Progress and a held-out curve every ``--eval-every`` steps are
printed (the final figure is the last step's, not the best). CPU, ``torch.set_num_threads(--threads)`` (default 1:
the machine is shared).

    python benchmarks/causal_lm_miniature.py [--steps 800] [--batch 32] [--seeds 0,1,2]
        [--arms plain,leakfree,chain,wholetree] [--train F --held-out F] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import platform
import random
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
MODEL = dict(n_embd=64, n_layer=2, n_head=4, n_inner=256, n_positions=128, resid_pdrop=0.1, embd_pdrop=0.1,
             attn_pdrop=0.0)
ARMS = ("plain", "leakfree", "chain", "wholetree")


# ----------------------------------------------------------------------------------------------------- data


def load(args):
    """(train sentences, held-out sentences, description)."""
    def read(path):
        return [s for s in sk.trees.read_conllu(path) if 1 <= len(s) <= args.max_words]

    if args.train or args.held_out:
        if not (args.train and args.held_out):
            raise SystemExit("--train and --held-out go together")
        train, held = read(args.train), read(args.held_out)
        return train, held, f"train {args.train}, held out {args.held_out}"
    path = args.data or (sk_data.treebank_path() if sk_data.treebank_available() else None)
    if path is None:
        print(sk_data.missing_message())
        raise SystemExit(0)
    sentences = read(path)
    if args.limit:
        sentences = sentences[:args.limit]
    cut = int(0.9 * len(sentences))
    return sentences[:cut], sentences[cut:], f"{path}: first 90 % train, last 10 % held out (file order)"


def build_vocab(train, min_count=2):
    counts = collections.Counter(w.lower() for s in train for w in s.words)
    words = sorted(w for w, c in counts.items() if c >= min_count)
    return {w: i for i, w in enumerate(SPECIALS + words)}


def encode(sentence, vocab):
    """(token ids, token heads) of ``<bos> w1 .. wn <eos>``; heads 0-based, -1 for the root ``<bos>``."""
    ids = [BOS] + [vocab.get(w.lower(), UNK) for w in sentence.words] + [EOS]
    heads = [-1] + [h + 1 if h >= 0 else 0 for h in sentence.heads] + [0]
    return ids, heads


def chain_heads(n):
    return [-1] + list(range(n - 1))


def make_batch(items, kind):
    """items: [(ids, heads)] -> (input_ids [B, N], attention_mask [B, N], labels [B, N], trees or None)."""
    n = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), n), PAD, dtype=torch.int64)
    mask = torch.zeros((len(items), n), dtype=torch.int64)
    for b, (ids, _) in enumerate(items):
        input_ids[b, :len(ids)] = torch.tensor(ids)
        mask[b, :len(ids)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    labels[:, 0] = -100  # <bos> is never a target (transformers shifts: position t predicts token t + 1)
    trees = None
    if kind == "leakfree":
        trees = sk.TreeBatch.from_heads([h for _, h in items], leak_free=True)
    elif kind == "chain":
        trees = sk.TreeBatch.from_heads([chain_heads(len(h)) for _, h in items], leak_free=True)
    elif kind == "wholetree":
        trees = sk.TreeBatch.from_heads([h for _, h in items], leak_free=False)
    return input_ids, mask, labels, trees


def batch_stream(n_items, size, seed):
    rng = random.Random(seed)
    order = list(range(n_items))
    while True:
        rng.shuffle(order)
        for start in range(0, n_items - size + 1, size):
            yield order[start:start + size]


# ----------------------------------------------------------------------------------------------------- models


def new_model(vocab_size, seed, arm):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab_size, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                                     **MODEL)
    model = transformers.GPT2LMHeadModel(config)
    model.set_attn_implementation("sdpa")
    if arm != "plain":
        enable_syntax_attention(model, "bias")
    return model


def forward(model, batch):
    input_ids, mask, labels, trees = batch
    extra = {} if trees is None else dict(syntax_trees=trees)
    return model(input_ids=input_ids, attention_mask=mask, **extra).logits


def token_nll(logits, labels):
    """NLL of each target: [B, N - 1] (0 where there is none) and the target mask."""
    target = labels[:, 1:]
    keep = target != -100
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), target.clamp(min=0), reduction="none")
    return nll * keep, keep


# ----------------------------------------------------------------------------------------------------- checks


def check_leak_free_rows(items):
    """(1): rows 0..i of the leak-free distance do not depend on heads after i; the whole tree's do."""
    from syntaxkernels.reference import leak_free_distance

    ids, heads = next((i, h) for i, h in items if len(h) >= 10 and any(x > k + 1 for k, x in enumerate(h)))
    n = len(heads)
    full = sk.TreeBatch.from_heads([heads], leak_free=True).distance[0].reshape(n, n)
    ref = leak_free_distance(heads)
    if not torch.equal(full.to(torch.int64), ref.to(torch.int64)):
        raise SystemExit("CHECK FAILED: leak-free distance differs from sk.reference.leak_free_distance")
    whole = sk.TreeBatch.from_heads([heads]).distance[0].reshape(n, n)
    whole_leaks = False
    for i in range(n - 1):
        other = heads[:i + 1] + [0] * (n - i - 1)  # every later token re-attached to <bos>: still a tree
        d = sk.TreeBatch.from_heads([other], leak_free=True).distance[0].reshape(n, n)
        if not torch.equal(d[:i + 1], full[:i + 1]):
            raise SystemExit(f"CHECK FAILED: leak-free rows 0..{i} change when later heads change")
        w = sk.TreeBatch.from_heads([other]).distance[0].reshape(n, n)
        whole_leaks |= not torch.equal(w[:i + 1, :i + 1], whole[:i + 1, :i + 1])
    if not whole_leaks:
        raise SystemExit("CHECK FAILED: the whole-tree rows never changed either: the check has no teeth")
    return n


def check_init_equal(vocab_size, items):
    """(2): a fresh syntax model gives the plain model's logits (eval mode)."""
    plain = new_model(vocab_size, 0, "plain").eval()
    worst = 0.0
    for kind in ARMS[1:]:
        patched = new_model(vocab_size, 0, kind).eval()
        with torch.no_grad():
            ref = forward(plain, make_batch(items, "plain"))
            batch = make_batch(items, kind)
            out = forward(patched, batch)
        valid = batch[1].bool()
        diff = float((out[valid] - ref[valid]).abs().max())
        worst = max(worst, diff)
        if diff > 1e-4:
            raise SystemExit(f"CHECK FAILED: fresh {kind} model differs from the plain model at init by {diff:.3g}")
    return worst


def check_no_peeking(vocab_size, items):
    """(3): with random syntax parameters, later words and heads leave earlier logits unchanged (leak-free)."""
    from syntaxkernels.integrations.transformers import syntax_parameters

    model = new_model(vocab_size, 0, "leakfree").eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 1.0)
    ids, heads = next((i, h) for i, h in items if len(h) >= 12)
    n = len(ids)
    rng = random.Random(5)
    worst, moved = 0.0, 0.0
    for cut in range(1, n - 1):
        ids2 = ids[:cut + 1] + [rng.randrange(4, vocab_size) for _ in range(n - cut - 1)]
        # each later token under <bos> or an earlier later token: still a tree whatever the prefix points at
        heads2 = heads[:cut + 1] + [rng.choice([0] + list(range(cut + 1, k))) for k in range(cut + 1, n)]
        with torch.no_grad():
            a = forward(model, make_batch([(ids, heads)], "leakfree"))[0, :cut + 1]
            b = forward(model, make_batch([(ids2, heads2)], "leakfree"))[0, :cut + 1]
            w1 = forward(model, make_batch([(ids, heads)], "wholetree"))[0, :cut + 1]
            w2 = forward(model, make_batch([(ids, heads2)], "wholetree"))[0, :cut + 1]
        worst = max(worst, float((a - b).abs().max()))
        moved = max(moved, float((w1 - w2).abs().max()))
    if worst > 1e-5:
        raise SystemExit(f"CHECK FAILED: leak-free logits at positions <= i moved by {worst:.3g} when later "
                         f"words / heads changed")
    return worst, moved


# ----------------------------------------------------------------------------------------------------- runs


def open_prefix(items):
    """bool [B, N - 1]: the target at t + 1 follows a prefix 0..t whose induced forest is not one tree (an earlier
    word's head is still to come), read off the leak-free distance (255 in row t); whatever the arm."""
    trees = sk.TreeBatch.from_heads([h for _, h in items], leak_free=True)
    n = trees.max_len
    d = trees.distance.reshape(len(items), n, n)
    lower = torch.ones(n, n, dtype=torch.bool).tril()
    valid = torch.arange(n)[None, :] < trees.lengths[:, None]
    unreachable = (d == 255) & lower & valid[:, None, :]
    return unreachable.any(-1)[:, :-1]


def evaluate(model, held, kind, size=64):
    """Held-out loss and perplexity: every target, without <eos>, and the word targets split by open_prefix."""
    model.eval()
    sums = collections.Counter()
    with torch.no_grad():
        for start in range(0, len(held), size):
            items = held[start:start + size]
            batch = make_batch(items, kind)
            nll, keep = token_nll(forward(model, batch), batch[2])
            eos = batch[0][:, 1:] == EOS
            words = keep & ~eos
            opened = open_prefix(items) & keep
            for name, part in (("all", keep), ("words", words), ("open", words & opened),
                               ("closed", words & ~opened)):
                sums[name + "_nll"] += float(nll[part].sum())
                sums[name + "_n"] += int(part.sum())
    model.train()
    out = dict(targets=sums["all_n"], word_targets=sums["words_n"])
    for name, key in (("all", ""), ("words", "_words"), ("open", "_open"), ("closed", "_closed")):
        loss = sums[name + "_nll"] / max(sums[name + "_n"], 1)
        out["loss" + key], out["ppl" + key] = loss, math.exp(loss)
    out["open_word_targets"] = sums["open_n"]
    return out


def training(model, arm, seed, n_train, args):
    """``(take_step, stream)`` of one arm's run: AdamW (the syntax parameter groups unless plain), a linear warm-up
    then a linear decay over ``args.steps``, gradient clipping at 1; ``take_step(loss)`` makes one step and returns
    the loss as a float; ``stream`` the seeded batches. The model goes to training mode and the dropout masks are
    seeded alike for every arm of a seed (the miniatures share this)."""
    if arm == "plain":
        groups = [dict(params=list(model.parameters()), lr=args.lr, weight_decay=0.01)]
    else:
        groups = sk.syntax_param_groups(model, lr=args.lr, weight_decay=0.01)
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * max(0.0, (args.steps - s) / args.steps))

    def take_step(loss):
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        return float(loss.detach())

    stream = batch_stream(n_train, args.batch, seed)
    model.train()
    torch.manual_seed(seed + 1000)  # dropout masks: the same for every arm of a seed
    return take_step, stream


def run(arm, seed, train, held, vocab_size, args):
    model = new_model(vocab_size, seed, arm)
    take_step, stream = training(model, arm, seed, len(train), args)
    losses, curve = [], []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = make_batch([train[i] for i in next(stream)], arm)
        nll, keep = token_nll(forward(model, batch), batch[2])
        losses.append(take_step(nll.sum() / keep.sum()))
        if step % args.eval_every == 0 or step == args.steps:
            e = evaluate(model, held, arm)
            curve.append((step, round(e["ppl"], 2)))
            print(f"  {arm:9s} seed {seed} step {step:5d}: train loss (last 50) "
                  f"{sum(losses[-50:]) / len(losses[-50:]):.3f}, held-out ppl {e['ppl']:.2f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    result = evaluate(model, held, arm)
    result.update(arm=arm, seed=seed, seconds=seconds, curve=curve,
                  train_loss_last50=sum(losses[-50:]) / len(losses[-50:]))
    if arm != "plain":
        from syntaxkernels.integrations.transformers import syntax_parameters

        result["syntax_params"] = {k: [round(x, 3) for x in v.detach().flatten().tolist()]
                                   for k, v in syntax_parameters(model).items()}
    return result


def summary(values):
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, sd, min(values), max(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=None, help="one CoNLL-U file, split 90 / 10")
    parser.add_argument("--train", type=pathlib.Path, default=None, help="a training split (with --held-out)")
    parser.add_argument("--held-out", type=pathlib.Path, default=None)
    parser.add_argument("--max-words", type=int, default=60)
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences of --data only (a smoke run)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    train_s, held_s, where = load(args)
    vocab = build_vocab(train_s)
    train = [encode(s, vocab) for s in train_s]
    held = [encode(s, vocab) for s in held_s]
    unk = sum(i == UNK for ids, _ in held for i in ids) / sum(len(ids) - 2 for ids, _ in held)
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    if any(a not in ARMS for a in arms):
        raise SystemExit(f"--arms: choose from {ARMS}")
    print(f"data: {where}; {len(train)} training sentences ({sum(len(i) - 2 for i, _ in train)} words), "
          f"{len(held)} held-out ({sum(len(i) - 2 for i, _ in held)} words, {unk:.1%} <unk>); vocabulary "
          f"{len(vocab)}; steps {args.steps}, batch {args.batch}, lr {args.lr}, seeds {seeds}, arms {arms}, "
          f"{torch.get_num_threads()} thread(s)")

    opened = sum(int((open_prefix(held[s:s + 64]) & (make_batch(held[s:s + 64], "plain")[2][:, 1:] != -100)).sum())
                 for s in range(0, len(held), 64))
    targets = sum(len(ids) - 1 for ids, _ in held)
    print(f"held-out targets {targets}: {opened} ({opened / targets:.1%}) follow an open prefix (an earlier word's "
          f"head still to come: never <eos>); <eos> is {len(held) / (targets - opened):.1%} of the targets after a "
          f"complete prefix, {len(held) / targets:.1%} of all")
    n = check_leak_free_rows(train)
    worst_init = check_init_equal(len(vocab), held[:16])
    worst_peek, whole_moved = check_no_peeking(len(vocab), held)
    print(f"checks passed: leak-free rows independent of later heads (a {n}-token sentence, every cut; whole-tree "
          f"rows do change); fresh syntax logits = plain (max |diff| {worst_init:.2g}); random-table model: later "
          f"words / heads move earlier logits by {worst_peek:.2g} leak-free, {whole_moved:.3g} whole-tree")

    results = dict(conditions=dict(data=where, train_sentences=len(train), held_out_sentences=len(held),
                                   vocab=len(vocab), held_out_unk=unk, steps=args.steps, batch=args.batch,
                                   lr=args.lr, warmup=args.warmup, max_words=args.max_words, seeds=seeds,
                                   model=MODEL, threads=torch.get_num_threads(), torch=torch.__version__,
                                   transformers=transformers.__version__, python=platform.python_version(),
                                   checks=dict(init_max_diff=worst_init, leak_free_max_move=worst_peek,
                                               whole_tree_max_move=whole_moved)),
                   runs=[])
    for seed in seeds:
        for arm in arms:
            r = run(arm, seed, train, held, len(vocab), args)
            results["runs"].append(r)
            print(f"{arm:9s} seed {seed}: held-out ppl {r['ppl']:.2f} (loss {r['loss']:.4f}), without <eos> "
                  f"{r['ppl_words']:.2f} (words after an open prefix {r['ppl_open']:.2f}, after a complete one "
                  f"{r['ppl_closed']:.2f}); train loss {r['train_loss_last50']:.3f}; {r['seconds']:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print("\narm        held-out ppl mean ± sd [min, max]   loss mean    ppl w/o <eos>   seconds/run   "
          "ppl open / complete prefix")
    for arm in arms:
        rs = [r for r in results["runs"] if r["arm"] == arm]
        m, sd, lo, hi = summary([r["ppl"] for r in rs])
        lm = summary([r["loss"] for r in rs])[0]
        wm, wsd, _, _ = summary([r["ppl_words"] for r in rs])
        sec = summary([r["seconds"] for r in rs])[0]
        om, cm = summary([r["ppl_open"] for r in rs])[0], summary([r["ppl_closed"] for r in rs])[0]
        print(f"{arm:9s}  {m:7.2f} ± {sd:5.2f} [{lo:.2f}, {hi:.2f}]   {lm:.4f}   {wm:7.2f} ± {wsd:5.2f}   {sec:6.0f}"
              f"        {om:7.2f} / {cm:7.2f}")
    if "plain" in arms:
        base = {r["seed"]: r["ppl"] for r in results["runs"] if r["arm"] == "plain"}
        for arm in arms:
            if arm != "plain":
                d = [r["ppl"] - base[r["seed"]] for r in results["runs"] if r["arm"] == arm and r["seed"] in base]
                print(f"{arm} - plain, same seed: " + ", ".join(f"{x:+.2f}" for x in d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
