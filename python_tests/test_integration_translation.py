"""transformers integration on the translation families (their rows of FAMILIES): BART, mBART, Marian, M2M100 (NLLB is
M2M100), method "bias", on tiny models built from configs (no downloads).

Only the encoder's self-attention is syntax-aware: the tree bias is added to the scaled scores (the module's
``scaling``, 1/sqrt(D)); positions are absolute (learned or sinusoidal) and added to the embeddings before the
layers, so the op adds no position term. The decoder's self-attention and the cross-attention stay plain (these
families build every attention module from one class, the decoder's with ``is_causal``, and the encoder and the
decoder from one config object: the encoder gets a config of its own).

What is checked, for each family: a fresh syntax model equals the unpatched one (the full seq2seq logits, the loss and
the encoder states on valid tokens; "sdpa" and "eager" references); with random tables the full logits equal a float64
reference (the op's float64 reference with the module's scaling in the unpatched model's encoder layers, the decoder
plain) and differ from the fresh model's; only the encoder's self-attention modules get syntax parameters; a layer
left plain equals the unpatched layer; gradients reach the syntax tables and the projections; a padded batch equals
each sentence alone; gradient checkpointing; bf16 autocast; save_pretrained / load_syntax_model; generate (beam
search: the source and target trees repeated per beam); torch.compile (one graph, BART) with source and target
trees; the refused methods and the errors.

Target trees (``decoder_trees=True``, last section): the decoder's self-attention takes leak-free target trees
(causal); a fresh model equals the unpatched one; with random tables the logits equal a float64 reference (causal op
reference in the decoder's self-attention, SDPA in the cross-attention) and the target tables change them; no position
sees later target tokens; gradients, save / load, generate with the start token's tree; the errors; a model without a
decoder refuses it (T5's decoder trees: test_integration_t5.py).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import reference  # noqa: E402
from syntaxkernels.integrations.transformers import (  # noqa: E402
    FAMILIES,
    SyntaxDistanceBias,
    enable_syntax_attention,
    load_syntax_model,
    syntax_parameters,
)
from seq2seq_checks import (  # noqa: E402
    check_autocast_bf16,
    check_seq2seq_beam_search,
    check_gradient_checkpointing,
    check_torch_compile,
    check_padded_batch_equals_each_sentence_alone,
)

VOCAB = 100
# Token trees, lengths 9 and 5 (root first).
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2]]
# model class -> (config class, model_type, FAMILIES name)
CLASSES = {
    "BartForConditionalGeneration": ("BartConfig", "bart", "BART"),
    "MBartForConditionalGeneration": ("MBartConfig", "mbart", "mBART"),
    "MarianMTModel": ("MarianConfig", "marian", "Marian"),
    "M2M100ForConditionalGeneration": ("M2M100Config", "m2m_100", "M2M100 (incl. NLLB)"),
}
PAD = 0


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The models are tiny: one intra-op thread runs them fastest (several threads on a shared 2-core machine made
    this file six times slower); the previous count is restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(cls: str, **overrides):
    sizes = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
                 decoder_layerdrop=0.0, pad_token_id=PAD, eos_token_id=1,
                 bos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    return getattr(transformers, CLASSES[cls][0])(**{**sizes, **overrides})


def _model(cls: str, attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, cls)(_config(cls, **overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def _pair(cls: str, attn_implementation: str = "sdpa", **kwargs):
    """(unpatched model, a copy with fresh syntax attention)."""
    plain = _model(cls, attn_implementation)
    syntax = enable_syntax_attention(copy.deepcopy(plain), "bias", **kwargs)
    return plain, syntax


def _batch(heads=HEADS):
    torch.manual_seed(1)
    n = max(len(h) for h in heads)
    ids = torch.randint(3, VOCAB, (len(heads), n))
    mask = torch.zeros(len(heads), n, dtype=torch.long)
    for b, h in enumerate(heads):
        mask[b, :len(h)] = 1
    ids = ids * mask + PAD * (1 - mask)
    labels = torch.randint(3, VOCAB, (len(heads), 4))
    return ids, mask, labels, sk.TreeBatch.from_heads(heads)


def _valid(x, mask):
    return x[mask.bool()]


def _randomise(model, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in syntax_parameters(model).items():
            if name.endswith("distance_bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
            elif name.endswith("bias_scale"):
                p.fill_(1.5)


def _encoder_attention(model):
    return [layer.self_attn for layer in model.get_encoder().layers]


def _decoder_attention(model):
    return [m for layer in model.get_decoder().layers for m in (layer.self_attn, layer.encoder_attn)]


needs = pytest.mark.parametrize("cls", list(CLASSES))


def test_rows():
    rows = {f.model_type: f for f in FAMILIES}
    for cls, (_, kind, name) in CLASSES.items():
        row = rows[kind]
        assert row.name == name and row.seq2seq and not row.relative_positions and row.methods == ("bias",)
        assert (row.encoder, row.layers, row.self_attention) == ("encoder", "layers", "self_attn")
    assert rows["t5"].relative_positions and rows["mt5"].relative_positions
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readme, api = (root / "README.md").read_text(), (root / "docs" / "api.md").read_text()
    for _, _, name in CLASSES.values():
        assert f"{name}, encoder only" in readme, name
        assert name.split(" (")[0] in api, name
    assert "Translation models" in api and "MarianMTModel" in readme


@needs
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_fresh_model_equals_plain(cls, impl):
    plain, syntax = _pair(cls, impl)
    ids, mask, labels, trees = _batch()
    assert syntax.get_encoder().config._attn_implementation == "syntaxkernels"
    assert syntax.get_decoder().config._attn_implementation == impl  # the decoder is left as it was
    assert syntax.get_encoder().config is not syntax.get_decoder().config
    assert all(m.config is syntax.get_encoder().config for m in _encoder_attention(syntax))
    assert all(m.config is syntax.get_decoder().config for m in _decoder_attention(syntax))
    assert plain.get_encoder().config._attn_implementation == impl  # the copy's config is its own
    with torch.no_grad():
        a = plain.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        b = syntax.get_encoder()(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
        torch.testing.assert_close(_valid(b, mask), _valid(a, mask), rtol=1e-5, atol=1e-5)
        pa = plain(input_ids=ids, attention_mask=mask, labels=labels)
        pb = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)
        torch.testing.assert_close(pb.logits, pa.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pb.loss, pa.loss, rtol=1e-5, atol=1e-5)


def _tree_reference(trees, encoder_modules):
    """A float64 attention function for the unpatched model: the op's reference (tree bias with the module's scaling)
    in the encoder's self-attention modules, plain SDPA everywhere else (the decoder, the cross-attention)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if id(module) not in encoder_modules:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        assert scaling == module.scaling == module.head_dim ** -0.5
        part = encoder_modules[id(module)]
        out = reference.syntax_bias_attention(query, key, value, trees.distance, part.distance_bias.double(),
                                              buckets=part.buckets, scale=scaling,
                                              bias_scale=part.bias_scale.double(), lengths=trees.lengths)
        return out.transpose(1, 2).contiguous(), None

    return attend


