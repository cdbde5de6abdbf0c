"""The methods as their papers wrote them and as their authors ran them (``variant="paper" | "release"``), checked
against compact transcriptions written here from the papers' equations and from what the released code computes
(never against the package's own reference). float64, padded batches, wordpieces and sentence pairs.

Transcribed from: syntax-augmented mBERT (section 2.2 Eq. 2-3, 2.3, 2.4; the release's ``graph_utils.py``,
``modeling_bert.py``, ``processors/utils_tag.py``, ``utils_classify.py``, ``constants.py``) and Syntax-BERT (its
prose; the release's ``modeling_syntaxbert.py``, ``data/processors/glue.py`` and ``tokenization_bert.py``).
"""
import math
import random

import pytest
import torch
import torch.nn.functional as F

import syntaxkernels as sk
from syntaxkernels.nn import (StructuralProbeLoss, SyntaxBertSelfAttention, SyntaxGAT, SyntaxHeadSelfAttention,
                              TopicalAttention)
from syntaxkernels.tools.workloads import random_forest

from conftest import CPP, TRITON

f64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _trees(sizes=(9, 5, 1), seed=0):
    """A padded batch of one [CLS]-rooted tree per item (as the release builds them)."""
    rng = random.Random(seed)
    rows = []
    for n in sizes:
        words = random_forest(rng, n - 1, 1) if n > 1 else []
        rows.append([-1] + [0 if h < 0 else h + 1 for h in words])
    return sk.TreeBatch.from_heads(rows)


def _release_distance(trees):
    """The release's distance matrix: tree distances, 99999 where a pair involves padding (``batchify``)."""
    d = trees.distance.to(f64).clone()
    N = d.shape[-1]
    valid = torch.arange(N)[None] < trees.lengths[:, None]
    return d.masked_fill(~(valid[:, :, None] & valid[:, None, :]), 99999.0), valid


def _perturb(module, scale=0.3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def _grads(out, weight, inputs):
    return torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


def _assert_same(got, want, inputs_got, inputs_want, weight, atol=1e-10):
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-9)
    for a, b in zip(_grads(got, weight, inputs_got), _grads(want, weight, inputs_want)):
        if a is None and b is None:
            continue
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-9)


# ============================================================================== syntax-augmented mBERT: the GAT


def paper_gat(x, D, delta, layers, heads):
    """Eq. 2-3 on one sentence: per head T = G W_T, V = G W_V, softmax((T T^T + M) / sqrt(d_g)) V with M_ij = 0 if
    D_ij <= delta, -inf otherwise; heads concatenated; no positions, feed-forward or residual. ``layers``:
    (W_T, W_V) in nn.Linear layout."""
    for w_t, w_v in layers:
        outs = []
        for T, V in zip((x @ w_t.T).chunk(heads, -1), (x @ w_v.T).chunk(heads, -1)):
            M = torch.zeros_like(D).masked_fill(D > delta, float("-inf"))
            outs.append(torch.softmax((T @ T.T + M) / math.sqrt(T.shape[-1]), -1) @ V)
        x = torch.cat(outs, -1)
    return x


def paper_gat_batch(x, D, lengths, delta, layers, heads):
    """:func:`paper_gat` item by item on the valid tokens (zeros past each length)."""
    out = torch.zeros(x.shape[0], x.shape[1], layers[-1][0].shape[0], dtype=x.dtype)
    for b, n in enumerate(lengths.tolist()):
        if n:
            out[b, :n] = paper_gat(x[b, :n], D[b, :n, :n], delta, layers, heads)
    return out


def release_gat(x, dist, delta, layers, norm):
    """The release's GATModel.forward (eval): adj = dist <= delta; per head Wh = h W, e = LeakyReLU_0.2(Wh a1 +
    (Wh a2)^T), -9e15 outside adj, softmax, h' = att Wh (concat=False: no ELU); heads concatenated; LayerNorm."""
    adj = (dist <= delta).to(f64)
    for heads in layers:
        outs = []
        for W, a1, a2 in heads:
            Wh = x @ W
            e = F.leaky_relu(Wh @ a1 + (Wh @ a2).transpose(1, 2), 0.2)
            att = torch.softmax(torch.where(adj > 0, e, -9e15 * torch.ones_like(e)), dim=2)
            outs.append(att @ Wh)
        x = torch.cat(outs, dim=2)
    return norm(x)


@pytest.mark.parametrize("backend", ["reference", "auto", "triton"])
def test_paper_gat_is_eq_2_3(backend):
    """The paper's GAT (one projection for queries and keys) on the reference, C++ and Triton (interpreter) paths."""
    trees = _trees()
    gat = _perturb(SyntaxGAT(12, num_layers=2, num_heads=2, head_dim=8, window=2, backend=backend,
                             variant="paper")).double()
    if backend != "reference":
        gat.float()
    dtype = next(gat.parameters()).dtype
    x = torch.randn(3, 9, 12, dtype=dtype, requires_grad=True)
    pos = torch.randint(0, 21, (3, 9))
    try:
        out = gat(x, trees, pos=pos)
    except ValueError as error:  # no Triton here
        pytest.skip(str(error))
    D, valid = _release_distance(trees)
    g0 = x + gat.pos_embedding(pos)
    want = paper_gat_batch(g0.double(), D, trees.lengths, 2,
                           [(l.t_proj.weight.double(), l.v_proj.weight.double()) for l in gat.layers], 2)
    w = torch.randn(out.shape, dtype=dtype) * valid[..., None]
    params = [x, gat.pos_embedding.weight] + [l.t_proj.weight for l in gat.layers]
    tol = 1e-10 if dtype == f64 else 2e-4
    torch.testing.assert_close((out * valid[..., None]).double(), want * valid[..., None], atol=tol, rtol=tol)
    got_g = _grads(out, w, params)
    want_g = _grads(want, w.double(), params)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a.double(), b.double(), atol=tol * max(1.0, b.abs().max().item()), rtol=tol)
    assert (out[~valid] == 0).all()


