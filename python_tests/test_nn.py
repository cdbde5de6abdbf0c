"""The drop-in modules: fresh layers equal plain attention, padding is inert, gradients reach every parameter,
and the modules learn a tree-dependent task that plain attention cannot."""
import random

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

import syntaxkernels as sk
from syntaxkernels import reference as R
from syntaxkernels.tools.workloads import random_forest
from syntaxkernels.nn import (StructuralProbeLoss, SyntaxBertSelfAttention, SyntaxBiasedSelfAttention, SyntaxGAT,
                              SyntaxHeadSelfAttention, SyntaxTransformerEncoderLayer, TopicalAttention)
from syntaxkernels.tools.testing import copy_into_torch_layer

f64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def trees_and_input(seed=0, sizes=(7, 4), trees_per_item=(1, 2), E=16):
    rng = random.Random(seed)
    heads = [random_forest(rng, n, t) for n, t in zip(sizes, trees_per_item)]
    trees = sk.TreeBatch.from_heads(heads)
    x = torch.randn(len(sizes), trees.max_len, E, dtype=f64)
    return trees, x


def plain_attention(module, x, lengths):
    """Multi-head attention with the module's projections, by PyTorch's SDPA (valid rows only are meaningful)."""
    B, N, E = x.shape
    H = module.num_heads

    def split(t):
        return t.view(B, N, H, E // H).transpose(1, 2)

    valid = torch.arange(N)[None] < lengths[:, None]
    out = F.scaled_dot_product_attention(split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x)),
                                         attn_mask=valid[:, None, None, :])
    return module.out_proj(out.transpose(1, 2).reshape(B, N, E)), valid


# ---------------------------------------------------------------- SyntaxBiasedSelfAttention


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
def test_fresh_bias_attention_is_plain_attention(per_head):
    trees, x = trees_and_input()
    module = SyntaxBiasedSelfAttention(16, 4, per_head=per_head, backend="reference").double()
    T = module.buckets.num_buckets
    assert module.distance_bias.shape == ((4, T) if per_head else (T,)) and (module.distance_bias == 0).all()
    assert module.bias_scale.item() == 1.0
    expected, valid = plain_attention(module, x, trees.lengths)
    got = module(x, trees)
    torch.testing.assert_close(got[valid], expected[valid])
    # The same through nn.MultiheadAttention with copied weights.
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
        mha.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
        mha.out_proj.load_state_dict(module.out_proj.state_dict())
    expected_mha = mha(x, x, x, key_padding_mask=trees.key_padding_mask(), need_weights=False)[0]
    torch.testing.assert_close(got[valid], expected_mha[valid])


def test_bias_attention_module_calls_the_op_and_trains_every_parameter():
    trees, x = trees_and_input(1)
    module = SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=4), per_head=True,
                                       backend="reference").double()
    with torch.no_grad():
        module.distance_bias.normal_()
        module.bias_scale.fill_(0.5)
    for window, causal in [(None, False), (2, False), (None, True)]:
        got = module(x, trees.distance, lengths=trees.lengths, window=window, causal=causal)
        q, k, v = (t.view(2, 7, 2, 8).transpose(1, 2) for t in (module.q_proj(x), module.k_proj(x), module.v_proj(x)))
        ref = R.syntax_bias_attention(q, k, v, trees.distance, module.distance_bias, buckets=module.buckets,
                                      bias_scale=module.bias_scale, lengths=trees.lengths, window=window,
                                      causal=causal)
        torch.testing.assert_close(got, module.out_proj(ref.transpose(1, 2).reshape(2, 7, 16)))
    got.sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bias_attention_fixed_scale_and_bad_input():
    module = SyntaxBiasedSelfAttention(8, 2, learnable_scale=False, backend="reference")
    assert module.bias_scale is None and "bias_scale" not in dict(module.named_parameters())
    trees, _ = trees_and_input(E=8)
    with pytest.raises(ValueError, match="x"):
        module(torch.randn(2, 7, 6), trees)
    with pytest.raises(TypeError, match="trees"):
        module(torch.randn(2, 7, 8), trees.heads)
    with pytest.raises(ValueError, match="divisible"):
        SyntaxBiasedSelfAttention(10, 4)


