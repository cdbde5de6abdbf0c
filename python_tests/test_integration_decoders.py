"""transformers integration on decoder-only language models (the causal rows of FAMILIES: GPT-2, Llama, Mistral,
Qwen2, Qwen3), method "bias", on tiny models built from configs (no downloads).

What is checked, per family: a fresh syntax model gives the unpatched model's logits (padded and packed batches,
leak-free or whole-tree distances); causal masking is exact with leak-free trees (a later token or head never
changes an earlier position's logits) while whole-tree distances leak; a training step reaches the table; gradient
checkpointing and bf16 autocast; save_pretrained / load_syntax_model; packed rows (DataCollatorWithFlattening's
layout, PackedTreeBatch) equal the padded batch, gradients included; greedy generate with the KV cache equals the
unpatched model's at init (beam search too: the prompts' trees repeated per beam), and after training the prompt's
positions use the bias while a generated token (no tree row) attends as with distance 255 to every key; the errors.
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.integrations.transformers import (  # noqa: E402
    FAMILIES,
    SyntaxDistanceBias,
    enable_syntax_attention,
    encoder_layers,
    load_syntax_model,
    syntax_parameters,
)

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]  # one per causal row of FAMILIES
PRIORITY = ["gpt2", "llama"]  # the fused projection and the rotary / grouped-query layout
VOCAB = 100
# Token trees of two sentences (lengths 9 and 6). Tokens 0, 1 and 4 attach to later tokens, so whole-tree distances
# between early tokens depend on later heads (the leak); leak-free ones do not.
HEADS = [[2, 2, -1, 2, 5, 3, 5, 8, 5], [-1, 0, 0, 2, 2, 0]]
LATER = [2, 5, 6, 2]  # other heads for tokens 5..8 of the first sentence (still a tree)


def _config(arch: str, **overrides):
    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if arch == "gpt2":
        drop = dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        return transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common,
                                       **{**drop, **overrides})
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, max_position_embeddings=64, **common)
    if arch == "qwen3":
        sizes["head_dim"] = 8
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    return cls(**sizes, **overrides)


def _model(arch: str, **overrides):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, **overrides))
    model.set_attn_implementation("sdpa")
    return model.eval()


def _pair(arch: str, **kwargs):
    """(unpatched model, a copy with fresh syntax attention)."""
    plain = _model(arch)
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, "bias", **kwargs)
    return plain, patched.eval()


def _batch(heads=HEADS, leak_free=True, seed=1):
    trees = sk.TreeBatch.from_heads(heads, leak_free=leak_free)
    n = trees.max_len
    mask = (torch.arange(n)[None, :] < trees.lengths[:, None]).long()
    ids = torch.randint(3, VOCAB, (len(heads), n), generator=torch.Generator().manual_seed(seed)) * mask
    return ids, mask, trees


def _randomise(model, std=1.0):
    torch.manual_seed(3)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, std)


def _logits(model, ids, mask, trees, **kwargs):
    return model(input_ids=ids, attention_mask=mask, syntax_trees=trees, **kwargs).logits


# ---------------------------------------------------------------------------------------------- the family table


def test_decoder_rows_name_real_classes_and_layouts():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readme, api = (root / "README.md").read_text(), (root / "docs" / "api.md").read_text()
    rows = [f for f in FAMILIES if f.causal]
    assert [f.model_type for f in rows] == ARCHS
    for family in rows:
        model = _model(family.model_type)
        assert type(model.base_model).__name__ == family.base_class
        assert family.encoder == "" and len(encoder_layers(model)) == 2
        module = encoder_layers(model)[0]
        for name in family.self_attention.split("."):
            module = getattr(module, name)
        assert module.is_causal and all(hasattr(module, p) for p in family.projections), family
        short = family.name.split(" (")[0]
        assert short in readme and short in api, short


# ---------------------------------------------------------------------------------------------- promises at init


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("leak_free", [True, False])
def test_fresh_model_gives_the_unpatched_logits(arch, leak_free):
    plain, patched = _pair(arch, per_head=True)
    ids, mask, trees = _batch(leak_free=leak_free)
    ref = plain(input_ids=ids, attention_mask=mask).logits
    out = _logits(patched, ids, mask, trees)
    valid = mask.bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    parts = [m for m in patched.modules() if isinstance(m, SyntaxDistanceBias)]
    assert len(parts) == 2 and all(p.causal for p in parts)
    assert all(torch.count_nonzero(p.distance_bias) == 0 for p in parts)


@pytest.mark.parametrize("arch", PRIORITY)
def test_plain_layers_stay_causal_padded_and_packed(arch):
    """With ``layers=[1]`` layer 0 stays plain attention (SDPA on padded rows, the varlen op on a packed row): a
    fresh model still gives the unpatched logits, and a packed row equals them."""
    plain, patched = _pair(arch, layers=[1])
    names = list(syntax_parameters(patched))
    assert len(names) == 2 and all(".1." in name for name in names), names
    ids, mask, trees = _batch()
    valid = mask.bool()
    ref = plain(input_ids=ids, attention_mask=mask).logits[valid]
    torch.testing.assert_close(_logits(patched, ids, mask, trees)[valid], ref, atol=1e-5, rtol=1e-5)
    packed_ids, positions, packed_trees = _packed(ids, trees)
    out = patched(input_ids=packed_ids, position_ids=positions, syntax_trees=packed_trees).logits[0]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    one = sk.TreeBatch.from_heads(HEADS[:1], leak_free=True)  # no attention mask at all
    torch.testing.assert_close(patched(input_ids=ids[:1], syntax_trees=one).logits,
                               plain(input_ids=ids[:1]).logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- causal masking


def _later_changed(trees_leak_free: bool):
    """Two one-row batches that agree on tokens 0..4 and differ after (token ids and the heads of 5..8)."""
    ids, mask, trees = _batch([HEADS[0]], leak_free=trees_leak_free)
    other = ids.clone()
    other[0, 5:] = (ids[0, 5:] + 7) % (VOCAB - 3) + 3
    other_trees = sk.TreeBatch.from_heads([HEADS[0][:5] + LATER], leak_free=trees_leak_free)
    return (ids, mask, trees), (other, mask, other_trees)


@pytest.mark.parametrize("arch", ARCHS)
def test_later_tokens_never_change_earlier_logits(arch):
    _, model = _pair(arch, per_head=True)
    _randomise(model)
    first, second = _later_changed(True)
    a, b = _logits(model, *first), _logits(model, *second)
    torch.testing.assert_close(a[0, :5], b[0, :5], atol=1e-5, rtol=1e-5)
    assert (a[0, 5:] - b[0, 5:]).abs().max() > 1e-3  # the later positions do see their change


@pytest.mark.parametrize("arch", PRIORITY)
def test_whole_tree_distances_leak(arch):
    """Accepted, but a later head changes an earlier position's logits: why a causal LM takes leak-free trees."""
    _, model = _pair(arch, per_head=True)
    _randomise(model)
    first, second = _later_changed(False)
    same_ids = (first[0], first[1], second[2])  # only the later heads differ
    a, b = _logits(model, *first), _logits(model, *same_ids)
    assert (a[0, :5] - b[0, :5]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------- training


def _loss(model, ids, mask, trees, **kwargs):
    labels = ids.masked_fill(mask == 0, -100)
    return model(input_ids=ids, attention_mask=mask, syntax_trees=trees, labels=labels, **kwargs).loss


@pytest.mark.parametrize("arch", ARCHS)
def test_training_step_reaches_the_table(arch):
    _, model = _pair(arch, per_head=True)
    model.train()
    ids, mask, trees = _batch()
    before = _logits(model.eval(), ids, mask, trees).detach()
    model.train()
    optimizer = torch.optim.AdamW(sk.syntax_param_groups(model, lr=1e-4, syntax_lr=0.05))
    loss = _loss(model, ids, mask, trees)
    loss.backward()
    params = syntax_parameters(model)
    assert len(params) == 4  # distance_bias and bias_scale of each layer
    for name, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert any(p.grad.abs().sum() > 0 for n, p in params.items() if n.endswith("distance_bias"))
    optimizer.step()
    after = _logits(model.eval(), ids, mask, trees)
    assert (after - before)[mask.bool()].abs().max() > 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_checkpointing_gives_the_same_gradients(arch):
    _, model = _pair(arch, per_head=True)
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    model.train()

    def grads():
        model.zero_grad()
        loss = _loss(model, ids, mask, trees)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref = grads()
    model.activation_checkpointing_enable({"use_reentrant": False})
    assert encoder_layers(model)[0].gradient_checkpointing
    loss, out = grads()
    torch.testing.assert_close(loss, ref_loss)
    assert out.keys() == ref.keys() and any("distance_bias" in n for n in out)
    for name in ref:
        torch.testing.assert_close(out[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_autocast_bf16_stays_close_to_fp32(arch):
    _, model = _pair(arch, per_head=True)
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    ref = _logits(model, ids, mask, trees)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _logits(model, ids, mask, trees)
    valid = mask.bool()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float()[valid], ref[valid], atol=0.1, rtol=0.05)


@pytest.mark.parametrize("arch", PRIORITY)
@pytest.mark.long_on_cpu
def test_torch_compile_matches_eager(arch):
    """torch.compile (aot_eager: dynamo and AOT autograd, no code generation) of a decoder's training forward: the
    logits and the syntax gradients equal eager."""
    torch._dynamo.reset()
    _, model = _pair(arch, per_head=True)
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    out = _logits(model, ids, mask, trees)
    out[mask.bool()].sum().backward()
    grads = {n: p.grad.clone() for n, p in syntax_parameters(model).items()}
    model.zero_grad()
    got = _logits(torch.compile(model, backend="aot_eager"), ids, mask, trees)
    torch.testing.assert_close(got[mask.bool()], out[mask.bool()], atol=1e-5, rtol=1e-5)
    got[mask.bool()].sum().backward()
    for name, p in syntax_parameters(model).items():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------- save and load


@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_syntax_model(tmp_path, arch):
    _, model = _pair(arch, per_head=True, window=6)
    _randomise(model)
    ids, mask, trees = _batch()
    ref = _logits(model, ids, mask, trees)
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(transformers.AutoModelForCausalLM, str(tmp_path)).eval()
    assert loaded.config.syntax_attention["window"] == 6
    torch.testing.assert_close(_logits(loaded, ids, mask, trees), ref)
    prompt = sk.TreeBatch.from_heads([HEADS[1]], leak_free=True)
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(loaded.generate(ids[1:, :6], syntax_trees=prompt, **kwargs),
                       model.generate(ids[1:, :6], syntax_trees=prompt, **kwargs))


# ---------------------------------------------------------------------------------------------- packed rows


def _packed(ids, trees):
    """The padded batch as one packed row, the way decoders are fine-tuned: DataCollatorWithFlattening's
    input_ids [1, T] and position_ids restarting at each sequence, the PackedTreeBatch of the same trees."""
    features = [{"input_ids": ids[b, :n].tolist()} for b, n in enumerate(trees.lengths.tolist())]
    batch = transformers.DataCollatorWithFlattening()(features, return_tensors="pt")
    packed = sk.TreeBatch.from_heads([h[:n] for h, n in zip(trees.heads.tolist(), trees.lengths.tolist())],
                                     packed=True, leak_free=trees.leak_free)
    assert torch.equal(batch["position_ids"][0].to(torch.int32), packed.positions)
    return batch["input_ids"], batch["position_ids"], packed


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_row_equals_the_padded_batch(arch):
    _, model = _pair(arch, per_head=True)
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    valid = mask.bool()
    weights = torch.randn(*ids.shape, VOCAB)
    padded = _logits(model, ids, mask, trees)
    (padded * weights)[valid].sum().backward()
    ref = {n: p.grad.clone() for n, p in syntax_parameters(model).items()}
    model.zero_grad()
    packed_ids, positions, packed_trees = _packed(ids, trees)
    packed = model(input_ids=packed_ids, position_ids=positions, syntax_trees=packed_trees).logits
    torch.testing.assert_close(packed[0], padded[valid], atol=1e-5, rtol=1e-5)
    (packed[0] * weights[valid]).sum().backward()
    for name, p in syntax_parameters(model).items():
        torch.testing.assert_close(p.grad, ref[name], atol=1e-4, rtol=1e-4, msg=name)


def test_tree_collator_packs_for_a_decoder():
    """TreeCollator(packed=True, leak_free=True) gives what the model takes: DataCollatorWithFlattening's keys
    plus the trees; the logits equal the padded batch's."""
    _, model = _pair("llama")
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    items = [dict(input_ids=ids[b, :n].tolist(), heads=HEADS[b]) for b, n in enumerate(trees.lengths.tolist())]
    batch = sk.trees.TreeCollator(packed=True, leak_free=True)(items)
    assert batch["trees"].leak_free and "attention_mask" not in batch
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], syntax_trees=batch["trees"]).logits
    torch.testing.assert_close(out[0], _logits(model, ids, mask, trees)[mask.bool()], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- generation

GENERATE = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_generate_equals_the_unpatched_generate(arch):
    plain, patched = _pair(arch)
    ids, _, _ = _batch()
    prompts = torch.cat([ids[:1, :6], ids[1:, :6]])  # two prompts of 6 tokens: no padding
    trees = sk.TreeBatch.from_heads([[2, 2, -1, 2, 2, 3], HEADS[1]], leak_free=True)
    ref = plain.generate(prompts, **GENERATE)
    out = patched.generate(prompts, syntax_trees=trees, **GENERATE)
    assert out.shape == (2, 12) and torch.equal(out, ref)


@pytest.mark.parametrize("arch", PRIORITY)
def test_beam_search_with_prompt_trees(arch):
    """generate with num_beams=3, num_return_sequences=2: the prompts' trees (two different leak-free trees of 6
    tokens) are repeated per beam as generate repeats the prompts (item b's beams next to each other); a fresh model
    gives the unpatched model's beams, a trained one first-step scores equal to a forward on the repeated prompts."""
    from seq2seq_checks import check_beam_search

    plain, patched = _pair(arch, per_head=True)
    ids, _, _ = _batch()
    rows = [[2, 2, -1, 2, 2, 3], [-1, 0, 0, 2, 2, 0]]
    check_beam_search(plain, patched, lambda model: _randomise(model, std=2.0), dict(input_ids=ids[:, :6]),
                      {"syntax_trees": (rows, True)}, tiled=("syntax_trees",))
    bare = sk.TreeBatch.from_heads(rows, leak_free=True)
    bare = sk.plan.structure_plan(bare.distance, bare.lengths, symmetric=False)  # a plan that is not a TreeBatch
    with pytest.raises(ValueError, match="repeats each batch item's syntax_trees: that takes a padded TreeBatch"):
        patched.generate(ids[:, :6], syntax_trees=bare, num_beams=2, max_new_tokens=1)


def test_copied_and_pickled_models_generate():
    """generate's check of syntax_trees travels with the model: a deepcopy and a torch.save / torch.load copy check
    against themselves and generate as the original does."""
    import io

    _, model = _pair("gpt2")
    _randomise(model)
    ids, _, _ = _batch()
    trees = sk.TreeBatch.from_heads([HEADS[0]], leak_free=True)
    ref = model.generate(ids[:1], syntax_trees=trees, **GENERATE)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for copied in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert copied._validate_model_kwargs.args[0] is copied
        assert copied._expand_inputs_for_generation.args[0] is copied
        assert torch.equal(copied.generate(ids[:1], syntax_trees=trees, **GENERATE), ref)


def test_generate_past_a_sliding_window():
    """Mistral with a sliding window of 8: a prompt of 6 tokens fits it, the 6 generated tokens run past it (their
    plain attention takes transformers' sliding mask); greedy generation equals the unpatched model's."""
    plain = _model("mistral", sliding_window=8)
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, "bias")
    ids, _, _ = _batch()
    trees = sk.TreeBatch.from_heads([HEADS[1]], leak_free=True)
    scores = dict(output_scores=True, return_dict_in_generate=True, **GENERATE)
    ref = plain.generate(ids[:1, :6], **scores)
    out = patched.generate(ids[:1, :6], syntax_trees=trees, **scores)
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(torch.stack(out.scores), torch.stack(ref.scores), atol=1e-5, rtol=1e-5)
    # (the window is what changes the last steps' logits: without it they differ)
    wide = _model("mistral", sliding_window=None)
    other = wide.generate(ids[:1, :6], **scores)
    assert (other.scores[-1] - ref.scores[-1]).abs().max() > 1e-4


