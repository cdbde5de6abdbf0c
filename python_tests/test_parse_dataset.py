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
    return {c: ds[c] for c in ("words", "heads", "upos", "deprel", "sentence_lengths")}


def test_columns_are_each_texts_parse(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a b c", "a b . c d e", "f"], "label": [1, 0, 1]})
    out = parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path, progress=False)
    assert out.column_names == ["text", "label", "words", "heads", "upos", "deprel", "sentence_lengths"]
    assert out["label"] == [1, 0, 1]
    assert out["words"] == [["a", "b", "c"], ["a", "b", "c", "d", "e"], ["f"]]
    # the two sentences of row 1 form one forest, the second one's heads shifted by the 2 words before it
    assert out["heads"] == [[-1, 0, 1], [-1, 0, -1, 2, 3], [-1]]
    assert out["upos"] == [["X"] * 3, ["X"] * 5, ["X"]]
    assert out["deprel"] == [["root", "dep", "dep"], ["root", "dep", "root", "dep", "dep"], ["root"]]
    assert out["sentence_lengths"] == [[3], [2, 3], [1]]
    assert str(out.features["heads"].feature.dtype) == "int32"
    assert str(out.features["sentence_lengths"].feature.dtype) == "int32"


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


# ----------------------------------------------------------------------------- sentence boundaries


def test_sentence_lengths_delimit_each_rows_sentences(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["a b . c d e . f", "g h"]})
    out = parse_dataset(ds, backward, parser_id="backward", cache_dir=tmp_path, progress=False)
    assert out["sentence_lengths"] == [[2, 3, 1], [2]]
    assert out["heads"][0] == [1, -1, 3, 4, -1, -1]
    row = out[0]
    assert sentence_from_row(row) == parse(["a b . c d e . f"], parser=backward, cache_dir=False)[0]
    split = sentence_from_row(row, split_sentences=True)
    assert split == parse(["a b . c d e . f"], parser=backward, cache_dir=False, split_sentences=True)[0]
    assert [s.heads for s in split] == [[1, -1], [1, 2, -1], [-1]]
    assert [s.upos for s in split] == [["Y"] * 2, ["Y"] * 3, ["Y"]]
    # a row without the column (written before it existed) is one sentence
    old = {k: v for k, v in row.items() if k != "sentence_lengths"}
    assert sentence_from_row(old) == sentence_from_row(row)
    assert len(sentence_from_row(old, split_sentences=True)) == 1


def test_sentence_lengths_are_checked():
    row = {"text": "a b c", "words": ["a", "b", "c"], "heads": [-1, 0, 1], "sentence_lengths": [2, 1]}
    with pytest.raises(ValueError, match=r"word 2 \(sentence 1, words 2..2\) has head 1, outside its sentence"):
        sentence_from_row(row)
    with pytest.raises(ValueError, match=r"add up to 4 words but 'words' has 3"):
        sentence_from_row({**row, "sentence_lengths": [2, 2]})
    with pytest.raises(ValueError, match=r"'sentence_lengths'\[1\] = 0"):
        sentence_from_row({**row, "sentence_lengths": [3, 0]})
    with pytest.raises(ValueError, match="'heads' has 2 entries but 'words' has 3"):
        sentence_from_row({**row, "heads": [-1, 0], "sentence_lengths": [3]})
    assert sentence_from_row({**row, "sentence_lengths": [3]}).heads == [-1, 0, 1]


# ----------------------------------------------------------------------------- TreeCollator(tokenizer=...) on rows


def _tokenizer(texts, folder, special=True):
    """The package's offline WordPiece tokenizer, with [CLS] ... [SEP] added around each sequence when ``special``."""
    pytest.importorskip("tokenizers")
    from tokenizers.processors import TemplateProcessing

    from syntaxkernels.tools.testing import wordpiece_tokenizer

    tok = wordpiece_tokenizer(texts, folder, vocab_size=60)
    if special:
        cls, sep = tok.convert_tokens_to_ids("[CLS]"), tok.convert_tokens_to_ids("[SEP]")
        tok.backend_tokenizer.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


ROW_TEXTS = ["the cat sat . it purred loudly", "dogs bark", "a dog barked at the cat . cats hiss . ok"]