def test_release_gat_is_the_released_computation():
    trees = _trees(seed=1)
    gat = _perturb(SyntaxGAT(12, num_layers=2, num_heads=3, head_dim=4, window=2, backend="reference",
                             variant="release", layer_norm_eps=1e-12), scale=0.1).double().eval()
    assert gat.pos_embedding.padding_idx == 0 and gat.pos_embedding.num_embeddings == 21
    x = torch.randn(3, 9, 12, dtype=f64, requires_grad=True)
    pos = torch.randint(0, 21, (3, 9))
    out = gat(x, trees, pos=pos)
    dist, valid = _release_distance(trees)
    layers = [[(l.weight[h], l.att_src[h][:, None], l.att_dst[h][:, None]) for h in range(3)] for l in gat.layers]
    want = release_gat(x + gat.pos_embedding(pos), dist, 2, layers, gat.norm)
    w = torch.randn(out.shape, dtype=f64) * valid[..., None]
    params = [x, gat.norm.weight, gat.pos_embedding.weight] + [p for l in gat.layers for p in l.parameters()]
    _assert_same(out * valid[..., None], want * valid[..., None], params, params, w)
    assert (out[~valid] == 0).all()  # the release's padding rows average every key; nothing valid reads them
    # The padding POS row (id 0) gets no gradient, as nn.Embedding(padding_idx=0) in the release.
    (gat(x, trees, pos=pos) * w).sum().backward()
    assert (gat.pos_embedding.weight.grad[0] == 0).all() and gat.pos_embedding.weight.grad[1:].abs().sum() > 0


def test_release_gat_dropout_follows_training_mode():
    trees = _trees()
    gat = SyntaxGAT(12, num_layers=1, num_heads=2, head_dim=4, window=2, variant="release", dropout=0.5)
    x = torch.randn(3, 9, 12)
    gat.eval()
    torch.testing.assert_close(gat(x, trees), gat(x, trees))
    gat.train()
    assert not torch.equal(gat(x, trees), gat(x, trees))


def test_gat_variants_on_packed_rows_equal_padded():
    rows = [[-1, 0, 1, 1, 0], [-1, 0], [-1, 0, 0, 2]]
    padded, packed = sk.TreeBatch.from_heads(rows), sk.TreeBatch.from_heads(rows, packed=True)
    x = torch.randn(3, 5, 8, dtype=f64)
    flat = sk.trees.pack_padded(x, padded.lengths)[None]
    for variant in ("paper", "release"):
        gat = SyntaxGAT(8, num_layers=2, num_heads=2, head_dim=4, window=1, variant=variant).double().eval()
        torch.testing.assert_close(gat(flat, packed)[0], sk.trees.pack_padded(gat(x, padded), padded.lengths))


# ============================================================================== the probe


def release_probe(g, B1, B2, dist, depths, lengths):
    """TwoWordPSDProbe + L1DistanceLoss and OneWordPSDProbe + L1DepthLoss (99999 = padding labels)."""
    t = g @ B1
    diffs = t[:, :, None, :] - t[:, None, :, :]
    pred = diffs.pow(2).sum(-1)
    ones = (dist != 99999).to(f64)
    per_sent = (pred * ones - dist * ones).abs().sum((1, 2)) / lengths.pow(2)
    sents = (lengths != 0).sum()
    d = g @ B2
    norms = (d * d).sum(-1)
    ones = (depths != 99999).to(f64)
    depth = ((norms * ones - depths * ones).abs().sum(1) / lengths).sum() / sents
    return per_sent.sum() / sents, depth


def paper_probe(g, B1, B2, dist, depths, lengths):
    """Section 2.4: sum_s (1/n^2) sum_ij |dist^2 - d_theta1(g_i, g_j)^2| (here per batch: its mean over s), the
    depth term with theta_2 (the paper does not write it out: Hewitt and Manning's, as the release)."""
    out = []
    for s in range(g.shape[0]):
        n = int(lengths[s])
        p = g[s, :n] @ B1
        sq = ((p[:, None] - p[None]) ** 2).sum(-1)
        out.append((dist[s, :n, :n] ** 2 - sq).abs().sum() / n ** 2)
    _, depth = release_probe(g, B1, B2, dist, depths, lengths)
    return torch.stack(out).mean(), depth


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_probe_is_the_papers_and_the_releases(variant):
    trees = _trees(sizes=(9, 5, 2), seed=3)
    probe = StructuralProbeLoss(6, 4, variant=variant).double()
    g = torch.randn(3, 9, 6, dtype=f64, requires_grad=True)
    dist, valid = _release_distance(trees)
    depths = trees.depth.to(f64).masked_fill(~valid, 99999.0)
    lengths = trees.lengths.to(f64)
    got = probe(g, trees)
    want = (paper_probe if variant == "paper" else release_probe)(g, probe.proj, probe.depth_proj, dist, depths,
                                                                   lengths)
    inputs = [g, probe.proj, probe.depth_proj]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
        for ga, gb in zip(torch.autograd.grad(a, inputs, retain_graph=True, allow_unused=True),
                          torch.autograd.grad(b, inputs, retain_graph=True, allow_unused=True)):
            if ga is None or gb is None:
                assert (ga is None or ga.abs().sum() == 0) and (gb is None or gb.abs().sum() == 0)
                continue
            torch.testing.assert_close(ga, gb)