def _extended(trees, new: int):
    """The prompt's trees with ``new`` generated tokens appended that have no tree row: distance 255 to every key
    (themselves included), roots without depth."""
    b, n = trees.distance.shape[:2]
    distance = torch.full((b, n + new, n + new), 255, dtype=torch.uint8)
    distance[:, :n, :n] = trees.distance

    def pad(x, value):
        return torch.cat([x, torch.full((b, new), value, dtype=x.dtype)], 1)

    return sk.TreeBatch(heads=pad(trees.heads, -1), lengths=trees.lengths + new, distance=distance,
                        depth=pad(trees.depth, 0), segment=pad(trees.segment, 0), leak_free=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_uses_the_bias_on_the_prompt_only(arch):
    """After the table learned: the first generated token comes from the prompt's syntax logits (not the plain
    model's); every later step equals a full forward in which the generated tokens have distance 255 to every key."""
    plain, model = _pair(arch, per_head=True)
    _randomise(model, std=2.0)
    ids, _, _ = _batch()
    prompt = ids[:1]
    trees = sk.TreeBatch.from_heads([HEADS[0]], leak_free=True)
    out = model.generate(prompt, syntax_trees=trees, output_scores=True, return_dict_in_generate=True, **GENERATE)
    scores = torch.stack(out.scores, 1)  # [1, new, V]: the logits of each step (greedy, no processors)
    full = model(input_ids=prompt, syntax_trees=trees).logits
    torch.testing.assert_close(scores[0, 0], full[0, -1], atol=1e-5, rtol=1e-5)
    assert (full[0, -1] - plain(input_ids=prompt).logits[0, -1]).abs().max() > 1e-2
    sequence = out.sequences
    new = sequence.shape[1] - prompt.shape[1]
    whole = model(input_ids=sequence, syntax_trees=_extended(trees, new)).logits
    n = prompt.shape[1]
    torch.testing.assert_close(scores[0], whole[0, n - 1:n - 1 + new], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- errors


def test_decoders_take_the_bias_method_only():
    model = _model("llama")
    for kwargs in (dict(method="subnetwork"), dict(method="gat"), dict(method="bias", trees="predicted",
                                                                         predictor_layer=0)):
        with pytest.raises(ValueError, match="decoder-only families .* take method='bias'"):
            enable_syntax_attention(model, **kwargs)
    assert getattr(model.config, "syntax_attention", None) is None


def test_decoder_input_errors():
    _, model = _pair("gpt2")
    ids, mask, trees = _batch()
    with pytest.raises(ValueError, match="pass syntax_trees"):
        model(input_ids=ids, attention_mask=mask)
    left = mask.flip(1)
    with pytest.raises(ValueError, match="pads on the left"):
        model(input_ids=ids, attention_mask=left, syntax_trees=trees)
    with pytest.raises(ValueError, match="pads on the left"):  # positional: GPT2Model(input_ids, cache, mask)
        model.transformer(ids, None, left, syntax_trees=trees)
    with pytest.raises(ValueError, match="expected batch 2 and N = 8"):
        model(input_ids=ids[:, :8], syntax_trees=trees)
    # A prompt fed in two chunks: the second forward continues inside the trees.
    cache = model(input_ids=ids[:1, :4], syntax_trees=sk.TreeBatch.from_heads([[-1, 0, 0, 0]], leak_free=True),
                  use_cache=True).cache
    with pytest.raises(ValueError, match="fed in chunks"):
        model(input_ids=ids[:1, 4:], cache=cache, syntax_trees=sk.TreeBatch.from_heads([HEADS[0]],
                                                                                                  leak_free=True),
              use_cache=True)
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="set_attn_implementation"):
        _logits(model, ids, mask, trees)


@pytest.mark.parametrize("layers", [None, [1]])
def test_a_sliding_window_shorter_than_the_sequence_is_kept(layers):
    """Mistral with a sliding window of 4 on 9-token rows: a fresh syntax model (every layer, or layer 1 with layer
    0 plain) gives the unpatched model's logits, whose sdpa attention applies the window; with a trained table, the
    window still holds (the first 4 positions, which see every earlier key either way, equal the windowless syntax
    model's logits, the later ones do not)."""
    plain = _model("mistral", sliding_window=4)
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, "bias", layers=layers)
    ids, mask, trees = _batch()
    valid = mask.bool()
    torch.testing.assert_close(_logits(patched, ids, mask, trees)[valid], _logits(plain, ids, mask, trees)[valid],
                               atol=1e-5, rtol=1e-5)
    _randomise(patched)
    wide = copy.deepcopy(patched)
    wide.config.sliding_window = None
    for layer in wide.model.layers:
        layer.self_attn.sliding_window = None
    windowed, unwindowed = _logits(patched, ids, mask, trees), _logits(wide, ids, mask, trees)
    torch.testing.assert_close(windowed[:, :4], unwindowed[:, :4], atol=1e-5, rtol=1e-5)
    assert (windowed[0, 4:9] - unwindowed[0, 4:9]).abs().max() > 1e-3


@pytest.mark.parametrize("layers", [None, [1]])
def test_a_packed_row_longer_than_the_sliding_window_keeps_it(layers):
    """Mistral with a sliding window of 4, a trained table: a packed row of sequences longer than the window (9 and
    6 tokens) gives the padded batch's logits (the window counted within each sequence; with layers=[1] layer 0 is
    a plain packed layer), which differ from the windowless model's."""
    patched = _model("mistral", sliding_window=4)
    enable_syntax_attention(patched, "bias", layers=layers)
    _randomise(patched)
    ids, mask, trees = _batch()
    valid = mask.bool()
    padded = _logits(patched, ids, mask, trees)[valid]
    packed_ids, positions, packed_trees = _packed(ids, trees)
    out = patched(input_ids=packed_ids, position_ids=positions, syntax_trees=packed_trees).logits[0]
    torch.testing.assert_close(out, padded, atol=1e-5, rtol=1e-5)
    wide = copy.deepcopy(patched)
    wide.config.sliding_window = None
    for layer in wide.model.layers:
        layer.self_attn.sliding_window = None
    unwindowed = wide(input_ids=packed_ids, position_ids=positions, syntax_trees=packed_trees).logits[0]
    assert (unwindowed - out).abs().max() > 1e-3


