"""Attention dropout on the probabilities: the mask (Philox-4x32-7 of seed, item and head, query, key), the
reference's dropout, and the fused Triton path of the padded distance-bias op against the reference with the
same seed (forward and every gradient), plus properties no reference comparison shows: the backward uses the
forward's mask, p = 0 is the op without dropout, a seed reproduces its mask, the expectation is the undropped
output. The C++ path is in test_dropout_cpu.py, the packed Triton kernels in test_dropout_varlen.py.
"""
import functools

import pytest
import torch
import triton
import triton.language as tl

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import _primitives as P
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads

from conftest import KERNEL_DEVICE as DEVICE, spy_launches

SEEDS = (0, 12345, 2 ** 40 + 99, 2 ** 63 + 5, 2 ** 64 - 1)


@triton.jit
def _philox_kernel(OUT, seed, N: tl.constexpr):
    offs = tl.arange(0, N).to(tl.uint32)
    zero = offs * 0
    r0, r1, r2, r3 = tl.philox(seed, offs, offs * 3 + 1, zero + 7, zero + 5, P.PHILOX_ROUNDS)
    for w, r in ((0, r0), (1, r1), (2, r2), (3, r3)):
        tl.store(OUT + 4 * tl.arange(0, N) + w, r.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.parametrize("seed", SEEDS)
def test_reference_philox_is_the_kernels_generator(seed):
    out = torch.zeros(64 * 4, dtype=torch.int64, device=DEVICE)
    _philox_kernel[(1,)](out, P.seed_bits(seed), 64)
    c = torch.arange(64)
    ref = torch.stack(reference.philox(seed, c, c * 3 + 1, torch.tensor(7), torch.tensor(5)), 1).reshape(-1)
    assert torch.equal(out.cpu(), ref)


@triton.jit
def _keep_kernel(TILE, PAIRS, seed, threshold, N, BM: tl.constexpr, BN: tl.constexpr):
    bh = tl.program_id(0)
    for mb in range(0, N, BM):
        for nb in range(0, N, BN):
            offs_m = mb + tl.arange(0, BM)
            offs_n = nb + tl.arange(0, BN)
            ok = (offs_m[:, None] < N) & (offs_n[None, :] < N)
            ptrs = bh * N * N + offs_m[:, None] * N + offs_n[None, :]
            keep = P.dropout_keep(seed, threshold, bh, offs_m, nb, BM, BN)
            tl.store(TILE + ptrs, keep.to(tl.int8), mask=ok)
            rows = offs_m[:, None] + offs_n[None, :] * 0
            cols = offs_n[None, :] + offs_m[:, None] * 0
            tl.store(PAIRS + ptrs, P.dropout_keep_pairs(seed, threshold, bh, rows, cols).to(tl.int8), mask=ok)


@pytest.mark.parametrize("seed,p", [(3, 0.1), (2 ** 62 + 17, 0.5), (2 ** 64 - 1, 0.9)])
def test_kernel_masks_equal_the_reference_mask(seed, p):
    B, H, N = 2, 3, 21
    s, threshold, _ = P.dropout_arguments(p, seed)
    tile = torch.zeros(B * H, N, N, dtype=torch.int8, device=DEVICE)
    pairs = torch.zeros_like(tile)
    _keep_kernel[(B * H,)](tile, pairs, s, threshold, N, 16, 16)
    ref = reference.dropout_keep(seed, p, B, H, N, N).reshape(B * H, N, N)
    assert torch.equal(tile.cpu().bool(), ref)
    assert torch.equal(pairs.cpu().bool(), ref)


def test_mask_statistics_and_independence():
    for p in (0.1, 0.5):
        keep = reference.dropout_keep(7, p, 4, 4, 64, 64)
        assert abs(keep.float().mean().item() - (1 - p)) < 0.01
        flat = keep.view(16, -1).float()  # items and heads draw different masks, uncorrelated
        corr = torch.corrcoef(flat)
        assert (corr - torch.eye(16)).abs().max() < 0.1
    a, b = reference.dropout_keep(1, 0.5, 1, 1, 32, 32), reference.dropout_keep(2, 0.5, 1, 1, 32, 32)
    assert 0.4 < (a != b).float().mean() < 0.6
    assert reference.dropout_keep(5, 0.0, 1, 1, 8, 8).all()
    # The item offset numbers a packed batch's sequences: item 1 of a batch is item 0 with first_item=1.
    assert torch.equal(reference.dropout_keep(9, 0.3, 2, 2, 9, 9)[1],
                       reference.dropout_keep(9, 0.3, 1, 2, 9, 9, first_item=1)[0])


def test_dropout_arguments_are_checked():
    q = torch.randn(1, 1, 4, 8)
    d = torch.zeros(1, 4, 4, dtype=torch.uint8)
    table = torch.zeros(sk.BucketSpec().num_buckets)
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="dropout_p"):
            sk.syntax_bias_attention(q, q, q, d, table, buckets=sk.BucketSpec(), dropout_p=bad, dropout_seed=1)
    with pytest.raises(ValueError, match="dropout_seed"):
        sk.syntax_bias_attention(q, q, q, d, table, buckets=sk.BucketSpec(), dropout_p=0.1)
    for bad in (-1, 2 ** 64, 1.5):
        with pytest.raises(ValueError, match="dropout_seed"):
            sk.syntax_bias_attention(q, q, q, d, table, buckets=sk.BucketSpec(), dropout_p=0.1, dropout_seed=bad)


