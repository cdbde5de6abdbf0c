"""benchmarks/flex_compiled.py: FlexAttention's backward as Inductor compiles it for a GPU this machine lacks, read
like our kernels (its figures: benchmarks/RESULTS.md).

The block classes and loop trips the script weights Flex's loops by are checked against Flex's own block mask
(``create_block_mask`` on the CPU) and against the score elements a full batch must cover; the Inductor lowering
and the SASS reading run end to end on a small batch in a subprocess without TRITON_INTERPRET (the interpreter
replaces ``@triton.jit``).
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "flex_compiled.py"

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention")


def _module():
    spec = importlib.util.spec_from_file_location("flex_compiled", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flex_classes(block_mask):
    """Flex's own classes per item: 1 where a block is listed partial, 2 where listed full, else 0."""
    nb = block_mask.kv_num_blocks.shape[-1]
    items = []
    for b in range(block_mask.kv_num_blocks.shape[0]):
        grid = [[0] * nb for _ in range(nb)]
        for value, counts, indices in ((1, block_mask.kv_num_blocks, block_mask.kv_indices),
                                       (2, block_mask.full_kv_num_blocks, block_mask.full_kv_indices)):
            for row in range(nb):
                for i in range(int(counts[b, 0, row])):
                    grid[row][int(indices[b, 0, row, i])] = value
        items.append(grid)
    return items


@pytest.mark.parametrize("N, lengths", [(300, [300, 257, 128, 5]), (57, [57, 30]), (256, [256, 1])])
def test_padded_block_classes_match_flex_block_mask(N, lengths):
    module = _module()
    lengths_t = torch.tensor(lengths)

    def mask_mod(b, h, i, j):
        return (i < lengths_t[b]) & (j < lengths_t[b])
    block_mask = flex_attention.create_block_mask(mask_mod, len(lengths), 1, N, N, device="cpu")
    assert module._block_classes(N, lengths, None) == _flex_classes(block_mask)


def test_packed_block_classes_match_flex_block_mask():
    module = _module()
    lengths = [3, 140, 20, 300, 9, 128]
    docs = [d for d, n in enumerate(lengths) for _ in range(n)]
    docs_t = torch.tensor(docs)
    N = len(docs)

    def mask_mod(b, h, i, j):
        return docs_t[i] == docs_t[j]
    block_mask = flex_attention.create_block_mask(mask_mod, 1, 1, N, N, device="cpu")
    assert module._block_classes(N, lengths, docs) == _flex_classes(block_mask)


def test_trips_cover_a_full_batch_exactly_once():
    """A full-length item: every score element in exactly one full-block trip of each loop (trips x tile area =
    N^2), none partial; rows shorter than a block take one trip of a loop, capped as the template caps."""
    module = _module()
    sm90_d64 = dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64)
    for N in (1024, 384):
        trips = module._trips(N, module._block_classes(N, [N], None), sm90_d64)
        assert trips["dq_partial"] == trips["dkdv_partial"] == 0
        assert trips["dq_full"] * 128 * 64 == trips["dkdv_full"] * 64 * 128 == N * N
    # N = 57: one block each, partial even for the full-length item (the block reaches past N); one trip each.
    trips = module._trips(57, module._block_classes(57, [57, 30], None), sm90_d64)
    assert trips == dict(dq_partial=2, dq_full=0, dkdv_partial=2, dkdv_full=0)
    # An item past the first block: its edge blocks are partial, the rest full.
    trips = module._trips(300, module._block_classes(300, [300], None), sm90_d64)
    assert trips["dq_partial"] > 0 and trips["dq_full"] > 0


END_TO_END = textwrap.dedent("""
    import json, sys, types
    sys.path.insert(0, sys.argv[1])
    import importlib.util
    spec = importlib.util.spec_from_file_location("flex_compiled", sys.argv[2])
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    out = {}
    for name, N, lengths in (("long", 256, [256, 200]), ("short", 48, [48, 20])):
        workload = types.SimpleNamespace(name=name, N=N, lengths=lengths, batch_size=len(lengths), packed=False)
        out[name] = module.flex_case(workload, 64, 90)
    json.dump(out, sys.stdout, default=str)
""")


@pytest.mark.slow
def test_flex_backward_compiled_and_read(tmp_path):
    """Inductor lowers Flex's backward for an sm_90 device that is not here; its four tile loops are read from
    the SASS; the full-block loops cost less than the partial ones; rows shorter than a block fall back to the
    full-block floor (marked as a bound)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    script = tmp_path / "end_to_end.py"
    script.write_text(END_TO_END)
    proc = subprocess.run([sys.executable, str(script), str(ROOT), str(SCRIPT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    long, short = out["long"], out["short"]
    assert not long["lower_bound"] and short["lower_bound"]
    loops = long["loops"]
    assert set(loops) == {"dq_partial", "dq_full", "dkdv_partial", "dkdv_full"}
    assert 0 < loops["dq_full"]["other"] < loops["dq_partial"]["other"]
    assert 0 < loops["dkdv_full"]["other"] < loops["dkdv_partial"]["other"]
    assert all(loop["ex2"] > 0 for loop in loops.values())
    assert long["blocks"] == dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64)
    assert long["resources"]["warps"] == 8 and long["resources"]["registers"] > 0
    assert long["trips"]["dq_full"] > 0 and long["trips"]["dq_partial"] > 0
    assert long["per_valid_pair"] > long["per_element"] > 0  # the padding's area costs per valid pair
    assert short["per_valid_pair"] > long["per_valid_pair"]
