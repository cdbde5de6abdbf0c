"""transformers integration with predicted trees: enable_syntax_attention(..., trees="predicted", predictor_layer=k).

What is checked, on tiny BERT / DistilBERT models built from configs (CPU, no downloads): the predicted trees are
well-formed token trees over each row's valid tokens and are what the predictor decodes from layer k's output; a
forward without trees equals a forward given those trees (the layer hooks feed the syntax layers), also in training
mode under gradient checkpointing (same loss and gradients as without it) and across forwards of other shapes (no
stash left behind); with trees given, syntax_aux_loss is the predictor's head cross-entropy on them (gradients to
every predictor parameter) and the layers use the given trees; predicted_tree_ratio; the argument errors; save /
load_syntax_model round trips (weights and config fields, identical logits); the default (trees="given") unchanged.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.integrations.transformers import (  # noqa: E402
    SyntaxTreePredictor,
    enable_syntax_attention,
    encoder_layers,
    load_syntax_model,
    predict_syntax_trees,
    syntax_aux_loss,
    syntax_parameters,
)

# initializer_range 0.2: each layer changes the hidden states visibly (at BERT's 0.02 the residual dominates).
SMALL = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, vocab_size=100,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2, 0], [-1, 0, 1]]  # [CLS]-rooted token trees
K = 1  # the predictor's layer in most tests


def _model(arch="bert", **kwargs):
    torch.manual_seed(0)
    if arch == "distilbert":
        config = transformers.DistilBertConfig(dim=32, n_layers=4, n_heads=4, hidden_dim=64, vocab_size=100,
                                               dropout=0.0, attention_dropout=0.0)
        model = transformers.DistilBertForTokenClassification(config)
    else:
        model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL))
    model.set_attn_implementation("sdpa")
    model.eval()
    if kwargs.get("trees", "predicted") == "predicted":
        kwargs.setdefault("trees", "predicted")
        kwargs.setdefault("predictor_layer", K)
    enable_syntax_attention(model, **kwargs)
    return model


def _randomise(model, std=0.5):
    """Non-zero syntax parameters (distance tables, the predictor's biaffine weights), so trees change outputs."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def _batch(heads=HEADS):
    gold = sk.TreeBatch.from_heads(heads)
    N = gold.max_len
    ids = torch.randint(4, SMALL["vocab_size"], (len(heads), N), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(N)[None, :] < gold.lengths[:, None]).long()
    return ids, mask, gold


def _valid(mask):
    return mask.bool()


def test_predicted_trees_are_well_formed_and_what_the_predictor_decodes():
    model = _model()
    _randomise(model)
    ids, mask, _ = _batch()
    trees = predict_syntax_trees(model, ids, mask)
    assert isinstance(trees, sk.TreeBatch)
    assert trees.lengths.tolist() == mask.sum(1).tolist()
    for b, n in enumerate(mask.sum(1).tolist()):
        row = trees.heads[b]
        assert int((row[:n] == -1).sum()) == 1, f"row {b} must have one root"
        assert bool(((row[:n] >= -1) & (row[:n] < n)).all())
        assert bool((row[:n] != torch.arange(n)).all())
        assert bool((row[n:] == -1).all())
    # Independently: the predictor on the hidden states output by layer K (hidden_states[K + 1]).
    with torch.no_grad():
        states = model.bert(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    expected = model.bert.encoder.syntax.predict(states[K + 1], mask.sum(1))
    assert torch.equal(trees.heads, expected.heads)
    assert torch.equal(trees.distance, expected.distance)
    # The check can tell layers apart: layer K's input (or the top layer's output) gives other trees.
    for other in (K, len(states) - 1):
        assert not torch.equal(model.bert.encoder.syntax.predict(states[other], mask.sum(1)).heads, trees.heads)


@pytest.mark.parametrize("arch,kwargs", [
    ("bert", dict(method="bias")),
    ("bert", dict(method="bias", layers=[2, 3], per_head=True)),
    ("bert", dict(method="subnetwork", variant="package")),
    ("distilbert", dict(method="bias")),
])
def test_forward_without_trees_equals_forward_given_the_predicted_trees(arch, kwargs):
    model = _model(arch, **kwargs)
    _randomise(model)
    ids, mask, gold = _batch()
    with torch.no_grad():
        predicted = predict_syntax_trees(model, ids, mask)
        without, given, with_gold = (
            model(input_ids=ids, attention_mask=mask, output_hidden_states=True, **extra).hidden_states[-1]
            for extra in ({}, {"syntax_trees": predicted}, {"syntax_trees": gold}))
    valid = _valid(mask)
    torch.testing.assert_close(without[valid], given[valid], rtol=0, atol=0)
    assert not torch.equal(predicted.heads, gold.heads)
    # The trees matter (so the equality above says the predicted ones reached the syntax layers).
    assert (without[valid] - with_gold[valid]).abs().max() > 1e-4  # exact equality above, this far off here
    base = getattr(model, model.base_model_prefix)
    encoder = base.encoder if hasattr(base, "encoder") else base.transformer
    assert encoder.syntax_prediction is None  # nothing kept after the forward


def test_no_stash_between_forwards_of_other_shapes():
    model = _model()
    _randomise(model)
    ids, mask, _ = _batch()
    ids2, mask2, _ = _batch([[-1, 0, 0, 1], [-1, 0]])
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask).logits
        second = model(input_ids=ids2, attention_mask=mask2).logits
        again = model(input_ids=ids, attention_mask=mask).logits
        trees2 = predict_syntax_trees(model, ids2, mask2)
        given2 = model(input_ids=ids2, attention_mask=mask2, syntax_trees=trees2).logits
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    valid2 = _valid(mask2)
    torch.testing.assert_close(second[valid2], given2[valid2], rtol=0, atol=0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_training_forward_under_gradient_checkpointing(reentrant):
    """Training mode, no trees: the loss and every gradient equal those of the same model without checkpointing
    (the recomputed layers get the trees predicted in the forward)."""
    ids, mask, _ = _batch()
    labels = torch.where(mask.bool(), ids % 2, torch.full_like(ids, -100))
    grads = []
    for checkpointing in (False, True):
        model = _model()
        _randomise(model)
        model.train()
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
            assert encoder_layers(model)[K + 1].gradient_checkpointing
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                          if p.grad is not None}))
    (loss_a, a), (loss_b, b) = grads
    torch.testing.assert_close(loss_a, loss_b)
    assert set(a) == set(b)
    assert any("distance_bias" in n for n in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def test_aux_loss_is_the_predictors_loss_on_given_trees():
    model = _model()
    _randomise(model)
    model.train()
    ids, mask, gold = _batch()
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=gold, output_hidden_states=True)
    loss = syntax_aux_loss(model)
    predictor = model.bert.encoder.syntax
    assert isinstance(predictor, SyntaxTreePredictor)
    expected = predictor.loss(out.hidden_states[K + 1], gold)
    torch.testing.assert_close(loss, expected)
    assert syntax_aux_loss(model, parts=True)[0] is loss
    model.zero_grad()
    loss.backward()
    for name, p in predictor.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # The loss reaches the layers the predictor reads (0..K), not the ones above.
    layers = encoder_layers(model)
    assert layers[K].output.dense.weight.grad.abs().sum() > 0
    assert layers[K + 1].output.dense.weight.grad is None
    # With trees given the layers use them: the same logits as the trees given to a predictor-less model.
    plain = _model(trees="given", method="bias", layers=list(range(K + 1, 4)))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".encoder.syntax." not in k})
    plain.train()
    torch.testing.assert_close(out.logits, plain(input_ids=ids, attention_mask=mask, syntax_trees=gold).logits)
    # A forward without trees has no loss.
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(RuntimeError, match="no forward with syntax_trees"):
        syntax_aux_loss(model)