def _run(case, dtype, backend, grad_out, **kw):
    op = functools.partial(sk.syntax_bias_attention, backend=backend)
    return bias_attention_grads(op, case, dtype, grad_out, DEVICE, **kw)


# id, (B, H, N, D), dtype, options; fp16/bf16 at N <= 64 take the short-row forward kernel
CASES = [
    ("N1-fp32", (2, 2, 1, 32), torch.float32, dict()),
    ("N17-fp32-ragged-empty", (3, 2, 17, 32), torch.float32, dict(lengths=[17, 0, 9])),
    ("N20-bf16-short", (2, 2, 20, 64), torch.bfloat16, dict()),
    ("N70-fp32-perhead-causal", (2, 2, 70, 32), torch.float32, dict(per_head=True, causal=True, lengths=[70, 33])),
    ("N45-fp16-window1", (2, 2, 45, 32), torch.float16, dict(window=1, lengths=[45, 20])),
]


@pytest.mark.parametrize("shape,dtype,opts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_triton_dropout_matches_the_reference(shape, dtype, opts):
    opts = dict(opts)
    window, causal = opts.pop("window", None), opts.pop("causal", False)
    case = bias_attention_case(*shape, dtype, bias_scale=0.8, **opts)
    B, H, N, D = shape
    grad_out = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(1))
    kw = dict(dropout_p=0.3, dropout_seed=2 ** 63 + 11, window=window, causal=causal)
    got = _run(case, dtype, "triton", grad_out, **kw)
    ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
    reflp = _run(case, dtype, "reference", grad_out, **kw)
    assert_bias_attention_close(case, got, ref64, reflp, dtype)
    undropped = _run(case, torch.float64, "reference", grad_out, window=window, causal=causal)
    if N > 1:  # the comparison sees the dropout: the undropped output is far from it
        assert (undropped[0] - ref64[0]).abs().max() > 0.05


def _one_hot_case(N, p, seed, backend, dtype=torch.float32):
    """Attention over one-hot values (``v_j = e_j``): the output row i is row i of the dropped probabilities."""
    trees = sk.TreeBatch.from_heads([[-1] + list(range(N - 1))])  # a chain
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, N, 16, generator=g).to(DEVICE, dtype).requires_grad_()
    k = torch.randn(1, 2, N, 16, generator=g).to(DEVICE, dtype)
    v = torch.eye(N).expand(1, 2, N, N).to(DEVICE, dtype).contiguous().requires_grad_()
    table = torch.randn(sk.BucketSpec().num_buckets, generator=g).to(DEVICE)
    out = sk.syntax_bias_attention(q, k, v, trees.to(DEVICE), table, buckets=sk.BucketSpec(), dropout_p=p,
                                   dropout_seed=seed, backend=backend)
    return q, v, out