@needs
def test_random_table_equals_float64_reference(cls):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    plain, syntax = _pair(cls, per_head=True)
    plain, syntax = plain.double(), syntax.double()
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    parts = {id(plain_m): m.syntax for plain_m, m in zip(_encoder_attention(plain), _encoder_attention(syntax))}
    AttentionInterface.register("test_tree_reference", _tree_reference(trees, parts))
    AttentionMaskInterface.register("test_tree_reference", sdpa_mask)
    fresh = copy.deepcopy(plain)
    plain.set_attn_implementation("test_tree_reference")
    with torch.no_grad():
        want = plain(input_ids=ids, attention_mask=mask, labels=labels).logits
        got = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
        states = syntax.get_encoder()(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
        before = fresh.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert (_valid(states, mask) - _valid(before, mask)).abs().max() > 1e-2  # the table changed the outputs


@needs
def test_only_encoder_self_attention_is_patched(cls):
    _, syntax = _pair(cls)
    assert all(isinstance(m.syntax, SyntaxDistanceBias) and not m.is_causal for m in _encoder_attention(syntax))
    assert not any(hasattr(m, "syntax") for m in _decoder_attention(syntax))
    names = list(syntax_parameters(syntax))
    assert names and all(name.startswith("model.encoder.layers.") for name in names), names


@needs
def test_plain_layer_equals_unpatched(cls):
    plain, syntax = _pair(cls, layers=[1])
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    assert not hasattr(_encoder_attention(syntax)[0], "syntax")
    seen = {}

    def keep(key):
        def hook(module, args, output):
            seen.setdefault(key, output[0] if isinstance(output, tuple) else output)
        return hook

    syntax.get_encoder().layers[0].register_forward_hook(keep("s"))
    plain.get_encoder().layers[0].register_forward_hook(keep("p"))
    with torch.no_grad():
        syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)
        plain(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(_valid(seen["s"], mask), _valid(seen["p"], mask), rtol=1e-5, atol=1e-5)


@needs
def test_gradients_reach_tables_and_projections(cls):
    _, syntax = _pair(cls)
    syntax.train()
    ids, mask, labels, trees = _batch()
    syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).loss.backward()
    for name, p in syntax_parameters(syntax).items():
        if name.endswith("distance_bias"):  # (bias_scale's gradient is the zero table's: 0 at init)
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    for module in _encoder_attention(syntax):
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert getattr(module, proj).weight.grad.abs().sum() > 0


