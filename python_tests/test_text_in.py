"""Text in: ``from_spacy`` and the cached parsing front ``sk.trees.parse`` (stanza or spaCy pipelines).

Real library objects are built without downloaded models: spaCy ``Doc(vocab, words=..., heads=..., deps=...)``
and a spaCy ``Language`` whose parser is trained here for a few steps on two sentences; stanza Documents from
stanza's CoNLL reader. A counting fake pipeline checks the cache; a real pre-trained parser is used where the
environment has one (skipped otherwise).
"""
import importlib.util

import pytest

import syntaxkernels as sk
from syntaxkernels.trees import (
    Sentence,
    TreeCollator,
    align_to_tokens,
    from_spacy,
    join_sentences,
    parse,
    parser_identity,
    read_conllu,
)

needs_spacy = pytest.mark.skipif(importlib.util.find_spec("spacy") is None,
                                 reason="spaCy is not installed (optional: pip install spacy, or the [test] extra)")
needs_stanza = pytest.mark.skipif(importlib.util.find_spec("stanza") is None,
                                  reason="stanza is not installed (optional: pip install stanza, or the [test] extra)")

CONLLU = """# text = I saw her.
1\tI\tI\tPRON\tPRP\t_\t2\tnsubj\t_\t_
2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_
3\ther\tshe\tPRON\tPRP\t_\t2\tobj\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_

# text = She ran home
1\tShe\tshe\tPRON\tPRP\t_\t2\tnsubj\t_\t_
2\tran\trun\tVERB\tVBD\t_\t0\troot\t_\t_
3\thome\thome\tADV\tRB\t_\t2\tadvmod\t_\t_

"""


def _spacy_doc(words, heads, deps, **kw):
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    return Doc(Vocab(), words=words, heads=heads, deps=deps, **kw)


def _two_sentence_doc():
    # spaCy heads are document indices; a root is its own head.
    return _spacy_doc(["I", "saw", "her", ".", "She", "ran", "home"], [1, 1, 1, 1, 5, 5, 5],
                      ["nsubj", "ROOT", "obj", "punct", "nsubj", "ROOT", "advmod"],
                      spaces=[True, True, False, True, True, True, False],
                      pos=["PRON", "VERB", "PRON", "PUNCT", "PRON", "VERB", "ADV"],
                      lemmas=["I", "see", "she", ".", "she", "run", "home"])


# ------------------------------------------------------------------------------------------------ from_spacy


@needs_spacy
def test_from_spacy_sentence_by_sentence():
    doc = _two_sentence_doc()
    sentences = from_spacy(doc)
    reference = read_conllu(CONLLU)
    assert [s.words for s in sentences] == [s.words for s in reference]
    assert [s.heads for s in sentences] == [s.heads for s in reference] == [[1, -1, 1, 1], [1, -1, 1]]
    assert [s.upos for s in sentences] == [s.upos for s in reference]
    assert [s.lemmas for s in sentences] == [s.lemmas for s in reference]
    assert sentences[0].deprel == ["nsubj", "ROOT", "obj", "punct"]
    assert sentences[0].misc[2] == "SpaceAfter=No" and sentences[0].misc[0] == "_"
    assert sentences[0].xpos == ["_"] * 4  # no tag given: "_"
    assert [s.text for s in sentences] == ["I saw her.", "She ran home"]
    # A Span (one sentence) converts alone.
    assert from_spacy(list(doc.sents)[1])[0].heads == [1, -1, 1]


@needs_spacy
def test_from_spacy_feeds_align_and_the_collator():
    sentences = from_spacy(_two_sentence_doc())
    # word ids of a tokenizer that splits "saw" into two pieces, with [CLS] ... [SEP]
    word_ids = [None, 0, 1, 1, 2, 3, None]
    heads = align_to_tokens(sentences[0], word_ids)
    assert heads == [-1, 2, 0, 2, 2, 2, 0]
    batch = TreeCollator()(sentences)
    assert batch["trees"].lengths.tolist() == [4, 3]
    assert batch["trees"].distance[0, 0, 2].item() == 2  # I -> saw -> her


