"""transformers integration on T5 / mT5 (their rows of FAMILIES), method "bias", on tiny models built from configs (no
downloads).

Only the encoder's self-attention is syntax-aware: the tree bias is added on top of T5's bucketed relative-position
bias, which the op adds itself (``position_buckets`` / ``position_table``, layer 0's ``relative_attention_bias``
shared by every encoder layer; scores unscaled). The decoder (self- and cross-attention) stays plain.

What is checked: a fresh syntax model equals the unpatched one (encoder states on valid tokens, seq2seq loss; T5,
the encoder-only class, mT5; "sdpa" and "eager" references); with random tables every layer's output equals a float64
reference that adds the tree bias to T5's position bias in the unpatched eager model; a random table changes the
outputs; gradients reach the syntax tables, T5's position table and the projections; padding (a padded batch equals
each sentence alone); gradient checkpointing; bf16 autocast; save_pretrained / load_syntax_model; generate (beam
search: the trees repeated per beam); a layer left plain keeps T5's position bias, stacks of syntax layers build none;
torch.compile (one graph) with source and target trees; the refused methods and the errors.

Target trees (``decoder_trees=True``, last section): the decoder's self-attention takes leak-free target trees beside
its own causal relative-position term; a fresh model equals the unpatched one; a float64 reference (each stack's tree
bias added to its position bias in the eager model); gradients; generate (cached steps keep T5's position bias).
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

VOCAB = 60
# Token trees, lengths 9 and 5 (root first).
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2]]
CLASSES = ["T5ForConditionalGeneration", "T5EncoderModel", "MT5ForConditionalGeneration"]


def _config(cls: str = "T5ForConditionalGeneration", **overrides):
    sizes = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, relative_attention_max_distance=6, dropout_rate=0.0,
                 decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    config_cls = transformers.MT5Config if cls.startswith("MT5") else transformers.T5Config
    return config_cls(**{**sizes, **overrides})


def _model(cls: str = "T5ForConditionalGeneration", attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, cls)(_config(cls, **overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def _pair(cls: str = "T5ForConditionalGeneration", attn_implementation: str = "sdpa", **kwargs):
    """(unpatched model, a copy with fresh syntax attention)."""
    plain = _model(cls, attn_implementation)
    syntax = enable_syntax_attention(copy.deepcopy(plain), "bias", **kwargs)
    return plain, syntax


def _batch(heads=HEADS):
    torch.manual_seed(1)
    n = max(len(h) for h in heads)
    ids = torch.randint(2, VOCAB, (len(heads), n))
    mask = torch.zeros(len(heads), n, dtype=torch.long)
    for b, h in enumerate(heads):
        mask[b, :len(h)] = 1
    ids = ids * mask
    labels = torch.randint(2, VOCAB, (len(heads), 4))
    return ids, mask, labels, sk.TreeBatch.from_heads(heads)


def _valid(x, mask):
    return x[mask.bool()]


def _randomise(model, seed: int = 3, same: bool = False):
    g = torch.Generator().manual_seed(seed)
    first = None
    with torch.no_grad():
        for name, p in syntax_parameters(model).items():
            if name.endswith("distance_bias"):
                if first is None or not same:
                    first = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
                p.copy_(first)


def test_rows():
    rows = {f.model_type: f for f in FAMILIES}
    for kind, base in (("t5", "T5PreTrainedModel"), ("mt5", "MT5PreTrainedModel")):
        row = rows[kind]
        assert row.base_class == base and row.seq2seq and row.methods == ("bias",)
        assert row.encoder == "encoder" and row.layers == "block"
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readme, api = (root / "README.md").read_text(), (root / "docs" / "api.md").read_text()
    for name in ("T5 (incl. Flan-T5)", "mT5", "T5 and mT5"):
        assert name in readme or name in api, name
    assert "mT5, encoder only" in readme and "T5 and mT5" in api


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_fresh_model_equals_plain(cls, impl):
    plain, syntax = _pair(cls, impl)
    ids, mask, labels, trees = _batch()
    assert syntax.encoder.config._attn_implementation == "syntaxkernels"
    if hasattr(syntax, "decoder"):
        assert syntax.decoder.config._attn_implementation == impl  # the decoder is left as it was
    with torch.no_grad():
        a = plain.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        b = syntax.encoder(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
        torch.testing.assert_close(_valid(b, mask), _valid(a, mask), rtol=1e-5, atol=1e-5)
        if cls != "T5EncoderModel":
            la = plain(input_ids=ids, attention_mask=mask, labels=labels).loss
            lb = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).loss
            torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", ["T5EncoderModel", "MT5ForConditionalGeneration"])
def test_random_table_equals_float64_reference(cls):
    """Every encoder layer: T5's eager attention with ``position_bias + c * table[bucket(d)]`` (one table shared by
    the layers, so the reference adds it once to the shared position bias), in float64."""
    plain, syntax = _pair(cls, "eager")
    plain, syntax = plain.double(), syntax.double()
    _randomise(syntax, same=True)
    ids, mask, _, trees = _batch()
    part = syntax.encoder.block[0].layer[0].SelfAttention.syntax
    tree_bias = reference.gather_bias(trees.distance, part.distance_bias, part.buckets, part.bias_scale,
                                      dtype=torch.float64)  # [B, 1, N, N]
    attention = plain.encoder.block[0].layer[0].SelfAttention
    own = attention.compute_bias
    attention.compute_bias = lambda *a, **k: own(*a, **k) + tree_bias
    with torch.no_grad():
        want = plain.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        got = syntax.encoder(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
        fresh = _pair(cls, "eager")[0].double().encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(_valid(got, mask), _valid(want, mask), rtol=1e-10, atol=1e-10)
    assert (_valid(got, mask) - _valid(fresh, mask)).abs().max() > 1e-3  # the table changed the outputs


def test_plain_layer_keeps_position_bias():
    plain, syntax = _pair("T5ForConditionalGeneration", layers=[1])
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    assert not hasattr(syntax.encoder.block[0].layer[0].SelfAttention, "syntax")
    with torch.no_grad():
        # layer 0 left plain: after it the hidden states equal the unpatched model's
        seen = {}

        def keep(key):
            def hook(module, args, output):
                seen.setdefault(key, output[0])
            return hook

        syntax.encoder.block[0].register_forward_hook(keep("s"))
        plain.encoder.block[0].register_forward_hook(keep("p"))
        syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)
        plain(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(_valid(seen["s"], mask), _valid(seen["p"], mask), rtol=1e-5, atol=1e-5)


def test_gradients_reach_tables_and_projections():
    _, syntax = _pair()
    syntax.train()
    ids, mask, labels, trees = _batch()
    syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).loss.backward()
    for name, p in syntax_parameters(syntax).items():
        if name.endswith("distance_bias"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    first = syntax.encoder.block[0].layer[0].SelfAttention
    assert first.relative_attention_bias.weight.grad.abs().sum() > 0
    for layer in syntax.encoder.block:
        for proj in ("q", "k", "v"):
            assert getattr(layer.layer[0].SelfAttention, proj).weight.grad.abs().sum() > 0


def test_position_table_gradient_matches_plain():
    """At init the syntax model is the plain model: the gradient of T5's position table (through the op's
    position_table) equals the unpatched model's (through its [1, H, N, N] position_bias)."""
    plain, syntax = _pair(attn_implementation="eager")
    plain, syntax = plain.double(), syntax.double()
    ids, mask, labels, trees = _batch()
    plain(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).loss.backward()
    for name in ("relative_attention_bias", "q", "k", "v"):
        a = getattr(plain.encoder.block[0].layer[0].SelfAttention, name).weight.grad
        b = getattr(syntax.encoder.block[0].layer[0].SelfAttention, name).weight.grad
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-10)


