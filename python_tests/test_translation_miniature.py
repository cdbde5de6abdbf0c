"""benchmarks/translation_miniature.py: end to end on a few sentences and steps (its figures: benchmarks/RESULTS.md),
the head-final targets, and its self-checks fail when what they check is broken."""
import importlib
import json
import pathlib

import pytest

pytest.importorskip("transformers")


@pytest.fixture
def module(monkeypatch):
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("translation_miniature")


@pytest.mark.long_on_cpu
def test_end_to_end(module, ud_dev_path, tmp_path):
    """main() on 60 sentences, 2 steps, every arm; its checks pass on real data (they run before training)."""
    path = tmp_path / "runs.json"
    argv = f"--data {ud_dev_path} --limit 60 --steps 2 --eval-every 2 --batch 8 --seeds 0 --json {path}"
    assert module.main(argv.split()) == 0
    data = json.loads(path.read_text())
    assert data["conditions"]["held_out_sentences"] == 6 and data["conditions"]["max_words"] == 20
    assert [r["arm"] for r in data["runs"]] == list(module.ARMS)
    assert all(0.0 <= r[k] <= 1.0 for r in data["runs"] for k in ("exact", "exact_reordered", "token_accuracy"))
    tables = data["runs"][1]["syntax_bias"]
    assert sorted(tables) == ["0", "1"] and all(len(v) == 12 for v in tables.values())


def test_missing_treebank_skips(module, monkeypatch, capsys):
    monkeypatch.setenv("SYNTAXKERNELS_UD", "")
    with pytest.raises(SystemExit) as info:
        module.main(["--quick"])
    assert info.value.code == 0 and "SYNTAXKERNELS_UD" in capsys.readouterr().out


def test_head_final_order(module):
    """A hand-made tree: "the cat saw a dog" (saw the root) -> "the cat a dog saw"; nested and several roots."""
    assert module.head_final([1, 2, -1, 4, 2]) == [0, 1, 3, 4, 2]
    # 0 <- 1 -> 2 -> 3 (1 root): 0 before 1's other dependents; 3 before 2
    assert module.head_final([1, -1, 1, 2]) == [0, 3, 2, 1]
    assert module.head_final([-1, 0, -1]) == [1, 0, 2]


def test_examples_against_conllu(module, ud_dev_path):
    """The encoding against the CoNLL-U columns directly; check_examples passes on real sentences."""
    import syntaxkernels as sk

    sentences = [s for s in sk.trees.read_conllu(ud_dev_path) if 1 <= len(s) <= 20][:40]
    vocab = module.build_vocab(sentences + sentences)  # every word seen twice: none is <unk>
    items = [module.example(s, vocab) for s in sentences]
    for s, x in zip(sentences, items):
        ids = [vocab[w.lower()] for w in s.words]
        assert x["ids"] == ids + [module.EOS] and sorted(x["target"]) == sorted(x["ids"])
        root = s.heads.index(-1)
        assert x["heads"][-1] == root and x["target"][-2] == ids[root]  # a lone root ends the target
    assert module.check_examples(items) == len(items)


def test_self_checks_fail_when_broken(module, ud_dev_path, monkeypatch):
    import syntaxkernels as sk
    import torch

    sentences = [s for s in sk.trees.read_conllu(ud_dev_path) if 4 <= len(s) <= 12][:20]
    vocab = module.build_vocab(sentences)
    items = [module.example(s, vocab) for s in sentences]
    module.check_examples(items)
    # the source order as target (not head-final), and a head-first order
    for wrong in ([dict(x, order=list(range(len(x["order"]))), target=x["ids"]) for x in items],
                  [dict(x, order=x["order"][::-1], target=[x["ids"][w] for w in x["order"][::-1]] + [module.EOS])
                   for x in items]):
        with pytest.raises(SystemExit, match="not the head-final order"):
            module.check_examples(wrong)
    # a syntax model whose table starts non-zero (a bias of 2 between tree neighbours in the first layer): BART's
    # init lets it move the logits by ~1e-5 only, the encoder states by far more
    original = module.new_model

    def neighbours_biased(vocab_size, seed, arm):
        model = original(vocab_size, seed, arm)
        if arm != "plain":
            with torch.no_grad():
                model.model.encoder.layers[0].self_attn.syntax.distance_bias[1] = 2.0
        return model

    monkeypatch.setattr(module, "new_model", neighbours_biased)
    with pytest.raises(SystemExit, match="differs from the plain model"):
        module.check_init_equal(len(vocab), items[:4])