def test_probe_variants_differ_as_documented():
    """The package pools squared targets over all pairs with one matrix: another number than either."""
    trees = _trees(sizes=(12, 7), seed=4)
    g = torch.randn(2, 12, 8, dtype=f64)
    torch.manual_seed(0)
    losses = {v: StructuralProbeLoss(8, 4, variant=v).double()(g, trees)[0].item()
              for v in ("paper", "release", "package")}
    assert len({round(v, 6) for v in losses.values()}) == 3, losses


# ============================================================================== syntax heads


def release_syntax_attention(x, g, q_w, q_b, k_w, k_b, v_w, v_b, lin_k, lin_v, lengths, heads, n, targets):
    """BertSelfAttention.forward of the release with addi_key / addi_value (or the paper's Q, K): the additive
    -10000 padding mask, scores * (E/H)^-0.5."""
    B, N, E = x.shape
    D = E // heads

    def split(t, h):
        return t.view(B, N, h, D).permute(0, 2, 1, 3)

    q, k, v = split(x @ q_w.T + q_b, heads), split(x @ k_w.T + k_b, heads), split(x @ v_w.T + v_b, heads)
    parts = {"q": q, "k": k, "v": v}
    for t, lin in zip(targets, (lin_k, lin_v)):
        add = split(g @ lin.weight.T + lin.bias, n)
        parts[t] = torch.cat([parts[t][:, :n] + add, parts[t][:, n:]], 1)
    mask = (1.0 - (torch.arange(N)[None] < lengths[:, None]).to(f64))[:, None, None, :] * -10000.0
    scores = parts["q"] @ parts["k"].transpose(-1, -2) * (E / heads) ** -0.5 + mask
    return (torch.softmax(scores, -1) @ parts["v"]).permute(0, 2, 1, 3).reshape(B, N, E)


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_syntax_heads_are_the_papers_and_the_releases(variant):
    trees = _trees(seed=5)
    module = SyntaxHeadSelfAttention(16, 4, syntax_dim=6, syntax_heads=2, variant=variant).double()
    assert module.targets == (("q", "k") if variant == "paper" else ("k", "v"))
    for proj in module.syntax_proj.values():  # the release's init: N(0, 0.02), bias 0
        assert proj.bias is not None and (proj.bias == 0).all() and 0.005 < proj.weight.std() < 0.05
    _perturb(module)
    x = torch.randn(3, 9, 16, dtype=f64, requires_grad=True)
    g = torch.randn(3, 9, 6, dtype=f64, requires_grad=True)
    got = module(x, g, lengths=trees.lengths)
    lins = [module.syntax_proj[t] for t in module.targets]
    inner = release_syntax_attention(x, g, module.q_proj.weight, module.q_proj.bias, module.k_proj.weight,
                                     module.k_proj.bias, module.v_proj.weight, module.v_proj.bias, *lins,
                                     trees.lengths, 4, 2, module.targets)
    want = module.out_proj(inner)
    valid = (torch.arange(9)[None] < trees.lengths[:, None])[..., None]
    params = [x, g] + [p for lin in lins for p in lin.parameters()]
    _assert_same(got * valid, want * valid, params, params, torch.randn(got.shape, dtype=f64))


# ============================================================================== Syntax-BERT: mixing


def paper_topical(H, q_task, WK, WV):
    """H^O = softmax(q_task (H W^K)^T / sqrt(d)) (H W^V) per token, H = [H_1 .. H_m] at full width d (heads
    concatenated). ``H [B, M, N, d]``."""
    scores = torch.einsum("e,bmne->bnm", q_task[0], H @ WK) / math.sqrt(H.shape[-1])
    return torch.einsum("bnm,bmne->bne", torch.softmax(scores, -1), H @ WV)


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_topical_attention_is_the_papers_and_the_releases(variant):
    B, M, H, N, D = 2, 5, 3, 4, 2
    module = _perturb(TopicalAttention(H, D, variant=variant).double()) if variant == "paper" else \
        TopicalAttention(H, D, variant=variant)
    outputs = torch.randn(B, M, H, N, D, dtype=f64, requires_grad=True)
    nonempty = torch.rand(B, M, N) > 0.5
    got = module(outputs, nonempty)
    full = outputs.permute(0, 1, 3, 2, 4).reshape(B, M, N, H * D)
    if variant == "paper":
        want = paper_topical(full, module.query, module.key_weight, module.value_weight)
        params = [outputs, module.query, module.key_weight, module.value_weight]
    else:
        want = full.sum(1) / math.sqrt(M)
        params = [outputs]
    want = want.view(B, N, H, D).permute(0, 2, 1, 3)
    _assert_same(got, want, params, params, torch.randn(got.shape, dtype=f64))


def test_fresh_paper_topical_attention_averages():
    outputs = torch.randn(2, 4, 3, 5, 2)
    torch.testing.assert_close(TopicalAttention(3, 2, variant="paper")(outputs, torch.ones(2, 4, 5, dtype=torch.bool)),
                               outputs.mean(1))


# ============================================================================== Syntax-BERT: masks on wordpieces


def release_word_indices(words_per_token_a, words_per_token_b=None):
    """tokenization_bert.build_word_indices_with_special_tokens: [CLS] takes the first token's word, each [SEP] the
    last token's word of its text."""
    a = [words_per_token_a[0]] + words_per_token_a + [words_per_token_a[-1]]
    return a, (None if words_per_token_b is None else words_per_token_b + [words_per_token_b[-1]])


