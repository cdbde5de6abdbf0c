"""Every fused kernel, compiled as a real launch specialises it for sm_80 and sm_90 (no GPU), stays spill-free and
within the instruction targets of its main loop (:mod:`syntaxkernels.tools.inspection`).

The compilation runs once per module, in a subprocess without TRITON_INTERPRET (the interpreter replaces
``@triton.jit``), on the launch cases flagged ``ci``: the bf16 target cases (D64/D128, dense, N = 1024), the
heaviest variants (window lists, causal), fp32 D64 and the edge kernels (bf16 D64). ``python -m syntaxkernels
inspect`` runs every case (fp16 compiles the same code as bf16). A second compilation (``workload_reports``)
compiles one layer's forward and backward on named workloads (sentences padded to the batch's longest, N = 1000)
for sm_80 and sm_90 and fails on any spill or shared memory over the family's limit (``inspect --workload all``
covers every workload and GPU family). The SASS readers, the workloads, the tile classes, the cost per valid
pair and the report's wording are unit-tested without compiling.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from syntaxkernels.tools import inspection as I

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    from syntaxkernels.tools import inspection as I
    if __name__ == "__main__":
        reports = I.inspect_kernels(processes=2, ci=True,
                                    progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(I.format_reports(reports), file=sys.stderr)
        json.dump([r.as_dict() for r in reports], sys.stdout)
""")


# The workloads CI compiles: the treebank's (or, without it, generated) sentences under a [CLS] root padded to
# the batch's longest (N rarely a multiple of 16) at D = 64 and 128, and N = 1000 (N % 16 = 8) at D = 64, for
# sm_80 and sm_90. ``python -m syntaxkernels inspect --workload all`` covers every workload and family.
CI_WORKLOADS = [("sentences", 64), ("sentences", 128), ("pairs", 64), ("odd-1000", 64)]
CI_WORKLOAD_ARCHS = (80, 90)
# T5's encoder layer (the relative-position term, RelativePositionSpec(): on sentences the one-tile short-row kernels
# with the term and the short table kernel's position-table gradient) on sentences at T5's head dim.
CI_POSITION_WORKLOADS = [("sentences", 64)]

WORKLOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    from syntaxkernels.tools import inspection as I
    if __name__ == "__main__":
        reports = []
        from syntaxkernels.specs import RelativePositionSpec
        jobs = [(name, "bf16", d, a) for name, d in %r for a in %r]
        jobs += [(name, "bf16", d, a, None, 0.0, 0, False, -1, RelativePositionSpec()) for name, d in %r for a in %r]
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(2) as pool:
            for job, batch in zip(jobs, pool.imap(I._workload_job, jobs)):
                print(job, len(batch), "kernels", file=sys.stderr, flush=True)
                reports += batch
        print(I.format_workload_reports(reports), file=sys.stderr)
        json.dump([r.as_dict() for r in reports], sys.stdout)
