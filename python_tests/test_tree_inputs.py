"""Tree inputs: CoNLL-U reader, head conventions, stanza conversion, subword alignment, DataLoader collation.

The tokenizers are built locally (WordPiece + BertPreTokenizer + TemplateProcessing wrapped in
PreTrainedTokenizerFast): no hub download.
"""
import importlib.util
import io
import pickle
import random
import re

import numpy as np
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.specs import UNREACHABLE
from syntaxkernels.trees import (
    Sentence,
    StanzaModelsNotFoundError,
    TreeCollator,
    align_batch,
    align_to_tokens,
    collate_trees,
    from_conllu_heads,
    from_self_root,
    from_stanza,
    parse_with_stanza,
    read_conllu,
)

pytestmark = pytest.mark.filterwarnings("ignore:syntaxkernels. the C\\+\\+ extension:RuntimeWarning")

# --------------------------------------------------------------------------------------------- CoNLL-U

HAND = (
    "# newdoc id = d1\n"
    "# sent_id = s1\n"
    "# text = I don't know.\n"
    "1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t4:nsubj\t_\n"
    "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t4:aux\t_\n"
    "3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t4:advmod\t_\n"
    "4\tknow\tknow\tVERB\tVB\t_\t0\troot\t0:root\tSpaceAfter=No\n"
    "5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t4:punct\t_\n"
    "\n"
    "\n"
    "# sent_id = s2\n"
    "1\tSue\tSue\tPROPN\tNNP\t_\t2\tnsubj\t2:nsubj\t_\n"
    "2\tlikes\tlike\tVERB\tVBZ\t_\t0\troot\t0:root\t_\n"
    "3\tcoffee\tcoffee\tNOUN\tNN\t_\t2\tobj\t2:obj\t_\n"
    "4\tand\tand\tCCONJ\tCC\t_\t5\tcc\t5:cc\t_\n"
    "4.1\tlikes\tlike\tVERB\tVBZ\t_\t_\t_\t2:conj:and\tCopyOf=2\n"
    "5\ttea\ttea\tNOUN\tNN\t_\t3\tconj\t4.1:obj\t_\n"
)


def test_read_hand_written_multiword_and_empty_nodes():
    s1, s2 = read_conllu(HAND)
    assert s1.words == ["I", "do", "n't", "know", "."]
    assert s1.heads == [3, 3, 3, -1, 3]
    assert s1.upos == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert s1.deprel == ["nsubj", "aux", "advmod", "root", "punct"]
    assert s1.lemmas[2] == "not" and s1.xpos[0] == "PRP" and s1.misc[3] == "SpaceAfter=No"
    assert s1.multiword_tokens == [(1, 2, "don't")]
    assert s1.sent_id == "s1" and s1.text == "I don't know."
    assert s1.comments == ["newdoc id = d1", "sent_id = s1", "text = I don't know."]
    assert s1.roots == [3]
    # the empty node 4.1 is skipped; word 5 keeps its basic head (3 -> index 2)
    assert s2.words == ["Sue", "likes", "coffee", "and", "tea"]
    assert s2.heads == [1, -1, 1, 4, 2]
    assert s2.text is None and s2.multiword_tokens == []
    tb = sk.TreeBatch.from_heads([s1.heads, s2.heads])
    assert tb.distance[0, 0, 4].item() == 2 and tb.distance[1, 0, 4].item() == 3