def test_auto_backend_runs_on_cpu():
    trees, x = trees_and_input()
    module = SyntaxBiasedSelfAttention(16, 4).double()
    assert module.backend == "auto"
    ref = SyntaxBiasedSelfAttention(16, 4, backend="reference").double()
    ref.load_state_dict(module.state_dict())
    torch.testing.assert_close(module(x, trees), ref(x, trees))


@pytest.mark.parametrize("kind", ["bias", "subnetwork", "gat", "head"])
def test_padding_never_changes_valid_outputs(kind):
    """Item by item without padding == the padded batch with junk in the padding (valid rows)."""
    torch.manual_seed(1)
    rng = random.Random(2)
    sizes = [6, 3, 1]
    heads = [random_forest(rng, n, 1 + (n > 3)) for n in sizes]
    padded_heads = torch.tensor([h + [0] * (6 - len(h)) for h in heads])
    batch = sk.TreeBatch.from_heads(padded_heads, lengths=sizes)
    x = torch.randn(3, 6, 16, dtype=f64)
    if kind == "bias":
        module = SyntaxBiasedSelfAttention(16, 4, per_head=True, backend="reference")
        torch.nn.init.normal_(module.distance_bias)
    elif kind == "subnetwork":
        module = SyntaxBertSelfAttention(16, 4, masks=sk.MaskSpec(max_distance=2, pairwise=True),
                                         backend="reference", variant="package")  # paper/release: N-dependent
        torch.nn.init.normal_(module.topical.query)
    elif kind == "gat":
        module = SyntaxGAT(16, num_layers=2, num_heads=2, head_dim=4, window=2, backend="reference")
    else:
        module = SyntaxHeadSelfAttention(16, 4, syntax_dim=16, syntax_heads=2)
        for p in module.syntax_proj.values():
            torch.nn.init.normal_(p.weight)
    module = module.double()

    def run(trees, inputs):
        if kind == "head":
            return module(inputs, inputs.flip(-1), lengths=trees.lengths)
        return module(inputs, trees)

    together = run(batch, x)
    for b, n in enumerate(sizes):
        alone = run(sk.TreeBatch.from_heads([heads[b]]), x[b:b + 1, :n])
        torch.testing.assert_close(together[b:b + 1, :n], alone, atol=1e-12, rtol=1e-12)
    if kind == "gat":
        assert (together[1, 3:] == 0).all() and (together[2, 1:] == 0).all()


def test_zero_length_item_gives_finite_outputs_and_grads():
    trees = sk.TreeBatch.from_heads(torch.tensor([[-1, 0, 0], [-1, 0, 0]]), lengths=[3, 0])
    x = torch.randn(2, 3, 8, dtype=f64, requires_grad=True)
    modules = [SyntaxBiasedSelfAttention(8, 2, backend="reference"),
               SyntaxBertSelfAttention(8, 2, backend="reference"),
               SyntaxGAT(8, num_layers=1, num_heads=2, head_dim=4, backend="reference")]
    for module in modules:
        out = module.double()(x, trees)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    head = SyntaxHeadSelfAttention(8, 2, syntax_dim=8).double()
    assert torch.isfinite(head(x, x, lengths=trees.lengths)).all()


# ---------------------------------------------------------------- Syntax-BERT


def test_subnetwork_with_only_full_is_plain_attention():
    trees, x = trees_and_input(3)
    full_only = sk.MaskSpec(parent=False, child=False, sibling=False, full=True)
    module = SyntaxBertSelfAttention(16, 4, masks=full_only, backend="reference").double()
    torch.nn.init.normal_(module.topical.query)  # a single sub-network: the topical weights are 1 anyway
    expected, valid = plain_attention(module, x, trees.lengths)
    torch.testing.assert_close(module(x, trees)[valid], expected[valid])


def test_fresh_subnetwork_layer_averages_nonempty_subnetworks():
    trees, x = trees_and_input(4)
    masks = sk.MaskSpec(max_distance=2, pairwise=True)
    module = SyntaxBertSelfAttention(16, 4, masks=masks, backend="reference", variant="package").double()
    torch.nn.init.normal_(module.topical.key_weight)  # irrelevant while the query is zero
    q, k, v = (t.view(2, 7, 4, 4).transpose(1, 2) for t in (module.q_proj(x), module.k_proj(x), module.v_proj(x)))
    outputs, nonempty = R.syntax_subnetwork_attention(q, k, v, trees, masks)
    weights = nonempty.to(f64)[:, :, None, :, None]
    average = (outputs * weights).sum(1) / weights.sum(1).clamp(min=1)  # padding rows: 0
    torch.testing.assert_close(module(x, trees), module.out_proj(average.transpose(1, 2).reshape(2, 7, 16)))