def test_predicted_tree_ratio():
    ids, mask, gold = _batch()
    model = _model(predicted_tree_ratio=1.0)
    _randomise(model)
    model.train()
    with torch.no_grad():
        predicted = model(input_ids=ids, attention_mask=mask).logits
        mixed = model(input_ids=ids, attention_mask=mask, syntax_trees=gold).logits
        assert syntax_aux_loss(model) is not None  # the loss is on the given trees
        model.eval()  # evaluation always uses given trees
        evaluated = model(input_ids=ids, attention_mask=mask, syntax_trees=gold).logits
    valid = _valid(mask)
    torch.testing.assert_close(mixed[valid], predicted[valid], rtol=0, atol=0)
    assert (evaluated[valid] - mixed[valid]).abs().max() > 1e-5


def test_argument_errors():
    with pytest.raises(ValueError, match=r"layers \[0, 1\] are not above it"):
        _model(layers=[0, 1, 3])
    with pytest.raises(ValueError, match=r"predictor_layer, an int in 0\.\.2"):
        _model(predictor_layer=3)
    with pytest.raises(ValueError, match="predictor_layer, an int"):
        _model(predictor_layer=None)
    with pytest.raises(ValueError, match="not method='gat'"):
        _model(method="gat", variant="package")
    with pytest.raises(ValueError, match="variant='paper'"):
        _model(method="subnetwork")
    with pytest.raises(ValueError, match="apply to trees='predicted' only"):
        _model(trees="given", predictor_layer=1)
    with pytest.raises(ValueError, match="trees must be one of"):
        _model(trees="parsed")
    with pytest.raises(ValueError, match="predicted_tree_ratio"):
        _model(predicted_tree_ratio=1.5)
    model = _model()
    ids, mask, gold = _batch()
    left = mask.flip(1)
    with pytest.raises(ValueError, match="batch item 1: the attention mask does not pad on the right"):
        model(input_ids=ids, attention_mask=left)
    packed = sk.TreeBatch.from_heads(HEADS, packed=True)
    flat = ids[mask.bool()][None]
    with pytest.raises(ValueError, match="packed .* not supported with trees='predicted'"):
        model(input_ids=flat, syntax_trees=packed)
    with pytest.raises(ValueError, match="needs a model enabled"):
        predict_syntax_trees(_model(trees="given", method="bias"), ids, mask)


def test_save_load_round_trip(tmp_path):
    model = _model(predictor_arc_size=16, predicted_tree_ratio=0.25)
    _randomise(model)
    ids, mask, _ = _batch()
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(transformers.BertForTokenClassification, tmp_path).eval()
    spec = loaded.config.syntax_attention
    assert (spec["trees"], spec["predictor_layer"], spec["predictor_arc_size"], spec["predicted_tree_ratio"]) == \
        ("predicted", K, 16, 0.25)
    predictor = loaded.bert.encoder.syntax
    assert (predictor.layer, predictor.arc_size, predictor.predicted_tree_ratio) == (K, 16, 0.25)
    for name, p in model.bert.encoder.syntax.named_parameters():
        assert torch.equal(p, dict(predictor.named_parameters())[name]), name
    with torch.no_grad():
        after = loaded(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_default_is_unchanged():
    model = _model(trees="given", method="bias")
    ids, mask, gold = _batch()
    assert "trees" not in model.config.syntax_attention
    assert not hasattr(model.bert.encoder, "syntax")
    with pytest.raises(ValueError, match="pass syntax_trees"):
        model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask, syntax_trees=gold)
