"""benchmarks/causal_lm_miniature.py: end to end on a few sentences and steps (its figures: benchmarks/RESULTS.md),
and its self-checks fail when what they check is broken."""
import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("transformers")


def _module():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "causal_lm_miniature.py"
    spec = importlib.util.spec_from_file_location("causal_lm_miniature", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.long_on_cpu
def test_runs_every_arm(ud_dev_path, tmp_path):
    module = _module()
    out = tmp_path / "runs.json"
    assert module.main(["--data", str(ud_dev_path), "--limit", "120", "--steps", "2", "--eval-every", "2",
                        "--batch", "8", "--seeds", "0", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["arm"] for r in runs] == list(module.ARMS)
    for r in runs:
        assert r["ppl"] > 1 and r["targets"] == r["word_targets"] + 12  # 12 held-out sentences: one <eos> each
        assert r["open_word_targets"] < r["word_targets"]


def _items(module, path, n=150):
    import syntaxkernels as sk

    sentences = [s for s in sk.trees.read_conllu(path)][:n]
    vocab = module.build_vocab(sentences)
    return vocab, [module.encode(s, vocab) for s in sentences]


def test_self_checks_fail_when_broken(ud_dev_path, monkeypatch):
    import torch

    module = _module()
    vocab, items = _items(module, ud_dev_path)
    # the checks pass as they are
    module.check_leak_free_rows(items)
    module.check_init_equal(len(vocab), items[:4])
    module.check_no_peeking(len(vocab), items)
    # whole-tree batches handed out as leak-free: the model then sees later heads
    make_batch = module.make_batch
    monkeypatch.setattr(module, "make_batch",
                        lambda it, kind: make_batch(it, "wholetree" if kind == "leakfree" else kind))
    with pytest.raises(SystemExit, match="leak-free logits"):
        module.check_no_peeking(len(vocab), items)
    monkeypatch.setattr(module, "make_batch", make_batch)
    # a syntax model that does not start as the plain one
    new_model = module.new_model

    def shifted(vocab_size, seed, arm):
        from syntaxkernels.integrations.transformers import syntax_parameters

        model = new_model(vocab_size, seed, arm)
        with torch.no_grad():
            for p in syntax_parameters(model).values() if arm != "plain" else ():
                p.copy_(torch.linspace(-1.0, 1.0, p.numel()).reshape(p.shape))
        return model

    monkeypatch.setattr(module, "new_model", shifted)
    with pytest.raises(SystemExit, match="differs from the plain model"):
        module.check_init_equal(len(vocab), items[:4])