def test_topical_module_init_and_grads():
    topical = TopicalAttention(2, 3, variant="package").double()
    assert (topical.query == 0).all()
    assert torch.equal(topical.value_weight, torch.eye(3, dtype=f64).expand(2, 3, 3))
    assert torch.equal(topical.key_weight, torch.eye(3, dtype=f64).expand(2, 3, 3))
    outputs = torch.randn(1, 4, 2, 5, 3, dtype=f64)
    nonempty = torch.rand(1, 4, 5) > 0.3
    topical(outputs, nonempty).pow(2).sum().backward()
    for name, p in topical.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert topical.query.grad.abs().sum() > 0


def _topical_case(seed, B=2, M=5, H=3, N=6, D=4, dtype=f64):
    """Perturbed TopicalAttention parameters and outputs/nonempty with a token whose masks are all empty (b=0,
    n=1), a token with one non-empty mask (b=1, n=2) and a batch item whose tokens are all empty (b=B-1 when
    B > 2), where the shape has them."""
    gen = torch.Generator().manual_seed(seed)
    module = TopicalAttention(H, D, variant="package").to(dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=f64).to(dtype))
    outputs = torch.randn(B, M, H, N, D, generator=gen, dtype=f64).to(dtype)
    nonempty = torch.rand(B, M, N, generator=gen) > 0.4
    nonempty[0, :, min(1, N - 1)] = False
    if B > 1 and N > 2:
        nonempty[1, :, 2] = False
        nonempty[1, M - 1, 2] = True
    if B > 2:
        nonempty[B - 1] = False
    return module, outputs, nonempty


@pytest.mark.parametrize("seed,shape", [(0, dict()), (1, dict(B=3, M=10, H=4, N=7, D=8)), (2, dict(M=1, N=1)),
                                        (3, dict(B=1, H=1, D=1))])
def test_topical_module_matches_the_reference(seed, shape):
    """The module's formulation (keys and values never formed, hand-written backward) against
    reference.topical_attention in float64: output and every gradient, with empty masks and empty tokens."""
    module, outputs, nonempty = _topical_case(seed, **shape)
    outputs.requires_grad_(True)
    got = module(outputs, nonempty)
    want = R.topical_attention(outputs, nonempty, module.query, module.key_weight, module.value_weight)
    assert got.shape == want.shape and got.dtype == f64
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    upstream = torch.randn_like(got)
    inputs = [outputs, module.query, module.key_weight, module.value_weight]
    got_grads = torch.autograd.grad(got, inputs, upstream)
    want_grads = torch.autograd.grad(want, inputs, upstream)
    for name, g, w in zip(["outputs", "query", "key_weight", "value_weight"], got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12, msg=name)
    empty = ~nonempty.any(dim=1)  # [B, N]: tokens with no non-empty mask
    assert (got.permute(0, 2, 1, 3)[empty] == 0).all()
    assert (got_grads[0].permute(0, 1, 3, 2, 4)[~nonempty] == 0).all()  # empty (mask, token): no gradient


