"""The pure-PyTorch reference against independent definitions: SDPA, brute-force masks and loops, gradcheck."""
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

import syntaxkernels as sk
from syntaxkernels import reference as R
from syntaxkernels.tools.checks.reference import brute_force_masks
from syntaxkernels.tools.workloads import random_forest
from syntaxkernels.specs import UNREACHABLE

f64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def rand(*shape, grad=False, dtype=f64):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def random_batch(seed, sizes, trees_per_item=None):
    rng = random.Random(seed)
    trees_per_item = trees_per_item or [1] * len(sizes)
    heads = [random_forest(rng, n, t) for n, t in zip(sizes, trees_per_item)]
    return heads, sk.TreeBatch.from_heads(heads)


# ---------------------------------------------------------------- distance-bias attention


def explicit_bias_attention(q, k, v, heads_dist, table, buckets, bias_scale, lengths, window, causal):
    """Loop form of the distance-bias attention and padding rules of docs/semantics.md: per (b, h, i) a softmax
    over the explicitly listed allowed keys."""
    B, H, N, D = q.shape
    lut = buckets.lut()
    c = 1.0 if bias_scale is None else bias_scale
    out = torch.zeros(B, H, N, v.shape[-1], dtype=q.dtype)
    for b in range(B):
        length = N if lengths is None else int(lengths[b])
        for h in range(H):
            row_table = table if table.dim() == 1 else table[h]
            for i in range(length):
                keys = [j for j in range(length)
                        if (window is None or int(heads_dist[b, i, j]) <= window) and (not causal or j <= i)]
                if not keys:
                    continue
                s = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(D) + c * row_table[lut[int(heads_dist[b, i, j])]]
                                 for j in keys])
                p = torch.softmax(s, dim=0)
                out[b, h, i] = sum(p[n] * v[b, h, j] for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("lengths", [None, [6, 3]], ids=["full", "ragged"])
@pytest.mark.parametrize("dtype", [torch.float32, f64], ids=["fp32", "fp64"])
def test_zero_table_unit_scale_is_sdpa(lengths, dtype):
    _, trees = random_batch(0, [6, 6], [1, 2])
    q, k, v = (rand(2, 3, 6, 8, dtype=dtype) for _ in range(3))
    buckets = sk.BucketSpec()
    out = R.syntax_bias_attention(q, k, v, trees.distance, torch.zeros(buckets.num_buckets, dtype=dtype),
                                  buckets=buckets, bias_scale=torch.ones(1, dtype=dtype), lengths=lengths)
    mask = None
    valid = torch.ones(2, 6, dtype=torch.bool)
    if lengths is not None:
        valid = torch.arange(6)[None] < torch.tensor(lengths)[:, None]
        mask = valid[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = 1e-12 if dtype == f64 else 1e-5
    torch.testing.assert_close(out[valid[:, None, :].expand(2, 3, 6)], expected[valid[:, None, :].expand(2, 3, 6)],
                               atol=tol, rtol=tol)
    assert (out[~valid[:, None, :].expand(2, 3, 6)] == 0).all()


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
@pytest.mark.parametrize("window,causal", [(None, False), (2, False), (None, True), (1, True)],
                         ids=["plain", "window2", "causal", "window1_causal"])
def test_bias_attention_matches_loops(per_head, window, causal):
    _, trees = random_batch(1, [7, 5], [1, 2])
    H = 2
    q, k, v = (rand(2, H, 7, 4) for _ in range(3))
    buckets = sk.BucketSpec(max_distance=4, log_distance=2)
    table = rand(H, buckets.num_buckets) if per_head else rand(buckets.num_buckets)
    scale = torch.tensor([0.7], dtype=f64)
    out = R.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale,
                                  lengths=trees.lengths, window=window, causal=causal)
    expected = explicit_bias_attention(q, k, v, trees.distance, table, buckets, 0.7, trees.lengths, window, causal)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
@pytest.mark.parametrize("window,causal", [(None, False), (1, True)], ids=["plain", "window1_causal"])
def test_bias_attention_gradcheck(per_head, window, causal):
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0, -1]])
    q, k, v = (rand(2, 2, 4, 3, grad=True) for _ in range(3))
    buckets = sk.BucketSpec(max_distance=2)
    table = rand(*((2, buckets.num_buckets) if per_head else (buckets.num_buckets,)), grad=True)
    scale = rand(1, grad=True)

    def fn(q, k, v, table, scale):
        return R.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale,
                                       lengths=trees.lengths, window=window, causal=causal)

    assert gradcheck(fn, (q, k, v, table, scale))


