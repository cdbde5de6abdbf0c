"""Attention dropout in training mode (CPU, about a minute): does a fresh "bias" model train like the model it
replaces?

A fresh "bias" layer (zero table, strength 1) computes the unpatched layer's attention exactly in eval mode. In
training mode the two draw different random masks (the fused op's Philox mask, torch's RNG), so one step's loss
differs seed by seed; what must agree is the distribution. This script measures the training-mode loss of one
batch (no optimizer step) over many seeds for:

- ``unpatched``: the pre-trained model as loaded (transformers' attention, dropout on the probabilities);
- ``bias``: ``enable_syntax_attention(method="bias")``, fresh: dropout on the probabilities in the fused op;
- ``bias, output dropout``: the same layers with the op's dropout off and ``F.dropout`` on the attention output
  instead (what the syntax layers did before dropout moved into the kernels).

It prints the mean loss and its standard error per run, the eval-mode loss of each, and the differences of the
means to ``unpatched`` in standard errors. Then, with every dropout but the attention's off (embeddings, hidden
states, classifier), the logits' spread over seeds (the standard deviation over seeds of each valid token's
logits, averaged): where dropout acts decides how much a mask moves the logits, so this tells the placements
apart where the mean loss cannot. Model and data as ``benchmarks/syntax_lr.py`` (the pre-trained
all-MiniLM-L6-v2, UPOS on UD English-EWT dev through ``$SYNTAXKERNELS_UD``); without them it says what is missing
and exits 0 (nothing measured).

    python benchmarks/dropout_check.py [--seeds 64] [--batch 16] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import sys

ROOT_DIR = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT_DIR))
sys.path.insert(0, str(ROOT_DIR / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import data as sk_data  # noqa: E402
from syntax_lr import UPOS, inputs, labels_of, model_dir, sentence_split  # noqa: E402


def losses(model, batch, labels, syntax, seeds):
    """Training-mode loss of ``batch`` for each seed (no gradient, no step), and the eval-mode loss."""
    model.train()
    out = []
    with torch.no_grad():
        for seed in seeds:
            torch.manual_seed(seed)
            out.append(model(**inputs(batch, syntax), labels=labels).loss.item())
        model.eval()
        evaluated = model(**inputs(batch, syntax), labels=labels).loss.item()
    return out, evaluated


def logit_spread(model, batch, syntax, seeds):
    """Mean over valid tokens and classes of the standard deviation over seeds of the training-mode logits, with
    every dropout module but the attention's at p = 0 (restored after)."""
    saved = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and not name.endswith("attention.self.dropout"):
            saved[m] = m.p
            m.p = 0.0
    model.train()
    logits = []
    try:
        with torch.no_grad():
            for seed in seeds:
                torch.manual_seed(seed)
                logits.append(model(**inputs(batch, syntax)).logits)
    finally:
        for m, p in saved.items():
            m.p = p
    valid = batch["attention_mask"].bool()
    return torch.stack(logits).std(0)[valid].mean().item()


def output_dropout():
    """Make the integration's "bias" layers drop the attention output instead of the probabilities."""
    from syntaxkernels.integrations.transformers import SyntaxDistanceBias

    original = SyntaxDistanceBias.forward

    def forward(self, q, k, v, trees, scale=None, dropout_p=0.0):
        out = original(self, q, k, v, trees, scale=scale, dropout_p=0.0)
        return F.dropout(out, p=dropout_p, training=True) if dropout_p > 0.0 else out
    SyntaxDistanceBias.forward = forward
    return lambda: setattr(SyntaxDistanceBias, "forward", original)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=pathlib.Path, help="an unpacked all-MiniLM-L6-v2 (default: the package's)")
    parser.add_argument("--data", type=pathlib.Path, default=None, help="CoNLL-U (default: $SYNTAXKERNELS_UD)")
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.data or sk_data.treebank_path()
    if data is None or not pathlib.Path(data).is_file():
        print(f"dropout_check: {sk_data.missing_message(data)}; nothing measured", file=sys.stderr)
        return 0
    path = model_dir(args.model)
    if path is None:
        return 0
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    collate = sk.trees.TreeCollator(tokenizer=tokenizer, max_length=128)
    train, _ = sentence_split(data, 0)
    batch = collate(train[: args.batch])
    labels = labels_of(batch)
    seeds = range(args.seeds)

    torch.manual_seed(0)  # the fresh 17-way head, the same in every run
    plain = transformers.BertForTokenClassification.from_pretrained(str(path), num_labels=len(UPOS))
    patched = transformers.BertForTokenClassification.from_pretrained(str(path), num_labels=len(UPOS))
    patched.load_state_dict(plain.state_dict())
    enable_syntax_attention(patched, method="bias")
    config = plain.config
    conditions = dict(model=str(path), data=pathlib.Path(data).name, batch=args.batch, seeds=args.seeds,
                      attention_dropout=config.attention_probs_dropout_prob, hidden_dropout=config.hidden_dropout_prob,
                      threads=args.threads, torch=torch.__version__, transformers=transformers.__version__,
                      python=platform.python_version(), machine=platform.machine(),
                      bias_backend="auto (CPU tensors: the C++ kernels)")
    print(json.dumps(conditions), flush=True)
    rows, spread = {}, {}
    rows["unpatched"] = losses(plain, batch, labels, False, seeds)
    spread["unpatched"] = logit_spread(plain, batch, False, seeds)
    rows["bias"] = losses(patched, batch, labels, True, seeds)
    spread["bias"] = logit_spread(patched, batch, True, seeds)
    restore = output_dropout()
    try:
        rows["bias, output dropout"] = losses(patched, batch, labels, True, seeds)
        spread["bias, output dropout"] = logit_spread(patched, batch, True, seeds)
    finally:
        restore()
    results = {}
    base = rows["unpatched"][0]
    base_mean = sum(base) / len(base)
    for name, (values, evaluated) in rows.items():
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1))
        se = sd / math.sqrt(len(values))
        # The difference to unpatched in standard errors of the difference (independent runs).
        se_diff = math.sqrt(se ** 2 + (results["unpatched"]["se"] ** 2 if results else se ** 2))
        z = (mean - base_mean) / se_diff if name != "unpatched" else 0.0
        results[name] = dict(mean=mean, sd=sd, se=se, eval_loss=evaluated, z_vs_unpatched=z,
                             logit_spread_attention_dropout_only=spread[name])
        print(f"{name:<22} train-mode loss {mean:.4f} +- {se:.4f} (sd {sd:.4f}, {len(values)} seeds); "
              f"eval {evaluated:.4f}; mean - unpatched = {mean - base_mean:+.4f} ({z:+.1f} se); logit spread "
              f"(attention dropout only) {spread[name]:.4f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(conditions=conditions, results=results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