def test_topical_module_gradcheck():
    module, outputs, nonempty = _topical_case(4, B=2, M=3, H=2, N=3, D=2)
    names = ["query", "key_weight", "value_weight"]

    def run(outputs, *params):
        return torch.func.functional_call(module, dict(zip(names, params)), (outputs, nonempty))

    args = [outputs.requires_grad_(True)] + [getattr(module, n).detach().requires_grad_(True) for n in names]
    assert gradcheck(run, args)
    # First derivatives only (documented): differentiating the gradient again raises instead of being wrong.
    (grad,) = torch.autograd.grad(run(*args).square().sum(), args[0], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|second order|double backward|differentiable"):
        grad.sum().backward()


def test_topical_module_takes_non_contiguous_outputs():
    module, outputs, nonempty = _topical_case(7)
    strided = outputs.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(True)  # same values, M outermost
    assert not strided.is_contiguous()
    dense = outputs.clone().requires_grad_(True)
    got, want = module(strided, nonempty), module(dense, nonempty)
    torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    got.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(strided.grad, dense.grad, atol=1e-13, rtol=0)


def test_fresh_topical_module_averages_and_keeps_the_dtype():
    _, outputs, nonempty = _topical_case(5, dtype=torch.float32)
    fresh = TopicalAttention(3, 4, variant="package")
    weights = nonempty.float()[:, :, None, :, None]
    average = (outputs * weights).sum(1) / weights.sum(1).clamp(min=1)
    torch.testing.assert_close(fresh(outputs, nonempty), average)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        module, outputs, nonempty = _topical_case(6)
        want = R.topical_attention(outputs, nonempty, module.query, module.key_weight, module.value_weight)
        low = module.to(dtype)(outputs.to(dtype).requires_grad_(True), nonempty)
        assert low.dtype == dtype
        torch.testing.assert_close(low.double(), want, atol=tol * want.abs().max().item(), rtol=0)


def test_topical_module_empty_sizes_and_bad_inputs():
    module = TopicalAttention(2, 3, variant="package")
    for shape in [(0, 4, 2, 5, 3), (2, 4, 2, 0, 3)]:
        outputs = torch.randn(shape, requires_grad=True)
        nonempty = torch.ones(shape[0], shape[1], shape[3], dtype=torch.bool)
        out = module(outputs, nonempty)
        assert out.shape == (shape[0], 2, shape[3], 3)
        out.sum().backward()
        assert outputs.grad.shape == shape
    outputs, nonempty = torch.randn(1, 4, 2, 5, 3), torch.ones(1, 4, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match="outputs must be a tensor"):
        module(outputs.tolist(), nonempty)
    with pytest.raises(TypeError, match="nonempty must be a tensor"):
        module(outputs, None)
    with pytest.raises(ValueError, match="outputs must have shape"):
        module(outputs[0], nonempty)
    with pytest.raises(ValueError, match="nonempty must be bool"):
        module(outputs, nonempty.float())
    with pytest.raises(ValueError, match=r"query must have shape \[H, D\] = \[3, 3\]"):
        module(torch.randn(1, 4, 3, 5, 3), nonempty)


def test_subnetwork_needs_a_treebatch():
    module = SyntaxBertSelfAttention(8, 2, backend="reference")
    trees, _ = trees_and_input(E=8)
    with pytest.raises(TypeError, match="TreeBatch"):
        module(torch.randn(2, 7, 8), trees.distance)


# ---------------------------------------------------------------- GAT, syntax heads, probe


def test_syntax_gat_matches_reference_layers():
    trees, x = trees_and_input(5)
    gat = SyntaxGAT(16, num_layers=2, num_heads=2, head_dim=3, window=2, num_pos_tags=18,
                    backend="reference", variant="package").double()
    pos = torch.randint(0, 18, (2, 7))
    out = gat(x, trees, pos=pos)
    assert out.shape == (2, 7, 6) and gat.output_dim == 6
    h = x + gat.pos_embedding(pos)
    for layer in gat.layers:
        h = R.gat_layer(h, trees.distance, layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight,
                        num_heads=2, window=2, lengths=trees.lengths)
    torch.testing.assert_close(out, h)
    assert "_zero_table" not in gat.state_dict()
    with pytest.raises(ValueError, match="window"):
        SyntaxGAT(16, window=-1)


def test_syntax_heads_module():
    torch.manual_seed(3)
    trees, x = trees_and_input(6)
    g = torch.randn(2, 7, 6, dtype=f64)
    module = SyntaxHeadSelfAttention(16, 4, syntax_dim=6, syntax_heads=2, targets=("k", "v"),
                                     variant="package").double()
    expected, valid = plain_attention(module, x, trees.lengths)
    torch.testing.assert_close(module(x, g, lengths=trees.lengths)[valid], expected[valid])  # zero init
    for p in module.syntax_proj.values():
        torch.nn.init.normal_(p.weight)
    got = module(x, g, lengths=trees.lengths)
    q, k, v = (t.view(2, 7, 4, 4).transpose(1, 2) for t in (module.q_proj(x), module.k_proj(x), module.v_proj(x)))
    q, k, v = R.inject_syntax_heads(q, k, v, g, [module.syntax_proj["k"].weight, module.syntax_proj["v"].weight],
                                    heads=2, targets=("k", "v"))
    allowed = R.allowed_pairs(trees.distance, trees.lengths)[:, None]
    ref = R.masked_attention(q @ k.transpose(-1, -2) / 2.0, allowed, v)
    torch.testing.assert_close(got, module.out_proj(ref.transpose(1, 2).reshape(2, 7, 16)))
    got.sum().backward()
    assert all(p.weight.grad.abs().sum() > 0 for p in module.syntax_proj.values())


def test_structural_probe_module():
    trees, _ = trees_and_input(7)
    probe = StructuralProbeLoss(6, 3, variant="package").double()
    g = torch.randn(2, 7, 6, dtype=f64)
    got = probe(g, trees)
    expected = R.structural_probe_loss(g, probe.proj, trees.distance, trees.depth, trees.lengths)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


# ---------------------------------------------------------------- building blocks and errors


def test_building_blocks_are_the_self_attention_modules_without_projections():
    """DistanceBias.attend, Subnetworks.attend and SyntaxHeads.inject on projected heads are what the
    self-attention modules (their subclasses) run; parameter names are those of the modules."""
    trees, x = trees_and_input(9)
    biased = SyntaxBiasedSelfAttention(16, 4, per_head=True, backend="reference").double()
    bert = SyntaxBertSelfAttention(16, 4, masks=sk.MaskSpec(max_distance=2), backend="reference",
                                   variant="package").double()
    heads = SyntaxHeadSelfAttention(16, 4, syntax_dim=6, syntax_heads=2, targets=("k", "v"),
                                    variant="package").double()
    assert isinstance(biased, sk.nn.DistanceBias) and isinstance(bert, sk.nn.Subnetworks)
    assert isinstance(heads, sk.nn.SyntaxHeads)
    assert {"distance_bias", "bias_scale", "q_proj.weight", "out_proj.bias"} <= set(biased.state_dict())
    assert {"topical.query", "topical.key_weight", "topical.value_weight"} <= set(bert.state_dict())
    assert {"syntax_proj.k.weight", "syntax_proj.v.weight"} <= set(heads.state_dict())
    for module in (biased, bert, heads):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.3 * torch.randn_like(p))
    q, k, v = (t.view(2, 7, 4, 4).transpose(1, 2) for t in (biased.q_proj(x), biased.k_proj(x), biased.v_proj(x)))
    want = R.syntax_bias_attention(q, k, v, trees.distance, biased.distance_bias, buckets=biased.buckets,
                                   bias_scale=biased.bias_scale, lengths=trees.lengths, window=3)
    torch.testing.assert_close(biased.attend(q, k, v, trees, window=3), want)
    torch.testing.assert_close(biased.attend(q, k, v, trees.distance, trees.lengths, window=3), want)
    outputs, nonempty = R.syntax_subnetwork_attention(q, k, v, trees, bert.masks, scale=0.3)
    torch.testing.assert_close(bert.attend(q, k, v, trees, scale=0.3), bert.topical(outputs, nonempty))
    g = torch.randn(2, 7, 6, dtype=f64)
    got = heads.inject(q, k, v, g)
    want = R.inject_syntax_heads(q, k, v, g, [heads.syntax_proj["k"].weight, heads.syntax_proj["v"].weight],
                                 heads=2, targets=("k", "v"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    standalone = sk.nn.DistanceBias(4, per_head=True, backend="reference").double()
    standalone.load_state_dict({"distance_bias": biased.distance_bias, "bias_scale": biased.bias_scale})
    torch.testing.assert_close(standalone.attend(q, k, v, trees, window=3), biased.attend(q, k, v, trees, window=3))


def test_wrong_types_raise_type_error_wrong_values_value_error():
    """TypeError for an argument of the wrong kind, ValueError for a wrong value or shape: on every module,
    as in the ops' own checks."""
    trees, x = trees_and_input(E=8)
    x = x.float()
    modules = {
        "bias": (SyntaxBiasedSelfAttention(8, 2, backend="reference"), lambda m, x: m(x, trees)),
        "subnetwork": (SyntaxBertSelfAttention(8, 2, backend="reference"), lambda m, x: m(x, trees)),
        "gat": (SyntaxGAT(8, num_layers=1, num_heads=2, head_dim=4, backend="reference"), lambda m, x: m(x, trees)),
        "heads": (SyntaxHeadSelfAttention(8, 2, syntax_dim=3), lambda m, x: m(x, torch.zeros(2, 7, 3))),
        "layer": (SyntaxTransformerEncoderLayer(8, 2, 16, dropout=0.0, backend="reference"),
                  lambda m, x: m(x, trees)),
    }
    for name, (module, call) in modules.items():
        with pytest.raises(TypeError, match="must be a tensor"):
            call(module, x.tolist())
        with pytest.raises(ValueError, match=r"must have shape \[B, N, E\]"):
            call(module, x[..., :6])
    q = torch.randn(2, 2, 7, 4)
    with pytest.raises(TypeError, match="syntax must be a tensor"):
        modules["heads"][0](x, [[0.0]])
    with pytest.raises(ValueError, match="syntax must have shape"):
        modules["heads"][0](x, torch.zeros(2, 7, 4))
    with pytest.raises(TypeError, match="pos must be"):
        modules["gat"][0](x, trees, pos=[[0] * 7] * 2)
    with pytest.raises(ValueError, match="pos must have shape"):
        modules["gat"][0](x, trees, pos=torch.zeros(2, 6, dtype=torch.int64))
    with pytest.raises(TypeError, match="trees must be a TreeBatch"):
        modules["bias"][0].attend(q, q, q, trees.heads.tolist())
    with pytest.raises(TypeError, match="g must be a tensor"):
        StructuralProbeLoss(4, 2)(None, trees)
    with pytest.raises(TypeError, match="trees must be a TreeBatch"):
        StructuralProbeLoss(4, 2)(torch.zeros(2, 7, 4), trees.distance)
    with pytest.raises(TypeError, match="buckets"):
        SyntaxBiasedSelfAttention(8, 2, buckets={"max_distance": 3})
    with pytest.raises(TypeError, match="masks"):
        SyntaxBertSelfAttention(8, 2, masks=["parent_1"])
    with pytest.raises(TypeError, match="embed_dim must be an int"):
        SyntaxBiasedSelfAttention(8.0, 2)
    with pytest.raises(TypeError, match="syntax_heads must be an int"):
        SyntaxHeadSelfAttention(8, 2, syntax_dim=3, syntax_heads=1.0)
    with pytest.raises(ValueError, match="syntax_heads must be an int in 0..2"):
        SyntaxHeadSelfAttention(8, 2, syntax_dim=3, syntax_heads=3)
    with pytest.raises(ValueError, match="targets"):
        SyntaxHeadSelfAttention(8, 2, syntax_dim=3, targets=("q", "q"))
    with pytest.raises(TypeError, match="num_layers must be an int"):
        SyntaxGAT(8, num_layers="2")
    for make in (lambda: SyntaxBiasedSelfAttention(8, 2, backend="cuda"), lambda: sk.nn.Subnetworks(2, 4, backend=""),
                 lambda: SyntaxGAT(8, backend="fast")):
        with pytest.raises(ValueError, match="backend"):
            make()
    with pytest.raises(ValueError, match="window must be an int in 0..254 for the GAT, got None"):
        SyntaxGAT(8, window=None)
    # The ops' own checks: the same kinds of mistake, the same exception types.
    table = torch.zeros(sk.BucketSpec().num_buckets)
    with pytest.raises(TypeError, match="q must be a tensor"):
        sk.syntax_bias_attention(None, q, q, trees.distance, table, buckets=sk.BucketSpec(), backend="reference")
    with pytest.raises(TypeError, match="bias_scale"):
        sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), bias_scale="2",
                                 backend="reference")
    with pytest.raises(ValueError, match="bias_scale"):
        sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), bias_scale=torch.ones(2),
                                 backend="reference")