def test_bias_attention_table_grad_is_per_bucket_sum():
    """d table[t] = c * sum of dS over the pairs in bucket t (and d c = sum_t table[t] * that sum)."""
    _, trees = random_batch(2, [6, 6], [1, 2])
    q, k, v = (rand(2, 2, 6, 4, grad=True) for _ in range(3))
    buckets = sk.BucketSpec(max_distance=3)
    table = rand(buckets.num_buckets, grad=True)
    scale = torch.tensor([1.5], dtype=f64, requires_grad=True)
    out = R.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale)
    grad_out = rand(*out.shape)
    out.backward(grad_out)
    # dS via an explicit dense-bias formulation.
    bias = R.gather_bias(trees.distance, table.detach(), buckets, None, f64).expand(2, 2, 6, 6).clone()
    bias.requires_grad_(True)
    scores = q.detach() @ k.detach().transpose(-1, -2) / 2.0 + 1.5 * bias
    (torch.softmax(scores, -1) @ v.detach()).backward(grad_out)
    per_bucket = torch.zeros(buckets.num_buckets, dtype=f64)
    per_bucket.index_add_(0, buckets.lut()[trees.distance.long()][:, None].expand(2, 2, 6, 6).reshape(-1),
                          bias.grad.reshape(-1) / 1.5)
    torch.testing.assert_close(table.grad, 1.5 * per_bucket)
    torch.testing.assert_close(scale.grad, (table.detach() * per_bucket).sum()[None])


def test_padding_never_changes_valid_outputs():
    heads = [[1, -1, 1, 1, 3], [-1, 0, 1]]
    short = sk.TreeBatch.from_heads(heads)
    padded = sk.TreeBatch.from_heads(torch.tensor([[1, -1, 1, 1, 3, 0, 0, 0], [-1, 0, 1, 7, 7, 2, 2, 2]]),
                                     lengths=[5, 3])
    buckets = sk.BucketSpec()
    table = rand(2, buckets.num_buckets)
    q, k, v = (rand(2, 2, 8, 4) for _ in range(3))
    out_short = R.syntax_bias_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], short.distance, table,
                                        buckets=buckets, lengths=short.lengths)
    out_pad = R.syntax_bias_attention(q, k, v, padded.distance, table, buckets=buckets, lengths=padded.lengths)
    torch.testing.assert_close(out_pad[:, :, :5], out_short, atol=1e-13, rtol=0)
    assert (out_pad[:, :, 5:] == 0).all() and (out_pad[1, :, 3:] == 0).all()


def test_empty_rows_give_zero_output_and_zero_grads():
    trees = sk.TreeBatch.from_heads([[-1, 0, 0], [-1, 0, 0]], lengths=[2, 0])
    q, k, v = (rand(2, 2, 3, 4, grad=True) for _ in range(3))
    buckets = sk.BucketSpec()
    table = rand(buckets.num_buckets, grad=True)
    scale = rand(1, grad=True)
    out = R.syntax_bias_attention(q, k, v, trees.distance, table, buckets=buckets, bias_scale=scale,
                                  lengths=trees.lengths)
    out.backward(torch.ones_like(out))
    for t in (out, q.grad, k.grad, v.grad, table.grad, scale.grad):
        assert torch.isfinite(t).all()
    assert (out[1] == 0).all() and (out[0, :, 2] == 0).all()
    for g in (q.grad, k.grad, v.grad):
        assert (g[1] == 0).all() and (g[0, :, 2] == 0).all()
    assert q.grad[0, :, :2].abs().sum() > 0


# ---------------------------------------------------------------- Syntax-BERT masks and sub-networks

MASK_SPECS = [
    sk.MaskSpec(),
    sk.MaskSpec(max_distance=4, pairwise=True),
    sk.MaskSpec(max_distance=1, parent=False, sibling=False, pairwise=True, full=False),
    sk.MaskSpec(max_distance=2, child=False, full=False),
]