def test_collator_takes_parsed_rows_directly(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ROW_TEXTS, "label": [2, 0, 1], "source": ["x", "y", "z"]})
    parsed = parse_dataset(ds, chain, parser_id="chain", cache_dir=tmp_path / "parses", progress=False)
    tok = _tokenizer(ROW_TEXTS, tmp_path)
    collator = TreeCollator(tokenizer=tok)
    loader = torch.utils.data.DataLoader(parsed, batch_size=3, collate_fn=collator)
    batch = next(iter(loader))
    # the same batch as the Sentence items of sk.trees.parse give (the route the package had)
    expected = collator(parse(ROW_TEXTS, parser=chain, cache_dir=False))
    for key in ("input_ids", "attention_mask", "lengths"):
        assert torch.equal(batch[key], expected[key]), key
    for name in ("heads", "distance", "depth", "lengths"):
        assert torch.equal(getattr(batch["trees"], name), getattr(expected["trees"], name)), name
    assert batch["word_ids"] == expected["word_ids"] and batch["sentences"] == expected["sentences"]
    assert batch["sentences"][0].text == ROW_TEXTS[0]
    assert batch["sentence_lengths"] == [[3, 3], [2], [6, 2, 1]]
    assert batch["label"].tolist() == [2, 0, 1] and batch["source"] == ["x", "y", "z"]
    assert "words" not in batch and "heads" not in batch and "text" not in batch
    # by hand for row 1, "dogs bark" = [CLS] dog ##s bark [SEP]: [CLS] roots the sequence, "dog" (the first piece of
    # the chain's root word) hangs from it, "##s" from "dog", "bark" from "dog", [SEP] from [CLS]
    assert tok.convert_ids_to_tokens(batch["input_ids"][1, :5]) == ["[CLS]", "dog", "##s", "bark", "[SEP]"]
    assert batch["trees"].heads[1, :5].tolist() == [-1, 0, 1, 1, 0]
    # the tree batch is aligned to the tokenizer's tokens: one entry per valid token
    assert batch["trees"].heads.shape == batch["input_ids"].shape
    assert batch["lengths"].tolist() == batch["attention_mask"].sum(1).tolist()


def test_collator_on_rows_reads_sentence_boundaries(tmp_path):
    tok = _tokenizer(ROW_TEXTS, tmp_path)
    collator = TreeCollator(tokenizer=tok)
    row = {"text": "dogs bark", "words": ["dogs", "bark"], "heads": [-1, 0], "upos": [], "deprel": [],
           "sentence_lengths": [2]}
    assert collator([row])["word_ids"] == [[None, 0, 0, 1, None]]  # [CLS] dog ##s bark [SEP]
    assert collator([row])["trees"].heads[0].tolist() == [-1, 0, 1, 1, 0]
    # a head that crosses the boundary the row states is refused, naming the item; without the column it is one
    # sentence, and the same heads are a tree
    crossing = {**row, "heads": [-1, 0], "sentence_lengths": [1, 1]}
    with pytest.raises(ValueError, match="batch item 1: .*word 1 .*outside its sentence"):
        collator([row, crossing])
    two_roots = {**row, "heads": [-1, -1], "sentence_lengths": [1, 1]}
    batch = collator([row, two_roots])
    assert batch["sentence_lengths"] == [[2], [1, 1]]
    # both sentence roots hang from [CLS] (connect=True)
    assert batch["trees"].heads[1].tolist() == [-1, 0, 1, 0, 0]


def test_collator_on_rows_options_and_errors(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ROW_TEXTS})
    parsed = parse_dataset(ds, chain, parser_id="chain", cache_dir=False, progress=False)
    rows = [parsed[i] for i in range(len(parsed))]
    tok = _tokenizer(ROW_TEXTS, tmp_path)
    sentences = parse(ROW_TEXTS, parser=chain, cache_dir=False)
    for options in (dict(packed=True), dict(max_length=6), dict(word_level=True), dict(connect=False),
                    dict(variant="release")):
        got, want = TreeCollator(tokenizer=tok, **options)(rows), TreeCollator(tokenizer=tok, **options)(sentences)
        for key in ("input_ids", "lengths"):
            assert torch.equal(got[key], want[key]), (options, key)
        assert torch.equal(got["trees"].distance, want["trees"].distance), options
    # without a tokenizer the rows stay dict items (word-level trees), as before
    assert TreeCollator()(rows)["lengths"].tolist() == [len(s.words) for s in sentences]
    with pytest.raises(ValueError, match="column 'lengths'"):
        TreeCollator(tokenizer=tok)([{**r, "lengths": 3} for r in rows])
    with pytest.raises(ValueError, match="batch item 1 has keys"):
        TreeCollator(tokenizer=tok)([rows[0], {k: v for k, v in rows[1].items() if k != "upos"}])
    # the collator still pickles (DataLoader workers)
    import pickle

    again = pickle.loads(pickle.dumps(TreeCollator(tokenizer=tok)))
    assert torch.equal(again(rows)["input_ids"], TreeCollator(tokenizer=tok)(rows)["input_ids"])