@needs_spacy
def test_from_spacy_errors_name_what_was_passed():
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    with pytest.raises(ValueError, match="no dependency parse"):
        from_spacy(Doc(Vocab(), words=["a", "b"]))
    with pytest.raises(ValueError, match="expected a parsed spaCy Doc.*got str"):
        from_spacy("I saw her")
    with pytest.raises(ValueError, match="got list"):
        from_spacy([1, 2])


# ------------------------------------------------------------------------------------------------ parse


class CountingParser:
    """A fake pipeline: counts its calls and returns real library objects."""

    def __init__(self, make):
        self.make = make
        self.calls = []

    def __call__(self, text):
        self.calls.append(text)
        return self.make(text)


def _spacy_parse(text):
    words = text.replace(".", " .").split()
    # a chain: each word's head is the next one, the last word is the root (its own head)
    return _spacy_doc(words, [min(i + 1, len(words) - 1) for i in range(len(words))],
                      ["dep"] * (len(words) - 1) + ["ROOT"])


@needs_spacy
def test_parse_caches_on_disk_keyed_by_parser_and_text(tmp_path):
    fake = CountingParser(_spacy_parse)
    texts = ["a b c.", "d e", "a b c."]
    first = parse(texts, parser=fake, cache_dir=tmp_path, parser_id="chain-v1")
    assert fake.calls == ["a b c.", "d e"]  # a repeated text is parsed once
    assert [s.words for s in first] == [["a", "b", "c", "."], ["d", "e"], ["a", "b", "c", "."]]
    assert first[1].heads == [1, -1] and first[0].text == "a b c."
    assert (tmp_path / "parses.sqlite").is_file()

    again = parse(texts + ["f g"], parser=fake, cache_dir=tmp_path, parser_id="chain-v1")
    assert fake.calls == ["a b c.", "d e", "f g"]  # only the new text is parsed
    assert again[:3] == first
    # another parser identity does not see these entries
    parse(["d e"], parser=fake, cache_dir=tmp_path, parser_id="chain-v2")
    assert fake.calls[-1] == "d e" and len(fake.calls) == 4
    # no cache: parsed every time
    parse(["d e"], parser=fake, cache_dir=False)
    assert len(fake.calls) == 5


@needs_spacy
def test_parse_cache_round_trips_every_field(tmp_path):
    fake = CountingParser(lambda text: _two_sentence_doc())
    fresh = parse(["x"], parser=fake, cache_dir=tmp_path, parser_id="p", split_sentences=True)
    cached = parse(["x"], parser=fake, cache_dir=tmp_path, parser_id="p", split_sentences=True)
    assert len(fake.calls) == 1
    assert cached == fresh == [from_spacy(_two_sentence_doc())]


@needs_spacy
def test_parse_joins_a_texts_sentences_into_a_forest(tmp_path):
    fake = CountingParser(lambda text: _two_sentence_doc())
    (joined,) = parse(["I saw her. She ran home"], parser=fake, cache_dir=False)
    assert joined.heads == [1, -1, 1, 1, 5, -1, 5] and joined.roots == [1, 5]
    assert joined.text == "I saw her. She ran home" and len(joined.upos) == 7
    assert joined == join_sentences(from_spacy(_two_sentence_doc()), text="I saw her. She ran home")
    trees = sk.TreeBatch.from_heads([joined.heads])
    assert trees.segment[0].tolist() == [0, 0, 0, 0, 1, 1, 1]  # two trees
    # ready for the tokenizer alignment: [CLS] roots both sentences
    heads = align_to_tokens(joined, [None, 0, 1, 2, 3, 4, 5, 6, None])
    assert heads == [-1, 2, 0, 2, 2, 6, 0, 6, 0]


