"""A positional (sliding) window in the distance-bias op: ``position_window=w`` allows only ``|i - j| <= w``
(ModernBERT's local layers, Mistral), combined with the distance window, causality and the lengths.

The reference against an independent mask; the padded Triton kernels (interpreted on the CPU: the short-row
forward and backward, the two-block backward, the tiled kernels walking live-tile lists) against the reference in
forward and every gradient; tiles outside the window are not walked; ``backend="auto"`` on CPU tensors runs a path
that takes it; bad values are a ``ValueError``. The C++ kernels and packed batches: test_position_window_cpu_packed.py.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.ops import _primitives as P
from syntaxkernels.ops import block_meta
from syntaxkernels.tools.testing import assert_bias_attention_close, bias_attention_case, bias_attention_grads

from conftest import KERNEL_DEVICE as DEVICE, needs_triton, spy_launches


def _run(case, dtype, backend, grad_out, **kw):
    def op(*args, **kwargs):
        return sk.syntax_bias_attention(*args, backend=backend, **kwargs)
    return bias_attention_grads(op, case, dtype, grad_out, DEVICE, **kw)


@pytest.mark.parametrize("w,causal,window", [(0, False, None), (2, False, None), (3, True, None), (5, False, 2),
                                             (100, True, None)])
def test_reference_window_is_the_band(w, causal, window):
    case = bias_attention_case(2, 2, 11, 8, lengths=[11, 7], seed=w)
    args = [case[n].double() for n in ("q", "k", "v")]
    kw = dict(buckets=case["buckets"], bias_scale=case["bias_scale"].double(), lengths=case["lengths"],
              causal=causal, window=window)
    got = reference.syntax_bias_attention(*args, case["distance"], case["table"].double(), position_window=w, **kw)
    # Independently: the band as a distance window on a distance that is 255 outside it.
    i = torch.arange(11)
    outside = (i[:, None] - i[None, :]).abs() > w
    far = case["distance"].masked_fill(outside[None], 255)
    bias = reference.gather_bias(case["distance"], case["table"].double(), case["buckets"],
                                 case["bias_scale"].double(), torch.float64)
    scores = args[0] @ args[1].transpose(-1, -2) / 8 ** 0.5 + bias
    allowed = reference.allowed_pairs(far, case["lengths"], window, causal) & ~outside[None]
    expected = reference.masked_attention(scores, allowed[:, None], args[2])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert not torch.equal(got, reference.syntax_bias_attention(*args, case["distance"], case["table"].double(), **kw)) \
        or w >= 10


def test_bad_position_windows_are_refused():
    q = torch.randn(1, 1, 4, 8)
    d = torch.zeros(1, 4, 4, dtype=torch.uint8)
    table = torch.zeros(sk.BucketSpec().num_buckets)
    packed = q[0].transpose(0, 1)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="position_window"):
            sk.syntax_bias_attention(q, q, q, d, table, buckets=sk.BucketSpec(), position_window=bad)
        with pytest.raises(ValueError, match="position_window"):  # packed batches take it, and check it
            sk.syntax_bias_attention(packed, packed, packed, d.view(-1), table, buckets=sk.BucketSpec(),
                                     cu_seqlens=cu, position_window=bad)


def test_cpu_auto_runs_a_path_that_takes_it():
    """On CPU tensors "auto" runs a path that takes a positional window (the C++ kernels where the extension is
    built: test_position_window_cpu_packed.py checks them; else the reference)."""
    case = bias_attention_case(2, 2, 13, 8, lengths=[13, 6], seed=2)
    grad_out = torch.randn(2, 2, 13, 8, generator=torch.Generator().manual_seed(3))
    got = bias_attention_grads(sk.syntax_bias_attention, case, torch.float32, grad_out, position_window=2)
    ref64 = bias_attention_grads(reference.syntax_bias_attention, case, torch.float64, grad_out, position_window=2)
    reflp = bias_attention_grads(reference.syntax_bias_attention, case, torch.float32, grad_out, position_window=2)
    assert_bias_attention_close(case, got, ref64, reflp, torch.float32)


def test_live_tiles_skip_the_far_ones():
    """With a positional window the live-tile lists hold only the tiles near the diagonal, and the tiles crossing
    the band's edges are boundary (masked) ones."""
    lengths = torch.tensor([512])
    smallest = torch.zeros(1, 8, 8, dtype=torch.uint8)
    live = block_meta.live_blocks(smallest, lengths, 64, 64, band=10)
    assert live[0].sum(1).tolist() == [2, 3, 3, 3, 3, 3, 3, 2]
    boundary = block_meta.boundary_tiles(lengths, 8, 8, 64, 64, False, by_key=True, band=10)
    assert bool(boundary[0][live[0]].all())  # 64-token tiles never lie wholly within |i - j| <= 10
    wide = block_meta.boundary_tiles(lengths, 8, 8, 64, 64, False, by_key=True, band=200)
    assert not bool(wide[0, 3, 3]) and bool(wide[0, 0, 4])