def test_read_sources_agree(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_text(HAND, encoding="utf-8")
    crlf = HAND.replace("\n", "\r\n")
    results = [read_conllu(path), read_conllu(str(path)), read_conllu(io.StringIO(HAND)), read_conllu(crlf),
               read_conllu(HAND + "\n\n\n"), read_conllu("\ufeff" + HAND)]
    for r in results[1:]:
        assert r == results[0]
    # one-line text (no newline) is recognised by its tabs
    (one,) = read_conllu("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t0:root\t_")
    assert one.words == ["Hi"] and one.heads == [-1]
    assert read_conllu("\n\n") == [] and read_conllu("# only a comment\n") == []


def test_to_conllu_round_trip():
    sentences = read_conllu(HAND)
    again = read_conllu("".join(s.to_conllu() for s in sentences))
    assert [s.words for s in again] == [s.words for s in sentences]
    assert [s.heads for s in again] == [s.heads for s in sentences]
    assert again[0].multiword_tokens == sentences[0].multiword_tokens
    assert again[0].sent_id == "s1"


def _line(cols):
    return "\t".join(cols) + "\n"


GOOD = ["1", "a", "a", "X", "X", "_", "0", "root", "_", "_"]
SECOND = ["2", "b", "b", "X", "X", "_", "1", "dep", "_", "_"]


@pytest.mark.parametrize(
    "text, line, pattern",
    [
        (_line(GOOD) + "2\tb\tb\tX\n", 2, "expected 10 tab-separated columns, got 4"),
        (_line(GOOD) + _line(SECOND[:6] + ["x"] + SECOND[7:]), 2, "head 'x' of word 2 is not an integer"),
        (_line(GOOD) + _line(SECOND[:6] + ["_"] + SECOND[7:]), 2, "not an integer"),
        (_line(GOOD) + _line(SECOND[:6] + ["7"] + SECOND[7:]), 2, "head 7 of word 2 out of range"),
        (_line(GOOD) + _line(SECOND[:6] + ["-1"] + SECOND[7:]), 2, "negative"),
        (_line(GOOD) + _line(SECOND[:6] + ["2"] + SECOND[7:]), 2, "its own head"),
        ("# c\n" + _line(GOOD) + _line(["3"] + SECOND[1:]), 3, "word ID 3 out of sequence"),
        (_line(["x"] + GOOD[1:]), 1, "bad word ID 'x'"),
        (_line(["1-x"] + GOOD[1:]), 1, "bad multiword token range"),
        (_line(GOOD) + _line(["2-3"] + GOOD[1:]) + _line(SECOND), 2, "goes past the last word"),
        (_line(["1", "a", "a", "X", "X", "_", "2", "dep", "_", "_"]) + _line(["2", "b", "b", "X", "X", "_", "1", "dep", "_", "_"]),
         1, r"cycle \(1 -> 2 -> 1\)"),
    ],
    ids=["columns", "head-word", "head-underscore", "head-range", "head-negative", "self-loop", "id-sequence",
         "bad-id", "bad-range", "range-past-end", "cycle"],
)
def test_read_errors_name_the_line(text, line, pattern):
    with pytest.raises(ValueError, match=rf"<text>, line {line}: .*{pattern}"):
        read_conllu(text)


def test_read_missing_file_and_bad_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_conllu(tmp_path / "absent.conllu")
    with pytest.raises(ValueError, match="path_or_text"):
        read_conllu(3)
    with pytest.raises(ValueError, match="2 words but 1 heads"):
        Sentence(words=["a", "b"], heads=[-1])
    with pytest.raises(ValueError, match="2 words but 1 upos"):
        Sentence(words=["a", "b"], heads=[-1, 0], upos=["X"])


def test_ud_dev_treebank(ud_dev_path):
    sentences = read_conllu(ud_dev_path)
    assert len(sentences) == 2001
    lines = ud_dev_path.read_text(encoding="utf-8").splitlines()
    word_lines = [ln for ln in lines if re.match(r"^\d+\t", ln)]
    range_lines = [ln for ln in lines if re.match(r"^\d+-\d+\t", ln)]
    assert sum(len(s) for s in sentences) == len(word_lines)
    assert sum(len(s.multiword_tokens) for s in sentences) == len(range_lines) > 0
    assert any(re.match(r"^\d+\.\d+\t", ln) for ln in lines)  # the file has empty nodes; they were skipped
    assert sentences[0].heads == [2, 2, 3, -1, 5, 3, 3]
    assert sentences[0].words == ["From", "the", "AP", "comes", "this", "story", ":"]
    for s in sentences:
        assert len(s.roots) == 1 and s.deprel[s.roots[0]] == "root"
        assert s.sent_id is not None and s.text is not None
    # every sentence is a valid tree: build them in chunks, each is one connected tree
    for start in range(0, len(sentences), 500):
        chunk = sentences[start:start + 500]
        tb = sk.TreeBatch.from_heads([s.heads for s in chunk])
        valid = ~tb.key_padding_mask()
        assert bool((tb.segment[valid] == 0).all())
        assert bool((tb.depth[valid] >= 0).all())
    # heads agree with the raw HEAD column
    raw_heads = [int(ln.split("\t")[6]) for ln in word_lines]
    assert [h for s in sentences for h in s.heads] == [h - 1 for h in raw_heads]


# ------------------------------------------------------------------------------------- head conventions

def test_from_conllu_heads():
    assert from_conllu_heads([2, 0, 2]) == [1, -1, 1]
    assert from_conllu_heads([[2, 0], [0]]) == [[1, -1], [-1]]  # ragged
    out = from_conllu_heads(np.array([[2, 0, 2]], dtype=np.int32))
    assert isinstance(out, np.ndarray) and out.tolist() == [[1, -1, 1]]
    t = from_conllu_heads(torch.tensor([[2, 0, 2], [0, -100, -100]]), ignore_index=-100)
    assert t.tolist() == [[1, -1, 1], [-1, -100, -100]]
    with pytest.raises(ValueError, match=">= 0"):
        from_conllu_heads([2, -1, 2])
    with pytest.raises(ValueError, match="integer"):
        from_conllu_heads(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="not an integer"):
        from_conllu_heads([1, "a"])


def test_from_self_root():
    assert from_self_root([1, 1, 1]) == [1, -1, 1]
    assert from_self_root([[0, 0], [1, 1, 1]]) == [[-1, 0], [1, -1, 1]]
    t = from_self_root(torch.tensor([[1, 1, 1], [0, 0, 7]]), ignore_index=7)
    assert t.tolist() == [[1, -1, 1], [-1, 0, 7]]
    a = from_self_root(np.array([2, 2, 2]))
    assert a.tolist() == [2, 2, -1]
    with pytest.raises(ValueError, match=">= 0"):
        from_self_root([0, -1])
    # agrees with the CoNLL-U conversion on a real tree
    conllu = [3, 3, 4, 0, 6, 4, 4]
    self_root = [2, 2, 3, 3, 5, 3, 3]
    assert from_self_root(self_root) == from_conllu_heads(conllu)


# ---------------------------------------------------------------------------------------------- stanza

#: stanza is an optional dependency (the [test] extra); the GPU machine, for one, does not have it.
needs_stanza = pytest.mark.skipif(importlib.util.find_spec("stanza") is None,
                                  reason="stanza is not installed (optional: pip install stanza, or the [test] extra)")

def _compare(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.words == b.words and a.heads == b.heads and a.upos == b.upos and a.deprel == b.deprel
        assert a.lemmas == b.lemmas and a.xpos == b.xpos
        assert a.multiword_tokens == b.multiword_tokens
        assert a.sent_id == b.sent_id and a.text == b.text


@needs_stanza
def test_from_stanza_hand_written():
    from stanza.utils.conll import CoNLL

    doc = CoNLL.conll2doc(input_str=HAND)
    _compare(from_stanza(doc), read_conllu(HAND))


@needs_stanza
def test_from_stanza_treebank(ud_dev_path):
    from stanza.utils.conll import CoNLL

    lines = ud_dev_path.read_text(encoding="utf-8").split("\n\n")
    text = "\n\n".join(lines[:400]) + "\n\n"
    _compare(from_stanza(CoNLL.conll2doc(input_str=text)), read_conllu(text))


@needs_stanza
def test_from_stanza_errors():
    import stanza

    doc = stanza.Document([[{"id": 1, "text": "a"}, {"id": 2, "text": "b"}]])
    with pytest.raises(ValueError, match="depparse"):
        from_stanza(doc)
    with pytest.raises(ValueError, match="stanza Document"):
        from_stanza(["not", "a", "doc"])


def test_parse_with_stanza_missing_models_is_clear(tmp_path):
    with pytest.raises(StanzaModelsNotFoundError) as info:
        parse_with_stanza("Sue likes tea.", model_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and "resources.json" in message
    assert "stanza.download('en'" in message and "never downloads" in message
    assert isinstance(info.value, FileNotFoundError)
    (tmp_path / "resources.json").write_text("{}")
    with pytest.raises(StanzaModelsNotFoundError, match="resources.json has no entry for 'en'"):
        parse_with_stanza("Sue likes tea.", model_dir=str(tmp_path))
    (tmp_path / "resources.json").write_text('{"fr": {"lang_name": "French"}}')
    with pytest.raises(StanzaModelsNotFoundError, match="no fr/ subdirectory"):
        parse_with_stanza([["Bonjour", "."]], lang="fr", model_dir=tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "resources.json"]  # nothing was downloaded


@needs_stanza
def test_parse_with_stanza_builds_a_no_download_pipeline(tmp_path, monkeypatch):
    import stanza

    import syntaxkernels.trees.stanza as stanza_helpers

    monkeypatch.setattr(stanza_helpers, "_PIPELINES", {})
    (tmp_path / "resources.json").write_text('{"fr": {"lang_name": "French"}}')
    (tmp_path / "fr").mkdir()
    calls = []

    def missing_model(**kwargs):
        calls.append(kwargs)
        raise FileNotFoundError(2, "No such file", str(tmp_path / "fr" / "pos" / "gsd.pt"))

    monkeypatch.setattr(stanza, "Pipeline", missing_model)
    with pytest.raises(StanzaModelsNotFoundError, match=re.escape(str(tmp_path / "fr" / "pos" / "gsd.pt"))):
        parse_with_stanza([["Bonjour", "."]], lang="fr", model_dir=tmp_path)
    assert calls[0]["download_method"] is None and calls[0]["dir"] == str(tmp_path)
    assert calls[0]["tokenize_pretokenized"] is True and calls[0]["use_gpu"] is False

    def built(**kwargs):
        calls.append(kwargs)
        return _FakePipeline(HAND)

    monkeypatch.setattr(stanza, "Pipeline", built)
    for _ in range(2):  # the second call reuses the cached pipeline
        out = parse_with_stanza("Du texte.", lang="fr", model_dir=tmp_path, processors="tokenize,pos,lemma,depparse")
    _compare(out, read_conllu(HAND))
    assert len(calls) == 2 and calls[1]["tokenize_pretokenized"] is False


class _FakePipeline:
    """Stands in for a stanza Pipeline: records its input, returns a fixed parsed Document."""

    def __init__(self, conllu):
        self.conllu = conllu
        self.inputs = []

    def __call__(self, document):
        from stanza.utils.conll import CoNLL

        self.inputs.append(document)
        return CoNLL.conll2doc(input_str=self.conllu)


@needs_stanza
def test_parse_with_stanza_inputs():
    fake = _FakePipeline(HAND)
    out = parse_with_stanza("I don't know. Sue likes coffee and tea", pipeline=fake)
    _compare(out, read_conllu(HAND))
    parse_with_stanza(["Sue", "likes", "tea"], pipeline=fake)
    parse_with_stanza([["Sue", "likes"], ["tea", "."]], pipeline=fake)
    assert fake.inputs == ["I don't know. Sue likes coffee and tea", [["Sue", "likes", "tea"]],
                           [["Sue", "likes"], ["tea", "."]]]
    with pytest.raises(ValueError, match="list of token strings"):
        parse_with_stanza([["Sue"], "tea"], pipeline=fake)
    with pytest.raises(ValueError, match="empty"):
        parse_with_stanza([["Sue"], []], pipeline=fake)


# ------------------------------------------------------------------------------------------- tokenizers

WORDPIECES = ["the", "cat", "##s", "un", "##believ", "##able", ".", "a", "dog", "ran", "quick", "##ly",
              "play", "##ing", "##ed", "on", "mat", "sue", "like", "tea", "and"]


def _bert_like(vocab_words, **kwargs):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {w: i for i, w in enumerate(specials + [w for w in vocab_words if w not in specials])}
    core = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return _bert_like(WORDPIECES)


def _assert_one_tree(heads, lengths=None):
    """Every row builds a valid TreeBatch with exactly one root per sequence."""
    tb = sk.TreeBatch.from_heads(heads, lengths)
    valid = ~tb.key_padding_mask()
    assert bool((tb.segment[valid] == 0).all()), tb.segment
    for b in range(tb.batch_size):
        n = int(tb.lengths[b])
        assert int((tb.heads[b, :n] == -1).sum()) == (1 if n else 0)
    return tb


CATS = Sentence(words=["the", "cats", "unbelievable", "."], heads=[1, -1, 1, 1])


def test_align_single_text_by_hand(tokenizer):
    enc = tokenizer(CATS.words, is_split_into_words=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "the", "cat", "##s", "un", "##believ", "##able", ".", "[SEP]"]
    heads = align_to_tokens(CATS, enc.word_ids())
    assert heads == [-1, 2, 0, 2, 2, 4, 4, 2, 0]
    _assert_one_tree([heads])
    # connect=False: the sentence is its own tree; [CLS] roots the special tokens' tree
    loose = align_to_tokens([CATS], enc.word_ids(), connect=False)
    assert loose == [-1, 2, -1, 2, 2, 4, 4, 2, 0]
    tb = sk.TreeBatch.from_heads([loose])
    assert tb.segment[0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 0]
    # plain head lists work as sentences too
    assert align_to_tokens(CATS.heads, enc.word_ids()) == heads


def test_align_text_of_several_sentences(tokenizer):
    s1 = Sentence(words=["the", "cats", "ran"], heads=[1, 2, -1])
    s2 = Sentence(words=["a", "dog", "played"], heads=[1, 2, -1])
    enc = tokenizer(s1.words + s2.words, is_split_into_words=True)
    assert enc.word_ids() == [None, 0, 1, 1, 2, 3, 4, 5, 5, None]
    heads = align_to_tokens([s1, s2], enc.word_ids())
    assert heads == [-1, 2, 4, 2, 0, 6, 7, 0, 7, 0]
    _assert_one_tree([heads])
    loose = align_to_tokens([s1, s2], enc.word_ids(), connect=False)
    assert loose == [-1, 2, 4, 2, -1, 6, 7, -1, 7, 0]
    tb = sk.TreeBatch.from_heads([loose])
    assert len(set(tb.segment[0].tolist())) == 3  # two sentences and the special tokens
    assert tb.distance[0, 1, 6].item() == UNREACHABLE


def test_align_sentence_pair(tokenizer):
    a = Sentence(words=["sue", "likes", "tea"], heads=[1, -1, 1])
    b1 = Sentence(words=["the", "cats"], heads=[1, -1])
    b2 = Sentence(words=["dog", "ran"], heads=[1, -1])
    enc = tokenizer(a.words, b1.words + b2.words, is_split_into_words=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "sue", "like", "##s", "tea", "[SEP]", "the", "cat", "##s", "dog", "ran", "[SEP]"]
    assert enc.word_ids() == [None, 0, 1, 1, 2, None, 0, 1, 1, 2, 3, None]
    heads = align_to_tokens([a, [b1, b2]], enc.word_ids(), sequence_ids=enc.sequence_ids())
    assert heads == [-1, 2, 0, 2, 2, 0, 7, 0, 7, 10, 0, 0]
    _assert_one_tree([heads])
    loose = align_to_tokens([a, [b1, b2]], enc.word_ids(), sequence_ids=enc.sequence_ids(), connect=False)
    assert sorted(i for i, h in enumerate(loose) if h == -1) == [0, 2, 7, 10]
    sk.TreeBatch.from_heads([loose])
    with pytest.raises(ValueError, match="pass sequence_ids"):
        align_to_tokens([a, b1, b2], enc.word_ids())
    # a single text passed where one text per sequence id is expected: clear message
    single = tokenizer(a.words, is_split_into_words=True)
    with pytest.raises(ValueError, match="one text per sequence id"):
        align_to_tokens([a, b1], single.word_ids(), sequence_ids=single.sequence_ids())
    assert align_to_tokens([a], single.word_ids(), sequence_ids=single.sequence_ids()) == \
        align_to_tokens(a, single.word_ids())


def test_align_without_special_tokens(tokenizer):
    s1 = Sentence(words=["the", "cats"], heads=[1, -1])
    s2 = Sentence(words=["dog", "ran"], heads=[1, -1])
    enc = tokenizer(s1.words + s2.words, is_split_into_words=True, add_special_tokens=False)
    assert enc.word_ids() == [0, 1, 1, 2, 3]
    assert align_to_tokens([s1, s2], enc.word_ids()) == [1, -1, 1, 4, 1]
    assert align_to_tokens([s1, s2], enc.word_ids(), connect=False) == [1, -1, 1, 4, -1]


def test_align_errors(tokenizer):
    enc = tokenizer(CATS.words, is_split_into_words=True)
    ids = enc.word_ids()
    with pytest.raises(ValueError, match=r"word_ids\[2\] = 9 out of range: text 0 has 4 words"):
        align_to_tokens(CATS, ids[:2] + [9] + ids[3:])
    with pytest.raises(ValueError, match=r"no token for word\(s\) 2, 3.*missing_words='reattach'"):
        align_to_tokens(CATS, ids[:4] + [None])
    with pytest.raises(ValueError, match="no token belongs to it"):
        align_to_tokens(CATS, [None, None])
    with pytest.raises(ValueError, match="go back"):
        align_to_tokens(CATS, [None, 0, 1, 0, 2, 3, None])
    with pytest.raises(ValueError, match="not an integer or None"):
        align_to_tokens(CATS, [None, 0, "1", 2, 3, None])
    with pytest.raises(ValueError, match="sequence_ids has 2 entries"):
        align_to_tokens([CATS], ids, sequence_ids=[None, 0])
    with pytest.raises(ValueError, match=r"sequence_ids\[1\] is None"):
        align_to_tokens([CATS], ids, sequence_ids=[None] * len(ids))
    with pytest.raises(ValueError, match="sentence 0, word 1: head 4 out of range"):
        align_to_tokens([[1, 4, 1, 1]], ids)
    with pytest.raises(ValueError, match="self-loop"):
        align_to_tokens([1, 1, 1, 1], ids)
    with pytest.raises(ValueError, match="must be a text"):
        align_to_tokens("the cats", ids)
    with pytest.raises(ValueError, match="missing_words"):
        align_to_tokens(CATS, ids, missing_words="drop")


def test_align_batch_padding_and_encoding(tokenizer):
    sentences = [CATS, Sentence(words=["a", "dog"], heads=[1, -1]),
                 Sentence(words=["sue", "likes", "tea", "and", "the", "cats"], heads=[1, -1, 1, 5, 5, 2])]
    enc = tokenizer([s.words for s in sentences], is_split_into_words=True, padding=True, return_tensors="pt")
    heads, lengths = align_batch(sentences, enc)
    assert heads.shape == enc["input_ids"].shape
    assert lengths.tolist() == enc["attention_mask"].sum(1).tolist()
    assert heads[1, int(lengths[1]):].eq(-1).all()
    for b, s in enumerate(sentences):
        n = int(lengths[b])
        assert heads[b, :n].tolist() == align_to_tokens(s, enc.word_ids(b)[:n])
    _assert_one_tree(heads, lengths)
    # without the attention mask the padding tokens (word id None) attach to [CLS]: still one tree
    raw_heads, raw_lengths = align_batch(sentences, [enc.word_ids(b) for b in range(3)])
    assert raw_lengths.tolist() == [enc["input_ids"].shape[1]] * 3
    assert raw_heads[1, int(lengths[1]):].eq(0).all()
    _assert_one_tree(raw_heads, raw_lengths)
    with pytest.raises(ValueError, match="left padding"):
        align_batch(sentences, [enc.word_ids(b) for b in range(3)], attention_mask=enc["attention_mask"].flip(1))
    with pytest.raises(ValueError, match="batch item 1: .*out of range"):
        align_batch([CATS, CATS], [enc.word_ids(0), [None, 0, 5, None]])
    with pytest.raises(ValueError, match="sentences has 2 items"):
        align_batch(sentences[:2], enc)
    # unpadded list output of the tokenizer: ragged rows
    ragged = tokenizer([s.words for s in sentences], is_split_into_words=True)
    r_heads, r_lengths = align_batch(sentences, ragged)
    assert torch.equal(r_heads, heads[:, : r_heads.shape[1]]) and torch.equal(r_lengths, lengths)


def test_align_truncation_reattaches(tokenizer):
    # "the quick cats ran on the mat": cats <- the, quick; ran root; mat <- on, the; ran -> cats, mat
    s = Sentence(words=["the", "quick", "cats", "ran", "on", "the", "mat"], heads=[2, 2, 3, -1, 6, 6, 3])
    enc = tokenizer(s.words, is_split_into_words=True, truncation=True, max_length=5)
    assert tokenizer.convert_ids_to_tokens(enc["input_ids"]) == ["[CLS]", "the", "quick", "cat", "[SEP]"]
    with pytest.raises(ValueError, match="missing_words='reattach'"):
        align_to_tokens(s, enc.word_ids())
    heads = align_to_tokens(s, enc.word_ids(), missing_words="reattach")
    # "cats" lost its "##s" but keeps its first piece; its head "ran" is cut, and "ran" is the root,
    # so "cats" becomes a sentence root and attaches to [CLS]
    assert heads == [-1, 3, 3, 0, 0]
    _assert_one_tree([heads])
    # a missing word in the middle of a chain: "mat" climbs past the missing "on" to "the"
    chain = Sentence(words=["the", "on", "mat", "dog"], heads=[-1, 0, 1, 2])
    ids = [None, 0, 2, 3, None]  # word 1 has no piece (e.g. a word the normaliser erased)
    assert align_to_tokens(chain, ids, missing_words="reattach") == [-1, 0, 1, 2, 0]
    # left truncation cuts the first pieces of a word: its first remaining piece represents it
    left = _bert_like(WORDPIECES, truncation_side="left")
    s2 = Sentence(words=["unbelievable", "cats"], heads=[1, -1])
    enc2 = left(s2.words, is_split_into_words=True, truncation=True, max_length=5)
    assert left.convert_ids_to_tokens(enc2["input_ids"]) == ["[CLS]", "##able", "cat", "##s", "[SEP]"]
    heads2 = align_to_tokens(s2, enc2.word_ids(), missing_words="reattach")
    assert heads2 == [-1, 2, 0, 2, 0]
    _assert_one_tree([heads2])


def _random_tree(rng, n):
    order = list(range(n))
    rng.shuffle(order)
    heads = [-1] * n
    for k in range(1, n):
        heads[order[k]] = order[rng.randrange(k)]
    return heads


def _nearest_present(heads, w, present):
    h = heads[w]
    while h != -1 and h not in present:
        h = heads[h]
    return h


def test_align_random_pairs_truncation_and_padding(tokenizer):
    """Random texts, pairs, truncation and padding: every row is one valid tree and obeys the rules."""
    rng = random.Random(0)
    words = ["the", "cats", "unbelievable", ".", "a", "dog", "ran", "quickly", "playing", "played", "mat",
             "zebra", "sue", "tea"]
    for trial in range(12):
        batch, pairs = [], rng.random() < 0.5
        for _ in range(4):
            texts = []
            for _ in range(2 if pairs else 1):
                sents = [Sentence(words=[rng.choice(words) for _ in range(n)], heads=_random_tree(rng, n))
                         for n in [rng.randint(1, 7) for _ in range(rng.randint(1, 3))]]
                texts.append(sents)
            batch.append(texts)
        flat = [[w for s in text for w in s.words] for texts in batch for text in texts[:1]]
        max_length = rng.choice([None, 12, 20])
        kwargs = dict(is_split_into_words=True, padding=True, return_tensors="pt",
                      truncation=max_length is not None, max_length=max_length)
        if pairs:
            second = [[w for s in texts[1] for w in s.words] for texts in batch]
            enc = tokenizer(flat, second, **kwargs)
            seq_ids = [enc.sequence_ids(b) for b in range(len(batch))]
            sentences = batch
        else:
            enc = tokenizer(flat, **kwargs)
            seq_ids = None
            sentences = [texts[0] for texts in batch]
        for connect in (True, False):
            heads, lengths = align_batch(sentences, enc, sequence_ids=seq_ids, connect=connect,
                                         missing_words="reattach")
            if connect:
                _assert_one_tree(heads, lengths)
            else:
                sk.TreeBatch.from_heads(heads, lengths)
        # the rules, checked token by token on the connected trees
        heads, lengths = align_batch(sentences, enc, sequence_ids=seq_ids, missing_words="reattach")
        for b in range(len(batch)):
            wids = enc.word_ids(b)
            sids = enc.sequence_ids(b) if pairs else [None if w is None else 0 for w in wids]
            texts = batch[b] if pairs else [batch[b][0]]
            first, cls = {}, None
            for p in range(int(lengths[b])):
                if wids[p] is None:
                    cls = p if cls is None else cls
                else:
                    first.setdefault((sids[p], wids[p]), p)
            for p in range(int(lengths[b])):
                h = int(heads[b, p])
                if wids[p] is None:
                    assert h == (-1 if p == cls else cls)
                    continue
                key = (sids[p], wids[p])
                if first[key] != p:
                    assert h == first[key]
                    continue
                text_heads, offset = [], 0
                for s in texts[sids[p]]:
                    text_heads += [-1 if x == -1 else x + offset for x in s.heads]
                    offset += len(s)
                present = {w for (t, w) in first if t == sids[p]}
                target = _nearest_present(text_heads, wids[p], present)
                assert h == (cls if target == -1 else first[(sids[p], target)])


@pytest.fixture
def char_tokenizer(ud_dev_path):
    """A WordPiece tokenizer with a few whole words and every character as a piece: real words split."""
    text = ud_dev_path.read_text(encoding="utf-8").lower()
    chars = sorted({c for c in text if not c.isspace()})
    vocab = ["the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "was", "on"]
    vocab += chars + ["##" + c for c in chars]
    return _bert_like(vocab)


def test_align_ud_treebank_with_real_tokenizer(ud_dev_path, char_tokenizer):
    sentences = read_conllu(ud_dev_path)[:300]
    for start in range(0, len(sentences), 100):
        chunk = sentences[start:start + 100]
        enc = char_tokenizer([s.words for s in chunk], is_split_into_words=True, padding=True,
                             truncation=True, max_length=96, return_tensors="pt")
        assert max(len(enc.word_ids(b)) for b in range(len(chunk))) == 96  # some rows were truncated
        assert any(enc.word_ids(0).count(w) > 1 for w in range(len(chunk[0])))  # words split into pieces
        heads, lengths = align_batch(chunk, enc, missing_words="reattach")
        tb = _assert_one_tree(heads, lengths)
        # pieces of a word are at distance 1 from its first piece; the [CLS] root has depth 0
        assert bool((tb.depth[:, 0] == 0).all())
        # untruncated rows: word-level distances are preserved between first pieces
        for b, s in enumerate(chunk[:10]):
            wids = enc.word_ids(b)
            if wids.count(None) != 2 or len(s) < 2 or enc["attention_mask"][b].sum() == 96:
                continue
            first = [wids.index(w) for w in range(len(s))]
            word_tb = sk.TreeBatch.from_heads([s.heads])
            idx = torch.tensor(first)
            assert torch.equal(tb.distance[b][idx][:, idx], word_tb.distance[0])


# ------------------------------------------------------------------------------------------- collation

def _dict_items(tokenizer):
    sentences = [CATS, Sentence(words=["a", "dog"], heads=[1, -1]),
                 Sentence(words=["sue", "likes", "tea", "and", "the", "cats"], heads=[1, -1, 1, 5, 5, 2]),
                 Sentence(words=["quickly"], heads=[-1])]
    items = []
    for k, s in enumerate(sentences):
        enc = tokenizer(s.words, is_split_into_words=True)
        items.append({"input_ids": enc["input_ids"], "token_type_ids": torch.tensor(enc.encodings[0].type_ids),
                      "heads": align_to_tokens(s, enc.word_ids()), "label": k, "id": f"s{k}"})
    return items


def test_collate_dict_items(tokenizer):
    items = _dict_items(tokenizer)
    batch = collate_trees(items, pad_token_id=tokenizer.pad_token_id)
    lengths = [len(it["input_ids"]) for it in items]
    n = max(lengths)
    assert batch["input_ids"].shape == (4, n) and batch["input_ids"].dtype == torch.int64
    assert batch["lengths"].tolist() == lengths
    assert batch["attention_mask"].sum(1).tolist() == lengths
    for b, it in enumerate(items):
        assert batch["input_ids"][b, : lengths[b]].tolist() == it["input_ids"]
        assert batch["input_ids"][b, lengths[b]:].eq(tokenizer.pad_token_id).all()
    assert batch["token_type_ids"].shape == (4, n)
    assert batch["label"].tolist() == [0, 1, 2, 3] and batch["id"] == ["s0", "s1", "s2", "s3"]
    trees = batch["trees"]
    expected = sk.TreeBatch.from_heads([it["heads"] for it in items])
    for name in ("heads", "lengths", "distance", "depth", "segment"):
        assert torch.equal(getattr(trees, name), getattr(expected, name)), name
    assert trees.distance.shape == (4, n, n)


def test_collate_sentences(tokenizer):
    sentences = [CATS, Sentence(words=["the", "quick", "cats", "ran", "on", "the", "mat"],
                                heads=[2, 2, 3, -1, 6, 6, 3])]
    word_level = collate_trees(sentences)
    assert word_level["lengths"].tolist() == [4, 7]
    assert word_level["trees"].distance.shape == (2, 7, 7) and word_level["words"][0] == CATS.words
    token_level = TreeCollator(tokenizer=tokenizer, max_length=6)(sentences)
    assert token_level["input_ids"].shape == (2, 6)
    assert token_level["lengths"].tolist() == [6, 6]
    _assert_one_tree(token_level["trees"].heads, token_level["trees"].lengths)
    assert token_level["word_ids"][1] == [None, 0, 1, 2, 2, None]
    full = TreeCollator(tokenizer=tokenizer)(sentences)
    heads, lengths = align_batch(sentences, tokenizer([s.words for s in sentences], is_split_into_words=True,
                                                      padding=True, return_tensors="pt"))
    assert torch.equal(full["trees"].heads[:, : heads.shape[1]], heads)


def test_collate_errors(tokenizer):
    items = _dict_items(tokenizer)
    bad = dict(items[1], input_ids=items[1]["input_ids"][:-1])
    with pytest.raises(ValueError, match="batch item 1: 'input_ids' has 3 entries but 'heads' has 4"):
        collate_trees([items[0], bad])
    with pytest.raises(ValueError, match="batch item 0 has no 'heads' key"):
        collate_trees([{"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match="all be dicts"):
        collate_trees([items[0], CATS])
    with pytest.raises(ValueError, match="empty batch"):
        collate_trees([])
    cyclic = dict(items[0], heads=[1, 2, 1] + items[0]["heads"][3:])
    with pytest.raises(ValueError, match="batch item 1, token 1: on a cycle"):
        collate_trees([items[0], cyclic])
    with pytest.raises(ValueError, match="keys"):
        collate_trees([items[0], {k: v for k, v in items[1].items() if k != "label"}])


def test_collate_labels_are_checked_and_padded_with_minus_100(tokenizer):
    items = _dict_items(tokenizer)[:2]
    n = [len(it["heads"]) for it in items]
    tagged = [dict(it, labels=list(range(len(it["heads"])))) for it in items]
    batch = collate_trees(tagged)
    assert isinstance(batch["labels"], torch.Tensor) and batch["labels"].shape == (2, max(n))
    for b, length in enumerate(n):
        assert batch["labels"][b, :length].tolist() == list(range(length))
        assert batch["labels"][b, length:].eq(-100).all()
    assert collate_trees(tagged, pad_values={"labels": -1})["labels"][n.index(min(n)), -1] == -1
    # one label per sequence (sequence classification): stacked
    assert collate_trees([dict(it, labels=b) for b, it in enumerate(items)])["labels"].tolist() == [0, 1]
    short = dict(tagged[1], labels=tagged[1]["labels"][:-1])
    with pytest.raises(ValueError, match=rf"batch item 1: 'labels' has {n[1] - 1} entries but 'heads' has {n[1]}"):
        collate_trees([tagged[0], short])
    with pytest.raises(ValueError, match=rf"batch item 1: 'labels' has no entries \(it is the int 3\) but 'heads' has {n[1]}"):
        collate_trees([tagged[0], dict(tagged[1], labels=3)])  # per-token labels mixed with a scalar
    with pytest.raises(ValueError, match="batch item 0: 'labels' must be a 1-D sequence of numbers"):
        collate_trees([dict(tagged[0], labels=["NOUN"] * n[0]), tagged[1]])


class _ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_collate_in_dataloader_workers_and_pin_memory(tokenizer):
    items = _dict_items(tokenizer) * 3
    collator = TreeCollator(pad_token_id=tokenizer.pad_token_id)
    clone = pickle.loads(pickle.dumps(collator))
    assert repr(clone) == repr(collator)
    with_tok = pickle.loads(pickle.dumps(TreeCollator(tokenizer=tokenizer, max_length=8)))
    assert with_tok([CATS])["input_ids"].shape == (1, 8)
    serial = list(torch.utils.data.DataLoader(_ListDataset(items), batch_size=4, collate_fn=collator))
    parallel = list(torch.utils.data.DataLoader(_ListDataset(items), batch_size=4, collate_fn=collator,
                                                num_workers=2, pin_memory=torch.cuda.is_available()))
    assert len(serial) == len(parallel) == 3
    for x, y in zip(serial, parallel):
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["trees"].distance, y["trees"].distance)
        assert torch.equal(x["trees"].segment, y["trees"].segment)
        if torch.cuda.is_available():
            assert y["trees"].distance.is_pinned() and y["input_ids"].is_pinned()
    sentences_loader = torch.utils.data.DataLoader(_ListDataset([CATS] * 4), batch_size=2, num_workers=2,
                                                   collate_fn=TreeCollator(tokenizer=tokenizer))
    for batch in sentences_loader:
        _assert_one_tree(batch["trees"].heads, batch["trees"].lengths)


# ------------------------------------------------------------------------------- where the treebank comes from


def test_treebank_path_follows_the_environment(tmp_path, monkeypatch):
    from syntaxkernels import data
    from syntaxkernels.tools import workloads
    from syntaxkernels.tools.checks import trees as tree_checks

    small = tmp_path / "tiny.conllu"
    small.write_text(HAND)
    monkeypatch.setenv(data.ENV_VAR, str(small))
    assert data.ENV_VAR == "SYNTAXKERNELS_UD"
    assert data.treebank_path() == small and data.require_treebank() == small
    assert workloads.treebank_heads() == [list(s.heads) for s in read_conllu(HAND)]
    ok, detail = tree_checks.check_treebank("cpu")
    assert ok and f"{len(read_conllu(HAND))} treebank sentences" in detail
    monkeypatch.delenv(data.ENV_VAR)
    assert data.treebank_path() is None and not data.treebank_available()  # never looked for elsewhere
    with pytest.raises(FileNotFoundError, match="SYNTAXKERNELS_UD is unset"):
        data.require_treebank()


def test_a_missing_treebank_says_how_to_provide_it(tmp_path, monkeypatch):
    from syntaxkernels import data
    from syntaxkernels.tools.checks import Skip
    from syntaxkernels.tools.checks import trees as tree_checks

    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "absent.conllu"))
    assert not data.treebank_available()
    with pytest.raises(FileNotFoundError, match="SYNTAXKERNELS_UD=.*absent.conllu does not name an existing file"):
        data.require_treebank()
    with pytest.raises(Skip, match="set SYNTAXKERNELS_UD to a CoNLL-U file"):
        tree_checks.check_treebank("cpu")
    source, batches = tree_checks.benchmark_batches(32, count=2)
    assert "generated" in source and "SYNTAXKERNELS_UD" in source and len(batches) == 2
    monkeypatch.setenv(data.ENV_VAR, "")  # empty counts as unset
    assert data.treebank_path() is None


# --------------------------------------------------------------------------------------------- import errors


_BREAK_A_READER = """
import importlib.abc, sys

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "syntaxkernels.trees.align":
            raise ImportError("simulated bug inside syntaxkernels.trees.align")
        return None

sys.meta_path.insert(0, Broken())
try:
    import syntaxkernels.trees
except ImportError as exc:
    print("raised:", exc)
else:
    print("imported; align_to_tokens present:", hasattr(syntaxkernels.trees, "align_to_tokens"))
"""


def test_a_broken_reader_module_fails_the_import_loudly():
    """An ImportError inside one of the package's own tree modules propagates; it never silently removes names
    (such as align_to_tokens) from syntaxkernels.trees."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _BREAK_A_READER], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "raised: simulated bug inside syntaxkernels.trees.align" in run.stdout, run.stdout


def test_every_tree_name_is_exported():
    for name in ["TreeBatch", "tree_distance", "Sentence", "read_conllu", "from_conllu_heads", "from_self_root",
                 "from_stanza", "parse_with_stanza", "StanzaModelsNotFoundError", "align_to_tokens", "align_batch",
                 "TreeCollator", "collate_trees"]:
        assert name in sk.trees.__all__ and hasattr(sk.trees, name), name


def test_parse_with_stanza_without_stanza_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    for name in ["stanza"] + [m for m in list(sys.modules) if m.startswith("stanza.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing stanza now fails as if it were not installed
    monkeypatch.delenv("STANZA_RESOURCES_DIR", raising=False)
    with pytest.raises(ImportError, match="pip install stanza"):
        parse_with_stanza("Sue likes tea.")  # default model directory: stanza's own
    (tmp_path / "resources.json").write_text('{"en": {"lang_name": "English"}}')
    (tmp_path / "en").mkdir()
    with pytest.raises(ImportError, match="pip install stanza"):
        parse_with_stanza("Sue likes tea.", model_dir=tmp_path)  # models there, library missing


def test_verify_reports_a_listed_check_module_that_does_not_exist(monkeypatch):
    """A module listed in checks.MODULES that cannot be imported, even because it does not exist, is a failed
    check (it is never skipped silently)."""
    from syntaxkernels.tools import checks

    monkeypatch.setattr(checks, "MODULES", ["syntaxkernels.tools.checks.no_such_module"])
    [(name, module, error)] = list(checks._modules())
    assert name == "syntaxkernels.tools.checks.no_such_module" and module is None
    assert isinstance(error, ModuleNotFoundError) and not isinstance(error, checks.Skip)
    rows = checks.run_checks("cpu", select="something else")
    assert [(r["check"], r["status"]) for r in rows] == [("syntaxkernels.tools.checks.no_such_module", "FAIL")]
    assert "no_such_module" in rows[0]["detail"]
