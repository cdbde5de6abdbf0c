"""Attention dropout in the modules and the transformers integration: in training mode a fresh "bias" layer drops
attention probabilities, as the model it replaces does. The exact check: an unpatched model whose attention
dropout draws the fused op's mask (torch's ``F.dropout`` replaced for the ``[B, H, N, N]`` weights by the Philox
mask of a seed drawn as the syntax layers draw theirs) computes the patched fresh model's logits in training mode,
hidden dropout included; dropout on the attention output (what the layers did before) does not.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.nn import SyntaxBiasedSelfAttention, SyntaxHeadSelfAttention, draw_dropout_seed

transformers = pytest.importorskip("transformers")
from syntaxkernels.integrations.transformers import enable_syntax_attention  # noqa: E402

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2, 0]]


def _mask_dropout(original):
    """``F.dropout`` with the fused op's mask on attention weights (4-D inputs): a seed drawn as the syntax layers
    draw theirs (:func:`draw_dropout_seed`), item b / head h / pair (i, j) kept as :func:`reference.dropout_keep`
    says; other inputs go to torch's dropout."""
    def dropout(x, p=0.5, training=True, inplace=False):
        if x.dim() != 4 or not training or p == 0.0:
            return original(x, p, training, inplace)
        B, H, N, M = x.shape
        keep = reference.dropout_keep(draw_dropout_seed(), p, B, H, N, M, device=x.device)
        return torch.where(keep, x / (1 - p), torch.zeros((), dtype=x.dtype))
    return dropout


def _bert(**overrides):
    model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL, **overrides))
    model.set_attn_implementation("eager")  # (its attention calls F.dropout on the weights)
    return model


def _batch():
    trees = sk.TreeBatch.from_heads(HEADS)
    N = trees.max_len
    ids = torch.randint(4, SMALL["vocab_size"], (2, N), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(N)[None, :] < trees.lengths[:, None]).long()
    return ids, mask, trees