def test_padded_batch_equals_each_sentence_alone():
    _, syntax = _pair()
    _randomise(syntax)
    ids, mask, _, _ = _batch()
    check_padded_batch_equals_each_sentence_alone(syntax.encoder, ids, mask, HEADS)


def test_gradient_checkpointing():
    _, syntax = _pair()
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    check_gradient_checkpointing(syntax, input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)


def test_autocast_bf16():
    _, syntax = _pair()
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    check_autocast_bf16(syntax, input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees)


@pytest.mark.parametrize("cls", ["T5ForConditionalGeneration", "MT5ForConditionalGeneration"])
def test_save_and_load(tmp_path, cls):
    _, syntax = _pair(cls, per_head=True)
    _randomise(syntax)
    ids, mask, labels, trees = _batch()
    syntax.save_pretrained(tmp_path)
    loaded = load_syntax_model(getattr(transformers, cls), str(tmp_path)).eval()
    assert loaded.encoder.config._attn_implementation == "syntaxkernels"
    assert loaded.decoder.config._attn_implementation == "sdpa"
    with torch.no_grad():
        a = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
        b = loaded(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
    torch.testing.assert_close(b, a)


def test_generate():
    plain, syntax = _pair()
    ids, mask, _, trees = _batch()
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, num_beams=1)
    with torch.no_grad():
        fresh = syntax.generate(ids, syntax_trees=trees, **kw)
        torch.testing.assert_close(fresh, plain.generate(ids, **kw))
        _randomise(syntax, seed=5)
        out = syntax.generate(ids, syntax_trees=trees, **kw)
        encoded = syntax.encoder(input_ids=ids, attention_mask=mask, syntax_trees=trees)
        # the decoder is plain: the unpatched model decoding the syntax encoder's states gives the same tokens
        want = plain.generate(ids, encoder_outputs=encoded, **kw)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("decoder_trees", [False, True])
