"""Command line: ``python -m syntaxkernels {info,verify,bench,inspect,show}``.

``info`` and ``show`` are the package's own (what runs here; plot what a model learned). ``verify``, ``bench`` and
``inspect`` are the developer tools: their arguments are defined here, and what they run lives in
:mod:`syntaxkernels.tools` (``tools/commands.py``), which is imported only when one of them runs: the one place
the package reaches its tooling. torch and Triton are imported inside the commands, never at the top of this
module, so ``--help`` and argument errors answer without loading them.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import Callable, List, Optional, Sequence

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


# ------------------------------------------------------------------------------------------------ arguments


def _device_argument(value: str) -> str:
    if not _DEVICE.match(value):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {value!r}")
    return value


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=_device_argument, default=None,
                        help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")


def _verify_arguments(parser: argparse.ArgumentParser) -> None:
    _add_device(parser)
    parser.add_argument("--select", default="", help="only checks whose name contains this (case-insensitive)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--no-interpret", action="store_true",
                        help="on CPU, do not run the Triton kernels under TRITON_INTERPRET=1 (they are then skipped)")


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    _add_device(parser)
    parser.add_argument("--select", default="", help="only benchmarks whose name contains this (case-insensitive)")
    parser.add_argument("--full", action="store_true", help="larger sizes (default: a quick run)")
    parser.add_argument("--json", default=None, help="write the rows as JSON to this file")


#: The named workloads of ``inspect --workload`` and its groups, as ``syntaxkernels.tools.workloads`` defines them
#: (``WORKLOADS``, ``RELATION_WORKLOADS``, ``WORKLOAD_GROUPS``; written out here so that ``--help`` imports no tool: a test keeps them
#: equal), and the edge report's (``inspection.EDGE_WORKLOADS``).
_WORKLOADS = ("sentences", "pairs", "finetune-128", "finetune-512", "finetune-1024", "packed", "packed-512",
              "sentences-packed", "long-4096", "long-8192", "odd-77", "odd-1000")
_RELATION_WORKLOADS = ("graph", "two-parse", "code-r1", "code-r4")
_WORKLOAD_GROUPS = ("long", "odd", "finetune", "all", "relations")
_EDGE_WORKLOADS = ("packed-4x1024", "cls-4x1024", "sentences", "pairs", "packed", "long-4096", "odd-1000")


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default=None,
                        help="GPU architectures to compile for, comma-separated or 'all' (75,80,86,89,90,100,120); "
                             "default: 80,90 for the launch cases, all with --workload")
    parser.add_argument("--workload", default="",
                        help="inspect these named workloads instead of the N = 1024 launch cases (comma-separated: "
                             f"{', '.join(_WORKLOADS)}; relation workloads {', '.join(_RELATION_WORKLOADS)}; groups "
                             f"{', '.join(_WORKLOAD_GROUPS)}); built from the treebank ($SYNTAXKERNELS_UD) or, "
                             "without it, generated trees (code-r1, code-r4: this package's sources)")
    parser.add_argument("--dtype", default="bf16", help="with --workload: dtypes, comma-separated (default bf16)")
    parser.add_argument("--buckets", default="",
                        help="with --workload: the layer's BucketSpec as MAX_DISTANCE or MAX_DISTANCE:LOG_DISTANCE "
                             "(e.g. 128:62, 66 log-spaced buckets: the runtime bucket loop); default BucketSpec()")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="with --workload or --host: the layer's attention dropout probability (default 0: the "
                             "kernels without their DROPOUT variant; --host: a seed drawn every call, as nn draws it)")
    parser.add_argument("--kv-heads", type=int, default=0,
                        help="with --workload: key/value heads of the layer (grouped-query attention: the 12 query "
                             "heads share them; default 0: 12, one a query head)")
    parser.add_argument("--window", type=int, default=-1,
                        help="with --workload (padded workloads): the layer's distance window, pairs with d_ij <= W "
                             "only (the kernels walk the live-tile lists; default -1: none)")
    parser.add_argument("--position-window", type=int, default=-1,
                        help="with --workload: the layer's positional window |i - j| <= W (a sliding window, as "
                             "ModernBERT's local layers and Mistral; default -1: none)")
    parser.add_argument("--position-buckets", default="",
                        help="with --workload or --host: T5's relative-position term in the layer, "
                             "NUM_BUCKETS:MAX_DISTANCE (T5's is 32:128; bidirectional, unidirectional with --causal), "
                             "a learnable [H, P] table and unscaled scores as T5 calls it (default: none)")
    parser.add_argument("--causal", action="store_true",
                        help="with --workload: a causal layer (a decoder's self-attention: keys j <= i)")
    parser.add_argument("--head-dim", default="64,128", help="with --workload: head dims (default 64,128)")
    parser.add_argument("--select", default="", help="only launch cases whose 'op name' contains this")
    parser.add_argument("--processes", type=int, default=2, help="compiler processes (default: 2)")
    parser.add_argument("--no-plain", action="store_true", help="skip the SYNTAX=False twins (faster)")
    parser.add_argument("--tiles", action="store_true",
                        help="also how often the table gradient's extra work runs on treebank trees, and the "
                             "weighted cost per element (needs the treebank, see SYNTAXKERNELS_UD)")
    parser.add_argument("--edges", action="store_true",
                        help="the edge-list kernels on real batches instead: slots and instructions per real edge "
                             "(one --arch, default 90; one --head-dim, default 64; --workload: edge workloads "
                             f"{', '.join(_EDGE_WORKLOADS)})")
    parser.add_argument("--host", action="store_true",
                        help="host work per layer instead: one distance-bias layer's forward and backward with every "
                             "launch compiled for one --arch (default 90) and not run, timed as a ratio to a bare "
                             "autograd round trip, and its device kernels counted (--workload: default sentences, "
                             "pairs, finetune-512, sentences-packed; one --dtype and --head-dim, default bf16 and 64)")
    parser.add_argument("--traffic", action="store_true",
                        help="the backward's memory traffic per valid pair and head instead: what it must move "
                             "against the scratch it writes and reads back, a model of the launchers' buffers, "
                             "nothing compiled (--workload: default sentences, pairs, finetune-128, finetune-512, "
                             "odd-77, sentences-packed, long-4096; --head-dim, --dtype, --causal; one --arch, "
                             "default 90)")
    parser.add_argument("--json", default=None, help="write every report as JSON to this file")


# ------------------------------------------------------------------------------------------------ info


def _first_line(command: List[str], last: bool = False, containing: str = "") -> Optional[str]:
    """The first (or last) line of a command's output that contains ``containing``; None if it does not run."""
    import subprocess

    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in (out.stdout or out.stderr).splitlines() if containing in line and line.strip()]
    if out.returncode != 0 or not lines:
        return None
    return lines[-1] if last else lines[0]