@pytest.mark.parametrize("N", [12, 70])
def test_backward_uses_the_forwards_mask(N):
    """With one-hot values the output is the dropped probabilities Pd, and dV = Pd^T dO: the backward's mask is
    the forward's exactly when dV equals out^T dO (a backward drawing another mask fails)."""
    q, v, out = _one_hot_case(N, 0.4, 77, "triton")
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out.backward(dout)
    expected = out.detach().transpose(-1, -2) @ dout
    torch.testing.assert_close(v.grad, expected, atol=1e-5, rtol=1e-5)
    zeros = (out.detach() == 0).float().mean().item()  # the dropped pairs are zero in the output
    assert 0.3 < zeros < 0.5


def test_the_output_is_the_dropped_probabilities():
    N, p, seed = 40, 0.25, 5
    _, _, out = _one_hot_case(N, p, seed, "triton")
    _, _, undropped = _one_hot_case(N, 0.0, None, "triton")
    keep = reference.dropout_keep(seed, p, 1, 2, N, N).to(DEVICE)
    expected = torch.where(keep, undropped.detach() / (1 - p), 0.0)
    torch.testing.assert_close(out.detach(), expected, atol=1e-6, rtol=1e-5)


def test_p_zero_is_the_op_without_dropout_and_seeds_reproduce():
    case = bias_attention_case(2, 2, 30, 32, torch.float32, bias_scale=0.8, lengths=[30, 11])
    grad_out = torch.randn(2, 2, 30, 32, generator=torch.Generator().manual_seed(1))
    plain = _run(case, torch.float32, "triton", grad_out)
    zero = _run(case, torch.float32, "triton", grad_out, dropout_p=0.0, dropout_seed=123)
    assert torch.equal(plain[0], zero[0])
    assert all(torch.equal(plain[1][n], zero[1][n]) for n in plain[1])
    a = _run(case, torch.float32, "triton", grad_out, dropout_p=0.2, dropout_seed=8)
    b = _run(case, torch.float32, "triton", grad_out, dropout_p=0.2, dropout_seed=8)
    c = _run(case, torch.float32, "triton", grad_out, dropout_p=0.2, dropout_seed=9)
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[1][n], b[1][n]) for n in a[1])
    assert not torch.equal(a[0], c[0])


def test_the_expectation_is_the_undropped_output():
    """Dropout on the probabilities with 1 / (1 - p) scaling keeps the expected output: the mean over seeds
    approaches the undropped output (the reference; the fused paths equal it mask for mask)."""
    case = bias_attention_case(1, 2, 12, 8, torch.float64, bias_scale=0.8)
    args = (case["q"], case["k"], case["v"], case["distance"], case["table"])
    kw = dict(buckets=case["buckets"], bias_scale=0.8, backend="reference")
    plain = sk.syntax_bias_attention(*args, **kw)
    mean = torch.stack([sk.syntax_bias_attention(*args, dropout_p=0.3, dropout_seed=s, **kw)
                        for s in range(400)]).mean(0)
    spread = (sk.syntax_bias_attention(*args, dropout_p=0.3, dropout_seed=0, **kw) - plain).abs().max()
    assert (mean - plain).abs().max() < spread / 5


@triton.jit
def _stream_kernel(OUT, seed, R: tl.constexpr):
    r = tl.arange(0, R)
    tl.store(OUT + r, P.dropout_stream_seed(seed, r))


def test_stream_seeds_equal_the_reference():
    for seed in (0, 5, 2 ** 63 + 1, 2 ** 64 - 1):
        out = torch.zeros(8, dtype=torch.int64, device=DEVICE)
        _stream_kernel[(1,)](out, P.seed_bits(seed), 8)
        assert [v & (2 ** 64 - 1) for v in out.cpu().tolist()] == [reference.stream_seed(seed, r) for r in range(8)]