def release_masks(sentences, tokens_of_word, n_mask, shift, N):
    """glue.generate_syntax_masks_with_parser on word heads (1-based, 0 = root) per sentence and the token ranges of
    each word: channels [n_mask child-like (row: the descendant), n_mask parent-like, n_mask siblings]."""
    masks = torch.zeros(3 * n_mask, N, N)
    for depth in range(1, n_mask + 1):
        word_shift = 0
        for heads in sentences:
            for wid in range(1, len(heads) + 1):
                par, flag = wid, 0
                for _ in range(depth):
                    if par == 0:
                        flag = 1
                        break
                    par = heads[par - 1]
                if flag == 0 and par != 0:
                    t0, t1 = tokens_of_word[word_shift + wid - 1], tokens_of_word[word_shift + par - 1]
                    masks[depth - 1, shift + t0[0]:shift + t0[-1] + 1, shift + t1[0]:shift + t1[-1] + 1] = 1
                    masks[depth - 1 + n_mask, shift + t1[0]:shift + t1[-1] + 1, shift + t0[0]:shift + t0[-1] + 1] = 1
            word_shift += len(heads)
    word_shift = 0
    for heads in sentences:
        def up(w):
            return heads[w - 1]

        def depth_of(w):
            d = 0
            while w != 0:
                d, w = d + 1, up(w)
            return d
        for i in range(1, len(heads) + 1):
            for j in range(1, len(heads) + 1):
                if i == j:
                    continue
                di, dj, ci, cj, dist = depth_of(i), depth_of(j), i, j, 0
                if di > dj:
                    dist += di - dj
                    for _ in range(di - dj):
                        ci = up(ci)
                if di < dj:
                    dist += dj - di
                    for _ in range(dj - di):
                        cj = up(cj)
                if ci == cj:
                    continue
                while ci != cj:
                    dist, ci, cj = dist + 2, up(ci), up(cj)
                if dist - 2 < n_mask:
                    t0, t1 = tokens_of_word[word_shift + i - 1], tokens_of_word[word_shift + j - 1]
                    c = dist - 2 + 2 * n_mask
                    masks[c, shift + t0[0]:shift + t0[-1] + 1, shift + t1[0]:shift + t1[-1] + 1] = 1
                    masks[c, shift + t1[0]:shift + t1[-1] + 1, shift + t0[0]:shift + t0[-1] + 1] = 1
        word_shift += len(heads)
    return masks


def _tokens_of_word(word_index_every_token):
    """glue.word_index_to_token_index."""
    out = [[] for _ in range(max(word_index_every_token) + 1)]
    for t, w in enumerate(word_index_every_token):
        out[w].append(t)
    return out


def _pieces(rng, num_words):
    """Word ids of a wordpiece tokenisation: 1-3 pieces per word."""
    return [w for w in range(num_words) for _ in range(rng.choice([1, 1, 2, 3]))]


def _random_text(rng, sizes):
    """A text of sentences (package heads) and its CoNLL-U heads per sentence."""
    sentences = [random_forest(rng, n, 1) for n in sizes]
    return sentences, [[h + 1 for h in s] for s in sentences]


def release_layout(rng, pair, n_mask, N):
    """One item: the package inputs (texts, word_ids, sequence_ids) and the release's M masks in MaskSpec order
    (parent_*, child_*, sibling_*, [pairwise], full) from the release's builders."""
    text_a, conll_a = _random_text(rng, [rng.randint(1, 6), rng.randint(2, 6)])
    wa = _pieces(rng, sum(len(s) for s in text_a))
    word_ids, seq = [None] + wa + [None], [None] + [0] * len(wa) + [None]
    idx_a, idx_b = release_word_indices(wa)
    texts = text_a
    if pair:
        text_b, conll_b = _random_text(rng, [rng.randint(1, 5)])
        wb = _pieces(rng, sum(len(s) for s in text_b))
        word_ids += wb + [None]
        seq += [1] * len(wb) + [None]
        idx_a, idx_b = release_word_indices(wa, wb)
        texts = [text_a, text_b]
    masks = release_masks(conll_a, _tokens_of_word(idx_a), n_mask, 0, N)
    if pair:
        masks = masks + release_masks(conll_b, _tokens_of_word(idx_b), n_mask, len(idx_a), N)
    order = list(range(n_mask, 2 * n_mask)) + list(range(n_mask)) + list(range(2 * n_mask, 3 * n_mask))
    masks = masks[order]  # the release's first group is the paper's child mask
    total = len(word_ids)
    extra = []
    if pair:  # generate_mask_cross_two_texts
        cross = torch.zeros(N, N)
        t1, t2 = len(idx_a), len(idx_b)
        cross[0:t1, t1:t1 + t2] = 1
        cross[t1:t1 + t2, 0:t1] = 1
        cross[range(t1 + t2), range(t1 + t2)] = 1
        extra.append(cross)
    full = torch.zeros(N, N)
    full[:total, :total] = 1  # generate_full_mask
    masks = torch.cat([masks] + [e[None] for e in extra] + [full[None]])
    return texts, word_ids, (seq if pair else None), masks


def _release_batch(pair, n_mask=2, seed=0, items=3):
    rng = random.Random(seed)
    N = 40
    cases = [release_layout(rng, pair, n_mask, N) for _ in range(items)]
    width = max(len(c[1]) for c in cases)
    texts = [c[0] for c in cases]
    word_ids = [c[1] for c in cases]
    seqs = [c[2] for c in cases] if pair else None
    masks = torch.stack([c[3][:, :width, :width] for c in cases])
    lengths = torch.tensor([len(w) for w in word_ids])
    word_ids = [w + [None] * (width - len(w)) for w in word_ids]
    if pair:
        seqs = [s + [None] * (width - len(s)) for s in seqs]
    attention_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    spec = sk.MaskSpec(max_distance=n_mask, pairwise=pair)
    return texts, word_ids, seqs, attention_mask, masks.bool(), spec


