"""Shared helpers of the attention benchmarks (timing, memory, FLOP counts, JSON and table output).

``bench_bias_attention.py`` and ``bench_subnetwork_attention.py`` use these so their results look the same (the
tree-distance and end-to-end benchmarks time whole CPU pipelines their own way): ``time_ms`` wraps
``triton.testing.do_bench`` (median and 20/80% quantiles), ``peak_memory_mib`` measures the peak
allocation of one call, ``attention_tflops`` follows the FlashAttention convention (forward
``4 * B * H * N^2 * D`` FLOPs, backward 2.5x that, fwd+bwd 3.5x, scaled by the visited-block density for
sparse ops), and ``write_results`` prints a table with the conditions (``syntaxkernels._table.table``) and
writes JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Callable, Dict, Iterable, List, Optional

import torch

from syntaxkernels._table import table

MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def require_cuda(script: str) -> bool:
    """True when a CUDA GPU is present; otherwise print that one is needed (the caller exits 0)."""
    if torch.cuda.is_available():
        return True
    print(f"{script}: a CUDA GPU is needed for this benchmark; none is available here, nothing was measured.")
    return False


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", default=None, help="write the result rows and conditions to this file")
    parser.add_argument("--quick", action="store_true", help="a reduced grid (for the GPU suite)")
    return parser


def conditions() -> Dict[str, str]:
    """GPU, versions and date: printed with every table and stored in the JSON."""
    import datetime

    info = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), python=platform.python_version(),
                torch=torch.__version__)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = "unavailable"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory >> 30} GiB)"
        info["cuda"] = str(torch.version.cuda)
    return info


def time_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> Dict[str, float]:
    """Median and 20/80% quantiles of ``fn()`` in milliseconds (``triton.testing.do_bench``)."""
    import triton

    median, low, high = triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return dict(ms=median, ms_p20=low, ms_p80=high)


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak CUDA memory allocated during one ``fn()`` call, above what was allocated before, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def attention_tflops(B: int, H: int, N: int, D: int, mode: str, ms: float, density: float = 1.0) -> float:
    """TFLOP/s by the FlashAttention convention (see the module docstring)."""
    flops = 4.0 * B * H * N * N * D * MODE_FACTOR[mode] * density
    return flops / (ms * 1e-3) / 1e12


def save_rows(rows: List[dict], path: Optional[str], title: str, complete: bool = False) -> None:
    """Write ``{"title", "conditions", "rows", "complete"}`` as JSON to ``path`` (nothing when ``path`` is None).

    Benchmarks call it after every row with ``complete=False``, so a run cut short (the GPU suite's deadlines)
    keeps what it measured; :func:`write_results` writes the final file with ``complete=True``.
    """
    if path:
        with open(path, "w") as f:
            json.dump(dict(title=title, conditions=conditions(), rows=rows, complete=complete), f, indent=1)


def write_results(rows: List[dict], path: Optional[str], title: str, columns: Iterable[str]) -> None:
    """Print the conditions and a table of ``rows``; write them as JSON to ``path`` (:func:`save_rows`)."""
    info = conditions()
    print(f"# {title}")
    print("  ".join(f"{k}={v}" for k, v in info.items()))
    for line in table(rows, list(columns), width=None):  # the package's one table printer, never cut here
        print(line)
    if path:
        save_rows(rows, path, title, complete=True)
        print(f"wrote {path}", file=sys.stderr)
