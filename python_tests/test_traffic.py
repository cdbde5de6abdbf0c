"""The backward's memory-traffic model (:mod:`syntaxkernels.tools.traffic`): its buffers are the launcher's own, its
figures follow the paths and lengths, and a 128-token item costs what the two-block kernels store and read back."""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.ops import _primitives
from syntaxkernels.tools import traffic
from syntaxkernels.tools.inspection import _kernels_on_cpu_tensors, fake_gpu
from syntaxkernels.tools.workloads import Workload


def _allocations_of_short2(B, H, N, D, causal=False):
    """fp32 tensors ``_short2_backward`` allocates on one call (launches captured, not compiled), by shape."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from syntaxkernels.ops.bias_attention import _launch

    shapes = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default) \
                    and out.dtype == torch.float32:
                shapes.append(tuple(out.shape))
            return out

    original = _launch._short2_backward

    def watched(*args, **kwargs):
        with Watch():
            return original(*args, **kwargs)

    heads = torch.full((B, N), -1, dtype=torch.int64)
    for b in range(B):
        heads[b, 1:N] = torch.arange(N - 1)
    trees = sk.TreeBatch.from_heads(heads, torch.full((B,), N))
    q, k, v = (torch.randn(B, H, N, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    table = torch.zeros(sk.BucketSpec().num_buckets, requires_grad=True)
    previous = _primitives.set_launch_hook(lambda *a: None)
    _launch._short2_backward = watched
    try:
        with fake_gpu(90), _kernels_on_cpu_tensors():
            out = sk.syntax_bias_attention(q, k, v, trees, table, buckets=sk.BucketSpec(), backend="triton",
                                           causal=causal)
            out.sum().backward()
    finally:
        _launch._short2_backward = original
        _primitives.set_launch_hook(previous)
    return shapes


@pytest.mark.parametrize("D", [64, 128])
def test_short2_buffers_are_the_launchers(D):
    B, H, N = 2, 3, 100
    allocated = _allocations_of_short2(B, H, N, D)
    _, configs = traffic._path(N, D, torch.bfloat16, 90, False)
    block = configs.short["BLOCK_M"]
    modelled = traffic.short2_buffers(B, H, D, D, block, dq_transposed=configs.short["DQ_T"],
                                      keys_outer=bool(configs.short.get("KEYS_OUTER")))
    assert ("dk_part" in modelled) == (D > 64)  # (sm_90 at D = 64: the key blocks outer, no dK/dV shares)
    for name, shape in modelled.items():
        assert shape in allocated, (name, shape, allocated)
        allocated.remove(shape)
    # what is left is the launcher's small buffers (per-tile bucket sums, delta rows), not shares or tiles
    assert all(torch.Size(s).numel() <= B * H * 2 * 128 + 4 * B * 256 for s in allocated), allocated


def test_a_128_token_item_costs_its_tiles_and_shares():
    """The query-major two-block kernel (sm_80's tiles)."""
    w = Workload("one", [[-1] + list(range(127))], 128, "test", "one 128-token chain")
    r = traffic.backward_traffic(w, head_dim=64, heads=1, arch=80)
    assert r["path"] == "short2" and r["block"] == 64 and not r["keys_outer"]
    long = r["per_long_item"]
    # written and read back, fp32: 4 dS tiles of 64 x 64 (128 KiB), 4 tiles' dK and dV shares of 64 x 64 (256 KiB),
    # one dQ share a query block (64 KiB), and the delta rows (written, read and updated, read: 2 KiB)
    assert long["scratch_kib"] == pytest.approx(128 + 256 + 64 + 4 * 4 * 128 / 1024)
    # q, k, v, dO read, dQ, dK, dV written (bf16), the lse rows and the distance: ~112 KiB
    assert long["essential_kib"] == pytest.approx((7 * 128 * 64 * 2 + 4 * 128 + 128 * 128) / 1024)
    causal = traffic.backward_traffic(w, head_dim=64, heads=1, causal=True, arch=80)["per_long_item"]
    # three tiles walked; only the second query block's rows reach both key blocks
    assert causal["scratch_kib"] == pytest.approx(96 + 192 + 32 + 4 * 4 * 64 / 1024)


@pytest.mark.parametrize("arch", [86, 120])
def test_the_small_familys_grouped_two_block_backward_keeps_the_key_blocks_outer(arch):
    """The small family at D = 64: an item of 12 heads groups them (a grid of one program per item cannot fill the
    GPU), so the two-block backward runs with the key blocks outer (the family's GROUPED_CONFIG): the same scratch as
    sm_90's, under twice the essential traffic; one head cannot be grouped, and its single-axis launch is the
    query-major kernel with its shares (over 3x)."""
    w = Workload("one", [[-1] + list(range(127))], 128, "test", "one 128-token chain")
    grouped = traffic.backward_traffic(w, head_dim=64, heads=12, arch=arch)
    assert grouped["path"] == "short2" and grouped["keys_outer"]
    assert grouped["per_long_item"] == traffic.backward_traffic(w, head_dim=64, heads=12)["per_long_item"]
    assert grouped["per_long_item"]["scratch_kib"] < 2 * grouped["per_long_item"]["essential_kib"]
    single = traffic.backward_traffic(w, head_dim=64, heads=1, arch=arch)
    assert not single["keys_outer"] and single["per_long_item"]["scratch_kib"] > 3 * single["per_long_item"][
        "essential_kib"]


def test_a_128_token_item_with_the_key_blocks_outer_stays_under_twice_its_essential_traffic():
    """sm_90 at D = 64: the two-block kernel with the key blocks outer keeps dK and dV in registers: 4 dS tiles
    (128 KiB), one dQ share a query block (64 KiB) and the delta rows (written, read and updated, read: 2 KiB),
    against the essential traffic (~112 KiB): under 2x."""
    w = Workload("one", [[-1] + list(range(127))], 128, "test", "one 128-token chain")
    r = traffic.backward_traffic(w, head_dim=64, heads=1)
    assert r["path"] == "short2" and r["keys_outer"]
    long = r["per_long_item"]
    assert long["scratch_kib"] == pytest.approx(128 + 64 + 4 * 4 * 128 / 1024)
    assert long["essential_kib"] == pytest.approx((7 * 128 * 64 * 2 + 4 * 128 + 128 * 128) / 1024)
    assert long["scratch_kib"] < 2 * long["essential_kib"]
    causal = traffic.backward_traffic(w, head_dim=64, heads=1, causal=True)["per_long_item"]
    assert causal["scratch_kib"] == pytest.approx(96 + 32 + 4 * 4 * 64 / 1024)


def test_only_the_positions_inside_the_length_count():
    """An item's scratch counts the positions the kernels write and read (inside the length, rounded up to 8, where
    they mask): a 100-token item's second key block stores 40 of its 64 keys' dS, dK and dV, and the table kernel
    reads 40 of the second query block's rows; a 20-token sentence's dS tile is written at 24 rows and read at
    24 x 24."""
    w = Workload("one", [[-1] + list(range(99))], 100, "test", "")
    long = traffic.backward_traffic(w, head_dim=64, heads=1, arch=80)["per_long_item"]
    ds = (2 * 64 * (64 + 40) + (64 + 40) ** 2) * 4
    dkdv = 2 * (64 + 64) * (64 + 40) * 4 * 2
    dq = 2 * 64 * 64 * 4 * 2
    assert long["scratch_kib"] == pytest.approx((ds + dkdv + dq + 4 * 4 * 100) / 1024)
    # the key blocks outer (sm_90, steps of 16 rows: 112 rows written, 48 of the second block's): dS written at
    # those rows and the keys kept, read at 40 rows of the second block; dQ shares and delta at the rows written
    keys = traffic.backward_traffic(w, head_dim=64, heads=1)["per_long_item"]
    ds = ((64 + 48) * (64 + 40) + (64 + 40) ** 2) * 4
    dq = 2 * 64 * (64 + 48) * 4 + 4 * 4 * 100
    assert keys["scratch_kib"] == pytest.approx((ds + dq) / 1024)
    short = Workload("s", [[-1] + [0] * 19], 30, "test", "")
    assert traffic.backward_traffic(short, heads=1)["per_long_item"]["scratch_kib"] == pytest.approx(
        (24 * 64 + 24 * 24) * 4 / 1024)


def test_paths_follow_n_and_short_items_keep_no_shares():
    short = Workload("s", [[-1] + [0] * 29, [-1] + [0] * 9], 30, "test", "")
    two = Workload("t", [[-1] + [0] * 59, [-1] + [0] * 89], 90, "test", "")
    long = Workload("l", [[-1] + list(range(599))], 600, "test", "")
    packed = Workload("p", [[-1] + [0] * 29, [-1] + [0] * 9], 30, "test", "", packed=True)
    r_short, r_two, r_long, r_packed = (traffic.backward_traffic(w, arch=80) for w in (short, two, long, packed))
    assert (r_short["path"], r_two["path"], r_long["path"], r_packed["path"]) == ("short", "short2", "tiled",
                                                                                 "packed")
    # the 60-token item of the two-block batch stores no shares: one dS tile, written whole, read at 64 x 64
    item_60 = traffic.backward_traffic(Workload("t1", [[-1] + [0] * 59], 90, "test", ""), arch=80)["per_long_item"]
    assert item_60["scratch_kib"] == pytest.approx(32.0)
    assert r_two["per_long_item"]["scratch_kib"] > 300  # the 90-token item's tiles and shares
    # with the key blocks outer (sm_90), no shares: under half of that
    assert traffic.backward_traffic(two)["per_long_item"]["scratch_kib"] < 150
    # the tiled path's scratch is its delta rows: 12 bytes a row
    assert r_long["per_long_item"]["scratch_kib"] == pytest.approx(3 * 4 * 600 / 1024)
    assert r_long["ratio"] < 0.05 < r_short["ratio"] < r_two["ratio"]


def test_packed_short_sequences_store_ds_long_ones_do_not():
    """A packed batch of short sequences: the dK/dV kernel's stored dS (fp32, each allowed pair written and read
    once a head) beside the delta rows; one sequence long enough that the batch passes 128 pairs a token: the table
    kernel recomputes dS and only the delta rows remain."""
    short = Workload("p", [[-1] + [0] * 29, [-1] + [0] * 9], 30, "test", "", packed=True)
    item = traffic.backward_traffic(short)["per_long_item"]
    assert item["tokens"] == 30 and item["scratch_kib"] == pytest.approx((3 * 4 * 30 + 2 * 4 * 30 * 30) / 1024)
    causal = traffic.backward_traffic(short, causal=True)["per_long_item"]
    assert causal["scratch_kib"] == pytest.approx((3 * 4 * 30 + 2 * 4 * 30 * 31 // 2) / 1024)
    mixed = Workload("m", [[-1] + list(range(299)), [-1] + [0] * 9], 300, "test", "", packed=True)
    assert traffic.backward_traffic(mixed)["per_long_item"]["scratch_kib"] == pytest.approx(3 * 4 * 300 / 1024)


def test_format_names_its_units_and_model():
    w = Workload("one", [[-1] + list(range(99))], 100, "test", "")
    row = dict(traffic.backward_traffic(w), workload="one", head_dim=64)
    text = traffic.format_traffic([row])
    assert "per valid pair and head (bytes" in text and "not a measurement" in text and "short2" in text


def test_cli_prints_the_model_and_refuses_what_it_does_not_model(capfd, tmp_path):
    import json

    from syntaxkernels import __main__ as cli

    out = tmp_path / "traffic.json"
    assert cli.main(["inspect", "--traffic", "--workload", "sentences,pairs", "--head-dim", "64",
                     "--json", str(out)]) == 0
    text = capfd.readouterr().out  # (under the interpreter the command runs in a child process)
    assert "sentences" in text and "short2" in text and "not a measurement" in text
    rows = json.loads(out.read_text())
    assert [r["path"] for r in rows] == ["short", "short2"] and rows[1]["keys_outer"]
    assert rows[0]["scratch"] > 0 and rows[1]["scratch"] > 0
    assert cli.main(["inspect", "--traffic", "--workload", "two-parse"]) == 2
    assert "not the relation workloads" in capfd.readouterr().err
    assert cli.main(["inspect", "--traffic", "--arch", "80,90"]) == 2