# ---------------------------------------------------------------- the encoder layer


@pytest.mark.parametrize("method", ["bias", "gat", "subnetwork"])
@pytest.mark.parametrize("norm_first,batch_first", [(False, True), (True, True), (False, False)],
                         ids=["post_norm", "pre_norm", "seq_first"])
def test_fresh_encoder_layer_matches_torch(method, norm_first, batch_first):
    trees, x = trees_and_input(8)
    masks = sk.MaskSpec(parent=False, child=False, sibling=False)  # `full` only: plain attention
    ours = SyntaxTransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", norm_first=norm_first,
                                         batch_first=batch_first, method=method, masks=masks, syntax_dim=5,
                                         backend="reference", variant="package").double()
    theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", norm_first=norm_first,
                                              batch_first=batch_first).double()
    copy_into_torch_layer(ours, theirs)
    padding = trees.key_padding_mask()
    src = x if batch_first else x.transpose(0, 1)
    syntax = torch.randn(2, 7, 5, dtype=f64)
    got = ours(src, trees, src_key_padding_mask=padding, syntax=syntax)
    expected = theirs(src, src_key_padding_mask=padding)
    if not batch_first:
        got, expected = got.transpose(0, 1), expected.transpose(0, 1)
    torch.testing.assert_close(got[~padding], expected[~padding])