@needs
def test_padded_batch_equals_each_sentence_alone(cls):
    _, syntax = _pair(cls)
    _randomise(syntax)
    ids, mask, _, _ = _batch()
    check_padded_batch_equals_each_sentence_alone(syntax.get_encoder(), ids, mask, HEADS)


@needs
def test_gradient_checkpointing(cls):
    _, syntax = _pair(cls)
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    check_gradient_checkpointing(syntax, input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)


@needs
def test_autocast_bf16(cls):
    _, syntax = _pair(cls)
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    check_autocast_bf16(syntax, input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)


@needs
def test_save_and_load(tmp_path, cls):
    _, syntax = _pair(cls, per_head=True)
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    syntax.save_pretrained(tmp_path)
    loaded = load_syntax_model(getattr(transformers, cls), str(tmp_path)).eval()
    assert loaded.get_encoder().config._attn_implementation == "syntaxkernels"
    assert loaded.get_decoder().config._attn_implementation == "sdpa"
    for name, p in syntax_parameters(syntax).items():
        torch.testing.assert_close(syntax_parameters(loaded)[name], p, msg=name)
    with torch.no_grad():
        a = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
        b = loaded(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
    torch.testing.assert_close(b, a)


@needs
def test_generate(cls):
    plain, syntax = _pair(cls)
    ids, mask, _, trees = _batch()
    kw = dict(attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False, num_beams=1)
    with torch.no_grad():
        fresh = syntax.generate(ids, syntax_trees=trees, **kw)
        torch.testing.assert_close(fresh, plain.generate(ids, **kw))
        _randomise(syntax, seed=5)
        calls = []
        handle = syntax.get_encoder().register_forward_pre_hook(lambda m, a, k: calls.append(1), with_kwargs=True)
        out = syntax.generate(ids, syntax_trees=trees, **kw)
        handle.remove()
        assert len(calls) == 1  # the encoder runs once, with the trees
        encoded = syntax.get_encoder()(input_ids=ids, attention_mask=mask, syntax_trees=trees)
        # the decoder is plain: the unpatched model decoding the syntax encoder's states gives the same tokens
        want = plain.generate(ids, encoder_outputs=encoded, **kw)
        assert not torch.equal(encoded.last_hidden_state,
                               plain.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state)
    torch.testing.assert_close(out, want)


@needs
def test_errors(cls):
    _, syntax = _pair(cls)
    ids, mask, labels, trees = _batch()
    name = CLASSES[cls][2]
    with pytest.raises(ValueError, match="syntax_trees"):
        syntax(input_ids=ids, attention_mask=mask, labels=labels)
    with pytest.raises(ValueError, match="batch item 0: syntax_trees has 8 tokens but the attention mask attends 9"):
        short = sk.TreeBatch.from_heads(torch.tensor([HEADS[0][:8] + [0], HEADS[1] + [0] * 4]), torch.tensor([8, 5]))
        syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=short)
    left = mask.clone()
    left[1] = mask[1].roll(4)  # item 1 attends positions 4..8: left padding
    with pytest.raises(ValueError, match="batch item 1: the attention mask pads on the left"):
        syntax(input_ids=ids, attention_mask=left, labels=labels, syntax_trees=trees)
    with pytest.raises(ValueError, match="cover"):
        syntax(input_ids=ids[:, :6], attention_mask=mask[:, :6], labels=labels, syntax_trees=trees)
    with pytest.raises(ValueError, match="packed"):
        syntax(input_ids=ids[:1, :9], labels=labels[:1], syntax_trees=sk.PackedTreeBatch.from_heads([HEADS[0]]))
    for method in ("subnetwork", "gat"):
        with pytest.raises(ValueError, match=name.split(" ")[0]):
            enable_syntax_attention(_model(cls), method)
    with pytest.raises(ValueError, match="given"):
        enable_syntax_attention(_model(cls), "bias", trees="predicted", predictor_layer=0)
    with pytest.raises(ValueError, match="already"):
        enable_syntax_attention(syntax, "bias")


