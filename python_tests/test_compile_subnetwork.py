"""Every sub-network attention kernel and config compiles for sm_80 and sm_90 without a GPU: no register
spills, and the attention kernels use tensor cores for fp16/bf16 (mma.sync / wgmma in the PTX).

Runs in a subprocess without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``), through
:mod:`syntaxkernels.ops._compile`.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, sys
from syntaxkernels.ops import subnetwork_attention as op
from syntaxkernels.ops._compile import compile_many, format_results

def main():
    specs = op.compile_specs(dtypes=("fp16", "bf16", "fp32"), head_dims=(32, 64, 128))
    results = compile_many(specs, processes=2)
    print(format_results(results), file=sys.stderr)
    print(json.dumps([dict(label=r.label, arch=r.arch, registers=r.registers, problems=r.problems)
                      for r in results]))

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sys.stderr.write(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_for_sm80_and_sm90_without_spills(compiled):
    labels = {r["label"] for r in compiled}
    for kernel in ("fwd", "bwd_dkdv", "bwd_dq"):
        for dtype in ("fp16", "bf16", "fp32"):
            for head_dim in (32, 64, 128):
                assert any(label.startswith(kernel + " ") and f"{dtype} D{head_dim} " in label for label in labels), \
                    (kernel, dtype, head_dim)
    assert any(label.startswith("block_meta") for label in labels)
    assert {r["arch"] for r in compiled} == {80, 90}
    bad = [f"{r['label']} sm_{r['arch']}: {'; '.join(r['problems'])}" for r in compiled if r["problems"]]
    assert not bad, "\n".join(bad)
