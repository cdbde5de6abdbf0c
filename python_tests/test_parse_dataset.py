"""sk.trees.parse_dataset: a corpus parsed once through 🤗 datasets (Arrow columns, the SQLite parse cache)."""
import sqlite3
import sys

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.trees import Sentence, TreeCollator, parse, parse_dataset, sentence_from_row

datasets = pytest.importorskip("datasets")


# Module-level parsers, so they pickle for num_proc=2. A text's sentences end at " . "; words are split on spaces.

def _sentences(text):
    return [part.split() for part in text.split(" . ") if part.split()]


def chain(text):
    """Each word headed by the previous one, the first the root."""
    out = []
    for words in _sentences(text):
        n = len(words)
        out.append(Sentence(words=words, heads=[-1] + list(range(n - 1)), upos=["X"] * n,
                            deprel=["root"] + ["dep"] * (n - 1)))
    return out


def backward(text):
    """Each word headed by the next one, the last the root (a different parser of the same texts)."""
    out = []
    for words in _sentences(text):
        n = len(words)
        out.append(Sentence(words=words, heads=list(range(1, n)) + [-1], upos=["Y"] * n,
                            deprel=["back"] * (n - 1) + ["root"]))
    return out


class Recording:
    """Wraps a parser, records the texts it is given, and raises once it has parsed ``fail_after`` texts."""

    def __init__(self, parser, fail_after=None):
        self.parser, self.fail_after, self.seen = parser, fail_after, []

    def __call__(self, text):
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise RuntimeError("parser crashed")
        self.seen.append(text)
        return self.parser(text)


TEXTS = [f"w{i} x{i} y{i % 3}" + (f" . z{i} q" if i % 4 == 0 else "") for i in range(23)]


def _cached_entries(directory):
    db = sqlite3.connect(str(directory / "parses.sqlite"))
    try:
        return dict(db.execute("SELECT parser, COUNT(*) FROM parses GROUP BY parser").fetchall())
    finally:
        db.close()


def _columns(ds):
    return {c: ds[c] for c in ("words", "heads", "upos", "deprel")}


def test_columns_are_each_texts_parse(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "a b . c d e", "f"], "label": [1, 0, 1]})
    out = parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, progress=False)
    assert out.column_names == ["text", "label", "words", "heads", "upos", "deprel"]
    assert out["label"] == [1, 0, 1]
    assert out["words"] == [["a", "b", "c"], ["a", "b", "c", "d", "e"], ["f"]]
    # the two sentences of row 1 form one forest, the second one's heads shifted by the 2 words before it
    assert out["heads"] == [[-1, 0, 1], [-1, 0, -1, 2, 3], [-1]]
    assert out["upos"] == [["X"] * 3, ["X"] * 5, ["X"]]
    assert out["deprel"] == [["root", "dep", "dep"], ["root", "dep", "root", "dep", "dep"], ["root"]]
    assert str(out.features["heads"].feature.dtype) == "int32"


def test_rows_feed_tree_collator_and_come_back_as_sentences(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "d . e f"]})
    out = parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, progress=False)
    rows = [out[i] for i in range(len(out))]
    batch = TreeCollator()(rows)  # dict items: word-level trees from "heads"
    assert batch["lengths"].tolist() == [3, 3]
    expected = TreeCollator()([Sentence(words=["a", "b", "c"], heads=[-1, 0, 1]),
                               Sentence(words=["d", "e", "f"], heads=[-1, -1, 1])])
    assert torch.equal(batch["trees"].distance, expected["trees"].distance)
    sentences = [sentence_from_row(r) for r in rows]
    assert sentences == parse(["a b c", "d . e f"], parser=chain, cache_dir=False)
    assert sentences[1].text == "d . e f" and sentences[1].heads == [-1, -1, 1]