@pytest.mark.parametrize("masks", MASK_SPECS, ids=lambda m: "-".join(m.names)[:40])
def test_masks_match_brute_force(masks):
    rng = random.Random(3)
    for trial in range(12):
        sizes = [rng.randint(1, 12) for _ in range(3)] + [1]
        heads = [random_forest(rng, n, rng.randint(1, 3)) for n in sizes]
        trees = sk.TreeBatch.from_heads(heads)
        got = R.syntax_masks(trees, masks)
        expected = brute_force_masks(heads, trees.max_len, masks)
        assert torch.equal(got, expected), f"trial {trial}, heads {heads}"


def test_mask_relations_partition_off_diagonal_pairs():
    """parent/child/sibling (unbounded distance) and pairwise split the off-diagonal valid pairs exactly once."""
    heads, trees = random_batch(4, [15, 9, 1], [2, 1, 1])
    masks = sk.MaskSpec(max_distance=14, pairwise=True, full=False)
    counts = R.syntax_masks(trees, masks).sum(dim=1)
    valid = trees.segment >= 0
    off_diagonal = valid[:, :, None] & valid[:, None, :] & ~torch.eye(trees.max_len, dtype=torch.bool)
    assert torch.equal(counts, off_diagonal.long())


def test_single_token_and_two_tree_pairwise():
    trees = sk.TreeBatch.from_heads([[-1], [-1, 0, -1, 2]])
    masks = sk.MaskSpec(max_distance=2, pairwise=True)
    got = R.syntax_masks(trees, masks)
    names = masks.names
    # The lone token: only `full` (itself) is non-empty.
    assert got[0, :, 0, 0].tolist() == [name == "full" for name in names]
    pairwise = got[1, names.index("pairwise")]
    expected = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(pairwise, expected)
    assert got[1, names.index("parent_1"), 0, 1] and got[1, names.index("child_1"), 1, 0]


def test_subnetwork_attention_matches_loops():
    heads, trees = random_batch(5, [7, 4], [1, 2])
    masks = sk.MaskSpec(max_distance=2, pairwise=True)
    q, k, v = (rand(2, 2, 7, 3) for _ in range(3))
    out, nonempty = R.syntax_subnetwork_attention(q, k, v, trees, masks)
    allowed = brute_force_masks(heads, 7, masks)
    assert torch.equal(nonempty, allowed.any(-1))
    for b in range(2):
        for m in range(masks.num_masks):
            for i in range(7):
                keys = allowed[b, m, i].nonzero()[:, 0]
                if len(keys) == 0:
                    assert (out[b, m, :, i] == 0).all()
                    continue
                p = torch.softmax(q[b, :, i, None, :] @ k[b, :, keys].transpose(-1, -2) / math.sqrt(3), -1)
                torch.testing.assert_close(out[b, m, :, i], (p @ v[b, :, keys])[:, 0])


def test_subnetwork_attention_gradcheck():
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 0, -1]], lengths=[5])
    masks = sk.MaskSpec(max_distance=2, pairwise=True)
    q, k, v = (rand(1, 1, 5, 2, grad=True) for _ in range(3))
    assert gradcheck(lambda q, k, v: R.syntax_subnetwork_attention(q, k, v, trees, masks)[0], (q, k, v))


# ---------------------------------------------------------------- topical attention


def test_topical_attention_matches_loops_and_fresh_is_average():
    heads, trees = random_batch(6, [6, 3])
    masks = sk.MaskSpec(max_distance=2)
    q, k, v = (rand(2, 2, 6, 3) for _ in range(3))
    outputs, nonempty = R.syntax_subnetwork_attention(q, k, v, trees, masks)
    query, wk, wv = rand(2, 3), rand(2, 3, 3), rand(2, 3, 3)
    mixed = R.topical_attention(outputs, nonempty, query, wk, wv)
    for b in range(2):
        for h in range(2):
            for i in range(6):
                ms = nonempty[b, :, i].nonzero()[:, 0]
                if len(ms) == 0:
                    assert (mixed[b, h, i] == 0).all()
                    continue
                hm = outputs[b, ms, h, i]  # [m, D]
                w = torch.softmax((hm @ wk[h]) @ query[h] / math.sqrt(3), 0)
                torch.testing.assert_close(mixed[b, h, i], w @ (hm @ wv[h]))
    eye = torch.eye(3, dtype=f64).expand(2, 3, 3)
    fresh = R.topical_attention(outputs, nonempty, torch.zeros(2, 3, dtype=f64), rand(2, 3, 3), eye)
    weights = nonempty.to(f64)[:, :, None, :, None]
    torch.testing.assert_close(fresh, (outputs * weights).sum(1) / weights.sum(1).clamp(min=1))