@needs_stanza
def test_parse_takes_a_pipeline_returning_stanza_documents(tmp_path):
    from stanza.utils.conll import CoNLL

    fake = CountingParser(lambda text: CoNLL.conll2doc(input_str=CONLLU))
    out = parse(["I saw her. She ran home"], parser=fake, cache_dir=tmp_path, parser_id="conll",
                split_sentences=True)
    assert [[s.heads for s in text] for text in out] == [[[1, -1, 1, 1], [1, -1, 1]]]
    assert out[0][0].deprel == ["nsubj", "root", "obj", "punct"]
    parse(["I saw her. She ran home"], parser=fake, cache_dir=tmp_path, parser_id="conll")
    assert len(fake.calls) == 1


def test_parse_rejects_what_is_not_a_parser():
    with pytest.raises(TypeError, match="got str 'en_core_web_sm'.*spacy.load"):
        parse(["a"], parser="en_core_web_sm")
    with pytest.raises(TypeError, match="got int 3"):
        parse(["a"], parser=3)
    with pytest.raises(TypeError, match="the class .*Sentence"):
        parse(["a"], parser=Sentence)
    with pytest.raises(TypeError, match=r"returned dict .* for texts\[0\]"):
        parse(["a"], parser=lambda text: {"words": ["a"]}, cache_dir=False)


def test_parse_checks_texts_and_the_cache_identity(tmp_path):
    def fake(text):
        return [Sentence(words=text.split(), heads=[-1] + [0] * (len(text.split()) - 1))]

    with pytest.raises(ValueError, match="plain callable.*parser_id"):
        parse(["a"], parser=fake, cache_dir=tmp_path)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        parse(["a", 3], parser=fake, cache_dir=False)
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        parse(["  "], parser=fake, cache_dir=False)
    with pytest.raises(TypeError, match="got int"):
        parse(5, parser=fake, cache_dir=False)
    # a parser that returns Sentences works, and one str is one text
    assert parse("a b", parser=fake, cache_dir=False)[0].heads == [-1, 0]
    assert parser_identity(fake) is None


@pytest.fixture(scope="module")
def trained_spacy_parser():
    """A real spaCy pipeline with a dependency parser, trained here for a few steps (no download)."""
    spacy = pytest.importorskip("spacy")
    from spacy.training import Example

    nlp = spacy.blank("en")
    parser = nlp.add_pipe("parser")
    data = [("The cat sat.", [2, 2, 2, 2], ["det", "nsubj", "ROOT", "punct"]),
            ("Dogs bark loudly.", [1, 1, 1, 1], ["nsubj", "ROOT", "advmod", "punct"])]
    examples = [Example.from_dict(nlp.make_doc(t), {"heads": h, "deps": d}) for t, h, d in data]
    for example in examples:
        for token in example.reference:
            parser.add_label(token.dep_)
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(5):
        nlp.update(examples, sgd=optimizer)
    return nlp


def test_parse_with_a_real_spacy_language(trained_spacy_parser, tmp_path, monkeypatch):
    nlp = trained_spacy_parser
    texts = ["The dog sat.", "Cats bark loudly. The cat sat."]
    monkeypatch.setenv("SYNTAXKERNELS_CACHE_DIR", str(tmp_path))  # the default cache directory
    out = parse(texts, parser=nlp, split_sentences=True)
    assert out == [from_spacy(nlp(t)) for t in texts]
    assert (tmp_path / "parses.sqlite").is_file()
    identity = parser_identity(nlp)
    assert identity.startswith("spacy-") and "parser" in identity

    # the second call reads the cache: the pipeline is not run again
    calls = []
    original = nlp.pipe
    monkeypatch.setattr(nlp, "pipe", lambda *a, **k: (calls.append(a), original(*a, **k))[1])
    assert parse(texts, parser=nlp, split_sentences=True) == out and calls == []
    # the joined form feeds the collator directly
    batch = TreeCollator()(parse(texts, parser=nlp))
    assert batch["trees"].lengths.tolist() == [4, 8]