def test_a_crash_loses_no_parse_and_a_rerun_parses_only_the_rest(tmp_path):
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    k = 11  # in the second map batch of 8: the batch in progress keeps its first 3 parses
    crashing = Recording(chain, fail_after=k)
    with pytest.raises(RuntimeError, match="parser crashed"):
        parse_dataset(ds, crashing, parser_id="chain", cache_dir=tmp_path, batch_size=8, progress=False)
    assert crashing.seen == TEXTS[:k]
    assert _cached_entries(tmp_path) == {"chain": k}
    rerun = Recording(chain)
    out = parse_dataset(ds, rerun, parser_id="chain", cache_dir=tmp_path, batch_size=8, progress=False)
    assert rerun.seen == TEXTS[k:]
    fresh = parse_dataset(ds, chain, parser_id="chain", cache_dir=False, progress=False)
    assert _columns(out) == _columns(fresh)
    again = Recording(chain)
    parse_dataset(ds, again, parser_id="chain", cache_dir=tmp_path, batch_size=5, progress=False)
    assert again.seen == []


def test_two_parsers_of_the_same_texts_are_kept_apart(tmp_path):
    # a dataset on disk: datasets then keeps the map's output in its own Arrow cache too
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "ds"))
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    cache = tmp_path / "parses"
    a = parse_dataset(ds, chain, parser_id="chain", cache_dir=cache, progress=False)
    b_parser = Recording(backward)
    b = parse_dataset(ds, b_parser, parser_id="backward", cache_dir=cache, progress=False)
    assert b_parser.seen == TEXTS  # not the chain parses under another name
    assert _cached_entries(cache) == {"chain": len(TEXTS), "backward": len(TEXTS)}
    assert a["heads"][1] == [-1, 0, 1] and b["heads"][1] == [1, 2, -1]
    assert b["upos"][1] == ["Y"] * 3 and b["deprel"][1] == ["back", "back", "root"]
    a_again = Recording(chain)
    assert _columns(parse_dataset(ds, a_again, parser_id="chain", cache_dir=cache, progress=False)) == _columns(a)
    assert a_again.seen == []


def test_two_processes_share_the_cache(tmp_path):
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    two = parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, num_proc=2, batch_size=4,
                        progress=False)
    assert _cached_entries(tmp_path) == {"chain": len(TEXTS)}
    one = parse_dataset(ds, chain, parser_id="chain", cache_dir=False, progress=False)
    assert _columns(two) == _columns(one)
    rerun = Recording(chain)
    parse_dataset(ds, rerun, parser_id="chain", cache_dir=tmp_path, progress=False)
    assert rerun.seen == []


def test_dataset_dict_and_duplicate_texts(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b", "a b", "c"]}),
                               "dev": datasets.Dataset.from_dict({"text": ["a b"]})})
    counting = Recording(chain)
    out = parse_dataset(dd, counting, parser_id="chain", cache_dir=tmp_path, progress=False)
    assert isinstance(out, datasets.DatasetDict)
    assert out["train"]["heads"] == [[-1, 0], [-1, 0], [-1]] and out["dev"]["heads"] == [[-1, 0]]
    assert counting.seen == ["a b", "c"]


def test_progress_line_on_stderr(tmp_path, capfd):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "d e"]})
    parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, progress=True)
    err = capfd.readouterr().err
    assert "parse_dataset: 2 texts, 5 words in" in err and "words/s" in err


def test_errors(tmp_path, monkeypatch):
    ds = datasets.Dataset.from_dict({"text": ["a b", "  ", "c"]})
    with pytest.raises(ValueError, match="row 1: the text is empty"):
        parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="no column 'sentence'"):
        parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, text_column="sentence", progress=False)
    with pytest.raises(ValueError, match="plain callable.*parser_id"):
        parse_dataset(ds, chain, cache_dir=tmp_path, progress=False)
    with pytest.raises(TypeError, match="sk.trees.parse"):
        parse_dataset(["a b"], chain, parser_id="chain", cache_dir=tmp_path)
    bad = datasets.Dataset.from_dict({"text": ["a b", "c d"]})
    with pytest.raises(TypeError, match="for row 1"):
        parse_dataset(bad, lambda t: chain(t) if t == "a b" else "nonsense", parser_id="bad", cache_dir=tmp_path,
                      progress=False)
    with pytest.raises(ValueError, match="no 'heads' column"):
        sentence_from_row({"words": ["a"]})
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets"):
        parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path)


def test_exported():
    assert sk.trees.parse_dataset is parse_dataset and sk.trees.sentence_from_row is sentence_from_row
