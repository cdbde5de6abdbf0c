"""Every fused kernel, compiled as a real launch specialises it for sm_80 and sm_90 (no GPU), stays spill-free and
within the instruction targets of its main loop (:mod:`syntaxkernels.inspection`).

The compilation runs once per module, in a subprocess without TRITON_INTERPRET (the interpreter replaces
``@triton.jit``), on the launch cases flagged ``ci``: the bf16 target cases (D64/D128, dense, N = 1024), the
heaviest variants (window lists, causal), fp32 D64 and the edge kernels (bf16 D64). ``python -m syntaxkernels
inspect`` runs every case (fp16 compiles the same code as bf16). The SASS readers are unit-tested on hand-written listings.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from syntaxkernels import inspection as I

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    from syntaxkernels import inspection as I
    if __name__ == "__main__":
        reports = I.inspect_kernels(processes=2, ci=True,
                                    progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(I.format_reports(reports), file=sys.stderr)
        json.dump([r.as_dict() for r in reports], sys.stdout)
""")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    pytest.importorskip("triton")
    script = tmp_path_factory.mktemp("inspect") / "inspect_ci.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2400)
    sys.stderr.write(proc.stderr[-30000:])
    assert proc.returncode == 0, proc.stderr[-5000:]
    return [I.KernelReport(**{k: v for k, v in r.items() if k != "ratio"}) for r in json.loads(proc.stdout)]


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
    assert {"_edge_fwd_kernel", "_edge_bwd_dq_kernel", "_edge_bwd_dkdv_kernel"} <= edge, edge
    for case in cases:
        for arch in (80, 90):
            kernels = {r.kernel for r in reports if r.case == case.name and r.arch == arch}
            assert {"_bias_fwd_kernel", "_bias_bwd_dq_kernel", "_bias_bwd_dkdv_kernel",
                    "_bias_bwd_dkdv_kernel:boundary", "_bias_bwd_preprocess_kernel"} <= kernels, (case.name, kernels)


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

    from syntaxkernels import workloads

    rng = random.Random(0)
    sentences = [workloads.random_forest(rng, rng.randint(5, 30)) for _ in range(300)]
    packed = I.table_gradient_tiles(workloads.pack_sentences(sentences, 512, rows=4), 512, 64)
    connected = I.table_gradient_tiles(workloads.connect_sentences(sentences, 512, rows=4), 512, 64)
    for tiles in (packed, connected):
        assert abs(tiles["one_bucket"] + tiles["mixed"] + tiles["boundary"] - 1) < 1e-9
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