def test_parse_with_a_spacy_pipeline_without_parser_says_so(tmp_path):
    spacy = pytest.importorskip("spacy")
    with pytest.raises(ValueError, match="no dependency parse.*'parser' component"):
        parse(["a b"], parser=spacy.blank("en"), cache_dir=tmp_path)


def test_parse_with_a_pretrained_parser_when_installed(tmp_path):
    """A real pre-trained parser: spaCy's en_core_web_sm, or stanza's English models, when installed."""
    parsers = []
    if importlib.util.find_spec("spacy") is not None:
        import spacy

        if spacy.util.is_package("en_core_web_sm"):
            parsers.append(spacy.load("en_core_web_sm"))
    if importlib.util.find_spec("stanza") is not None and not parsers:
        from syntaxkernels.trees import StanzaModelsNotFoundError
        from syntaxkernels.trees.stanza import _default_model_dir, _pipeline

        try:
            parsers.append(_pipeline("en", _default_model_dir(), "tokenize,pos,lemma,depparse", "default",
                                     False, False))
        except StanzaModelsNotFoundError:
            pass
    if not parsers:
        pytest.skip("no pre-trained parser here (spaCy en_core_web_sm or stanza English models)")
    for nlp in parsers:
        (text,) = parse(["The quick brown fox jumps over the lazy dog."], parser=nlp, cache_dir=tmp_path,
                        split_sentences=True)
        assert len(text) == 1 and text[0].words[:2] == ["The", "quick"]
        assert text[0].heads[text[0].words.index("fox")] == text[0].words.index("jumps")


@needs_stanza
def test_parse_with_a_stanza_pipeline_object(tmp_path):
    """A real stanza Pipeline subclass (no models to load): kind detection, identity from its config and model
    files, the cache."""
    import stanza
    from stanza.utils.conll import CoNLL

    model_file = tmp_path / "depparse.pt"
    model_file.write_bytes(b"weights v1")

    class LocalPipeline(stanza.Pipeline):
        def __init__(self):  # what a loaded Pipeline holds, without loading models
            self.lang = "en"
            self.config = {"lang": "en", "processors": "tokenize,depparse", "depparse_model_path": str(model_file)}
            self.processors = {"tokenize": None, "depparse": None}
            self.calls = 0

        def __call__(self, text):
            self.calls += 1
            return CoNLL.conll2doc(input_str=CONLLU)

    nlp = LocalPipeline()
    identity = parser_identity(nlp)
    assert identity.startswith(f"stanza-{stanza.__version__}/en/tokenize+depparse/")
    (text,) = parse(["I saw her. She ran home"], parser=nlp, cache_dir=tmp_path)
    assert text.heads == [1, -1, 1, 1, 5, -1, 5] and nlp.calls == 1
    parse(["I saw her. She ran home"], parser=nlp, cache_dir=tmp_path)
    assert nlp.calls == 1  # cached
    model_file.write_bytes(b"weights v2, retrained")  # another model file: another identity, parsed again
    assert parser_identity(nlp) != identity
    parse(["I saw her. She ran home"], parser=nlp, cache_dir=tmp_path)
    assert nlp.calls == 2


@needs_spacy
def test_spacy_identity_follows_the_pipeline():
    import spacy

    blank = spacy.blank("en")
    with_sentencizer = spacy.blank("en")
    with_sentencizer.add_pipe("sentencizer")
    assert parser_identity(blank) == parser_identity(spacy.blank("en"))
    assert parser_identity(blank) != parser_identity(with_sentencizer)
    assert parser_identity(spacy.blank("de")) != parser_identity(blank)


def test_parse_takes_an_iterable_of_texts():
    def fake(text):
        return [Sentence(words=text.split(), heads=[-1] + [0] * (len(text.split()) - 1))]

    out = parse((t for t in ["a b", "c"]), parser=fake, cache_dir=False)
    assert [s.words for s in out] == [["a", "b"], ["c"]]
    with pytest.raises(TypeError, match="got dict"):
        parse({"a": 1}, parser=fake, cache_dir=False)