# ------------------------------------------------------------------------------ decoder target trees (decoder_trees)

TARGET_HEADS = [[-1, 0, 1, 1], [-1, 0, 0]]  # trees of the decoder input (lengths 4 and 3), leak-free


def _targets():
    ids = torch.randint(3, VOCAB, (2, 4), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return ids * mask, mask, sk.TreeBatch.from_heads(TARGET_HEADS, leak_free=True)


def _reference_attention(source, parts, target, decoder_parts):
    """A float64 attention function for the unpatched model: the op's reference with the source trees in the
    encoder's self-attention, causal with the target trees in the decoder's self-attention, SDPA in the
    cross-attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        causal = id(module) in decoder_parts
        if not causal and id(module) not in parts:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        trees, part = (target, decoder_parts[id(module)]) if causal else (source, parts[id(module)])
        out = reference.syntax_bias_attention(query, key, value, trees.distance, part.distance_bias.double(),
                                              buckets=part.buckets, scale=scaling, causal=causal,
                                              bias_scale=part.bias_scale.double(), lengths=trees.lengths)
        return out.transpose(1, 2).contiguous(), None

    return attend


def _self_attention(model, stack):
    return [layer.self_attn for layer in getattr(model.model, stack).layers]


@needs
def test_decoder_trees_fresh_equals_plain_and_reference(cls):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    plain, syntax = _pair(cls, decoder_trees=True, per_head=True)
    ids, mask, _, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    assert all(isinstance(m.syntax, SyntaxDistanceBias) and m.syntax.causal for m in _self_attention(syntax, "decoder"))
    assert not any(hasattr(layer.encoder_attn, "syntax") for layer in syntax.get_decoder().layers)
    assert syntax.get_decoder().config._attn_implementation == "syntaxkernels"
    with torch.no_grad():
        want = plain(**kw).logits
        got = syntax(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
    valid = dec_mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)

    plain, syntax = plain.double(), syntax.double()
    _randomise(syntax)
    pairs = lambda stack: {id(a): b.syntax for a, b in zip(_self_attention(plain, stack),  # noqa: E731
                                                             _self_attention(syntax, stack))}
    AttentionInterface.register("test_target_reference",
                                _reference_attention(trees, pairs("encoder"), targets, pairs("decoder")))
    AttentionMaskInterface.register("test_target_reference", sdpa_mask)
    source_only = copy.deepcopy(syntax)  # the same model with zero target tables
    with torch.no_grad():
        for module in _self_attention(source_only, "decoder"):
            module.syntax.distance_bias.zero_()
    plain.set_attn_implementation("test_target_reference")
    with torch.no_grad():
        want = plain(**kw).logits
        got = syntax(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
        before = source_only(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-10, atol=1e-10)
    assert (got[valid] - before[valid]).abs().max() > 1e-4  # the target tables changed the outputs


@needs
def test_decoder_trees_do_not_leak_the_future(cls):
    """With leak-free target trees a decoder position's logits do not change when later target tokens and their
    heads change."""
    _, syntax = _pair(cls, decoder_trees=True)
    _randomise(syntax)
    ids, mask, _, trees = _batch()
    dec_ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(8))
    other = dec_ids.clone()
    other[0, 3:] = (other[0, 3:] + 1) % (VOCAB - 3) + 3
    first = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 3]], leak_free=True)
    second = sk.TreeBatch.from_heads([[-1, 0, 1, 0, 0]], leak_free=True)  # same heads for tokens 0..2
    with torch.no_grad():
        source = dict(input_ids=ids[:1], attention_mask=mask[:1], syntax_trees=sk.TreeBatch.from_heads([HEADS[0]]))
        a = syntax(**source, decoder_input_ids=dec_ids, decoder_syntax_trees=first).logits
        b = syntax(**source, decoder_input_ids=other, decoder_syntax_trees=second).logits
    torch.testing.assert_close(a[0, :3], b[0, :3], rtol=1e-5, atol=1e-5)
    assert (a[0, 3:] - b[0, 3:]).abs().max() > 0


@needs
def test_decoder_trees_gradients_save_and_generate(tmp_path, cls):
    plain, syntax = _pair(cls, decoder_trees=True)
    ids, mask, labels, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    syntax.train()
    syntax(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
           labels=labels, syntax_trees=trees, decoder_syntax_trees=targets).loss.backward()
    grads = {n: p.grad for n, p in syntax_parameters(syntax).items() if n.endswith("distance_bias")}
    assert any(".decoder." in n for n in grads) and any(".encoder." in n for n in grads)
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads
    syntax.eval()
    _randomise(syntax)
    syntax.save_pretrained(tmp_path)
    loaded = load_syntax_model(getattr(transformers, cls), str(tmp_path)).eval()
    assert loaded.config.syntax_attention["decoder_trees"]
    start = sk.TreeBatch.from_heads([[-1], [-1]])  # the decoder's prompt: the start token alone
    kw = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1,
              output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        a = syntax(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
                   syntax_trees=trees, decoder_syntax_trees=targets).logits
        b = loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
                   syntax_trees=trees, decoder_syntax_trees=targets).logits
        torch.testing.assert_close(b, a)
        out = syntax.generate(ids, syntax_trees=trees, decoder_syntax_trees=start, **kw)
        # the start token has one tree row (distance 0 to itself, the same constant for every key: softmax cancels
        # it) and the generated tokens none: the decoder decodes as the unpatched decoder does
        encoded = syntax.get_encoder()(input_ids=ids, attention_mask=mask, syntax_trees=trees)
        want = plain.generate(ids, encoder_outputs=encoded, **kw)
    torch.testing.assert_close(out.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(out.scores), torch.stack(want.scores), rtol=1e-5, atol=1e-5)


@needs
@pytest.mark.parametrize("decoder_trees", [False, True])
def test_beam_search_with_trees(cls, decoder_trees):
    """generate with num_beams=3, num_return_sequences=2: the source trees bias the encoder (run once on the B items),
    the target trees of a 3-token decoder prompt (two different trees of one length) are repeated per beam as
    generate repeats the inputs (item b's beams next to each other). (Weights drawn with std 0.3: at 0.02 the tiny
    model's logits barely move with the tables.)"""
    plain = _model(cls, init_std=0.3)
    syntax = enable_syntax_attention(copy.deepcopy(plain), "bias", decoder_trees=decoder_trees, per_head=True)
    ids, mask, _, _ = _batch()
    check_seq2seq_beam_search(plain, syntax, _randomise, ids, mask, HEADS, 2, decoder_trees)


@pytest.mark.long_on_cpu
def test_torch_compile_with_source_and_target_trees():
    """torch.compile (aot_eager, one graph) of BART with source and target trees (1 + 1 layers): logits and the
    syntax tables' gradients equal eager (the other families share BART's attention class and hooks)."""
    cls = "BartForConditionalGeneration"
    model = enable_syntax_attention(_model(cls, encoder_layers=1, decoder_layers=1), "bias", decoder_trees=True,
                                    per_head=True)
    _randomise(model)
    ids, mask, _, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    check_torch_compile(model, input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids,
                        decoder_attention_mask=dec_mask, syntax_trees=trees, decoder_syntax_trees=targets)


@needs
def test_decoder_trees_errors(cls):
    _, syntax = _pair(cls, decoder_trees=True)
    ids, mask, labels, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    with pytest.raises(ValueError, match="decoder_syntax_trees"):
        syntax(**kw, syntax_trees=trees)
    with pytest.raises(ValueError, match="syntax_trees"):
        syntax(**kw, decoder_syntax_trees=targets)
    too_long = sk.TreeBatch.from_heads(torch.tensor([[-1, 0, 1, 1], [-1, 0, 0, 0]]), torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="batch item 1: syntax_trees has 4 tokens but the attention mask attends 3"):
        syntax(**kw, syntax_trees=trees, decoder_syntax_trees=too_long)
    _, plain_decoder = _pair(cls)
    with pytest.raises(ValueError, match="decoder_trees=True"):
        plain_decoder(**kw, syntax_trees=trees, decoder_syntax_trees=targets)


def test_decoder_trees_refused_without_decoder():
    model = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))
    with pytest.raises(ValueError, match="has none"):
        enable_syntax_attention(model, "bias", decoder_trees=True)
    assert getattr(model.config, "syntax_attention", None) is None