def _cpu_description() -> str:
    import platform

    name = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    count = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else count
    return f"{name} ({platform.machine()}, {count} logical cores, {usable} usable)"


def _os_description() -> str:
    import platform

    system = f"{platform.system()} {platform.release()}"
    try:
        with open("/etc/os-release") as f:
            fields = dict(line.rstrip().split("=", 1) for line in f if "=" in line)
        system = f"{fields.get('PRETTY_NAME', '').strip(chr(34))} ({system})"
    except OSError:
        pass
    libc = " ".join(platform.libc_ver()).strip()
    return f"{system}{', ' + libc if libc else ''}"


def _version(module: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed"


#: The optional packages ``info`` reports, as pip names them, and what needs each (setup.py's extras install them).
OPTIONAL_PACKAGES = (
    ("transformers", "the transformers integration (enable_syntax_attention), show --conllu; [transformers] extra"),
    ("tokenizers", "fast tokenizers: TreeCollator(tokenizer=...), align_to_tokens with word_ids()"),
    ("spacy", "sk.trees.parse with a spaCy pipeline (from_spacy reads a Doc without it); [spacy] extra"),
    ("stanza", "sk.trees.parse_with_stanza, sk.trees.parse with a stanza pipeline"),
    ("matplotlib", "python -m syntaxkernels show, syntaxkernels.show.plot_learned; [plot] extra"),
    ("scipy", "bench's comparison with scipy.sparse.csgraph, verify's treebank check, tests; [bench] extra"),
    ("networkx", "benchmarks/bench_tree_distance.py (a comparison row); [bench] extra"),
    ("hypothesis", "the tests (property-based tree cases); [test] extra"),
)


def _backends(torch, cuda: bool) -> List[tuple]:
    """(what, on CPU tensors, on CUDA tensors) for the tree builder and every public fused op, backend="auto": what
    each op's own ``implementation`` says it runs (``ops.IMPLEMENTATION``) for a typical input (D = 64; float32 on
    CPU, with what float64 runs where it differs; bfloat16 on CUDA)."""
    from . import _ext, ops
    from .ops._dispatch import triton_status, triton_unsupported

    names = {"triton": "Triton kernels", "reference": "PyTorch reference", "cpp": "C++ kernels"}
    no_cuda = "n/a (no CUDA here)"
    rows = []
    if _ext.available():
        cpu_builder = f"C++ builder ({torch.get_num_threads()} threads)"
    else:
        cpu_builder = "NumPy fallback (no C++ extension)"
    if not cuda:
        gpu_builder = no_cuda
    elif _ext.has_cuda_builder():
        gpu_builder = "CUDA builder"
    else:
        gpu_builder = "C++ builder after a copy (no CUDA builder)"
    rows.append(("tree_distance / TreeBatch", cpu_builder, gpu_builder))
    on_cpu_probe = torch.empty(1, 1, 1, 64)
    for name in ops.__all__:
        implementation = ops.IMPLEMENTATION[name]
        on_cpu = names[implementation(on_cpu_probe, on_cpu_probe)]
        float64 = implementation(on_cpu_probe.double(), on_cpu_probe.double())
        if names[float64] != on_cpu:
            on_cpu += f" (float64: {float64})"
        on_gpu = no_cuda
        if cuda:
            probe = torch.empty(1, 1, 1, 64, dtype=torch.bfloat16, device="cuda")
            on_gpu = names[implementation(probe, probe)]
            if triton_status() != "ok":
                on_gpu += " (no Triton)"
            elif on_gpu == names["reference"] and triton_unsupported(probe, probe):  # e.g. a T4 (sm_75): say why
                major, minor = torch.cuda.get_device_capability()
                on_gpu += f" (sm_{major}{minor}: the kernels need sm_80+)"
        rows.append((name, on_cpu, on_gpu))
    return rows


def _run_info(args) -> int:
    import platform
    import shutil

    import torch

    from . import __version__, _ext, _interpreter, data
    from ._table import WIDTH, table
    from .ops._dispatch import triton_status

    cuda = torch.cuda.is_available()
    cxx = os.environ.get("CXX") or "c++"
    lines = [
        ("syntaxkernels", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        ("OS", _os_description()),
        ("CPU", _cpu_description()),
        ("C++ compiler", f"{_first_line([cxx, '--version']) or 'not found'} ({cxx})"),
        ("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'}, "
                  f"{torch.get_num_threads()} threads)"),
        ("triton", f"{_version('triton')} ({triton_status()})"),
        ("numpy", _version("numpy")),
        ("TRITON_INTERPRET", _interpreter.setting()),
        ("C++ extension", _ext.status()),
    ]
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                    if os.environ.get("CUDA_HOME") else None)
    nvcc_version = _first_line([nvcc, "--version"], last=True, containing="release") if nvcc else None
    lines.append(("nvcc", f"{nvcc_version or 'does not run'} ({nvcc})" if nvcc else "not found"))
    if cuda:
        driver = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        lines.append(("CUDA", f"runtime {torch.version.cuda}, driver {driver or 'unknown (no nvidia-smi)'}"))
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append((f"cuda:{i}", f"{props.name}, sm_{props.major}{props.minor}, "
                                       f"{props.total_memory >> 20} MiB, {props.multi_processor_count} SMs"))
    else:
        lines.append(("CUDA", "not available" + (" (CPU build of torch)" if torch.version.cuda is None else "")))
    path = data.treebank_path()
    lines.append(("treebank", f"{data.ENV_VAR} unset (treebank tests skip)" if path is None else
                  f"{path} ({'found' if path.is_file() else 'absent'})"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        wrapped = textwrap.wrap(value, WIDTH - width - 2, break_long_words=False, break_on_hyphens=False) or [""]
        print(f"{key:<{width}}  {wrapped[0]}")
        for more in wrapped[1:]:
            print(f"{'':<{width}}    {more}")
    print()
    print("Optional packages (the package runs without them; what needs each):")
    rows = [{"package": name, "installed": _version(name), "needed by": what} for name, what in OPTIONAL_PACKAGES]
    for line in table(rows, ["package", "installed", "needed by"], indent="  "):
        print(line)
    print()
    print('What runs here (backend="auto"):')
    rows = [{"op": w, "CPU tensors": c, "CUDA tensors": g} for w, c, g in _backends(torch, cuda)]
    for line in table(rows, ["op", "CPU tensors", "CUDA tensors"], indent="  "):
        print(line)
    if triton_status() == "ok":
        print("  backend='triton' runs the kernels on CPU tensors too when TRITON_INTERPRET=1 is set.")
    else:
        print(f"  Triton: {triton_status()}")
    return 0


# ------------------------------------------------------------------------------------------------ show


def _show_batch(args, source: str):
    """Keyword arguments of one forward on the first ``--sentences`` sentences of ``--conllu``."""
    from pathlib import Path

    if not Path(source).is_dir():
        raise ValueError("--conllu needs a save_pretrained directory as the source (its model is run on the "
                         "sentences); for other models call syntaxkernels.show.plot_learned(model, batch=...)")
    import json

    from transformers import AutoTokenizer

    from .trees import TreeCollator, read_conllu

    tokenizer_dir = args.tokenizer or source
    if args.tokenizer is None and not any((Path(source) / f).is_file()
                                          for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{source} holds no tokenizer: pass --tokenizer DIR (a local fast tokenizer, e.g. saved "
                         "with tokenizer.save_pretrained next to the model)")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sentences = read_conllu(args.conllu)[: args.sentences]
    if not sentences:
        raise ValueError(f"{args.conllu} holds no sentence")
    with open(Path(source) / "config.json", encoding="utf-8") as f:
        spec = json.load(f).get("syntax_attention") or {}
    method = spec.get("method")
    variant = spec.get("variant", "package")  # saved before the variants existed: the package's form
    if method == "bias":
        variant = "paper"  # the token trees of the paper's layout (the package's too)
    word_level = method == "subnetwork" and variant != "package"  # Syntax-BERT's masks relate words
    collated = TreeCollator(tokenizer=tokenizer, max_length=args.max_length, variant=variant,
                            word_level=word_level)(sentences)
    batch = {k: collated[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in collated}
    batch["syntax_trees"] = collated["trees"]
    if method == "gat":
        from .integrations.upos import token_pos_ids

        batch["syntax_pos"] = token_pos_ids(sentences, collated["word_ids"], width=collated["input_ids"].shape[1],
                                            variant=variant, lengths=collated["lengths"])
    return batch


def _run_show(args) -> int:
    try:
        import matplotlib
    except ModuleNotFoundError:
        print("syntaxkernels show: needs matplotlib, which is not installed: pip install matplotlib "
              "(or install syntaxkernels with its [plot] extra)", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    from .show import plot_learned
    from .specs import BucketSpec

    try:
        buckets = None
        if args.max_distance is not None or args.log_distance is not None or args.no_unreachable_bucket:
            buckets = BucketSpec(max_distance=args.max_distance if args.max_distance is not None else 10,
                                 log_distance=args.log_distance, unreachable_bucket=not args.no_unreachable_bucket)
        batch = _show_batch(args, args.source) if args.conllu else None
        learned, figure = plot_learned(args.source, args.out, buckets=buckets, batch=batch,
                                       trusted=args.trust_pickle, columns=args.columns)
    except (ValueError, TypeError, ImportError, OSError) as exc:
        print(f"syntaxkernels show: {exc}", file=sys.stderr)
        return 2
    import matplotlib.pyplot as plt

    plt.close(figure)
    print(learned.summary())
    print(f"wrote {args.out}")
    if args.json:
        import json

        def plain(value):
            if hasattr(value, "tolist"):
                return value.tolist()
            if hasattr(value, "__dataclass_fields__"):
                out = {k: plain(getattr(value, k)) for k in value.__dataclass_fields__}
                for extra in ("spread", "negligible"):  # BiasLayer's derived figures
                    if hasattr(value, extra):
                        out[extra] = getattr(value, extra)
                return out
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value if isinstance(value, (int, float, str, type(None))) else str(value)

        with open(args.json, "w") as f:
            json.dump(plain(learned), f, indent=1)
    return 0


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a directory saved by save_pretrained after enable_syntax_attention, a "
                                       "*.safetensors file, or a torch.save'd state dict / checkpoint dict")
    parser.add_argument("--out", default="learned_syntax.png", help="image to write (default: learned_syntax.png)")
    parser.add_argument("--conllu", default=None, help="also run the model (a directory) on these sentences: "
                                                        "attention by tree distance, topical mixing weights")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer for --conllu (default: the source directory)")
    parser.add_argument("--sentences", type=int, default=32, help="sentences of --conllu to use (default: 32)")
    parser.add_argument("--max-length", type=int, default=128, help="truncate --conllu sentences to this many tokens")
    parser.add_argument("--max-distance", type=int, default=None, help="BucketSpec of a state dict (default: inferred)")
    parser.add_argument("--log-distance", type=int, default=None, help="BucketSpec.log_distance of a state dict")
    parser.add_argument("--no-unreachable-bucket", action="store_true", help="BucketSpec(unreachable_bucket=False)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow a file that holds a pickled module (unpickling runs code: trusted files only)")
    parser.add_argument("--columns", type=int, default=3, help="panels per row (default: 3)")
    parser.add_argument("--json", default=None, help="also write the plotted values as JSON to this file")


# ------------------------------------------------------------------------------------------------ main


def _run_tool(args) -> int:
    """``verify``, ``bench`` and ``inspect``: the tools' command of that name (syntaxkernels/tools/commands.py)."""
    from .tools import commands

    return getattr(commands, args.command)(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m syntaxkernels",
                                     description="syntaxkernels: syntax-tree-aware attention for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(run=run)
        return p

    command("info", "versions, OS, CPU, compiler, CUDA and driver, and which backend each op uses here", _run_info)
    _verify_arguments(command("verify", "every op against its reference on this device; non-zero exit on a mismatch",
                              _run_tool))
    _bench_arguments(command("bench", "the quick benchmarks available on this machine (optional dependencies skip "
                                      "their rows)", _run_tool))
    _inspect_arguments(command("inspect", "compile every fused kernel as launched for GPUs this machine lacks "
                                          "(sm_80/sm_90, or every family on named workloads) and report its cost "
                                          "model", _run_tool))
    _show_arguments(command("show", "plot what a syntax model learned (bias per tree distance per layer, bias "
                                    "scale, topical mixing)", _run_show))
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