def test_encoder_layer_structure_and_errors():
    layer = SyntaxTransformerEncoderLayer(16, 4, method="bias", window=3)
    for name in ("self_attn", "linear1", "dropout", "linear2", "norm1", "norm2", "dropout1", "dropout2"):
        assert hasattr(layer, name)
    assert isinstance(layer.self_attn, SyntaxBiasedSelfAttention)
    trees, x = trees_and_input(E=16)
    layer.eval()
    with torch.no_grad():
        layer.self_attn.distance_bias.normal_()
    out_window = layer(x.float(), trees)
    layer.window = None
    assert not torch.allclose(out_window, layer(x.float(), trees))
    with pytest.raises(ValueError, match="method"):
        SyntaxTransformerEncoderLayer(16, 4, method="tree")
    with pytest.raises(ValueError, match="window"):
        SyntaxTransformerEncoderLayer(16, 4, method="gat", window=2)
    with pytest.raises(ValueError, match="syntax"):
        SyntaxTransformerEncoderLayer(16, 4, method="gat")(x.float(), trees)
    with pytest.raises(ValueError, match="not both"):
        layer(x.float(), trees, src_key_padding_mask=trees.key_padding_mask(), lengths=trees.lengths)


# ---------------------------------------------------------------- the modules learn a tree-dependent task


