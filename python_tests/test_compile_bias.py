"""Every bias-attention kernel, with every candidate config, compiles for sm_80 and sm_90 without spills.

Compilation runs in ONE subprocess without TRITON_INTERPRET (the interpreter replaces @triton.jit
functions), two worker processes, PTX + ``ptxas -v`` from Triton's package (no GPU needed). Covered:
forward, dK/dV and dQ kernels (each with its own ``CONFIGS`` entries) in their heaviest variant (live lists +
window + causal) for fp16, bf16, fp32 and head dims 32, 64, 128 with every entry of ``CONFIGS``; the dense
variant with the launcher's config; tables of 32 and 256 buckets (memory gather of the bias; per-row bucket
sums at 32, per-bucket sums only at 256) with the launcher's config; the preprocess kernel and the
block-metadata kernel for every tiling. Half-type matmul kernels must contain mma.sync (sm_80) or wgmma
(sm_90); fp32 runs exact fp32 dots (no tensor cores by design).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # minutes of compilation; the GPU suite runs -m "not slow"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    from syntaxkernels.ops.bias_attention import compile_specs
    from syntaxkernels.ops._compile import compile_many, format_results
    if __name__ == "__main__":
        specs = compile_specs()
        results = compile_many(specs, (80, 90), processes=2)
        print(format_results(results), file=sys.stderr)
        json.dump([dict(label=r.label, arch=r.arch, registers=r.registers, spill_stores=r.spill_stores,
                        spill_loads=r.spill_loads, mma=r.mma, wgmma=r.wgmma, problems=r.problems)
                   for r in results], sys.stdout)
""")


@pytest.fixture(scope="module")
def compile_results(tmp_path_factory):
    pytest.importorskip("triton")
    script = tmp_path_factory.mktemp("compile") / "compile_bias.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    sys.stderr.write(proc.stderr[-20000:])
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout)


def test_every_kernel_compiles_without_spills_and_with_tensor_cores(compile_results):
    assert len(compile_results) > 50
    assert {r["arch"] for r in compile_results} == {80, 90}
    bad = [f"sm_{r['arch']} {r['label']}: {'; '.join(r['problems'])}" for r in compile_results if r["problems"]]
    assert not bad, "\n".join(bad)


def test_forward_uses_wgmma_on_sm90(compile_results):
    """Forward tiles of 64+ query rows are warp-group sized: Hopper's wgmma, not only mma.sync."""
    fwd = [r for r in compile_results if r["arch"] == 90 and r["label"].split()[1] in ("fp16", "bf16")
           and r["label"].startswith("fwd") and int(r["label"].split()[-3].split("x")[0]) >= 64]
    assert fwd and all(r["wgmma"] for r in fwd)