def test_topical_attention_gradcheck_and_empty_tokens():
    outputs = rand(1, 3, 2, 4, 2, grad=True)
    nonempty = torch.tensor([[[True, False, True, False], [True, True, False, False], [False, True, True, False]]])
    query, wk, wv = rand(2, 2, grad=True), rand(2, 2, 2, grad=True), rand(2, 2, 2, grad=True)
    assert gradcheck(lambda *a: R.topical_attention(a[0], nonempty, *a[1:]), (outputs, query, wk, wv))
    out = R.topical_attention(outputs, nonempty, query, wk, wv)
    out.sum().backward()
    assert (out[0, :, 3] == 0).all()  # token 3 has no non-empty mask
    assert (outputs.grad[0, :, :, 3] == 0).all() and torch.isfinite(query.grad).all()
    assert (outputs.grad[0, 1, :, 2] == 0).all()  # an empty (mask, token) gets no gradient


def test_topical_attention_bad_shapes():
    outputs, nonempty = rand(1, 3, 2, 4, 2), torch.ones(1, 3, 4, dtype=torch.bool)
    with pytest.raises(TypeError, match="outputs must be a tensor"):
        R.topical_attention(outputs.tolist(), nonempty, rand(2, 2), rand(2, 2, 2), rand(2, 2, 2))
    with pytest.raises(TypeError, match="value_weight must be a tensor"):
        R.topical_attention(outputs, nonempty, rand(2, 2), rand(2, 2, 2), None)
    with pytest.raises(ValueError, match="outputs must have shape"):
        R.topical_attention(outputs[0], nonempty, rand(2, 2), rand(2, 2, 2), rand(2, 2, 2))
    with pytest.raises(ValueError, match="query"):
        R.topical_attention(outputs, nonempty, rand(2, 3), rand(2, 2, 2), rand(2, 2, 2))
    with pytest.raises(ValueError, match="nonempty"):
        R.topical_attention(outputs, nonempty.float(), rand(2, 2), rand(2, 2, 2), rand(2, 2, 2))
    with pytest.raises(ValueError, match="key_weight"):
        R.topical_attention(outputs, nonempty, rand(2, 2), rand(2, 3, 2), rand(2, 2, 2))


# ---------------------------------------------------------------- GAT, syntax heads, probe


@pytest.mark.parametrize("window", [0, 1, 3])
def test_gat_attention_matches_sdpa_with_window_mask(window):
    _, trees = random_batch(7, [8, 5], [1, 2])
    q, k, v = (rand(2, 2, 8, 4) for _ in range(3))
    out = R.gat_attention(q, k, v, trees.distance, window=window, lengths=trees.lengths)
    allowed = trees.distance.long() <= window  # padding and other trees are UNREACHABLE (255)
    rows = allowed.any(-1)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=(allowed | ~rows[..., None])[:, None])
    expected = expected * rows[:, None, :, None]
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    if window == 0:
        torch.testing.assert_close(out, v * rows[:, None, :, None])


def test_gat_attention_gradcheck_and_errors():
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 2, 0]])
    q, k, v = (rand(1, 2, 5, 2, grad=True) for _ in range(3))
    assert gradcheck(lambda q, k, v: R.gat_attention(q, k, v, trees.distance, window=1), (q, k, v))
    with pytest.raises(ValueError, match="window"):
        R.gat_attention(q, k, v, trees.distance, window=None)
    with pytest.raises(ValueError, match="window"):
        R.gat_attention(q, k, v, trees.distance, window=-1)


def test_gat_layer_is_heads_concatenated_and_gradchecks():
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1], [-1, 0, 0, 0]], lengths=[4, 3])
    x = rand(2, 4, 3, grad=True)
    wq, wk, wv = (rand(4, 3, grad=True) for _ in range(3))
    g = R.gat_layer(x, trees.distance, wq, wk, wv, num_heads=2, window=1, lengths=trees.lengths)
    assert g.shape == (2, 4, 4) and (g[1, 3] == 0).all()
    for h in range(2):
        cols = slice(2 * h, 2 * h + 2)
        head = R.gat_attention((x @ wq[cols].T)[:, None], (x @ wk[cols].T)[:, None], (x @ wv[cols].T)[:, None],
                               trees.distance, window=1, lengths=trees.lengths)[:, 0]
        torch.testing.assert_close(g[..., cols], head)
    fn = lambda x, wq, wk, wv: R.gat_layer(x, trees.distance, wq, wk, wv, num_heads=2, window=1,  # noqa: E731
                                           lengths=trees.lengths)
    assert gradcheck(fn, (x, wq, wk, wv))