@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
def test_release_masks_on_wordpieces_and_special_tokens(pair):
    texts, word_ids, seqs, attention_mask, want, spec = _release_batch(pair)
    trees = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask,
                                       variant="release")
    got = sk.reference.syntax_masks(trees, spec)
    assert torch.equal(got, want)
    paper = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask)
    expected = want.clone()
    if pair:  # the paper's pairwise mask: tokens of different sentences only (no diagonal)
        expected[:, spec.names.index("pairwise")] &= ~torch.eye(want.shape[-1], dtype=torch.bool)
    assert torch.equal(sk.reference.syntax_masks(paper, spec), expected)
    # The package's token tree is another set of masks (pieces are children of their first piece).
    package = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask,
                                         variant="package")
    assert not torch.equal(sk.reference.syntax_masks(package, spec), want)


def release_syntax_bert(x, q_w, q_b, k_w, k_b, v_w, v_b, masks, heads):
    """SyntaxBertSelfAttention.forward of the release (use_task_aggregation False): scores / sqrt(D) plus
    (1 - mask) * -10000 per mask, softmax over every key, context per mask, sum over masks / sqrt(M)."""
    B, N, E = x.shape
    D = E // heads

    def split(t):
        return t.view(B, N, heads, D).permute(0, 2, 1, 3)

    q, k, v = split(x @ q_w.T + q_b), split(x @ k_w.T + k_b), split(x @ v_w.T + v_b)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D))[:, :, None] + ((1.0 - masks.to(f64)) * -10000.0)[:, None]
    context = torch.softmax(scores, -1) @ v[:, :, None]  # [B, H, M, N, D]
    out = context.sum(2) / math.sqrt(masks.shape[1])
    return out.permute(0, 2, 1, 3).reshape(B, N, E)


def paper_syntax_bert(x, q_w, q_b, k_w, k_b, v_w, v_b, masks, heads, q_task, WK, WV):
    """Masked self-attention sub-networks (sparse connections as in each mask; a row with none: the release's plain
    attention over every key), heads concatenated, then the paper's topical attention."""
    B, N, E = x.shape
    D = E // heads

    def split(t):
        return t.view(B, N, heads, D).permute(0, 2, 1, 3)

    q, k, v = split(x @ q_w.T + q_b), split(x @ k_w.T + k_b), split(x @ v_w.T + v_b)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D))[:, :, None]  # [B, H, 1, N, N]
    allowed = masks[:, None]
    empty = ~allowed.any(-1, keepdim=True)
    p = torch.softmax(scores.masked_fill(~(allowed | empty), float("-inf")), -1)
    Hm = (p @ v[:, :, None]).permute(0, 2, 3, 1, 4).reshape(B, masks.shape[1], N, E)
    return paper_topical(Hm, q_task, WK, WV)


@pytest.mark.parametrize("variant", ["paper", "release"])
@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("backend", ["reference", CPP, TRITON])
def test_syntax_bert_layer_is_the_papers_and_the_releases(variant, pair, backend):
    """Outputs (every row: padding rows too) and gradients of SyntaxBertSelfAttention on a mask builder's batch,
    against the transcriptions, on the reference, C++ and Triton (interpreter) paths."""
    name, device = backend if isinstance(backend, tuple) else (backend, "cpu")
    texts, word_ids, seqs, attention_mask, masks, spec = _release_batch(pair, seed=7)
    trees = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask,
                                       variant=variant)
    valid = attention_mask.bool()
    empty = ~masks.any(-1)  # [B, M, N]: (token, mask) rows without a key
    assert (empty & valid[:, None]).any() and (~empty & valid[:, None]).any()  # both kinds among valid tokens
    module = _perturb(SyntaxBertSelfAttention(16, 2, masks=spec, backend=name, variant=variant), scale=0.2)
    dtype = f64 if name == "reference" else torch.float32
    module = module.to(dtype)
    B, N = attention_mask.shape
    x = torch.randn(B, N, 16, dtype=dtype, requires_grad=True)
    got = module(x, trees)
    if variant == "paper" and pair:  # the paper's pairwise mask has no diagonal
        masks = masks.clone()
        masks[:, spec.names.index("pairwise")] &= ~torch.eye(N, dtype=torch.bool)
    proj = [t.double() for m in (module.q_proj, module.k_proj, module.v_proj) for t in (m.weight, m.bias)]
    xd = x.double()
    if variant == "release":
        inner = release_syntax_bert(xd, *proj, masks, 2)
    else:
        inner = paper_syntax_bert(xd, *proj, masks, 2, module.topical.query.double(),
                                  module.topical.key_weight.double(), module.topical.value_weight.double())
    want = F.linear(inner, module.out_proj.weight.double(), module.out_proj.bias.double())
    tol = 1e-9 if dtype == f64 else 3e-4
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    w = torch.randn(got.shape, dtype=f64)
    params = [x, module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]
    for a, b in zip(_grads(got, w.to(dtype), params), _grads(want, w, params)):
        torch.testing.assert_close(a.double(), b.double(), atol=tol * max(1.0, b.abs().max().item()), rtol=tol)