@pytest.mark.parametrize("backend", ["auto", "triton", "reference"])
def test_fresh_bias_model_in_training_mode_is_the_model_it_replaces(monkeypatch, backend):
    plain = _bert(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2)
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, "bias", backend=backend)
    ids, mask, trees = _batch()
    valid = mask.bool()
    plain.train(), patched.train()
    torch.manual_seed(11)
    ours = patched(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    monkeypatch.setattr(F, "dropout", _mask_dropout(F.dropout))
    torch.manual_seed(11)
    theirs = plain(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[valid], theirs[valid], atol=1e-5, rtol=1e-5)
    # Training mode drops something (the comparison is not eval against eval) ...
    with torch.no_grad():
        evaluated = plain.eval()(input_ids=ids, attention_mask=mask).logits
    assert (evaluated[valid] - theirs[valid]).abs().max() > 1e-2
    # ... and dropout on the attention output instead of the probabilities computes something else.
    monkeypatch.undo()
    plain.train()

    def output_dropout(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        weights = (query @ key.transpose(-1, -2)) * scaling + attention_mask
        out = F.dropout(weights.softmax(-1) @ value, p=dropout, training=True)
        return out.transpose(1, 2).contiguous(), None
    monkeypatch.setattr(transformers.models.bert.modeling_bert, "eager_attention_forward", output_dropout)
    torch.manual_seed(11)
    elsewhere = plain(input_ids=ids, attention_mask=mask).logits
    assert (elsewhere[valid] - ours[valid]).abs().max() > 1e-2


def test_bias_module_drops_probabilities_in_training_mode_only():
    torch.manual_seed(0)
    layer = SyntaxBiasedSelfAttention(16, 2, dropout=0.3, backend="reference")
    trees = sk.TreeBatch.from_heads(HEADS)
    x = torch.randn(2, trees.max_len, 16)
    layer.eval()
    plain = layer(x, trees)
    layer.train()
    torch.manual_seed(5)
    dropped = layer(x, trees)
    torch.manual_seed(5)
    seed = draw_dropout_seed()  # the seed the layer drew
    q, k, v = (proj(x).view(2, -1, 2, 8).transpose(1, 2) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    heads = reference.syntax_bias_attention(q, k, v, trees.distance, layer.distance_bias, buckets=layer.buckets,
                                            bias_scale=layer.bias_scale, lengths=trees.lengths, dropout_p=0.3,
                                            dropout_seed=seed)
    expected = layer.out_proj(heads.transpose(1, 2).reshape(2, -1, 16))
    torch.testing.assert_close(dropped, expected)
    assert (dropped - plain).abs().max() > 1e-2
    torch.manual_seed(5)
    torch.testing.assert_close(layer(x, trees), dropped)  # reproducible under torch.manual_seed
    with torch.no_grad():
        layer.eval()
        torch.testing.assert_close(layer(x, trees), plain)


def test_syntax_head_attention_drops_probabilities():
    """SDPA's own dropout on the weights: the output row of a query with a single valid key is that key's value
    or zero (dropout on the output would zero single elements instead)."""
    torch.manual_seed(0)
    layer = SyntaxHeadSelfAttention(16, 2, 8, syntax_heads=1, dropout=0.5, variant="package")
    layer.train()
    x = torch.randn(1, 3, 16)
    captured = {}
    layer.out_proj.register_forward_hook(lambda m, inputs, out: captured.setdefault("heads", inputs[0]))
    layer(x, torch.zeros(1, 3, 8), lengths=torch.tensor([1]))
    row = captured["heads"][0, 0].view(2, 8)  # token 0 sees only itself: per head, v_0 / (1 - p) or 0
    v0 = layer.v_proj(x)[0, 0].view(2, 8)
    for h in range(2):
        assert torch.allclose(row[h], 2 * v0[h], atol=1e-6) or torch.equal(row[h], torch.zeros(8))


@pytest.mark.parametrize("method,kwargs", [("bias", {}), ("subnetwork", dict(masks=sk.MaskSpec(max_distance=2),
                                                                              variant="package"))])
def test_packed_rows_drop_what_their_padded_form_drops(method, kwargs):
    """In training mode (attention dropout only) a padding-free batch gives the padded batch's logits at every
    token: each sequence draws the mask its padded row draws, in every layer (the seeds come in the same order)."""
    from syntaxkernels.integrations.transformers import syntax_parameters

    config = transformers.BertConfig(**SMALL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.3)
    model = transformers.BertForTokenClassification(config)
    enable_syntax_attention(model, method, **kwargs)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 0.5)
    lengths = [9, 3, 14, 1]
    gen = torch.Generator().manual_seed(17)
    items = [dict(input_ids=torch.randint(4, 100, (n,), generator=gen).tolist(), heads=[-1] + list(range(n - 1)))
             for n in lengths]
    padded = sk.trees.TreeCollator()(items)
    packed = sk.trees.TreeCollator(packed=True)(items)
    model.train()
    torch.manual_seed(3)
    out_pad = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                    syntax_trees=padded["trees"]).logits
    torch.manual_seed(3)
    inputs = {k: v for k, v in packed.items() if k not in ("trees", "labels", "heads")}
    out_pack = model(**inputs, syntax_trees=packed["trees"]).logits
    valid = padded["attention_mask"].bool()
    torch.testing.assert_close(out_pack[0], out_pad[valid], atol=1e-5, rtol=1e-5)
    torch.manual_seed(4)  # (another seed: other masks)
    other = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                  syntax_trees=padded["trees"]).logits
    assert (other[valid] - out_pad[valid]).abs().max() > 1e-3


def test_the_drawn_seed_is_torch_randint_of_the_default_generator():
    """The modules' seeds are ``torch.randint(0, 2**63 - 1, ())`` of torch's default generator (drawn into a kept
    scalar): ``torch.manual_seed`` reproduces them, in any thread."""
    import threading

    torch.manual_seed(7)
    want = [int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64)) for _ in range(4)]
    torch.manual_seed(7)
    assert [draw_dropout_seed() for _ in range(4)] == want
    got = []
    torch.manual_seed(7)
    thread = threading.Thread(target=lambda: got.extend(draw_dropout_seed() for _ in range(4)))
    thread.start()
    thread.join()
    assert got == want