@pytest.mark.parametrize("targets", [("q", "k"), ("k", "v"), ("v",)], ids=lambda t: "".join(t))
def test_inject_syntax_heads(targets):
    B, H, N, D, E = 2, 3, 4, 2, 5
    q, k, v, g = rand(B, H, N, D), rand(B, H, N, D), rand(B, H, N, D), rand(B, N, E)
    weights = [rand(2 * D, E) for _ in targets]
    new = dict(zip("qkv", R.inject_syntax_heads(q, k, v, g, weights, heads=2, targets=targets)))
    old = dict(q=q, k=k, v=v)
    for name in "qkv":
        assert torch.equal(new[name][:, 2:], old[name][:, 2:])  # the other heads are untouched
        if name in targets:
            w = weights[targets.index(name)]
            for h in range(2):
                torch.testing.assert_close(new[name][:, h], old[name][:, h] + g @ w[h * D:(h + 1) * D].T)
        else:
            assert new[name] is old[name]
    assert gradcheck(lambda g, *w: R.inject_syntax_heads(q, k, v, g, w, heads=2, targets=targets),
                     (g.requires_grad_(), *(w.requires_grad_() for w in weights)))


def test_inject_syntax_heads_errors():
    q = rand(1, 2, 3, 2)
    g = rand(1, 3, 4)
    with pytest.raises(ValueError, match="targets"):
        R.inject_syntax_heads(q, q, q, g, [rand(2, 4)], heads=1, targets=("x",))
    with pytest.raises(ValueError, match="heads"):
        R.inject_syntax_heads(q, q, q, g, [rand(2, 4), rand(2, 4)], heads=3)
    with pytest.raises(ValueError, match="weight"):
        R.inject_syntax_heads(q, q, q, g, [rand(3, 4), rand(2, 4)], heads=1)


def explicit_probe(g, proj, distance, depth, lengths):
    p = g @ proj
    dist_terms, depth_terms = [], []
    for b in range(g.shape[0]):
        for i in range(int(lengths[b])):
            depth_terms.append((depth[b, i].double() ** 2 - (p[b, i] ** 2).sum()).abs())
            for j in range(int(lengths[b])):
                if i != j and int(distance[b, i, j]) != UNREACHABLE:
                    dist_terms.append((distance[b, i, j].double() ** 2 - ((p[b, i] - p[b, j]) ** 2).sum()).abs())
    return torch.stack(dist_terms).mean(), torch.stack(depth_terms).mean()


def test_structural_probe_matches_explicit_and_gradchecks():
    trees = sk.TreeBatch.from_heads(torch.tensor([[-1, 0, 1, 1, -1, 4], [2, 2, -1, 0, 0, 0]]), lengths=[6, 3])
    g, proj = rand(2, 6, 4, grad=True), rand(4, 3, grad=True)
    losses = R.structural_probe_loss(g, proj, trees.distance, trees.depth, trees.lengths)
    expected = explicit_probe(g, proj, trees.distance, trees.depth, trees.lengths)
    torch.testing.assert_close(losses[0], expected[0])
    torch.testing.assert_close(losses[1], expected[1])
    # Default validity from depth, and padding rows of g never matter.
    g2 = g.detach().clone()
    g2[1, 3:] = 1e3
    torch.testing.assert_close(R.structural_probe_loss(g2, proj.detach(), trees.distance, trees.depth)[0],
                               losses[0].detach())
    assert gradcheck(lambda g, p: R.structural_probe_loss(g, p, trees.distance, trees.depth, trees.lengths),
                     (g, proj))


def test_structural_probe_errors():
    trees = sk.TreeBatch.from_heads([[-1, 0]])
    with pytest.raises(ValueError, match="proj"):
        R.structural_probe_loss(rand(1, 2, 4), rand(3, 2), trees.distance, trees.depth)
    with pytest.raises(ValueError, match="distance"):
        R.structural_probe_loss(rand(1, 2, 4), rand(4, 2), trees.distance.long(), trees.depth)