def test_subnetwork_op_takes_word_batches_on_every_path():
    """The op itself on a WordTreeBatch: C++ and Triton (interpreter) against the reference, outputs, nonempty and
    gradients (the release's pairwise diagonal included)."""
    texts, word_ids, seqs, attention_mask, _, spec = _release_batch(True, seed=9)
    trees = sk.trees.syntax_bert_batch(texts, word_ids, sequence_ids=seqs, attention_mask=attention_mask,
                                       variant="release")
    B, N = attention_mask.shape
    q, k, v = (torch.randn(B, 2, N, 8, requires_grad=True) for _ in range(3))
    want, want_ne = sk.reference.syntax_subnetwork_attention(q.double(), k.double(), v.double(), trees, spec)
    upstream = torch.randn(want.shape)
    want_g = torch.autograd.grad((want * upstream.double()).sum(), [q, k, v])
    for backend in ("auto", "triton"):
        try:
            got, got_ne = sk.syntax_subnetwork_attention(q, k, v, trees, spec, backend=backend)
        except ValueError as error:
            pytest.skip(str(error))
        assert torch.equal(got_ne, want_ne)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        for a, b in zip(torch.autograd.grad((got * upstream).sum(), [q, k, v]), want_g):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-4, rtol=1e-4)


def test_fresh_subnetwork_layers_with_only_full_are_plain_attention():
    """The promise each variant keeps: with only ``full`` a fresh layer is plain attention on the valid tokens."""
    trees = _trees()
    full_only = sk.MaskSpec(parent=False, child=False, sibling=False)
    x = torch.randn(3, 9, 16, dtype=f64)
    valid = torch.arange(9)[None] < trees.lengths[:, None]
    for variant in ("paper", "release", "package"):
        m = SyntaxBertSelfAttention(16, 4, masks=full_only, variant=variant, backend="reference").double()
        q, k, v = (t.view(3, 9, 4, 4).transpose(1, 2) for t in (m.q_proj(x), m.k_proj(x), m.v_proj(x)))
        plain = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
        torch.testing.assert_close(m(x, trees)[valid], m.out_proj(plain.transpose(1, 2).reshape(3, 9, 16))[valid])


# ============================================================================== token trees and POS ids


def release_token_heads(sentence_heads, word_ids):
    """processors.process_sentence (1-based heads, 0 = root) of one text's wordpieces: a non-first piece hangs from
    its word's first piece; every piece of a root word but the very first hangs from that first one."""
    first, start = [], 0
    for w in range(len(sentence_heads)):
        first.append(word_ids.index(w))
    out, head_idx = [], -1
    for i, w in enumerate(word_ids):
        h = sentence_heads[w]
        if h == 0:
            if head_idx == -1:
                head_idx = i + 1
                out.append(0)
            else:
                out.append(head_idx)
        elif first[w] == i:
            out.append(first[h - 1] + 1)
        else:
            out.append(first[w] + 1)
    return out


def test_release_token_trees_single_and_pairs():
    rng = random.Random(11)
    for _ in range(20):
        a = [random_forest(rng, rng.randint(1, 5), 1) for _ in range(rng.randint(1, 2))]
        b = [random_forest(rng, rng.randint(1, 5), 1)]
        conll = lambda text: [h + 1 + sum(len(s) for s in text[:k]) if h >= 0 else 0  # noqa: E731
                              for k, s in enumerate(text) for h in s]
        wa = _pieces(rng, len(conll(a)))
        wb = _pieces(rng, len(conll(b)))
        # utils_tag: heads = [0] + (text heads + 1, the root's -> 1) + [1]: [SEP] hangs from [CLS].
        ha = [h + 1 for h in release_token_heads(conll(a), wa)]
        ha[ha.index(1)] = 1
        single = [0] + [1 if h == 1 else h for h in ha] + [1]
        got = sk.trees.align_to_tokens(a, [None] + wa + [None], variant="release")
        assert [h + 1 for h in got] == single
        # utils_classify: [0] + a + [len(a) + 1] + b (offset, root -> 1) + [total - 1].
        hb = [h if h == 0 else h + len(wa) + 2 for h in release_token_heads(conll(b), wb)]
        hb = [1 if h == 0 else h for h in hb]
        total = len(wa) + len(wb) + 3
        pair = [0] + [1 if h == 1 else h for h in ha] + [len(wa) + 1] + hb + [total - 1]
        word_ids = [None] + wa + [None] + wb + [None]
        seq = [None] + [0] * len(wa) + [None] + [1] * len(wb) + [None]
        got = sk.trees.align_to_tokens([a, b], word_ids, sequence_ids=seq, variant="release")
        assert [h + 1 for h in got] == pair
        # The paper: [SEP] hangs from [CLS] (section 2.2), like the package.
        assert sk.trees.align_to_tokens([a, b], word_ids, sequence_ids=seq) == sk.trees.align_to_tokens(
            [a, b], word_ids, sequence_ids=seq, variant="package")


def test_release_pos_ids():
    """constants.UPOS_MAP: [PAD] 0, the 17 UPOS tags, [CLS] 18, [SEP] 19, [UNK] 20."""
    symbols = ["[PAD]"] + list(sk.integrations.upos.UPOS_TAGS) + ["[CLS]", "[SEP]", "[UNK]"]
    upos_map = {s: i for i, s in enumerate(symbols)}
    s = sk.trees.Sentence(words=["A", "b", "c"], heads=[1, -1, 1], upos=["DET", "VERB", "PUNCT"])
    word_ids = [None, 0, 1, 1, 2, None, None]
    want = [upos_map[t] for t in ["[CLS]", "DET", "VERB", "VERB", "PUNCT", "[SEP]"]] + [0]
    for variant in ("paper", "release"):
        assert sk.integrations.upos.token_pos_ids([s], [word_ids], variant=variant, lengths=[6]).tolist() == [want]


# ============================================================================== the transformers integration

transformers = pytest.importorskip("transformers")


def _bert(**overrides):
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     **overrides)
    return transformers.BertModel(config).eval()