def test_beam_search_with_trees(decoder_trees):
    """generate with num_beams=3, num_return_sequences=2: the source trees bias the encoder (run once on the B items),
    the target trees of a 3-token decoder prompt (two different trees of one length; with T5's causal position term)
    are repeated per beam as generate repeats the inputs (item b's beams next to each other)."""
    plain, syntax = _pair(decoder_trees=decoder_trees)
    ids, mask, _, _ = _batch()
    check_seq2seq_beam_search(plain, syntax, _randomise, ids, mask, HEADS, 0, decoder_trees)


@pytest.mark.long_on_cpu
def test_torch_compile_with_source_and_target_trees():
    """torch.compile (aot_eager, one graph) of T5 with source and target trees (1 + 1 layers): logits, the syntax
    tables' and both position tables' gradients equal eager."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(_config(num_layers=1, num_decoder_layers=1))
    enable_syntax_attention(model, "bias", decoder_trees=True)
    _randomise(model)
    ids, mask, _, trees = _batch()
    dec_ids = torch.tensor([[0, 17, 33, 5], [0, 41, 8, 0]])
    dec_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    targets = sk.TreeBatch.from_heads([[-1, 0, 1, 1], [-1, 0, 0]], leak_free=True)
    check_torch_compile(model, [f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
                                for stack in ("encoder", "decoder")],
                        input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
                        syntax_trees=trees, decoder_syntax_trees=targets)


def _count_compute_bias(model):
    """Counts of T5's ``compute_bias`` calls (the ``[1, H, N, N]`` position bias) in each stack's layer 0, by stack."""
    calls = {}
    for name in ("encoder", "decoder"):
        attention = getattr(model, name).block[0].layer[0].SelfAttention
        real = attention.compute_bias
        calls[name] = 0

        def spy(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        attention.compute_bias = spy
    return calls


def test_stacks_of_syntax_layers_build_no_position_bias():
    """A stack whose every self-attention layer is a syntax layer (the op adds T5's position term) skips T5's
    ``compute_bias``: the encoder always, the decoder (``decoder_trees=True``) in a forward with target trees; a
    decoding step with a cache (plain attention with T5's bias) and a stack with a plain layer still build it. The
    outputs equal the unpatched model's."""
    plain, syntax = _pair(decoder_trees=True)
    ids, mask, labels, trees = _batch()
    targets = sk.TreeBatch.from_heads([[-1, 0, 1, 1]] * 2, leak_free=True)
    calls = _count_compute_bias(syntax)
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1)
    with torch.no_grad():
        got = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees,
                     decoder_syntax_trees=targets).logits
        assert calls == {"encoder": 0, "decoder": 0}
        torch.testing.assert_close(got, plain(input_ids=ids, attention_mask=mask, labels=labels).logits, rtol=1e-5,
                                   atol=1e-5)
        out = syntax.generate(ids, attention_mask=mask, syntax_trees=trees,
                              decoder_syntax_trees=sk.TreeBatch.from_heads([[-1]] * 2), **kw)
        assert calls == {"encoder": 0, "decoder": 3}  # the 3 steps after the start token's forward
        torch.testing.assert_close(out, plain.generate(ids, attention_mask=mask, **kw))
    plain, syntax = _pair(layers=[1])  # layer 0 plain: it reads T5's bias (the decoder is untouched)
    calls = _count_compute_bias(syntax)
    with torch.no_grad():
        got = syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=trees).logits
    assert calls == {"encoder": 1, "decoder": 1}
    torch.testing.assert_close(got, plain(input_ids=ids, attention_mask=mask, labels=labels).logits, rtol=1e-5,
                               atol=1e-5)