# id, (B, H, N, D), dtype, case options, op options, a kernel the call must run, arch (None: the default)
TRITON_CASES = [
    ("short-bf16", (2, 2, 20, 32), torch.bfloat16, dict(lengths=[20, 13]), dict(position_window=3),
     "_bias_bwd_short_kernel", 90),
    ("short-t-bf16-causal", (2, 2, 33, 32), torch.bfloat16, dict(lengths=[33, 0]),
     dict(position_window=4, causal=True), "_bias_bwd_short_t_kernel", 80),
    ("two-block-bf16-causal", (2, 2, 90, 32), torch.bfloat16, dict(lengths=[90, 50]),
     dict(position_window=10, causal=True), "_bias_bwd_short2_keys_kernel", 90),
    ("two-block-queries-bf16", (2, 2, 90, 32), torch.bfloat16, dict(lengths=[90, 50]),
     dict(position_window=10), "_bias_bwd_short2_kernel", 80),
    ("tiled-fp32-perhead-window", (2, 2, 45, 16), torch.float32, dict(lengths=[45, 30], per_head=True),
     dict(position_window=7, window=2), "_bias_bwd_table_kernel", None),
    ("tiled-fp32-causal", (2, 2, 100, 16), torch.float32, dict(lengths=[100, 61]),
     dict(position_window=20, causal=True), "_bias_bwd_dkdv_kernel", None),
    ("tiled-fp16-diagonal-only", (2, 2, 70, 32), torch.float16, dict(lengths=[70, 70], per_head=True),
     dict(position_window=0), "_bias_bwd_dkdv_kernel", None),
    ("tiled-fp32-dropout-gqa", (2, 4, 66, 16), torch.float32, dict(lengths=[66, 40], kv_heads=2),
     dict(position_window=9, dropout_p=0.2, dropout_seed=5), "_bias_bwd_table_kernel", None),
]


@needs_triton
@pytest.mark.parametrize("shape,dtype,opts,kw,kernel,arch", [c[1:] for c in TRITON_CASES],
                         ids=[c[0] for c in TRITON_CASES])
def test_triton_position_window_matches_the_reference(monkeypatch, shape, dtype, opts, kw, kernel, arch):
    launches = spy_launches(monkeypatch, fresh_configs=True)
    B, H, N, D = shape
    previous = P.interpret_as(arch) if arch is not None else None
    try:
        case = bias_attention_case(B, H, N, D, dtype, bias_scale=0.8, seed=N, **opts)
        grad_out = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(1))
        got = _run(case, dtype, "triton", grad_out, **kw)
    finally:
        if arch is not None:
            P.interpret_as(previous)
    assert kernel in launches, launches
    # The tiled kernels walk live-tile lists (tiles outside the window skipped).
    assert all(kw.get("USE_LISTS") for name, kw in zip(launches, launches.kwargs)
               if name in ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel",
                           "_bias_bwd_table_kernel")), launches
    ref64 = _run(case, torch.float64, "reference", grad_out, **kw)
    reflp = _run(case, dtype, "reference", grad_out, **kw)
    assert_bias_attention_close(case, got, ref64, reflp, dtype)
    if kw["position_window"] < N - 1:  # the window matters here
        unbanded = _run(case, torch.float64, "reference", grad_out,
                        **{k: v for k, v in kw.items() if k != "position_window"})
        assert (unbanded[0] - ref64[0]).abs().max() > 1e-3


@needs_triton
@pytest.mark.long_on_cpu
def test_calls_with_a_window_take_their_own_tiles(monkeypatch):
    """A call with a positional window reads configs.BAND_CONFIGS over the family's tiles, one without keeps them:
    sm_80's table kernel at D = 128 runs one stage with the window (two spilled 8 B there, compiled as launched on
    odd-1000), and the call with those configs is exact against the reference (bf16, rows of 70 and 45)."""
    if DEVICE != "cpu":
        pytest.skip("families are forced under the interpreter only")
    from syntaxkernels.ops import _replay
    from syntaxkernels.ops.bias_attention import _launch

    from syntaxkernels.ops.bias_attention import configs

    monkeypatch.setattr(configs, "_SHORT_ROWS", False)  # (rows of 70 take the tiled kernels, as past 128 tokens)
    previous = P.interpret_as(80)
    try:
        banded = _launch.launch_configs(70, 128, 128, torch.bfloat16, 1, -1, sk.BucketSpec(), band=10).table
        plain = _launch.launch_configs(70, 128, 128, torch.bfloat16, 1, -1, sk.BucketSpec()).table
        assert banded == {**plain, "num_stages": 1} and plain["num_stages"] == 2, (banded, plain)
        _replay.clear()  # (a program recorded by another test would skip the launchers)
        launches = spy_launches(monkeypatch, fresh_configs=True)
        case = bias_attention_case(2, 2, 70, 128, torch.bfloat16, bias_scale=0.8, seed=3, lengths=[70, 45])
        grad_out = torch.randn(2, 2, 70, 128, generator=torch.Generator().manual_seed(1))
        got = _run(case, torch.bfloat16, "triton", grad_out, position_window=12)
    finally:
        P.interpret_as(previous)
    table = [kw for name, kw in zip(launches, launches.kwargs) if name == "_bias_bwd_table_kernel"]
    assert table and all(kw["num_stages"] == 1 for kw in table), table
    ref64 = _run(case, torch.float64, "reference", grad_out, position_window=12)
    reflp = _run(case, torch.bfloat16, "reference", grad_out, position_window=12)
    assert_bias_attention_close(case, got, ref64, reflp, torch.bfloat16)
