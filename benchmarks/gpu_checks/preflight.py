"""The GPU suite's preflight step (benchmarks/gpu_suite.sh): Python, torch, CUDA, Triton, nvcc and the test extras.

    python benchmarks/gpu_checks/preflight.py --json RESULT.json [--dry-run]

Writes what it found to RESULT.json and prints it. Missing test extras (setup.py's ``EXTRAS["test"]``) are
installed from wheels carried in ``./.whl/`` when there are any (the GPU machine cannot download; not under
``--dry-run``). Exit status: 1 (with a message) when pytest, pytest-timeout or hypothesis is missing, since the
suite's pytest steps need them; 2 when no CUDA GPU is visible and this is not a dry run (the suite then stops);
0 otherwise. Run from the repository root (it reads setup.py there).
"""
import argparse, ast, glob, importlib.metadata as md, json, platform, shutil, subprocess, sys

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true")
args = p.parse_args()

def test_extras():
    tree = ast.parse(open("setup.py").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTRAS" for t in node.targets):
            return ast.literal_eval(node.value)["test"]
    raise SystemExit("preflight: setup.py has no EXTRAS = {...} with a 'test' list")

def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

REQUIRED = ("pytest", "pytest-timeout", "hypothesis")  # the suite's pytest steps fail without these
result = {"python": platform.python_version(), "executable": sys.executable, "dry_run": args.dry_run}
extras = test_extras()
missing = [n for n in extras if installed(n) is None]
wheels = sorted(glob.glob(".whl/*.whl"))
if missing and wheels and not args.dry_run:
    # No registry here: only wheels carried in .whl/ can fill the gap.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links", ".whl",
                    *missing], check=False)
    missing = [n for n in extras if installed(n) is None]
result["extras"] = {n: installed(n) or "MISSING" for n in extras}
import torch

result.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
              triton=installed("triton"), nvcc=shutil.which("nvcc"))
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    result["gpu"] = f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory >> 30} GiB)"
try:
    result["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                          capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    result["nvidia_smi"] = None
json.dump(result, open(args.json, "w"), indent=1)
print(json.dumps(result, indent=1))
bad = [n for n in REQUIRED if n in missing or installed(n) is None]
if bad:
    sys.exit(f"preflight: {', '.join(bad)} missing (needed by the test steps); carry wheels in .whl/")
if missing:
    print(f"preflight: optional test extras missing ({', '.join(missing)}): their tests skip", file=sys.stderr)
if not args.dry_run and not torch.cuda.is_available():
    print("preflight: no CUDA GPU is visible (torch.cuda.is_available() is False): nothing to measure. "
          "Use --dry-run to check the suite on a machine without one.", file=sys.stderr)
    sys.exit(2)
