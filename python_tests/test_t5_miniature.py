"""benchmarks/t5_miniature.py: end to end on a few sentences and steps (its figures: benchmarks/RESULTS.md), and its
self-checks fail when what they check is broken."""
import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("transformers")


def _module():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "t5_miniature.py"
    spec = importlib.util.spec_from_file_location("t5_miniature", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.long_on_cpu
def test_runs_every_arm(ud_dev_path, tmp_path):
    """main() end to end; its checks pass on real data (they run before training)."""
    module = _module()
    out = tmp_path / "runs.json"
    assert module.main(["--data", str(ud_dev_path), "--limit", "60", "--steps", "2", "--eval-every", "2",
                        "--batch", "8", "--seeds", "0", "--threads", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert [r["arm"] for r in runs] == list(module.ARMS)
    for r in runs:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["evaluated"] == data["conditions"]["held_out_examples"] > 0
    assert set(runs[1]["syntax_bias"]) == {"0", "1"} and len(runs[1]["syntax_bias"]["0"]) == 12


def test_missing_treebank_skips(monkeypatch, capsys):
    monkeypatch.setenv("SYNTAXKERNELS_UD", "")
    with pytest.raises(SystemExit) as info:
        _module().main(["--quick"])
    assert info.value.code == 0 and "SYNTAXKERNELS_UD" in capsys.readouterr().out


def _items(module, path, n=40):
    import syntaxkernels as sk

    sentences = [s for s in sk.trees.read_conllu(path)][:n]
    vocab = module.task_vocab(sentences)
    return vocab, [x for s in sentences for x in module.examples(s, vocab)]


def test_examples_are_the_head_word(ud_dev_path):
    """The encoding against the CoNLL-U columns directly: marker before the marked word, target its head's id."""
    import syntaxkernels as sk

    module = _module()
    sentence = next(s for s in sk.trees.read_conllu(ud_dev_path) if len(s) >= 8)
    vocab = module.task_vocab([sentence, sentence])  # every word seen twice: none is <unk>
    items = module.examples(sentence, vocab)
    marked = [k for k, h in enumerate(sentence.heads) if h >= 0 and sentence.deprel[k] != "punct"]
    assert [x["mark"] for x in items] == marked
    for x in items:
        k = x["mark"]
        assert x["ids"][k] == vocab[module.MARK] and x["ids"][-1] == module.EOS
        assert x["target"] == vocab[sentence.words[sentence.heads[k]].lower()]
        assert x["offset"] == sentence.heads[k] - k
    assert module.check_examples(items) == len(items)


def test_self_checks_fail_when_broken(ud_dev_path, monkeypatch):
    import torch

    module = _module()
    vocab, items = _items(module, ud_dev_path)
    module.check_examples(items)  # passes as it is (check_init_equal passes in test_runs_every_arm)
    # a target that is not the head (the word after the marked one)
    broken = [dict(x, target=x["ids"][x["mark"] + 2]) for x in items]
    with pytest.raises(SystemExit, match="not the marked word's head"):
        module.check_examples(broken)
    # a syntax model that does not start as the plain one
    new_model = module.new_model

    def shifted(vocab_size, seed, arm):
        from syntaxkernels.integrations.transformers import syntax_parameters

        model = new_model(vocab_size, seed, arm)
        with torch.no_grad():
            for p in syntax_parameters(model).values() if arm != "plain" else ():
                p.copy_(torch.linspace(-3.0, 3.0, p.numel()).reshape(p.shape))
        return model

    monkeypatch.setattr(module, "new_model", shifted)
    with pytest.raises(SystemExit, match="differs from the plain model"):
        module.check_init_equal(len(vocab), items[:4])