def test_errors():
    _, syntax = _pair()
    ids, mask, labels, trees = _batch()
    with pytest.raises(ValueError, match="syntax_trees"):
        syntax(input_ids=ids, attention_mask=mask, labels=labels)
    with pytest.raises(ValueError):
        short = sk.TreeBatch.from_heads([HEADS[0][:8], HEADS[1]])  # lengths 8, 5 but the mask has 9, 5
        syntax(input_ids=ids, attention_mask=mask, labels=labels, syntax_trees=short)
    with pytest.raises(ValueError, match="cover"):
        syntax(input_ids=ids[:, :6], attention_mask=mask[:, :6], labels=labels, syntax_trees=trees)
    for method in ("subnetwork", "gat"):
        with pytest.raises(ValueError, match="T5"):
            enable_syntax_attention(_model(), method)
    with pytest.raises(ValueError, match="given"):
        enable_syntax_attention(_model(), "bias", trees="predicted", predictor_layer=0)
    with pytest.raises(ValueError, match="already"):
        enable_syntax_attention(syntax, "bias")
    assert all(isinstance(layer.layer[0].SelfAttention.syntax, SyntaxDistanceBias) for layer in syntax.encoder.block)
    assert not any("decoder" in name for name in syntax_parameters(syntax))


# ------------------------------------------------------------------------------ decoder target trees (decoder_trees)

TARGET_HEADS = [[-1, 0, 1, 1], [-1, 0, 0]]  # trees of the decoder input (lengths 4 and 3), leak-free