@pytest.mark.parametrize("N,arch,kernel", [(40, 90, "_bias_bwd_short_kernel"), (40, 80, "_bias_bwd_short_t_kernel"),
                                           (100, 90, "_bias_bwd_dkdv_kernel")])
def test_short_rows_take_the_mask_in_their_own_backward(monkeypatch, N, arch, kernel):
    """fp16/bf16 rows of at most 64 tokens keep their one-tile backward with dropout (queries-major on sm_90,
    keys-major on mma.sync GPUs); rows of 65..128 tokens run the tiled backward (the two-block kernels take no
    mask). Exact against the reference with the same seed, ragged and empty rows included."""
    from syntaxkernels.ops.bias_attention import _launch

    names = []
    real_launch = _launch.launch

    def spy(fn, grid, *args, **kwargs):
        names.append(fn.fn.__name__)
        real_launch(fn, grid, *args, **kwargs)

    monkeypatch.setattr(_launch, "launch", spy)
    monkeypatch.setattr(_launch, "_CONFIGS", {})
    previous = P.interpret_as(arch)
    try:
        case = bias_attention_case(3, 2, N, 32, torch.bfloat16, bias_scale=0.8, lengths=[N, 0, 23], seed=5)
        grad_out = torch.randn(3, 2, N, 32, generator=torch.Generator().manual_seed(1))
        kw = dict(dropout_p=0.25, dropout_seed=99)
        got = _run(case, torch.bfloat16, "triton", grad_out, **kw)
        assert kernel in names, names
        assert "_bias_bwd_short2_kernel" not in names
        ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
        reflp = _run(case, torch.bfloat16, "reference", grad_out, **kw)
        assert_bias_attention_close(case, got, ref64, reflp, torch.bfloat16)
    finally:
        P.interpret_as(previous)


@pytest.mark.long_on_cpu
def test_a_distance_window_with_dropout_on_the_padded_tiles_matches_the_reference(monkeypatch):
    """sm_90's padded call with a distance window and dropout (100 tokens: the tiled backward on the live-tile lists)
    takes the table kernel's 32x32 tiles on four warps of the PADDED_CONFIGS entry naming both (over the dropout
    entry's 128x32), exact against the reference with the same seed, ragged and empty rows included."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay

    _replay.clear()  # (a program recorded by another test would skip the launchers)
    names = spy_launches(monkeypatch, fresh_configs=True)
    previous = P.interpret_as(90)
    try:
        case = bias_attention_case(3, 2, 100, 32, torch.bfloat16, bias_scale=0.8, lengths=[100, 0, 41], seed=6)
        grad_out = torch.randn(3, 2, 100, 32, generator=torch.Generator().manual_seed(1))
        kw = dict(dropout_p=0.25, dropout_seed=7, window=2)
        got = _run(case, torch.bfloat16, "triton", grad_out, **kw)
        table = [k for n, k in zip(names, names.kwargs) if n == "_bias_bwd_table_kernel"]
        assert [(k["BLOCK_M"], k["BLOCK_N"], k["num_warps"]) for k in table] == [(32, 32, 4)], table
        assert table[0]["USE_LISTS"] and table[0]["DROPOUT"]
        ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
        reflp = _run(case, torch.bfloat16, "reference", grad_out, **kw)
        assert_bias_attention_close(case, got, ref64, reflp, torch.bfloat16)
    finally:
        P.interpret_as(previous)


@pytest.mark.parametrize("layout", ["padded", "packed", "cpp"])
def test_torch_compile_fullgraph_with_dropout(layout):
    """torch.compile traces the dropout call (the ops' dropout arguments, a seed above 2^63 as its int64 bits) and
    gives the reference's output and gradients for the same seed."""
    if layout == "cpp" and not sk.ops.IMPLEMENTATION["syntax_bias_attention"](torch.zeros(1), torch.zeros(1)) == "cpp":
        pytest.skip("the C++ kernels are not built")
    device = "cpu" if layout == "cpp" else DEVICE
    backend = "auto" if layout == "cpp" else "triton"
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0]], packed=layout == "packed")
    g = torch.Generator().manual_seed(2)
    shape = (8, 2, 16) if layout == "packed" else (2, 2, 5, 16)
    q, k, v = (torch.randn(shape, generator=g).to(device).requires_grad_() for _ in range(3))
    table = torch.randn(sk.BucketSpec().num_buckets, generator=g).to(device).requires_grad_()
    trees = trees.to(device)
    kw = dict(buckets=sk.BucketSpec(), dropout_p=0.3, dropout_seed=2 ** 64 - 7)

    def f(q, k, v, table):
        return sk.syntax_bias_attention(q, k, v, trees, table, backend=backend, **kw)

    compiled = torch.compile(f, fullgraph=True, backend="inductor" if device == "cuda" else "eager")
    out = compiled(q, k, v, table)
    grads = torch.autograd.grad(out.sum(), (q, k, v, table))
    ref = sk.syntax_bias_attention(q, k, v, trees, table, backend="reference", **kw)
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v, table))
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