""" % (CI_WORKLOADS, CI_WORKLOAD_ARCHS, CI_POSITION_WORKLOADS, CI_WORKLOAD_ARCHS))


def _compile_in_subprocess(tmp_path_factory, name, text):
    pytest.importorskip("triton")
    script = tmp_path_factory.mktemp("inspect") / name
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2400)
    sys.stderr.write(proc.stderr[-30000:])
    assert proc.returncode == 0, proc.stderr[-5000:]
    return [I.KernelReport(**{k: v for k, v in r.items() if k != "ratio"}) for r in json.loads(proc.stdout)]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return _compile_in_subprocess(tmp_path_factory, "inspect_ci.py", SCRIPT)


@pytest.fixture(scope="module")
def workload_reports(tmp_path_factory):
    return _compile_in_subprocess(tmp_path_factory, "inspect_workloads_ci.py", WORKLOAD_SCRIPT)


@pytest.mark.slow  # compiles for sm_80/sm_90 (the workload_reports fixture)
def test_workload_kernels_compile_without_spills_and_fit_shared_memory(workload_reports):
    """On the batches users have (sentences padded to the batch's longest, N = 1000), every kernel of a layer's
    forward and backward compiles for sm_80 and sm_90, none spills, and each fits its family's shared memory."""
    problems = I.workload_problems(workload_reports)
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # compiles for sm_80/sm_90 (the workload_reports fixture)
def test_a_layer_after_the_first_leaves_the_block_metadata_to_the_plan(workload_reports):
    """The summary's ``bwd_layer_instr`` is the backward without the block-metadata kernels (the structure plan
    keeps their tile bucket sets for the batch's other layers): on N = 1000 the tiled path's bucket-mask kernel is
    left out, on sentences (the short-row table kernel forms its tiles' bucket sets itself) nothing is."""
    rows = I.workload_summary(workload_reports)
    metadata = {}
    for r in workload_reports:
        if r.kernel in I._TILE_PROGRAMS and not r.error and (r.cost or {}).get("instr") is not None:
            metadata[(r.case, r.arch)] = metadata.get((r.case, r.arch), 0.0) + r.cost["instr"]
    for row in rows:
        spent = metadata.get((row["case"], row["arch"]), 0.0)
        assert row["bwd_layer_instr"] == pytest.approx(row["bwd_instr"] - spent), row
        if row["case"].startswith("odd-1000"):
            assert spent > 0 and row["bwd_layer_instr"] < row["bwd_instr"]
        if row["case"].startswith("sentences"):
            assert spent == 0


@pytest.mark.slow  # compiles for sm_80/sm_90 (the workload_reports fixture)
def test_workload_cases_report_every_kernel_its_tiles_and_cost(workload_reports):
    from syntaxkernels.ops.bias_attention import configs as op

    tiled = {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel",
             "_block_bucket_mask_kernel"}
    # Rows of at most 64 tokens: the short-row backward (one tile a sequence, every head a program); of 65..128:
    # the two-block one (a program per query block, its shares added by a second kernel; on sm_90 at D = 64 with
    # the key blocks outer: a program per item, no shares, no second kernel). Their table kernel
    # forms each tile's bucket set itself (no metadata launch).
    short = {"_bias_fwd_short_kernel", "_bias_bwd_short_kernel", "_bias_bwd_short_table_kernel"}  # (sm_90)
    short_t = {"_bias_fwd_short_kernel", "_bias_bwd_short_t_kernel", "_bias_bwd_short_table_kernel"}  # (keys-major)
    short2 = {"_bias_fwd_kernel", "_bias_bwd_short2_kernel", "_bias_bwd_short2_sum_kernel",
              "_bias_bwd_short_table_kernel"}
    short2_keys = {"_bias_fwd_kernel", "_bias_bwd_short2_keys_kernel", "_bias_bwd_short_table_kernel"}
    cases = {(f"{name} bf16 D{d}", a) for name, d in CI_WORKLOADS for a in CI_WORKLOAD_ARCHS}
    cases |= {(f"{name} bf16 D{d} rp32:128", a) for name, d in CI_POSITION_WORKLOADS for a in CI_WORKLOAD_ARCHS}
    assert {(r.case, r.arch) for r in workload_reports} == cases
    for case, arch in cases:
        group = [r for r in workload_reports if (r.case, r.arch) == (case, arch)]
        rows = I._workload(case.split()[0]).N
        head_dim = int(case.split()[2][1:])
        keys_major = op.select_config("short", torch.bfloat16, head_dim, arch=arch).get("KEYS_MAJOR")
        one_tile = short_t if keys_major else short
        keys_outer = op.select_config("short2", torch.bfloat16, head_dim, arch=arch).get("KEYS_OUTER")
        two_block = short2_keys if keys_outer else short2
        expected = one_tile if rows <= op.SHORT_ROW_LIMIT else two_block if rows <= 2 * op.SHORT_ROW_LIMIT else tiled
        if case.endswith("rp32:128") and rows > op.SHORT_ROW_LIMIT:  # T5's position term: the one-tile kernels,
            expected = tiled  # else the tiled ones (the two-block kernels take no term)
        # (and the one-program epilogue that turns the bucket sums into the table's and strength's gradients)
        assert {r.kernel for r in group} == expected | {"_bias_table_grad_kernel"}, (case, arch,
                                                                                     {r.kernel for r in group})
        for r in group:
            assert r.shared_limit == I.SHARED_LIMIT[arch]
            assert all(x >= 0 for x in r.loop_other + r.loop_all), r
            if r.kernel in ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel",
                            "_bias_bwd_table_kernel"):
                t = r.tiles
                assert t["skipped"] + t["interior"] + t["boundary"] == t["grid"], r
                assert t["one_bucket"] + t["mixed"] <= t["interior"] + t["boundary"]
                # The kernels compute at least every valid pair; their cost is positive.
                assert r.cost["area"] >= 1.0 and r.cost["instr"] > 0, r
                assert r.main_tensor_core > 0, r
            if r.kernel == "_bias_bwd_table_kernel":  # a loop over the heads of a shared table in its tile loop
                assert r.heads == I.WORKLOAD_HEADS and r.head_loop_other and min(r.head_loop_other) > 0, r
                # Every tile of a sentence batch is walked and reduces its dS per bucket.
                assert r.tiles["one_bucket"] + r.tiles["mixed"] > 0, r
            elif r.kernel in ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel"):
                assert r.cost["plain_instr"] and r.cost["plain_instr"] < r.cost["instr"], r  # the bias-free twin
            if r.kernel in I._HEAD_PROGRAMS:  # one tile a sequence, a loop over the 12 heads, the rest once
                t = r.tiles
                if r.kernel in I._ONE_TILE:
                    assert t["grid"] == t["boundary"] and t["skipped"] == 0, r
                assert r.once_other > 0 and r.once_all >= r.once_other, r
                if r.kernel == "_bias_bwd_short_table_kernel":  # every head's dS summed in one program
                    assert r.heads == I.WORKLOAD_HEADS, r
                else:  # a group of heads a program: the heads it walks and the grid of the whole batch agree
                    items = I._workload(case.split()[0]).batch_size
                    groups = r.programs // items
                    assert r.programs % items == 0 and r.heads == -(-I.WORKLOAD_HEADS // groups), r
                assert r.cost["area"] >= 1.0 and r.cost["instr"] > 0, r
                if r.kernel in I._ONE_TILE:
                    assert r.main_tensor_core > 0, r
                    assert r.cost["area"] == t["area"] * t["grid"] / t["valid_pairs"], r  # one 64 x 64 tile a row
                else:  # every tile holding an allowed pair reduces its dS per bucket; the others are skipped
                    assert t["one_bucket"] + t["mixed"] == t["boundary"], r
            if r.kernel in I._SHORT2_PROGRAMS:  # three head loops (first pass, two key blocks), all modelled
                t = r.tiles
                assert len(r.loop_other) == 3 and min(r.loop_other) > 0 and r.main_tensor_core > 0, r
                assert t["skipped"] + t["boundary"] == t["grid"] and t["first_pass"] == t["second_key_block"] > 0, r
                assert r.cost["area"] >= 1.0 and r.cost["instr"] > 0, r
            if r.kernel in I._SHORT2_SUM:
                assert r.tiles["programs_long"] > 0 and r.cost["instr"] > 0, r
            if r.kernel in I._SHORT2_KEYS:  # head loop > key-block loop > step loop, and the zeroing loops
                t, n = r.tiles, r.nest
                assert n is not None and 0 < n["step_other"] <= n["step_all"] and n["key_block"] > 0, r
                assert n["zero_step"] > 0 and n["zero_block"] > 0 and n["once"] > 0, r
                assert t["skipped"] + t["boundary"] == t["grid"] and t["steps"] == t["boundary"] > 0, r
                assert t["key_blocks"] >= t["items"] == I._workload(case.split()[0]).batch_size, r
                assert r.cost["area"] >= 1.0 and r.cost["instr"] > 0 and r.main_tensor_core > 0, r


@pytest.mark.slow  # compiles for sm_80/sm_90 (the reports fixture)
def test_every_launched_kernel_meets_the_rules(reports):
    """No compile error, no spill, no loop above the limit; the target cases meet their main-loop targets
    (instructions and ex2 per element, async copies, no nested loop)."""
    problems = I.check_targets(reports, I.launch_cases(ci=True))
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # compiles for sm_80/sm_90 (the reports fixture)
def test_every_case_launches_every_kernel_for_both_archs(reports):
    cases = [c for c in I.launch_cases(ci=True) if c.op == "bias_attention"]
    assert {(r.case, r.arch) for r in reports if r.op == "bias_attention"} == {(c.name, a) for c in cases
                                                                                for a in (80, 90)}
    edge = {r.kernel for r in reports if r.op == "edge_attention"}
    assert {"_edge_fwd_kernel", "_edge_merge_kernel", "_edge_bwd_delta_kernel", "_edge_bwd_dq_kernel",
            "_edge_sum_kernel", "_edge_bwd_dkdv_kernel"} <= edge, edge
    for case in cases:
        for arch in (80, 90):
            kernels = {r.kernel for r in reports if r.case == case.name and r.arch == arch}
            assert {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel",
                    "_bias_bwd_table_kernel"} <= kernels, (case.name, kernels)


@pytest.mark.slow  # compiles for sm_80/sm_90 (the reports fixture)
def test_target_cases_report_plain_twins_and_tensor_cores(reports):
    """The target cases carry the SYNTAX=False twin (the syntax work's overhead as a ratio); half-precision
    main loops run on tensor cores (wgmma on sm_90) fed by asynchronous copies."""
    targets = {c.name for c in I.launch_cases(ci=True) if c.targets}
    checked = 0
    for r in reports:
        if r.case not in targets or r.kernel not in I.TARGETS:
            continue
        checked += 1
        assert r.plain_other_per_unit and r.ratio and r.ratio > 1.0, r
        assert r.main_tensor_core > 0 and r.main_async, r
        if r.arch == 90:
            assert r.main_wgmma, r
    assert checked == len(targets) * 2 * len(I.TARGETS)


def test_table_gradient_tiles_on_generated_trees():
    """The tile fractions add up and follow the trees: between packed sentences tiles are one bucket
    (unreachable), while under one root token every pair is a few edges apart and tiles are mixed."""
    import random

    from syntaxkernels.tools import workloads

    rng = random.Random(0)
    sentences = [workloads.random_forest(rng, rng.randint(5, 30)) for _ in range(300)]
    packed = I.table_gradient_tiles(workloads.pack_sentences(sentences, 512, rows=4), 512, 64)
    connected = I.table_gradient_tiles(workloads.connect_sentences(sentences, 512, rows=4), 512, 64)
    for tiles in (packed, connected):
        assert abs(tiles["one_bucket"] + tiles["mixed"] - 1) < 1e-9
    assert packed["one_bucket"] > 0.3 and connected["one_bucket"] < 0.1


# A loop (0x0040..0x00d0) with a branch skipping three instructions, an inner loop, and an exit.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
        /*0020*/                   NOP ;
        /*0030*/                   ISETP.GE.AND P0, PT, R0, 0x1, PT ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT, gsb0 ;
        /*0060*/               @P0 BRA 0xa0 ;
        /*0070*/                   FADD R5, R5, R6 ;
        /*0080*/                   MUFU.EX2 R7, R7 ;
        /*0090*/                   FADD R5, R5, R7 ;
        /*00a0*/                   IADD3 R8, R8, 0x1, RZ ;
        /*00b0*/                   ISETP.NE.AND P1, PT, R8, R9, PT ;
        /*00c0*/               @P1 BRA 0xa0 ;
        /*00d0*/               @P0 BRA 0x40 ;
        /*00e0*/                   EXIT ;
"""


def test_sass_loops_shortest_path_and_mix():
    instructions, loops = I.analyse_sass(SASS)
    assert len(instructions) == 15
    outer = [l for l in loops if l.tensor_core][0]
    inner = [l for l in loops if not l.tensor_core][0]
    assert (outer.start, outer.end) == (4, 13) and (inner.start, inner.end) == (10, 12)
    assert outer.instructions == 10 and outer.tensor_core == 1 and outer.ex2 == 1
    assert outer.asynchronous and outer.wgmma
    # Cheapest iteration: LDGSTS, HGMMA, BRA (taken), IADD3, ISETP, BRA (not taken), BRA = 7.
    assert outer.shortest == 7


def test_check_targets_flags_every_rule():
    case = I.launch_cases("bf16 D64 N1024 dense")[0]
    good = I.KernelReport("bias_attention", case.name, "_bias_fwd_kernel", 90, head_dim=64, dtype="bf16",
                          registers=200, local_bytes=0, stack_bytes=0, main_tensor_core=8, main_async=True,
                          other_per_unit=15.0, all_per_unit=15.0, ex2_per_unit=1.05, worst_per_unit=20.0)
    assert I.check_targets([good], [case]) == []
    bad = [
        I.KernelReport(**dict(good.__dict__, other_per_unit=25.0)),
        I.KernelReport(**dict(good.__dict__, ex2_per_unit=2.0)),
        I.KernelReport(**dict(good.__dict__, stack_bytes=8)),
        I.KernelReport(**dict(good.__dict__, worst_per_unit=90.0)),
        I.KernelReport(**dict(good.__dict__, main_async=False)),
        I.KernelReport(**dict(good.__dict__, nested_loops=1)),
        I.KernelReport(**dict(good.__dict__, error="CompilationError: boom")),
    ]
    for report in bad:
        assert len(I.check_targets([report], [case])) == 1, report
    # sm_80 is allowed 25% more.
    assert I.check_targets([I.KernelReport(**dict(good.__dict__, arch=80, other_per_unit=24.0))], [case]) == []


# ---------------------------------------------------------------------------------------------------------
# Workloads, tile classes, the cost per valid pair and the report's wording (no compilation)
# ---------------------------------------------------------------------------------------------------------


def _generated():
    from syntaxkernels.tools import workloads

    return workloads.generated_sentences(400, seed=3, max_length=40), "generated trees (test)"


@pytest.mark.parametrize("name", ["sentences", "pairs", "finetune-128", "finetune-512", "packed", "long-4096",
                                  "odd-77", "odd-1000"])
def test_named_workloads_are_the_batches_they_say(name):
    from syntaxkernels.tools import workloads

    sentences, source = _generated()
    w = workloads.named_workload(name, sentences, source)
    assert w.source == source and w.N >= max(w.lengths)
    roots = [sum(1 for h in row if h < 0) for row in w.heads]
    if name in ("sentences", "pairs") or name.startswith("finetune"):
        assert w.batch_size == 32
        for row in w.heads:  # [CLS] roots the row; every sentence root and [SEP] hangs under it
            assert row[0] == -1 and row[-1] == 0 and sum(1 for h in row if h < 0) == 1
        if name == "pairs":
            assert all(sum(1 for i, h in enumerate(row) if h == 0 and i > 0) >= 3 for row in w.heads)
    if name in ("sentences", "pairs"):
        assert w.N == max(w.lengths)  # padded to the batch's longest
    if name.startswith(("finetune", "odd", "long")) or name == "packed":
        assert w.N == int(name.split("-")[-1]) if "-" in name else w.N == 1024
    if name == "packed":
        assert all(r > 1 for r in roots)  # forests: several sentences a row
    if name.startswith(("long", "odd")):
        assert all(r == 1 for r in roots)
    batch = w.tree_batch()
    assert tuple(batch.distance.shape) == (w.batch_size, w.N, w.N)
    assert batch.lengths.tolist() == w.lengths
    rows = w.compile_rows()
    assert max(w.lengths[b] for b in rows) == max(w.lengths)  # the compile batch keeps the batch's N


def test_workload_names_and_groups():
    from syntaxkernels.tools import workloads

    assert workloads.workload_names("long,odd-77") == ["long-4096", "long-8192", "odd-77"]
    assert workloads.workload_names("all") == list(workloads.WORKLOADS)
    with pytest.raises(ValueError, match="sentences"):
        workloads.workload_names("sentence")


def test_tile_presence_matches_the_block_metadata():
    import torch

    from syntaxkernels.tools import workloads
    from syntaxkernels.ops.block_meta import block_bucket_masks_torch
    from syntaxkernels.specs import BucketSpec

    sentences, source = _generated()
    batch = workloads.named_workload("odd-77", sentences, source).tree_batch()
    lut = BucketSpec().lut()
    for bm, bn in ((16, 32), (64, 128)):
        got = I.tile_presence(batch.distance, batch.lengths, bm, bn, lut)
        want = block_bucket_masks_torch(batch.distance, batch.lengths, lut, bm, bn)
        assert torch.equal(got.to(torch.int32), want)


def test_workload_tiles_follow_padding_and_lengths():
    from syntaxkernels.tools import workloads

    sentences, source = _generated()
    padded = workloads.named_workload("finetune-128", sentences, source)
    tight = workloads.named_workload("sentences", sentences, source)
    for w in (padded, tight):
        for kernel in ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel", "_bias_bwd_table_kernel"):
            t = I.workload_tiles(kernel, w, 16, 32)
            assert t["skipped"] + t["interior"] + t["boundary"] == t["grid"]
            walked = (t["interior"] + t["boundary"]) * t["area"]
            assert walked >= w.valid_pairs()
            if kernel == "_bias_bwd_table_kernel":  # every walked tile holds an allowed pair here
                assert t["one_bucket"] + t["mixed"] == t["interior"] + t["boundary"] and t["mixed"] > 0
            else:
                assert t["one_bucket"] == t["mixed"] == 0
    # The same sentences padded to 128 instead of their longest: more tiles skipped, the same tiles walked.
    a = I.workload_tiles("_bias_fwd_kernel", padded, 16, 32)
    b = I.workload_tiles("_bias_fwd_kernel", tight, 16, 32)
    assert a["grid"] > b["grid"] and a["skipped"] > b["skipped"]
    assert (a["interior"], a["boundary"]) == (b["interior"], b["boundary"])
    # Full-length rows whose N is a multiple of the tile: every tile interior, one element per valid pair.
    full = workloads.Workload("full", [workloads.chain(64)] * 2, 64, "chains", "")
    t = I.workload_tiles("_bias_fwd_kernel", full, 16, 32)
    assert t["interior"] == t["grid"] and t["boundary"] == t["skipped"] == 0
    assert (t["interior"] * t["area"]) == full.valid_pairs()


def test_workload_tiles_with_a_window_count_the_live_tile_lists_by_hand():
    """With a distance window or a positional window the forward, dQ, dK/dV and table kernels walk the launcher's
    live-tile lists: on chains (d_ij = |i - j|) of 100 and 40 tokens and an empty row padded to 128, 32 x 32 tiles, a
    window of 4 keeps the diagonal tiles and their neighbours (adjacent blocks hold pairs one apart), masked where
    the walked block runs past the length; a window of 0 the diagonal only, whose one bucket the table kernel skips
    (each query block's most frequent one-bucket tile); a positional window of 2 the same tiles as the window of 4,
    every one masked (each holds pairs farther apart)."""
    from syntaxkernels.tools import workloads

    w = workloads.Workload("t", [workloads.chain(100), workloads.chain(40), []], 128, "chains", "")
    grid = 3 * 4 * 4
    for kernel in ("_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel"):
        plain = I.workload_tiles(kernel, w, 32, 32)
        assert plain["interior"] + plain["boundary"] == 16 + 4  # (every tile inside the lengths)
        t = I.workload_tiles(kernel, w, 32, 32, window=4)
        # 100 tokens: 4 diagonal tiles and 2 x 3 neighbours; 40: 2 and 2; the walked block past the length: block 3
        # of the 100-token row (its two live tiles), block 1 of the 40-token one (its two)
        assert (t["interior"], t["boundary"], t["skipped"], t["grid"]) == (10, 4, grid - 14, grid), kernel
        t = I.workload_tiles(kernel, w, 32, 32, window=0)
        assert (t["interior"], t["boundary"]) == (4, 2), kernel
        t = I.workload_tiles(kernel, w, 32, 32, band=2)
        assert (t["interior"], t["boundary"]) == (0, 14), kernel
    t = I.workload_tiles("_bias_bwd_table_kernel", w, 32, 32, window=0)
    assert (t["bucket_skipped"], t["one_bucket"], t["mixed"], t["interior"] + t["boundary"]) == (6, 0, 0, 0)
    plain = I.workload_tiles("_bias_bwd_table_kernel", w, 32, 32)
    assert plain["mixed"] > 0  # (without the window the diagonal tiles hold many buckets)
    t = I.workload_tiles("_bias_bwd_table_kernel", w, 32, 32, window=4)
    assert t["interior"] + t["boundary"] + t["bucket_skipped"] == 14 and t["mixed"] > 0


SASS_EARLY_EXIT = """
        /*0000*/                   S2R R0, SR_CTAID.X ;
        /*0010*/                   ISETP.GE.AND P0, PT, R0, 0x4, PT ;
        /*0020*/               @P0 BRA 0x80 ;
        /*0030*/                   LDG.E.U8 R2, desc[UR4][R4.64] ;
        /*0040*/                   LOP3.LUT R3, R2, 0xff, RZ, 0xc0, !PT ;
        /*0050*/                   SHFL.BFLY PT, R6, R3, 0x1, 0x1f ;
        /*0060*/                   STG.E [R8.64], R6 ;
        /*0070*/                   EXIT ;
        /*0080*/                   STG.E [R8.64], RZ ;
        /*0090*/                   EXIT ;
"""


def test_block_metadata_tiles_past_the_length_cost_their_early_exit():
    """The block-metadata kernels' programs whose tile starts past the length (or, for the causal bucket masks,
    lies wholly above the diagonal) count as skipped and cost only their path to the early exit; the others every
    instruction."""
    from syntaxkernels.tools import workloads

    # The cheapest path to an EXIT: S2R, ISETP, BRA (taken), STG, EXIT.
    assert I._shortest_exit(I._instructions(SASS_EARLY_EXIT)) == 5
    w = workloads.Workload("t", [workloads.chain(100), workloads.chain(40), []], 128, "chains", "")
    t = I.workload_tiles("_block_bucket_mask_kernel", w, 32, 32)
    # 100 tokens: 4 x 4 tiles start inside the length; 40: 2 x 2; the empty item none.
    assert (t["grid"], t["interior"], t["skipped"], t["boundary"]) == (48, 20, 28, 0)
    causal = I.workload_tiles("_block_bucket_mask_kernel", w, 32, 32, causal=True)
    assert (causal["interior"], causal["skipped"]) == (10 + 3, 48 - 13)  # (key block <= query block)
    report = I.KernelReport("bias_attention", "c", "_block_bucket_mask_kernel", 90, num_warps=4, instructions=50,
                            exit_instructions=8)
    cost = I.workload_cost(report, t, heads=12)
    assert cost["instr"] == pytest.approx((20 * 50 + 28 * 8) * 128 / 12 / (100 ** 2 + 40 ** 2))


def test_two_block_tiles_with_the_key_blocks_outer_count_steps_by_hand():
    """The two-block kernel with the key blocks outer walks, per item and head, first the second key block for the
    rows reaching it (the exact delta), then each key block inside the length over the steps of ROWS query rows up
    to the length's last (causal: from the key block's diagonal), and zeroes the steps of a last block past the
    length and the blocks past it."""
    from syntaxkernels.tools import workloads

    w = workloads.Workload("t", [workloads.chain(100), workloads.chain(40), []], 128, "chains", "")
    t = I.workload_tiles("_bias_bwd_short2_keys_kernel", w, 64, 64, rows=16)
    # 100 tokens: 2 key blocks x 7 steps; 40: 1 x 3; empty: none
    assert (t["steps"], t["key_blocks"], t["items"]) == (2 * 7 + 3, 3, 3)
    assert t["boundary"] == t["steps"] and t["interior"] == 0 and t["area"] == 16 * 64
    assert t["grid"] == 3 * 2 * 2 * 4 and t["skipped"] == t["grid"] - t["steps"]
    assert (t["zero_steps"], t["zero_blocks"]) == ((8 - 7) + (4 - 3), 0 + 1 + 2)
    assert t["first_pass"] == 7  # (the 100-token item's steps over its second key block, for the exact delta)
    causal = I.workload_tiles("_bias_bwd_short2_keys_kernel", w, 64, 64, rows=16, causal=True)
    assert causal["steps"] == (7 + (7 - 4)) + 3 and causal["first_pass"] == 3
    nest = dict(step_other=10, step_all=12, first_other=6, first_all=8, key_block=30, head=7, zero_step=5,
                zero_block=9, once=100, heads=12, groups=4)
    report = I.KernelReport("bias_attention", "c", "_bias_bwd_short2_keys_kernel", 90, num_warps=4, nest=nest)
    per_head = 17 * 10 + 7 * 6 + 3 * 30 + 3 * 7 + 2 * 5 + 3 * 9
    once = 3 * 4 * 100 / 12
    assert I.workload_cost(report, t)["instr"] == pytest.approx((per_head + once) * 128 / w.valid_pairs())
    assert I.workload_cost(report, t)["area"] == pytest.approx(17 * 16 * 64 / w.valid_pairs())


def test_tile_presence_is_cached_per_batch_not_per_name():
    """Two workloads of one name built from other trees (the treebank's and generated ones) are two batches: the
    tile presence cache gave the first one's bucket sets to the second (the table kernel's tiles then did not add
    up when another test had built a named workload from the treebank first)."""
    from syntaxkernels.tools import workloads

    chains = workloads.Workload("same-name", [workloads.chain(20)] * 2, 32, "chains", "")
    forests = workloads.Workload("same-name", [[-1] * 20] * 2, 32, "one-token trees", "")
    assert not torch.equal(I._presence(chains, 16, 16), I._presence(forests, 16, 16))
    assert I._presence(chains, 16, 16) is I._presence(chains, 16, 16)  # still cached


def _brute_force_sets(distance, lengths, lut, bm, bn):
    """Per tile the set of buckets of its valid pairs, by a loop over the tiles (the reference for the model)."""
    B, N, _ = distance.shape
    out = {}
    for b in range(B):
        L = int(lengths[b])
        for qb in range(-(-N // bm)):
            for kb in range(-(-N // bn)):
                tile = distance[b, qb * bm:min((qb + 1) * bm, L), kb * bn:min((kb + 1) * bn, L)]
                out[b, qb, kb] = set(lut[tile.long()].flatten().tolist())
    return out


def test_tile_bucket_sets_hold_every_code_of_256_buckets():
    """The tile model counts more than 62 buckets (a relation batch's 256 codes): the bucket sets equal a
    brute-force count per tile, the buckets a tile walks are its held buckets up to 31 buckets and for the 256 codes
    (inside the range the launcher's own ``_tile_buckets`` metadata, lowest + 256 * highest, says), the range for
    other tables over 31 buckets, and the 62-bit packing refuses such a LUT instead of dropping buckets."""
    from syntaxkernels.ops.bias_attention import _launch
    from syntaxkernels.specs import BucketSpec
    from syntaxkernels.trees.relations import CODE_BUCKETS

    g = torch.Generator().manual_seed(0)
    B, N = 3, 45
    lengths = torch.tensor([45, 30, 7])
    low = torch.randint(0, 256, (B, N, N), generator=g)  # codes over the whole byte, some tiles narrow
    low[:, :16, :16] = torch.randint(60, 64, (B, 16, 16), generator=g)
    distance = low.to(torch.uint8)
    lut = CODE_BUCKETS.lut()
    for bm, bn in ((16, 16), (32, 16)):
        sets = I.tile_bucket_sets(distance, lengths, bm, bn, lut)
        assert sets.shape == (B, -(-N // bm), -(-N // bn), 256)
        brute = _brute_force_sets(distance, lengths, lut, bm, bn)
        for (b, qb, kb), held in brute.items():
            assert set(torch.nonzero(sets[b, qb, kb]).flatten().tolist()) == held, (b, qb, kb)
        assert int(sets.sum()) > 62 * 3  # many tiles hold more than 62 buckets: no 62-bit set could
        # One bucket per byte value (the codes): the kernels walk the codes a tile holds, inside the range the
        # launcher's metadata gives; a table of more than 31 buckets otherwise walks the whole range.
        walked = I.tile_walk_counts(sets, CODE_BUCKETS.num_buckets)
        meta = _launch._tile_buckets(distance, lengths.to(torch.int32), bm, bn, -1, False, CODE_BUCKETS).long()
        lowest, highest = meta % 256, meta // 256
        live = sets.any(-1)  # (a tile without a valid pair is never walked: its metadata is not read)
        assert torch.equal(walked, sets.sum(-1)) and not bool(walked[~live].any())
        assert bool((walked[live] <= (highest - lowest + 1)[live]).all())
        assert bool((walked[live] < (highest - lowest + 1)[live]).any())  # (the codes leave gaps in the range)
        ranged = I.tile_walk_counts(sets, 102)  # e.g. BucketSpec(max_distance=100)'s 102 buckets: the range
        for (b, qb, kb), held in brute.items():  # the range, every bucket between counted
            assert int(walked[b, qb, kb]) == len(held)
            assert int(ranged[b, qb, kb]) == (max(held) - min(held) + 1 if held else 0)
    # Up to 31 buckets: the buckets held (the bit set's popcount).
    small = BucketSpec()
    sets = I.tile_bucket_sets(distance, lengths, 16, 16, small.lut())
    assert torch.equal(I.tile_walk_counts(sets, small.num_buckets), sets.sum(-1))
    with pytest.raises(ValueError, match="62"):
        I.tile_presence(distance, lengths, 16, 16, lut)


def test_relation_workloads_are_the_plans_they_say():
    """graph: an undirected GraphBatch of 32 [CLS] rows padded to the longest; two-parse: a 2-relation
    RelationBatch whose codes decode to the gold tree and to a perturbed tree (still one tree, other heads); the
    tile model walks their codes with the kernels' LUT (CODE_BUCKETS), as the launcher's metadata."""
    from syntaxkernels.ops.bias_attention import _launch
    from syntaxkernels.specs import BucketSpec
    from syntaxkernels.tools import workloads
    from syntaxkernels.trees import GraphBatch, RelationBatch, TreeBatch
    from syntaxkernels.trees.relations import CODE_BUCKETS

    sentences, source = _generated()
    assert "relations" in workloads.WORKLOAD_GROUPS and workloads.workload_names("relations") == list(
        workloads.RELATION_WORKLOADS)
    assert not set(workloads.workload_names("all")) & set(workloads.RELATION_WORKLOADS)
    graph = workloads.named_workload("graph", sentences, source)
    plan = graph.plan()
    assert isinstance(plan, GraphBatch) and not plan.directed and plan.symmetric
    assert graph.batch_size == 32 and graph.N == max(graph.lengths) and graph.structure == "graph"
    assert tuple(plan.distance.shape) == (32, graph.N, graph.N)
    for b, n in enumerate(graph.lengths):  # [CLS] (0) one edge from [SEP] (n - 1); every node reachable
        assert int(plan.distance[b, 0, n - 1]) == 1 and int(plan.distance[b, :n, :n].max()) < 255
    assert graph.kernel_buckets == BucketSpec()
    with pytest.raises(ValueError, match="no heads"):
        graph.tree_batch()

    two = workloads.named_workload("two-parse", sentences, source)
    base = workloads.named_workload("sentences", sentences, source)
    rel = two.plan()
    assert isinstance(rel, RelationBatch) and rel.num_relations == 2 and rel.buckets == (BucketSpec(),) * 2
    assert two.lengths == base.lengths and two.N == base.N and two.kernel_buckets == CODE_BUCKETS
    gold = base.tree_batch()
    lut = BucketSpec().lut()
    codes = rel.distance.long()
    changed = 0
    for b, n in enumerate(two.lengths):
        assert torch.equal(codes[b, :n, :n] % 12, lut[gold.distance[b, :n, :n].long()])
        changed += int(not torch.equal(codes[b, :n, :n] // 12, codes[b, :n, :n] % 12))
    assert changed >= 16  # most rows' second parse differs
    rng = __import__("random").Random(1)
    for heads in sentences[:50]:
        heads = workloads._single_root(heads)
        other = workloads.perturbed_tree(heads, rng, share=0.5)
        TreeBatch.from_heads([other])  # one tree still (a cycle raises)
        assert [i for i, h in enumerate(other) if h < 0] == [i for i, h in enumerate(heads) if h < 0]
    # The model walks the codes each tile holds (the kernels at 256 buckets go from each code to the next): a
    # distinct count of each tile's valid codes, inside the range the launcher's metadata gives.
    tiles = I.workload_tiles("_bias_bwd_short_table_kernel", two, 64, 64)
    meta = _launch._tile_buckets(rel.distance, rel.kernel_lengths, 64, 64, -1, False, CODE_BUCKETS).long()
    lowest, highest = meta % 256, meta // 256
    held = torch.zeros_like(meta)
    for b, n in enumerate(two.lengths):
        for qb in range(-(-n // 64)):
            for kb in range(-(-n // 64)):
                tile = codes[b, qb * 64:min(n, qb * 64 + 64), kb * 64:min(n, kb * 64 + 64)]
                held[b, qb, kb] = tile.unique().numel()
    assert bool((held <= torch.where(held > 0, highest - lowest + 1, 0)).all())
    assert tiles["one_bucket"] + tiles["buckets_mixed"] == int(held.sum())
    assert tiles["mixed"] == int((held > 1).sum()) and tiles["boundary"] == int((held > 0).sum())
    with pytest.raises(ValueError, match="relation batch"):
        I.inspect_workload("two-parse", "bf16", 64, 90, buckets=BucketSpec(254))


def test_code_workload_has_four_relations_of_the_code_tree():
    """code-r4: the code model's four relations (RelationBatch.code_model: path, up, down, sibling) of this
    package's sources, rows of at most 512 tokens, its code the relations' buckets in mixed radix; code-r1: the same
    rows with the code distance alone (BucketSpec())."""
    pytest.importorskip("tree_sitter")
    pytest.importorskip("tree_sitter_python")
    from syntaxkernels.tools import workloads
    from syntaxkernels.trees import RelationBatch, code_relation_distances, from_tree_sitter

    one = workloads.named_workload("code-r1")
    w = workloads.named_workload("code-r4")
    assert one.lengths == w.lengths and one.plan([0]).distance.shape == (1, 512, 512) and one.relations is None
    assert I._presence(one, 64, 64).shape[-1] == 12  # BucketSpec()'s LUT
    assert w.N == 512 and w.batch_size == 16 and max(w.lengths) == 512 and w.relations == 4
    assert all(n <= 512 for n in w.lengths) and w.kernel_buckets.num_buckets == 256
    sources, spans, _ = workloads.code_rows()
    rows = [0, 1]
    rel = w.plan(rows)
    assert isinstance(rel, RelationBatch) and rel.num_relations == 4 and not rel.symmetric
    sizes = [s.num_buckets for s in rel.buckets]
    assert sizes == [6, 3, 3, 4] and tuple(rel.buckets) == tuple(w.buckets)
    code = from_tree_sitter([sources[b] for b in rows], [spans[b] for b in rows], size=512)
    distances, specs = code_relation_distances(code, workloads.CODE_R4_RELATIONS, max_sibling=1)
    assert tuple(specs) == tuple(w.buckets)
    want, stride = 0, 1
    for d, spec in zip(distances, specs):
        want = want + spec.lut()[d.long()] * stride
        stride *= spec.num_buckets
    for b in range(len(rows)):
        n = w.lengths[rows[b]]
        assert torch.equal(rel.distance[b, :n, :n].long(), want[b, :n, :n])
    assert torch.equal(distances[0][0, :w.lengths[0], :w.lengths[0]], code.distance[0, :w.lengths[0], :w.lengths[0]])


def test_workload_cost_weights_each_class_by_its_loop():
    from syntaxkernels.specs import BucketSpec

    T = BucketSpec().num_buckets
    tiles = dict(grid=10, skipped=2, interior=5, boundary=3, one_bucket=0, mixed=0, buckets_mixed=0,
                 valid_pairs=1000, area=256)
    report = I.KernelReport("bias_attention", "c", "_bias_bwd_dkdv_kernel", 90, loop_other=[10.0, 20.0],
                            loop_all=[10.0, 20.0], plain_loop_other=[6.0, 9.0])
    cost = I.workload_cost(report, tiles)
    assert cost["instr"] == pytest.approx((5 * 10.0 + 3 * 20.0) * 256 / 1000)
    assert cost["plain_instr"] == pytest.approx((5 * 6.0 + 3 * 9.0) * 256 / 1000)
    assert cost["area"] == pytest.approx(8 * 256 / 1000)
    # The table kernel: its head loop per head, the rest of its tile loop and the buckets once per 4 heads.
    tiles.update(one_bucket=2, mixed=3, buckets_mixed=12)
    table = I.KernelReport("bias_attention", "c", "_bias_bwd_table_kernel", 90, loop_other=[4.0, 8.0],
                           loop_all=[4.0 + 2 * T, 8.0 + T], head_loop_other=[10.0, 12.0], heads=4)
    per_element = 5 * (10.0 + 4.0 / 4) + 3 * (12.0 + 8.0 / 4) + (2 + 12) * 2.0 / 4
    assert I.workload_cost(table, tiles)["instr"] == pytest.approx(per_element * 256 / 1000)
    assert I.workload_cost(I.KernelReport("bias_attention", "c", "_bias_fwd_kernel", 90, error="x"), tiles) is None
    # The short table kernel on 256 buckets: per tile for its 12 heads the rest once, each head's dS sum, one trip
    # of the bucket loop per bucket of the range walked.
    from syntaxkernels.trees.relations import CODE_BUCKETS

    short = I.KernelReport("bias_attention", "c", "_bias_bwd_short_table_kernel", 90, loop_other=[6.0],
                           loop_all=[6.0], heads=12, once_other=2.0, once_all=30.0, head_sum_other=1.5)
    tiles = dict(grid=4, skipped=1, interior=0, boundary=3, one_bucket=1, mixed=2, buckets_mixed=150,
                 valid_pairs=1000, area=4096)
    per_element = (3 * (2.0 + 12 * 1.5) + (1 + 150) * 6.0) / 12
    assert I.workload_cost(short, tiles, buckets=CODE_BUCKETS)["instr"] == pytest.approx(per_element * 4096 / 1000)


# sm_100-style code: the tile loop (0x30..0x90) waits on a barrier in a block placed after the code (0xb0),
# which branches back into the loop; the tensor-core instruction sits on a branch (one elected thread).
SASS_OUT_OF_LINE = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
        /*0020*/                   ISETP.GE.AND P0, PT, R0, 0x1, PT ;
        /*0030*/               @P1 BRA 0x50 ;
        /*0040*/                   UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR8], tmem[UR10], idesc[UR11], UPT ;
        /*0050*/               @!P2 BRA 0xb0 ;
        /*0060*/                   FADD R5, R5, R6 ;
        /*0070*/                   MUFU.EX2 R7, R7 ;
        /*0080*/                   IADD3 R8, R8, 0x1, RZ ;
        /*0090*/               @P0 BRA 0x30 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR4], R3 ;
        /*00c0*/               @!P2 BRA 0xb0 ;
        /*00d0*/                   BRA 0x60 ;
"""


def test_out_of_line_waits_close_no_loop_and_figures_are_never_negative():
    _, loops = I.analyse_sass(SASS_OUT_OF_LINE)
    with_tc = [l for l in loops if l.tensor_core]
    assert [(l.start, l.end) for l in with_tc] == [(3, 9)]  # 0xd0 -> 0x60 returns from the wait, no loop
    loop = with_tc[0]
    # Cheapest path: BRA (taken, skipping the elected MMA), BRA, FADD, MUFU, IADD3, BRA = 6, none tensor-core.
    assert loop.shortest == 6 and loop.shortest_other == 6 and loop.tensor_core == 1
    assert loop.instructions - loop.tensor_core >= 0


def _report(case, kernel="_bias_fwd_kernel", **kw):
    base = dict(registers=100, local_bytes=0, stack_bytes=0, other_per_unit=10.0, all_per_unit=12.0,
                ex2_per_unit=1.0, tile="128x64", num_warps=8, num_stages=3)
    base.update(kw)
    return I.KernelReport("bias_attention", case, kernel, 90, **base)


def test_report_never_contradicts_itself_cuts_no_case_and_names_its_units():
    long_case = "bf16 D128 N1024 log-buckets per-head"
    spilling = _report(long_case, stack_bytes=248)
    edge = I.KernelReport("edge_attention", "bf16 D64 N1024 MaskSpec()", "_edge_fwd_kernel", 90, unit="edge",
                          registers=80, local_bytes=0, stack_bytes=0, other_per_unit=30.0, tile="E64")
    text = I.format_reports([spilling, edge])
    assert long_case in text and "bf16 D64 N1024 MaskSpec()" in text
    edge_line = [l for l in text.splitlines() if "MaskSpec()" in l][0]
    assert " edge " in edge_line and " elem " not in edge_line
    assert " 248 " in [l for l in text.splitlines() if long_case in l][0]  # the spill, in bytes
    known = [f"sm_90 {long_case}: spills 248 B"]
    for problems, known_list in (([], known), (["x"], known), (["x"], [])):
        line = I.verdict([spilling, edge], problems, known_list)
        assert not line.startswith(("every", "all")), line
    assert I.verdict([edge], [], []).startswith("all 1 launched kernels compile without spills")


def test_workload_report_lists_every_problem_it_flags():
    spill = _report("sentences bf16 D64", "_bias_bwd_dkdv_kernel", stack_bytes=360, shared_bytes=1000,
                    shared_limit=232448)
    big = _report("sentences bf16 D64", shared_bytes=122880, shared_limit=101376)
    broken = I.KernelReport("bias_attention", "sentences bf16 D64", "_bias_fwd_kernel", 86, error="boom")
    problems = I.workload_problems([spill, big, broken])
    assert len(problems) == 3 and "360 B" in problems[0] and "101376" in problems[1] and "boom" in problems[2]
    # A GPU without Triton configs (sm_75: the ops run the reference) is reported as such, not as a problem.
    t4 = I.KernelReport("bias_attention", "sentences bf16 D64", "(call)", 75, error="no Triton configs")
    assert I.workload_problems([t4]) == [] and I.workload_unsupported([t4, spill]) == [75]
    text = I.format_workload_reports([spill, big, broken])
    assert "ERROR boom" in text and all(len(line) <= 100 for line in text.splitlines())
    spill_line, big_line = [l for l in text.splitlines() if l.startswith("sentences bf16 D64")][:2]
    assert " 360 " in spill_line and "120!99" in big_line  # spill bytes; shared KiB over the limit


@pytest.mark.long_on_cpu
def test_inspect_rejects_an_unknown_workload_without_compiling():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "syntaxkernels", "inspect", "--workload", "sentence"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "sentences" in proc.stderr, proc.stderr


def test_inspect_window_options_are_checked_before_compiling(capfd):
    """``--window`` takes 0..255 (or -1), and like ``--position-window`` only padded workloads (a packed batch is
    refused by name): exit status 2 and why, nothing compiled."""
    from syntaxkernels import __main__ as cli

    assert cli.main(["inspect", "--workload", "pairs", "--window", "300"]) == 2
    assert "--window takes an int in 0..255" in capfd.readouterr().err
    for option in ("--window", "--position-window"):
        assert cli.main(["inspect", "--workload", "pairs,sentences-packed", option, "3"]) == 2
        err = capfd.readouterr().err
        assert "padded workloads only" in err and "sentences-packed" in err and "pairs" not in err.split("not")[-1]


@pytest.mark.long_on_cpu
def test_bench_workloads_summary_without_a_gpu(monkeypatch):
    """``bench`` on a CPU machine: every workload with its valid-pair fraction and tile coverage, no compile."""
    from syntaxkernels.tools import workloads
    from syntaxkernels.tools.checks import bias_attention as checks

    sentences, source = _generated()
    monkeypatch.setattr(workloads, "sentence_source", lambda: (sentences, source))
    monkeypatch.setattr(I, "_WORKLOAD_CACHE", {})
    monkeypatch.setattr(I, "_PRESENCE_CACHE", {})
    rows = checks.bench_workloads("cpu", True)
    assert [r["workload"] for r in rows] == list(workloads.WORKLOADS)
    for r in rows:
        assert 0 < r["valid"] <= 1 and r["f_area"] >= 1 and r["b_area"] >= 1
        assert r["source"] == source and "inspect --workload" in r["note"]


# ---------------------------------------------------------------------------------------------------------
# Edge-list kernels: slots per real edge and the per-edge cost model (no compilation)
# ---------------------------------------------------------------------------------------------------------

def _generated_source(monkeypatch):
    """The edge workloads from generated sentences, whatever SYNTAXKERNELS_UD says (fast, the same everywhere)."""
    from syntaxkernels.tools import workloads as W

    monkeypatch.setattr(W, "sentence_source", lambda: (W.generated_sentences(600, seed=0, max_length=40),
                                                       "generated"))


@pytest.mark.parametrize("name", ["packed-4x1024", "cls-4x1024"])
def test_balanced_schedule_walks_at_most_1_25_slots_per_edge(monkeypatch, name):
    """The balanced kernels walk <= 1.25 edge slots per real edge (forward, dQ, dK/dV) on the lists of 4 x 1024
    tokens of sentences, packed or under one [CLS]-like root, relation masks and windows 1..4, at the launched
    BLOCK_E of bf16 D64 and D128 (64 and 32); the per-relation lockstep layout they replace walked more."""
    _generated_source(monkeypatch)
    batch, _ = I.edge_workload_batch(name)
    for which in I.EDGE_LISTS:
        lists = I._edge_lists(batch, which)
        E = lists.num_edges
        for block in (32, 64):
            after = I.schedule_slots(lists.schedule(), block)
            before = I.lockstep_slots(lists, block)
            for kernel in ("fwd", "dq", "dkdv"):
                assert E <= after[kernel] <= 1.25 * E, (which, block, kernel, after[kernel] / E)
            assert before["fwd"] > 1.5 * E and before["dkdv"] > 1.5 * E, (which, block, before, E)


def test_lockstep_and_schedule_slots_match_their_loop_bounds():
    """The two slot models against direct loops over a small batch (rows of one relation in blocks; items in
    sorted blocks)."""
    from conftest import trees_of_kind
    import syntaxkernels as sk

    lists = trees_of_kind("star", 23, seed=1).relation_lists(sk.MaskSpec(max_distance=2))
    B, R, N = lists.nonempty.shape
    counts = (lists.row_ptr[1:] - lists.row_ptr[:-1]).view(B, N, R)
    block = 4
    want = sum(block * int(counts[b, i0:i0 + block, r].max()) for b in range(B) for r in range(R)
               for i0 in range(0, N, block))
    assert I.lockstep_slots(lists, block)["fwd"] == want
    tokens = counts.sum(dim=2)
    want_dq = sum(block * int(tokens[b, i0:i0 + block].max()) for b in range(B) for i0 in range(0, N, block))
    assert I.lockstep_slots(lists, block)["dq"] == want_dq
    schedule = lists.schedule(3)
    want_items = sum(block * int(table[-2, i0:i0 + block].max()) for table in (schedule.q_items, schedule.qp_items)
                     for i0 in range(0, table.shape[1], block))
    assert I.schedule_slots(schedule, block)["dq"] == want_items


def test_edge_cost_charges_loops_per_slot_and_prologues_per_program(monkeypatch):
    """``edge_cost`` with made-up kernel figures: the main loop per slot walked, the rest once per program."""
    from conftest import trees_of_kind
    import syntaxkernels as sk
    from syntaxkernels.ops import edge_attention as op

    monkeypatch.setattr(op, "SCHEDULE_CHUNK", 3)
    lists = trees_of_kind("star", 19, seed=2).relation_lists(sk.MaskSpec(max_distance=2))
    schedule = lists.schedule(3)
    kernel = dict(threads=128, loop=10, rest=100, block=8)
    costs = {name: dict(kernel) for name in ("_edge_fwd_kernel", "_edge_bwd_dq_kernel", "_edge_bwd_dkdv_kernel")}
    got = I.edge_cost(lists, costs)
    slots = I.schedule_slots(schedule, 8)
    assert got["slots"] == slots
    assert got["fwd_loop"] == 10 * 128 / 8 * slots["fwd"]
    programs = -(-schedule.f_items.shape[1] // 8) + -(-schedule.p_items.shape[1] // 8)  # two launches
    assert schedule.p_items.shape[1] > 0
    assert got["fwd"] == got["fwd_loop"] + 100 * 128 * programs  # no merge kernel figures given: not charged
    assert got["bwd"] == (got["dq_loop"] + 100 * 128 * (-(-schedule.q_items.shape[1] // 8)
                                                        + -(-schedule.qp_items.shape[1] // 8))
                          + got["dkdv_loop"] + 100 * 128 * (-(-schedule.k_items.shape[1] // 8)
                                                            + -(-schedule.kp_items.shape[1] // 8)))


@pytest.mark.long_on_cpu
def test_inspect_edges_takes_one_arch_and_names_its_workloads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "syntaxkernels", "inspect", "--edges", "--arch", "80,90"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "one --arch" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "syntaxkernels", "inspect", "--edges", "--workload", "sentence"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cls-4x1024" in proc.stderr, proc.stderr


@pytest.mark.slow  # compiles the edge kernels for sm_90
def test_inspect_edges_reports_slots_and_instructions_per_real_edge():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "syntaxkernels", "inspect", "--edges", "--workload", "sentences"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("sentences ")]
    assert [r[1] for r in rows] == list(I.EDGE_LISTS), proc.stdout
    treebank = "generated trees" not in proc.stdout.splitlines()[0]
    for r in rows:
        slots_after = [float(x) for x in r[5].split("/")]
        # The balanced schedule: at most 1.25 slots per real edge on the treebank's sentences (generated trees
        # have other degree spreads; there only >= 1).
        assert all(1.0 <= s <= (1.25 if treebank else 2.0) for s in slots_after), r
        assert 0 < float(r[7]) <= 450, r  # the forward's main loop per real edge (bf16, D64, sm_90)


def test_the_workload_overview_shows_the_tiles_the_batchs_row_class_launches():
    """``bench``'s workload rows (no compile) give the tiles a call on the whole batch's plan launches: short rows
    padded to 512 or 1024 the padded batches' (PADDED_CONFIGS), a long tree and rows packed into 512 tokens the long
    rows' (LONG_ROW_CONFIGS over the family's, sm_90 at D64: the forward 128 x 128), sentences the short-row
    kernels (64-token tiles); not the family's base tiles."""
    from syntaxkernels.ops.bias_attention import configs

    def tile(kind, table, D):
        config = dict(configs.CONFIGS[(kind, "sm90", "half", D)], **table.get((kind, "sm90", "half", D), {}))
        return f"{config['BLOCK_M']}x{config['BLOCK_N']}"

    rows = {(r["workload"], r["D"]): r for r in I.workload_overview(
        ["finetune-512", "finetune-1024", "long-4096", "packed-512", "sentences"], "sm90", (64, 128))}
    for D in (64, 128):
        for name in ("finetune-512", "finetune-1024"):
            assert rows[name, D]["fwd_tile"] == tile("fwd", configs.PADDED_CONFIGS, D), (name, D)
            assert rows[name, D]["dkdv_tile"] == tile("dkdv", configs.PADDED_CONFIGS, D), (name, D)
        for name in ("long-4096", "packed-512"):
            assert rows[name, D]["fwd_tile"] == tile("fwd", configs.LONG_ROW_CONFIGS, D), (name, D)
            assert rows[name, D]["dkdv_tile"] == tile("dkdv", configs.LONG_ROW_CONFIGS, D), (name, D)
        assert rows["sentences", D]["fwd_tile"] == "64x64", D
    assert rows["long-4096", 64]["fwd_tile"] == "128x128" != tile("fwd", {}, 64)
    assert rows["finetune-1024", 64]["fwd_tile"] != tile("fwd", {}, 64)
    assert rows["finetune-512", 64]["f_area"] < 5  # (the base 128 x 64 tiles: 10.3 score elements a valid pair)