def release_bert_forward(model, ids, mask, pos, dist, n_syntax, targets):
    """The release's BertModel.forward with syntax (modeling_bert.py): the GAT on the word embeddings plus POS
    embeddings, LayerNorm, per layer Linear(G) added to the first heads' targets, the -10000 padding mask. The
    rest of BERT is transformers' own modules (the same computation in both)."""
    enc = model.encoder
    gat = enc.syntax_gat
    word = model.embeddings.word_embeddings(ids)
    hidden = model.embeddings(input_ids=ids)
    layers = [[(l.weight[h], l.att_src[h][:, None], l.att_dst[h][:, None]) for h in range(gat.num_heads)]
              for l in gat.layers] if gat.variant == "release" else None
    if layers is not None:
        g = release_gat(word + gat.pos_embedding(pos), dist, gat.window, layers, gat.norm)
    else:
        lengths = mask.sum(1)
        g = paper_gat_batch(word + gat.pos_embedding(pos), dist, lengths, gat.window,
                            [(l.t_proj.weight, l.v_proj.weight) for l in gat.layers], gat.num_heads)
    for layer in enc.layer:
        att = layer.attention.self
        lins = [att.syntax.syntax_proj[t] for t in targets]
        ctx = release_syntax_attention(hidden, g, att.query.weight, att.query.bias, att.key.weight, att.key.bias,
                                       att.value.weight, att.value.bias, *lins, mask.sum(1), 4, n_syntax, targets)
        attn_out = layer.attention.output(ctx, hidden)
        hidden = layer.output(layer.intermediate(attn_out), attn_out)
    return hidden


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_gat_model_is_the_papers_and_the_releases(variant):
    """enable_syntax_attention(method="gat", variant=...) on a tiny BERT against the release's forward (its
    GAT reads the word embeddings, not the embedding layer's output)."""
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(0)
    model = _bert().double()
    enable_syntax_attention(model, "gat", variant=variant, syntax_heads=2,
                            gat_config=dict(num_layers=2, num_heads=2, head_dim=8, window=2))
    _perturb(model.encoder.syntax_gat, scale=0.1)
    trees = _trees(sizes=(9, 6, 3), seed=12)
    mask = (torch.arange(9)[None] < trees.lengths[:, None]).long()
    ids = torch.randint(5, 100, (3, 9)) * mask
    pos = sk.integrations.upos.token_pos_ids([[]] * 3, [[None] * int(n) for n in trees.lengths], width=9,
                                             variant=variant)
    pos = torch.where(mask.bool(), torch.randint(1, 18, (3, 9)), pos)
    got = model(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=pos).last_hidden_state
    dist, valid = _release_distance(trees)
    targets = ("q", "k") if variant == "paper" else ("k", "v")
    want = release_bert_forward(model, ids, mask, pos, dist, 2, targets)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-9, rtol=1e-9)
    w = torch.randn(got.shape, dtype=f64) * valid[..., None]
    params = [p for n, p in model.named_parameters() if "syntax" in n and "k.bias" not in n]
    params.append(model.embeddings.word_embeddings.weight)
    for a, b in zip(_grads(got, w, params), _grads(want, w, params)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)


def test_fresh_models_and_the_promise_of_each_variant():
    """A fresh "gat" model equals the pre-trained one with variant="package" only (the paper's and the release's
    syntax heads start as the release's BERT init); "subnetwork" with only the full mask equals it in every
    variant."""
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    trees = _trees(sizes=(9, 6), seed=13)
    mask = (torch.arange(9)[None] < trees.lengths[:, None]).long()
    ids = torch.randint(5, 100, (2, 9)) * mask
    valid = mask.bool()
    plain = _bert().double()  # float64: the paper's fresh model differs from the plain one by ~1e-6 only
    ref = plain(input_ids=ids, attention_mask=mask).last_hidden_state
    for method, variant, equal in [("gat", "package", True), ("gat", "paper", False), ("gat", "release", False),
                                   ("subnetwork", "paper", True), ("subnetwork", "release", True),
                                   ("subnetwork", "package", True)]:
        import copy

        model = copy.deepcopy(plain)
        extra = dict(gat_config=dict(num_layers=1, num_heads=2, head_dim=8, window=2)) if method == "gat" else dict(
            masks=sk.MaskSpec(parent=False, child=False, sibling=False))
        enable_syntax_attention(model, method, variant=variant, **extra)
        out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).last_hidden_state
        difference = (out[valid] - ref[valid]).abs().max().item()
        assert (difference < 1e-10) if equal else (difference > 1e-8), (method, variant, difference)
        assert model.config.syntax_attention["variant"] == variant


@pytest.mark.parametrize("method", ["subnetwork", "gat"])
def test_saved_variant_comes_back(tmp_path, method):
    from syntaxkernels.integrations.transformers import enable_syntax_attention, load_syntax_model

    model = transformers.BertForTokenClassification(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)).eval()
    extra = dict(gat_config=dict(num_layers=1, num_heads=2, head_dim=8, window=2, probe_rank=4)) if method == "gat" \
        else {}
    enable_syntax_attention(model, method, variant="release", **extra)
    trees = _trees(sizes=(9, 6), seed=14)
    mask = (torch.arange(9)[None] < trees.lengths[:, None]).long()
    ids = torch.randint(5, 100, (2, 9)) * mask
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(transformers.BertForTokenClassification, tmp_path).eval()
    assert loaded.config.syntax_attention["variant"] == "release"
    part = loaded.bert.encoder.layer[0].attention.self.syntax
    assert part.variant == "release"
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits, out)
    # A checkpoint saved before the variants existed (no "variant" in its config) computed the package's form.
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    del config["syntax_attention"]["variant"]
    if method == "gat":
        config["syntax_attention"]["gat_config"]["num_pos_tags"] = 18
        config["syntax_attention"]["targets"] = ["q", "k"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    fresh = transformers.BertForTokenClassification(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100))
    enable_syntax_attention(fresh, method, variant="package", **({"gat_config": dict(
        num_layers=1, num_heads=2, head_dim=8, window=2, probe_rank=4)} if method == "gat" else {}))
    fresh.save_pretrained(tmp_path / "old")
    config_old = json.loads((tmp_path / "old" / "config.json").read_text())
    del config_old["syntax_attention"]["variant"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config_old))
    old = load_syntax_model(transformers.BertForTokenClassification, tmp_path / "old")
    assert old.config.syntax_attention["variant"] == "package"