def _targets():
    ids = torch.randint(2, VOCAB, (2, 4), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return ids * mask, mask, sk.TreeBatch.from_heads(TARGET_HEADS, leak_free=True)


@pytest.mark.parametrize("cls", ["T5ForConditionalGeneration", "MT5ForConditionalGeneration"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_decoder_trees_fresh_model_equals_plain(cls, impl):
    plain, syntax = _pair(cls, impl, decoder_trees=True)
    ids, mask, _, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    assert syntax.decoder.config._attn_implementation == "syntaxkernels"
    for block in syntax.decoder.block:
        assert isinstance(block.layer[0].SelfAttention.syntax, SyntaxDistanceBias)
        assert block.layer[0].SelfAttention.syntax.causal and not hasattr(block.layer[1].EncDecAttention, "syntax")
    with torch.no_grad():
        want = plain(**kw).logits
        got = syntax(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
    valid = dec_mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_decoder_trees_equal_float64_reference():
    """T5's eager attention with the tree bias added to the shared position bias of each stack (the source trees'
    in the encoder, the target trees' in the decoder, whose position bias has causal buckets), in float64."""
    plain, syntax = _pair("T5ForConditionalGeneration", "eager", decoder_trees=True, per_head=True)
    plain, syntax = plain.double(), syntax.double()
    _randomise(syntax, same=True)
    ids, mask, _, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
    for stack, given in (("encoder", trees), ("decoder", targets)):
        part = getattr(syntax, stack).block[0].layer[0].SelfAttention.syntax
        tree_bias = reference.gather_bias(given.distance, part.distance_bias, part.buckets, part.bias_scale,
                                          dtype=torch.float64)  # [B, H, N, N]
        attention = getattr(plain, stack).block[0].layer[0].SelfAttention
        attention.compute_bias = (lambda own, b: lambda *a, **k: own(*a, **k) + b)(attention.compute_bias, tree_bias)
    zero_targets = copy.deepcopy(syntax)
    with torch.no_grad():
        for block in zero_targets.decoder.block:
            block.layer[0].SelfAttention.syntax.distance_bias.zero_()
        want = plain(**kw).logits
        got = syntax(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
        before = zero_targets(**kw, syntax_trees=trees, decoder_syntax_trees=targets).logits
    valid = dec_mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-10, atol=1e-10)
    assert (got[valid] - before[valid]).abs().max() > 1e-4  # the target tables changed the outputs


def test_decoder_trees_gradients_and_generate():
    plain, syntax = _pair(decoder_trees=True)
    ids, mask, labels, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    syntax.train()
    syntax(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
           labels=labels, syntax_trees=trees, decoder_syntax_trees=targets).loss.backward()
    for name, p in syntax_parameters(syntax).items():
        if name.endswith("distance_bias"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert any(name.startswith("decoder.") for name in syntax_parameters(syntax))
    assert syntax.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad.abs().sum() > 0
    syntax.eval()
    _randomise(syntax, seed=5)
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, num_beams=1, output_scores=True,
              return_dict_in_generate=True)
    start = sk.TreeBatch.from_heads([[-1], [-1]])  # the decoder's prompt: the start token alone
    with torch.no_grad():
        out = syntax.generate(ids, syntax_trees=trees, decoder_syntax_trees=start, **kw)
        # one tree row for the start token (a constant: softmax cancels it), none for the generated tokens, whose
        # cached steps keep T5's position bias: the unpatched decoder on the syntax encoder's states
        encoded = syntax.encoder(input_ids=ids, attention_mask=mask, syntax_trees=trees)
        want = plain.generate(ids, encoder_outputs=encoded, **kw)
    torch.testing.assert_close(out.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(out.scores), torch.stack(want.scores), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="decoder_syntax_trees"):
        syntax(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, syntax_trees=trees)


def test_decoder_trees_save_and_load(tmp_path):
    _, syntax = _pair("MT5ForConditionalGeneration", decoder_trees=True, per_head=True)
    _randomise(syntax)
    ids, mask, _, trees = _batch()
    dec_ids, dec_mask, targets = _targets()
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask,
              syntax_trees=trees, decoder_syntax_trees=targets)
    syntax.save_pretrained(tmp_path)
    loaded = load_syntax_model(transformers.MT5ForConditionalGeneration, str(tmp_path)).eval()
    assert loaded.config.syntax_attention["decoder_trees"]
    assert loaded.decoder.config._attn_implementation == "syntaxkernels"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**kw).logits, syntax(**kw).logits)
