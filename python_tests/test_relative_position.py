"""T5's relative-position term in the distance-bias op (``position_buckets``, ``position_table``): the buckets
against T5's own rule (transformers' ``T5Attention._relative_position_bucket``), the clamp the kernels use, the
reference against plain attention with T5's bias, padded and packed batches, the table's gradient, bad input.
"""
import math

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import RelativePositionSpec, reference
from syntaxkernels.ops.bias_attention._host import position_gradient, position_lut

SPECS = [RelativePositionSpec(), RelativePositionSpec(bidirectional=False), RelativePositionSpec(8, 20),
         RelativePositionSpec(6, 7), RelativePositionSpec(2, 2, False), RelativePositionSpec(5, 9)]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_buckets_are_t5s(spec):
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    r = torch.arange(-700, 701)
    t5 = modeling_t5.T5Attention._relative_position_bucket(r, bidirectional=spec.bidirectional,
                                                           num_buckets=spec.num_buckets,
                                                           max_distance=spec.max_distance)
    assert torch.equal(spec.bucket(r), t5)
    # The kernels' clamp to [-reach, reach] keeps every offset's bucket.
    assert torch.equal(spec.lut()[r.clamp(-spec.reach, spec.reach) + spec.reach], t5)
    assert int(t5.max()) < spec.num_buckets


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_boundaries_split_the_offsets_into_buckets(spec):
    lut = spec.lut()
    cuts = [-spec.reach] + spec.boundaries() + [spec.reach + 1]
    seen = []
    for lo, hi in zip(cuts, cuts[1:]):
        bucket = lut[lo + spec.reach:hi + spec.reach]
        assert (bucket == bucket[0]).all() and lo < hi
        seen.append(int(bucket[0]))
    assert len(seen) == len(set(seen))  # one interval of offsets per bucket


def _t5_attention(q, k, v, table, spec, lengths):
    n = q.shape[2]
    pos = torch.arange(n)
    scores = q @ k.transpose(-1, -2) + table[:, spec.bucket(pos[None, :] - pos[:, None])][None]
    valid = pos[None, :] < lengths[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], -math.inf)
    return (scores.softmax(-1) @ v) * valid[:, None, :, None]


@pytest.mark.parametrize("spec", SPECS[:3], ids=str)
def test_reference_adds_t5s_bias(spec):
    torch.manual_seed(0)
    B, H, N, D = 2, 3, 29, 8
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64) for _ in range(3))
    trees = sk.TreeBatch.from_heads([[-1] + [0] * (N - 1), [-1] + [0] * 12])
    buckets = sk.BucketSpec()
    zero = torch.zeros(buckets.num_buckets, dtype=torch.float64)
    table = torch.randn(H, spec.num_buckets, dtype=torch.float64)
    got = reference.syntax_bias_attention(q, k, v, trees.distance, zero, buckets=buckets, scale=1.0,
                                          lengths=trees.lengths, position_buckets=spec, position_table=table)
    expected = _t5_attention(q, k, v, table, spec, trees.lengths)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    plain = reference.syntax_bias_attention(q, k, v, trees.distance, zero, buckets=buckets, scale=1.0,
                                            lengths=trees.lengths)
    assert not torch.allclose(got, plain)


def test_packed_counts_positions_within_each_sequence():
    torch.manual_seed(1)
    spec = RelativePositionSpec(8, 12)
    heads = [[-1, 0, 1, 1, 0], [-1, 0], [-1] + [0] * 16]
    packed = sk.PackedTreeBatch.from_heads(heads)
    padded = sk.TreeBatch.from_heads(heads)
    H, D = 2, 8
    T = packed.sequence.shape[0]
    q, k, v = (torch.randn(T, H, D, dtype=torch.float64) for _ in range(3))
    buckets = sk.BucketSpec()
    table = torch.randn(buckets.num_buckets, dtype=torch.float64)
    ptable = torch.randn(H, spec.num_buckets, dtype=torch.float64)
    out = sk.syntax_bias_attention(q, k, v, packed, table, buckets=buckets, position_buckets=spec,
                                   position_table=ptable)
    cu = packed.cu_seqlens.tolist()
    N = padded.distance.shape[1]
    lay = torch.zeros(3, H, N, D, dtype=torch.float64)
    lk, lv = lay.clone(), lay.clone()
    for s in range(3):
        a, b = cu[s], cu[s + 1]
        lay[s, :, :b - a], lk[s, :, :b - a], lv[s, :, :b - a] = (x[a:b].transpose(0, 1) for x in (q, k, v))
    ref = sk.syntax_bias_attention(lay, lk, lv, padded, table, buckets=buckets, position_buckets=spec,
                                   position_table=ptable, backend="reference")
    for s in range(3):
        a, b = cu[s], cu[s + 1]
        torch.testing.assert_close(out[a:b], ref[s, :, :b - a].transpose(0, 1), rtol=1e-12, atol=1e-12)


def test_position_table_gets_its_gradient():
    torch.manual_seed(2)
    spec = RelativePositionSpec(8, 10)
    B, H, N, D = 2, 2, 14, 4
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    trees = sk.TreeBatch.from_heads([[-1] + [0] * (N - 1), [-1, 0, 0]])
    buckets = sk.BucketSpec()
    table = torch.zeros(buckets.num_buckets, dtype=torch.float64)
    ptable = torch.randn(H, spec.num_buckets, dtype=torch.float64, requires_grad=True)

    def f(ptable):
        return sk.syntax_bias_attention(q, k, v, trees, table, buckets=buckets, position_buckets=spec,
                                        position_table=ptable, backend="reference")
    assert torch.autograd.gradcheck(f, (ptable,))


def test_position_lut_and_gradient_helpers():
    spec = RelativePositionSpec(8, 10)
    table = torch.randn(3, 8)
    lut = position_lut(spec, table)
    assert lut.shape == (3, 2 * spec.reach + 1)
    torch.testing.assert_close(lut, table[:, spec.lut()] / math.log(2))
    # Per-offset sums into per-bucket sums: each bucket adds its offsets.
    offsets = torch.randn(3, 2 * spec.reach + 1)
    expected = torch.zeros(3, 8).index_add_(1, spec.lut(), offsets)
    torch.testing.assert_close(position_gradient(offsets, spec, table), expected)


def test_bad_position_terms_are_refused():
    q = torch.randn(1, 2, 4, 8)
    d = torch.zeros(1, 4, 4, dtype=torch.uint8)
    buckets = sk.BucketSpec()
    table = torch.zeros(buckets.num_buckets)
    spec = RelativePositionSpec(8, 10)
    cases = [(spec, None, "go together"), (None, torch.zeros(2, 8), "go together"),
             ((8, 10), torch.zeros(2, 8), "RelativePositionSpec"), (spec, torch.zeros(2, 7), r"\[2, 8\]"),
             (spec, torch.zeros(8), r"\[2, 8\]"), (spec, torch.zeros(2, 8, dtype=torch.long), "float")]
    for position_buckets, position_table, match in cases:
        with pytest.raises((ValueError, TypeError), match=match):
            sk.syntax_bias_attention(q, q, q, d, table, buckets=buckets, position_buckets=position_buckets,
                                     position_table=position_table)
    for bad in (dict(num_buckets=3), dict(num_buckets=1, bidirectional=False), dict(max_distance=2),
                dict(num_buckets=2.0), dict(bidirectional=1)):
        with pytest.raises((ValueError, TypeError)):
            RelativePositionSpec(**bad)