# (arch, head dim, N, head groups): rows of 65..128 tokens take the tiled backward with dropout (every family's
# DROPOUT_CONFIGS entries for dq, dK/dV and the table kernel); rows of at most 64 the one-tile kernels (the "short"
# entries: grouped launches, 2 groups, take GROUPED_CONFIG; single-axis ones, 1, the entry's own fields).
DROPOUT_TILE_CASES = [(arch, d, 70, None) for arch in (80, 86, 90, 100, 120) for d in (64, 128)] + [
    (90, 64, 40, 2), (90, 64, 40, 1), (90, 128, 40, 2), (100, 128, 40, 2), (80, 64, 40, 1), (86, 128, 40, 1),
    (120, 64, 40, 1)]


@pytest.mark.parametrize("arch,head_dim,N,groups", DROPOUT_TILE_CASES)
@pytest.mark.long_on_cpu
def test_dropout_calls_take_their_own_tiles_and_match_the_reference(monkeypatch, arch, head_dim, N, groups):
    """Calls with dropout read :data:`configs.DROPOUT_CONFIGS` over the family's tiles (compiled as launched, the
    mask's registers made the family's tiles spill; on a padded batch's rows, 65..512 tokens at D <= 64, over the
    padded tiles), calls without keep the family's; the forward, the metadata
    made for the backward and the backward ask for the same (dropout) configs; and the dropout tiles are exact
    against the reference (forward and every gradient, bf16, ragged and empty rows), grouped and single-axis."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay
    from syntaxkernels.ops.bias_attention import _launch, configs

    if groups is not None:
        monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device: groups)
    previous = P.interpret_as(arch)
    try:
        spec = sk.BucketSpec()
        family = P.arch_family(arch)
        wanted = configs.dropout_overrides(torch.bfloat16, head_dim, family, arch)
        # A padded batch's call (65..512 tokens; with dropout at D <= 64) takes the padded tiles first, and their
        # entries naming dropout last
        is_padded = configs.SHORT_ROW_LIMIT < N <= configs.PADDED_ROW_LIMIT and head_dim <= 64
        padded, padded_last = [configs.padded_overrides(torch.bfloat16, head_dim, family, arch, dropout=True,
                                                        last=last) if is_padded else {} for last in (False, True)]
        _launch._CONFIGS.clear()
        padded_configs = configs.PADDED_CONFIGS
        monkeypatch.setattr(configs, "PADDED_CONFIGS", {})  # the family's own tiles
        plain = _launch.launch_configs(N, head_dim, head_dim, torch.bfloat16, 1, -1, spec)
        monkeypatch.setattr(configs, "PADDED_CONFIGS", padded_configs)
        _launch._CONFIGS.clear()
        dropped = _launch.launch_configs(N, head_dim, head_dim, torch.bfloat16, 1, -1, spec, dropout=True)
        short_kind = "short" if N <= configs.SHORT_ROW_LIMIT else "short2"
        expected = {}
        for source in (padded, wanted, padded_last):  # (the dropout entries after the padded ones)
            for kind, fields in source.items():
                if kind in ("short", "short2"):
                    if kind != short_kind:
                        continue
                    kind = "short"
                expected[kind] = {**expected.get(kind, {}), **fields}
        for kind in ("fwd", "fwd_short", "dq", "dkdv", "table", "short"):  # nothing else moves
            base = getattr(plain, kind)
            want = None if base is None else {**base, **expected.get(kind, {})}
            assert getattr(dropped, kind) == want, (kind, expected.get(kind))
        _launch._CONFIGS.clear()
        _replay.clear()  # (a program recorded by another test would skip the launchers asked about below)
        case = bias_attention_case(2, 2, N, head_dim, torch.bfloat16, bias_scale=0.8, lengths=[N, 0] if N < 64
                                   else [N, N - 9])
        grad_out = torch.randn(2, 2, N, head_dim, generator=torch.Generator().manual_seed(2))
        kw = dict(dropout_p=0.2, dropout_seed=99)
        got = _run(case, torch.bfloat16, "triton", grad_out, **kw)
        asked = {key[-2:] for key in _launch._CONFIGS if key[0] == N}  # (dropout, band) flags, every launch
        assert asked == {(True, False)}
        ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
        reflp = _run(case, torch.bfloat16, "reference", grad_out, **kw)
        assert_bias_attention_close(case, got, ref64, reflp, torch.bfloat16)
    finally:
        P.interpret_as(previous)


def test_dropout_entries_for_a_calls_other_variants_apply_after_the_plain_ones():
    """A DROPOUT_CONFIGS key naming further variants ("causal", "grouped_kv", "position", "position_window") applies
    only to calls with all of them, after every plain entry (the family's and sm_100's / sm_120's own): the small
    family's table kernel at D = 64 takes 16-key blocks with dropout only when the call is causal or has
    grouped-query k, v; sm_120's grouped-query one-tile backward takes score chunks of 16 grouped although sm_120's
    own plain entry says 32; entries naming two or more variants (T5's term with a window, or with grouped-query k,
    v; three or four of them) apply only to calls with all of them."""
    from syntaxkernels.ops.bias_attention import configs

    def table(arch, variants=frozenset()):
        fields = configs.dropout_overrides(torch.bfloat16, 64, P.arch_family(arch), arch, frozenset(variants))
        return fields.get("table", {}).get("BLOCK_N")

    for arch in (86, 89, 120):
        assert table(arch) is None
        assert table(arch, {"causal"}) == table(arch, {"grouped_kv"}) == table(arch, {"causal", "grouped_kv"}) == 16
    assert table(80, {"causal"}) == 16 and table(90, {"causal", "grouped_kv"}) == 32  # (their plain entries)
    short = configs.dropout_overrides(torch.bfloat16, 64, "small", 120, frozenset({"grouped_kv"}))["short"]
    assert short["CHUNK"] == 16 and short["GROUPED_CONFIG"] == {"CHUNK": 16}
    plain = configs.dropout_overrides(torch.bfloat16, 64, "small", 120)["short"]
    assert plain["GROUPED_CONFIG"] == {"CHUNK": 32}
    assert "short" not in configs.dropout_overrides(torch.bfloat16, 64, "small", 86)
    # T5's term: sm_90's tiled dQ takes 32-key blocks with dropout, sm_100 keeps its own 64
    with_term = frozenset({"position"})
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 90, with_term)["dq"]["BLOCK_N"] == 32
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, with_term)["dq"]["BLOCK_N"] == 64
    assert "dq" not in configs.dropout_overrides(torch.bfloat16, 64, "sm90", 90)
    # A positional window: sm_90's tiled dQ takes 32-key blocks with dropout at D = 64, sm_100 keeps its 64; at
    # D = 128 sm_100's dQ takes 64-query blocks; calls without the window keep the plain entries
    window = frozenset({"position_window"})
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 90, window)["dq"]["BLOCK_N"] == 32
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, window)["dq"]["BLOCK_N"] == 64
    assert configs.dropout_overrides(torch.bfloat16, 128, "sm90", 100, window)["dq"] == {"BLOCK_M": 64}
    assert "dq" not in configs.dropout_overrides(torch.bfloat16, 128, "sm90", 100)
    assert configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, window | with_term)["table"] == {
        "BLOCK_N": 16, "num_stages": 1}  # (an entry naming both variants, after the one naming the window)
    assert configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, window)["table"] == {"BLOCK_N": 16,
                                                                                         "num_stages": 2}
    # T5's term with a window: sm_80's dK/dV at D = 64 takes 16-query blocks, with either variant alone it does not
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm80", 80, window | with_term)["dkdv"]["BLOCK_M"] == 16
    assert "BLOCK_M" not in configs.dropout_overrides(torch.bfloat16, 64, "sm80", 80, with_term)["dkdv"]
    assert "BLOCK_M" not in configs.dropout_overrides(torch.bfloat16, 64, "sm80", 80, window).get("dkdv", {})
    assert "table" not in configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80)
    # T5's term with grouped-query k, v: the grouped dK/dV loop's own tiles (sm_100 at D = 64 32x128 on one stage,
    # not its T5 entry's 64 queries on two; sm_90 16 queries a block), sm_80's grouped one-tile backward at D = 128
    # its single-axis tiles; with either variant alone the entries do not apply
    grouped_term = frozenset({"grouped_kv", "position"})
    dkdv = configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, grouped_term)["dkdv"]
    assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"], dkdv["num_stages"]) == (32, 128, 1)
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, with_term)["dkdv"]["BLOCK_M"] == 64
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 90, grouped_term)["dkdv"]["BLOCK_M"] == 16
    assert configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, grouped_term)["short"]["GROUPED_CONFIG"] == {}
    assert configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, with_term)["short"]["GROUPED_CONFIG"] != {}
    # a window with grouped-query k, v: sm_100's dK/dV at D = 64 takes 64-key blocks, sm_80's table kernel 64x32;
    # grouped-query k, v in a causal call: sm_90's dK/dV at D = 64 one stage, the small family's 32x32 at D = 128
    grouped_window = frozenset({"grouped_kv", "position_window"})
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, grouped_window)["dkdv"]["BLOCK_N"] == 64
    assert "dkdv" not in configs.dropout_overrides(torch.bfloat16, 64, "sm90", 100, window)
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm80", 80, grouped_window)["table"] == {"BLOCK_M": 64,
                                                                                                 "BLOCK_N": 32}
    grouped_causal = frozenset({"grouped_kv", "causal"})
    assert configs.dropout_overrides(torch.bfloat16, 64, "sm90", 90, grouped_causal)["dkdv"]["num_stages"] == 1
    dkdv = configs.dropout_overrides(torch.bfloat16, 128, "small", 86, grouped_causal)["dkdv"]
    assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"]) == (32, 32)
    assert "BLOCK_M" not in configs.dropout_overrides(torch.bfloat16, 128, "small", 86, frozenset({"causal"})).get(
        "dkdv", {})
    # causal at D = 128: sm_80's dK/dV 32x32 (its 16x64 spilled 8 B on padded batches), grouped-query k, v too
    dkdv = configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, frozenset({"causal"}))["dkdv"]
    assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"]) == (32, 32)
    dkdv = configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80, grouped_causal)["dkdv"]
    assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"]) == (32, 32)
    assert "BLOCK_M" not in configs.dropout_overrides(torch.bfloat16, 128, "sm80", 80)["dkdv"]
    # Three variants besides dropout: T5's term with grouped-query k, v in a causal call (the small family and
    # sm_100 take 32x16 dK/dV tiles at D = 128; sm_120 keeps its own 32-key blocks), or with a positional window
    # (the small family 32x32, sm_100 32x16, sm_80's table kernel at D = 64 128x16); all four (32x16 on the small
    # family and the sm90 family); any two of them keep the entries naming two
    def dkdv(head_dim, family, arch, variants):
        fields = configs.dropout_overrides(torch.bfloat16, head_dim, family, arch, frozenset(variants))["dkdv"]
        return fields["BLOCK_M"], fields["BLOCK_N"]

    term_causal, term_window = grouped_term | {"causal"}, grouped_term | {"position_window"}
    for family, arch in (("small", 86), ("small", 89), ("sm90", 100)):
        assert dkdv(128, family, arch, term_causal) == (32, 16)
    assert dkdv(128, "small", 120, term_causal) == (32, 32)
    assert dkdv(128, "small", 86, term_window) == (32, 32) and dkdv(128, "sm90", 100, term_window) == (32, 16)
    assert dkdv(128, "small", 86, grouped_term) == (16, 16) and dkdv(128, "sm90", 100, grouped_term) == (32, 32)
    table_window = configs.dropout_overrides(torch.bfloat16, 64, "sm80", 80, term_window)["table"]
    assert (table_window["BLOCK_M"], table_window["BLOCK_N"]) == (128, 16)
    every = term_causal | term_window
    for family, arch in (("small", 86), ("sm90", 90), ("sm90", 100)):
        assert dkdv(128, family, arch, every) == (32, 16)
    # (sm_90 with three of them keeps what the term's causal grouped-query entry gives: spill-free there)
    assert "BLOCK_M" not in configs.dropout_overrides(torch.bfloat16, 128, "sm90", 90, term_causal)["dkdv"]


@pytest.mark.parametrize("arch,head_dim,opts", [(86, 64, dict(causal=True)), (80, 128, dict(causal=True)),
                                                (90, 128, dict(kv_heads=2)),
                                                (120, 64, dict(kv_heads=2, groups=2)),
                                                (100, 128, dict(position_window=9)), (90, 64, dict(position_window=9)),
                                                (100, 64, dict(kv_heads=2, position_window=9))])
@pytest.mark.long_on_cpu
def test_dropout_with_other_variants_takes_their_tiles_and_matches_the_reference(monkeypatch, arch, head_dim, opts):
    """Causal, grouped-query and positional-window calls with dropout run their DROPOUT_CONFIGS entries (rows of
    65..128 tokens: the tiled backward; of at most 64 with 2 head groups: the one-tile one), every launch asking with
    the call's flags, exact against the reference."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay
    from syntaxkernels.ops.bias_attention import _launch

    opts = dict(opts)
    causal, groups, kv_heads = opts.pop("causal", False), opts.pop("groups", None), opts.pop("kv_heads", None)
    band = opts.pop("position_window", None)
    N = 40 if groups else 70
    if groups:
        monkeypatch.setattr(_launch, "head_groups", lambda programs, H, device: groups)
    previous = P.interpret_as(arch)
    try:
        _launch._CONFIGS.clear()
        _replay.clear()
        case = bias_attention_case(2, 4, N, head_dim, torch.bfloat16, bias_scale=0.8, lengths=[N, N - 9],
                                   kv_heads=kv_heads)
        grad_out = torch.randn(2, 4, N, head_dim, generator=torch.Generator().manual_seed(3))
        kw = dict(dropout_p=0.2, dropout_seed=7, causal=causal, position_window=band)
        got = _run(case, torch.bfloat16, "triton", grad_out, **kw)
        keys = [key for key in _launch._CONFIGS if key[0] == N]
        # (key: ..., grouped, tiny, causal, dropout, band)
        assert keys and all(key[-2] and key[-3] == causal and key[-5] == bool(kv_heads)
                            and key[-1] == (band is not None) for key in keys), keys
        ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
        reflp = _run(case, torch.bfloat16, "reference", grad_out, **kw)
        assert_bias_attention_close(case, got, ref64, reflp, torch.bfloat16)
    finally:
        P.interpret_as(previous)
