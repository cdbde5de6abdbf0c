"""transformers integration on ModernBERT (its row of FAMILIES), method "bias", on tiny models built from configs (no
downloads).

ModernBERT's layers are global (every ``global_attn_every_n_layers``-th, from layer 0) or local: a local layer attends
``|i - j| <= local_attention // 2`` (transformers passes ``sliding_window = local_attention // 2 + 1`` to the attention
function, its sdpa / eager mask is ``|i - j| <= config.sliding_window``). The tiny models here have a window of 2 or 4
tokens on each side and sentences of 6 to 11 tokens, so the local layers cut most rows.

What is checked: the row names the real classes and layout; a fresh syntax model gives the unpatched model's outputs
on valid tokens (base model and the MaskedLM / sequence / token classification heads; "sdpa" and "eager" as the
reference, every layer or some layers syntax-aware); with a randomised table a local layer keeps its window (rows
whose window covers the sentence equal a windowless twin's, cut rows differ); padding (a padded batch equals each
sentence alone); gradient checkpointing; save_pretrained / load_syntax_model; a training step reaches every layer's
table; bf16 autocast; packed rows (sequences within the window) equal the padded batch, longer ones are refused; the
refused methods and the errors.
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

VOCAB = 100
# [CLS]-rooted token trees, lengths 11 and 6.
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0, 8, 8], [-1, 0, 0, 2, 2, 0]]
HEAD_CLASSES = {
    "base": "ModernBertModel",
    "mlm": "ModernBertForMaskedLM",
    "sequence": "ModernBertForSequenceClassification",
    "token": "ModernBertForTokenClassification",
}


def _config(**overrides):
    sizes = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                 vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2, local_attention=4)
    return transformers.ModernBertConfig(**{**sizes, **overrides})


def _model(head: str = "base", attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, HEAD_CLASSES[head])(_config(**overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def _pair(head: str = "base", attn_implementation: str = "sdpa", overrides=None, **kwargs):
    """(unpatched model, a copy with fresh syntax attention)."""
    plain = _model(head, attn_implementation, **(overrides or {}))
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, "bias", **kwargs)
    return plain, patched.eval()


def _batch(heads=HEADS, seed=1):
    trees = sk.TreeBatch.from_heads(heads)
    n = trees.max_len
    mask = (torch.arange(n)[None, :] < trees.lengths[:, None]).long()
    ids = torch.randint(3, VOCAB, (len(heads), n), generator=torch.Generator().manual_seed(seed)) * mask
    return ids, mask, trees


def _randomise(model, std=1.0, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, std)


def _out(model, **inputs):
    out = model(**inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


# ---------------------------------------------------------------------------------------------- the family table


def test_modernbert_row_names_the_real_classes_and_layout():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readme, api = (root / "README.md").read_text(), (root / "docs" / "api.md").read_text()
    family = next(f for f in FAMILIES if f.model_type == "modernbert")
    assert not family.causal and family.encoder == "" and family.methods == ("bias",)
    model = _model("token")
    assert type(model.base_model).__name__ == family.base_class
    layers = encoder_layers(model)
    assert len(layers) == 3
    for layer in layers:
        module = getattr(layer, family.self_attention)
        assert all(isinstance(getattr(module, p), torch.nn.Linear) for p in family.projections)
    # transformers' layer types and windows, as this file assumes them
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert [layer.attn.sliding_window for layer in layers] == [None, 3, None]  # local_attention // 2 + 1
    assert "ModernBERT" in readme and "ModernBERT" in api
    assert "ModernBERT is refused" not in readme


# ---------------------------------------------------------------------------------------------- promises at init


@pytest.mark.parametrize("head", list(HEAD_CLASSES))
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_fresh_model_gives_the_unpatched_outputs(head, attn_implementation):
    plain, patched = _pair(head, attn_implementation, per_head=head == "token")
    ids, mask, trees = _batch()
    ref = _out(plain, input_ids=ids, attention_mask=mask)
    out = _out(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    if head == "sequence":  # pooled over the valid tokens: one row per sentence
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    else:
        valid = mask.bool()
        torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert all(isinstance(layer.attn.syntax, SyntaxDistanceBias) for layer in encoder_layers(patched))


@pytest.mark.parametrize("layers", [[0, 2], [1]], ids=["global-only", "local-only"])
@pytest.mark.parametrize("local_attention", [4, 8])
def test_fresh_model_with_some_plain_layers(layers, local_attention):
    """Plain layers run SDPA with the window as a band (a local layer left plain), syntax layers the op's
    position_window: both are the unpatched model's attention at init."""
    plain, patched = _pair(overrides=dict(local_attention=local_attention), layers=layers)
    ids, mask, trees = _batch()
    ref = _out(plain, input_ids=ids, attention_mask=mask)
    out = _out(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    valid = mask.bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert [hasattr(layer.attn, "syntax") for layer in encoder_layers(patched)] == [i in layers for i in range(3)]


# ---------------------------------------------------------------------------------------------- a trained table


def test_trained_table_keeps_the_local_window():
    """Two layers, global then local (window 5 on each side). A windowless twin (same weights, local_attention 64)
    with the same table: on rows whose window covers the whole sentence the outputs are equal, on the cut rows they
    differ (the local layer attends only |i - j| <= 5, with the tree bias)."""
    overrides = dict(num_hidden_layers=2, local_attention=10, initializer_range=0.2)  # attention that shows
    _, windowed = _pair("base", overrides=overrides, per_head=True)
    _, windowless = _pair("base", overrides={**overrides, "local_attention": 64}, per_head=True)
    assert windowless.config.layer_types == windowed.config.layer_types == ["full_attention", "sliding_attention"]
    _randomise(windowed)
    _randomise(windowless)
    ids, mask, trees = _batch()
    a = _out(windowed, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    b = _out(windowless, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    lengths = trees.lengths.tolist()
    whole = torch.zeros_like(mask, dtype=torch.bool)  # rows whose window [i - 5, i + 5] covers 0..length - 1
    for r, n in enumerate(lengths):
        for i in range(n):
            whole[r, i] = i - 5 <= 0 and i + 5 >= n - 1
    cut = mask.bool() & ~whole
    assert whole.sum() == 1 + 6 and cut.sum() == 10  # sentence 0 (11 tokens): token 5; sentence 1: all 6
    torch.testing.assert_close(a[whole], b[whole], atol=1e-5, rtol=1e-5)
    assert ((a[cut] - b[cut]).abs().amax(-1) > 1e-2).all()  # (0.04 to 0.45 here)
    # and the table matters: the randomised model is not the plain one
    plain = _model("base", **overrides)
    ref = _out(plain, input_ids=ids, attention_mask=mask)
    assert (a[mask.bool()] - ref[mask.bool()]).abs().max() > 1e-2


def test_trained_local_layer_equals_the_reference_op():
    """The local layer's attention output is the float64 reference of the op with position_window =
    local_attention // 2 (and the global layer's without one), on the q, k, v the layer computes (after rotary)."""
    _, model = _pair("base", overrides=dict(num_hidden_layers=2, local_attention=4), per_head=True)
    _randomise(model)
    ids, mask, trees = _batch()
    seen = {}

    def spy(index):
        def hook(module, args, kwargs, output):
            seen[index] = (args, kwargs, output)
        return hook

    handles = [layer.attn.syntax.register_forward_hook(spy(i), with_kwargs=True)
               for i, layer in enumerate(encoder_layers(model))]
    try:
        model(input_ids=ids, attention_mask=mask, syntax_trees=trees)
    finally:
        for h in handles:
            h.remove()
    for index, window in ((0, None), (1, 2)):
        args, kwargs, output = seen[index]
        q, k, v = args[:3]
        assert kwargs["position_window"] == window
        part = encoder_layers(model)[index].attn.syntax
        ref = sk.reference.syntax_bias_attention(
            q.double(), k.double(), v.double(), trees.distance, part.distance_bias.double(), buckets=part.buckets,
            scale=kwargs["scale"], bias_scale=part.bias_scale.double(), lengths=trees.lengths,
            position_window=window)
        valid = mask.bool()
        got, want = output.transpose(1, 2)[valid], ref.to(output.dtype).transpose(1, 2)[valid]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- padding


def test_padded_batch_equals_each_sentence_alone():
    _, model = _pair("token")
    _randomise(model)
    ids, mask, trees = _batch()
    out = _out(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    for r, heads in enumerate(HEADS):
        n = len(heads)
        alone = _out(model, input_ids=ids[r:r + 1, :n], attention_mask=mask[r:r + 1, :n],
                     syntax_trees=sk.TreeBatch.from_heads([heads]))
        torch.testing.assert_close(out[r, :n], alone[0], atol=1e-5, rtol=1e-5)


def test_padding_errors_name_the_item():
    _, model = _pair("token")
    ids, mask, trees = _batch()
    left = mask.flip(1)
    with pytest.raises(ValueError, match="batch item 1: the attention mask pads on the left"):
        model(input_ids=ids, attention_mask=left, syntax_trees=trees)
    with pytest.raises(ValueError, match="pass syntax_trees"):
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(ValueError, match="syntax_trees must cover the token sequence"):
        model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], syntax_trees=trees)
    with pytest.raises(ValueError, match="2-D padding attention_mask"):
        model(input_ids=ids, attention_mask={"full_attention": None}, syntax_trees=trees)
    with pytest.raises(ValueError, match="syntax_pos is used by method='gat' only"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=torch.zeros_like(ids))


# ---------------------------------------------------------------------------------------------- training


def _loss(model, ids, mask, trees):
    labels = (ids % 2).masked_fill(mask == 0, -100)
    return model(input_ids=ids, attention_mask=mask, syntax_trees=trees, labels=labels).loss


def test_training_step_reaches_every_table():
    _, model = _pair("token", per_head=True)
    _randomise(model, std=0.1)
    model.train()
    ids, mask, trees = _batch()
    before = {n: p.detach().clone() for n, p in syntax_parameters(model).items()}
    assert len(before) == 6  # distance_bias and bias_scale of 3 layers (global, local, global)
    optimizer = torch.optim.AdamW(sk.syntax_param_groups(model, lr=1e-2, weight_decay=0.0))
    _loss(model, ids, mask, trees).backward()
    for name, p in syntax_parameters(model).items():
        assert p.grad is not None and p.grad.abs().max() > 0, name
    optimizer.step()
    for name, p in syntax_parameters(model).items():
        assert not torch.equal(p.detach(), before[name]), name


def test_gradient_checkpointing_gives_the_same_gradients():
    _, model = _pair("token", per_head=True)
    _randomise(model, std=0.5)
    model.train()  # every dropout of the config is 0
    ids, mask, trees = _batch()
    params = list(model.parameters())
    loss = _loss(model, ids, mask, trees)
    grads = torch.autograd.grad(loss, params)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls = []
    handles = [layer.attn.syntax.register_forward_hook(lambda *args: calls.append(1))
               for layer in encoder_layers(model)]
    try:
        loss_ckpt = _loss(model, ids, mask, trees)
        grads_ckpt = torch.autograd.grad(loss_ckpt, params)
    finally:
        for h in handles:
            h.remove()
    assert len(calls) == 2 * 3  # each layer's syntax attention ran again in the backward pass: recomputed
    torch.testing.assert_close(loss_ckpt, loss)
    for (name, _), a, b in zip(model.named_parameters(), grads_ckpt, grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_bf16_autocast():
    _, model = _pair("token", per_head=True)
    _randomise(model, std=0.5)
    ids, mask, trees = _batch()
    ref = _out(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _out(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
        loss = _loss(model, ids, mask, trees)
    valid = mask.bool()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[valid].float(), ref[valid], atol=6e-2, rtol=5e-2)
    loss.backward()
    for name, p in syntax_parameters(model).items():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, name


# ---------------------------------------------------------------------------------------------- saving


def test_save_and_load_syntax_model(tmp_path):
    _, model = _pair("token", per_head=True, layers=[1, 2])
    _randomise(model)
    ids, mask, trees = _batch()
    expected = _out(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(transformers.ModernBertForTokenClassification, str(tmp_path)).eval()
    assert loaded.config.syntax_attention["layers"] == [1, 2]
    got = _out(loaded, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    base = load_syntax_model(transformers.ModernBertModel, str(tmp_path)).eval()
    for (name, p), (_, q) in zip(syntax_parameters(base).items(), syntax_parameters(model).items()):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)
    plain = transformers.ModernBertForTokenClassification.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="load_syntax_model"):
        plain(input_ids=ids, attention_mask=mask)


# ---------------------------------------------------------------------------------------------- packed rows


def test_packed_rows_within_the_window_equal_the_padded_batch():
    """Packed sequences (no padding, position_ids restarting) equal the padded batch, those within the local window
    + 1 and a longer one (the window counted within each sequence)."""
    _, model = _pair("token", overrides=dict(local_attention=8), per_head=True)  # |i - j| <= 4
    _randomise(model)
    rows = [[-1, 0, 1, 1, 0], [-1, 0, 0], [-1, 0, 1, 2]]
    gen = torch.Generator().manual_seed(5)
    items = [dict(input_ids=torch.randint(3, VOCAB, (len(r),), generator=gen).tolist(), heads=r) for r in rows]
    padded = sk.trees.TreeCollator(pad_token_id=0)(items)
    packed = sk.trees.TreeCollator(packed=True)(items)
    expected = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                     syntax_trees=padded["trees"]).logits
    got = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                syntax_trees=packed["trees"]).logits
    torch.testing.assert_close(got[0], sk.trees.pack_padded(expected, padded["lengths"]), atol=1e-5, rtol=1e-5)
    long = items + [dict(input_ids=list(range(3, 12)), heads=[-1, 0, 1, 2, 3, 4, 0, 6, 7])]
    padded = sk.trees.TreeCollator(pad_token_id=0)(long)
    packed = sk.trees.TreeCollator(packed=True)(long)
    expected = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                     syntax_trees=padded["trees"]).logits
    got = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                syntax_trees=packed["trees"]).logits
    torch.testing.assert_close(got[0], sk.trees.pack_padded(expected, padded["lengths"]), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kwargs", [dict(method="subnetwork"), dict(method="gat"),
                                    dict(method="bias", trees="predicted", predictor_layer=0)],
                         ids=["subnetwork", "gat", "predicted"])
def test_other_methods_are_refused_with_the_reason(kwargs):
    model = _model("token")
    with pytest.raises(ValueError, match="ModernBERT takes method='bias' with trees='given' .*sliding window"):
        enable_syntax_attention(model, **kwargs)
    assert getattr(model.config, "syntax_attention", None) is None
    assert not any(hasattr(layer.attn, "syntax") for layer in encoder_layers(model))