def test_variant_argument_errors():
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    with pytest.raises(ValueError, match="variant applies to method='subnetwork' and method='gat'"):
        enable_syntax_attention(_bert(), "bias", variant="paper")
    with pytest.raises(ValueError, match="variant must be one of 'paper', 'release', 'package'"):
        enable_syntax_attention(_bert(), "gat", variant="authors")
    with pytest.raises(ValueError, match="variant must be one of"):
        SyntaxGAT(8, variant="released")
    with pytest.raises(ValueError, match="connect=True"):
        sk.trees.align_to_tokens([[-1]], [None, 0, None], connect=False, variant="release")


def test_treebank_batches_through_the_collator(ud_dev_path, tmp_path):
    """UD sentences through a WordPiece tokenizer: TreeCollator(word_level=True) builds Syntax-BERT's word-level
    masks (equal to syntax_bert_batch), which differ from the package's token-tree masks; a "subnetwork" BERT of
    each variant trains on them, a "gat" BERT on the release's token trees and POS ids."""
    pytest.importorskip("tokenizers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_aux_loss, token_pos_ids
    from syntaxkernels.tools.testing import wordpiece_tokenizer

    sentences = [s for s in sk.trees.read_conllu(ud_dev_path) if 4 <= len(s) <= 16][:6]
    tok = wordpiece_tokenizer([" ".join(s.words) for s in sentences], tmp_path, vocab_size=90)
    spec = sk.MaskSpec(max_distance=2)
    batch = sk.trees.TreeCollator(tokenizer=tok, word_level=True)(sentences)
    assert isinstance(batch["trees"], sk.trees.WordTreeBatch)
    direct = sk.trees.syntax_bert_batch(sentences, batch["word_ids"], attention_mask=batch["attention_mask"])
    assert torch.equal(batch["trees"].distance, direct.distance) and torch.equal(batch["trees"].depth, direct.depth)
    package = sk.trees.TreeCollator(tokenizer=tok)(sentences)["trees"]
    ours, theirs = (sk.reference.syntax_masks(t, spec) for t in (batch["trees"], package))
    assert (ours != theirs).any()
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     vocab_size=len(tok), num_labels=18)
    labels = token_pos_ids(batch["sentences"], batch["word_ids"], variant="package").masked_fill(
        batch["attention_mask"] == 0, -100)
    for variant in ("paper", "release"):
        torch.manual_seed(0)
        model = transformers.BertForTokenClassification(config)
        enable_syntax_attention(model, "subnetwork", masks=spec, variant=variant)
        trees = sk.trees.TreeCollator(tokenizer=tok, word_level=True, variant=variant)(sentences)["trees"]
        losses = _train(model, batch, trees, labels)
        assert losses[-1] < losses[0], (variant, losses)
    release = sk.trees.TreeCollator(tokenizer=tok, variant="release")(sentences)
    pos = token_pos_ids(release["sentences"], release["word_ids"], variant="release", lengths=release["lengths"])
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(config)
    enable_syntax_attention(model, "gat", variant="release",
                            gat_config=dict(num_layers=2, num_heads=2, head_dim=8, window=1, probe_rank=8))
    losses = _train(model, release, release["trees"], labels, syntax_pos=pos, aux=lambda: syntax_aux_loss(model))
    assert losses[-1] < losses[0], losses


def _train(model, batch, trees, labels, steps=4, aux=None, **extra):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], syntax_trees=trees,
                    labels=labels, **extra)
        loss = out.loss + (0.5 * aux() if aux is not None else 0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(out.loss.detach()))
    return losses


def test_miniature_experiments_run(ud_dev_path, tmp_path):
    """benchmarks/papers_in_miniature.py end to end on a few sentences and steps (its figures: RESULTS.md)."""
    import importlib.util
    import json
    import pathlib

    pytest.importorskip("tokenizers")
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "papers_in_miniature.py"
    spec = importlib.util.spec_from_file_location("papers_in_miniature", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "runs.json"
    assert module.main(["all", "--data", str(ud_dev_path), "--limit", "50", "--steps", "2", "--batch", "8",
                        "--seeds", "0", "--variants", "none,paper,release", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert {(r["task"], r.get("trees")) for r in runs} == {("tagging", None), ("sentence", "dependency"),
                                                         ("sentence", "constituency")}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in runs)


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_subnetworks_packed_equal_padded_without_padding(variant):
    """Empty rows attend every key of their row: the same keys packed and padded when nothing is padding."""
    rows = [[-1, 0, 1, 1, 0], [-1, 0, 0, 0, 3], [-1, -1, 1, 2, 2]]
    padded, packed = sk.TreeBatch.from_heads(rows), sk.TreeBatch.from_heads(rows, packed=True)
    m = _perturb(SyntaxBertSelfAttention(16, 2, masks=sk.MaskSpec(max_distance=2, pairwise=True),
                                         variant=variant)).double()
    x = torch.randn(3, 5, 16, dtype=f64)
    torch.testing.assert_close(m(x.reshape(1, 15, 16), packed)[0], m(x, padded).reshape(15, 16))