def neighbour_mean_task(seed, batch=24, max_len=9):
    """Each token carries a random scalar f_i; the target is the mean of f over its tree neighbours (d = 1).

    Positions carry no information about the tree (random shapes, random head directions), so attention that
    does not see the tree cannot solve it.
    """
    rng = random.Random(seed)
    heads = [random_forest(rng, rng.randint(3, max_len), 1) for _ in range(batch)]
    trees = sk.TreeBatch.from_heads(heads)
    gen = torch.Generator().manual_seed(seed)
    valid = ~trees.key_padding_mask()
    f = torch.randn(batch, trees.max_len, generator=gen) * valid
    adjacent = (trees.distance == 1).float()
    target = (adjacent @ f[..., None])[..., 0] / adjacent.sum(-1).clamp(min=1)
    return trees, f, target, valid


class TinyModel(torch.nn.Module):
    def __init__(self, method, E=16):
        super().__init__()
        torch.manual_seed(0)
        self.method = method
        self.embed = torch.nn.Linear(1, E)
        self.gat = SyntaxGAT(E, num_layers=1, num_heads=2, head_dim=8, window=1, num_pos_tags=0,
                             backend="reference") if method == "gat" else None
        self.layer = SyntaxTransformerEncoderLayer(E, 2, 32, dropout=0.0,
                                                   method="bias" if method == "plain" else method,
                                                   masks=sk.MaskSpec(max_distance=1), syntax_dim=16,
                                                   syntax_targets=("q", "k"), backend="reference")
        if method == "plain":  # the bias layer with its table frozen at zero is plain attention
            self.layer.self_attn.distance_bias.requires_grad_(False)
            self.layer.self_attn.bias_scale.requires_grad_(False)
        self.head = torch.nn.Linear(E, 1)

    def forward(self, trees, f):
        x = self.embed(f[..., None])
        syntax = self.gat(x, trees) if self.gat is not None else None
        return self.head(self.layer(x, trees, syntax=syntax))[..., 0]


def train(method, steps=40):
    model = TinyModel(method)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.02)
    trees, f, target, valid = neighbour_mean_task(0)
    losses = []
    for _ in range(steps):
        loss = ((model(trees, f) - target) ** 2)[valid].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_modules_learn_a_tree_dependent_task():
    plain = train("plain")
    for method in ("bias", "subnetwork", "gat"):
        losses = train(method)
        assert losses[-1] < 0.5 * losses[0], f"{method}: loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        assert losses[-1] < 0.4 * plain[-1], f"{method}: {losses[-1]:.3f} vs plain attention {plain[-1]:.3f}"
