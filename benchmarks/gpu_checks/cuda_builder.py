"""The GPU suite's cuda-builder step (benchmarks/gpu_suite.sh): the CUDA tree builder must exist wherever CUDA does.

    python benchmarks/gpu_checks/cuda_builder.py --json RESULT.json [--dry-run]

Records the C++ extension's status and whether its CUDA tree builder was built. Fails loudly (exit status 1,
with a banner) when a CUDA GPU is visible but ``syntaxkernels._C.has_cuda()`` is false, and, outside a dry run,
when the extension did not load at all.
"""
import argparse, json, sys

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true")
args = p.parse_args()
import torch
from syntaxkernels import _ext

module = _ext.load()
result = {"extension": _ext.status(), "cuda_available": torch.cuda.is_available(),
          "cuda_builder": _ext.has_cuda_builder(),
          "has_cuda_binding": bool(module is not None and hasattr(module, "has_cuda"))}
json.dump(result, open(args.json, "w"), indent=1)
print(json.dumps(result))
if module is None and not args.dry_run:
    sys.exit("cuda-builder: FAIL: the C++ extension did not load: " + _ext.status())
if torch.cuda.is_available() and not result["cuda_builder"]:
    banner = "#" * 100
    sys.exit(f"{banner}\nFAIL: CUDA is present but the CUDA tree builder was not built "
             f"(syntaxkernels._C.has_cuda() is false: {_ext.status()}).\nThe build ran without a CUDA toolkit "
             f"or a CUDA torch; see the build step in suite.log.\n{banner}")
