"""Build and install syntaxkernels with its C++ extension ``syntaxkernels._C``.

    pip install --no-build-isolation -e .          # needs torch already installed (see README)

The extension is always a CppExtension (the CPU tree-distance builder). The CUDA builder (csrc/cuda/) joins
only in a CUDA build: a CUDA toolkit and a CUDA torch, or ``FORCE_CUDA=1``. ``MAX_JOBS`` sets the parallel
compile jobs (ninja); unset, they are capped by the memory available (:func:`build_jobs`: one compiler takes
about 2.3 GB on these sources), so that a small or busy machine does not kill the build. The source list lives
in cmake/sources.cmake, shared with CMakeLists.txt.
"""
import os
import re
import sys
from pathlib import Path
from typing import Mapping, Optional, Tuple

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def read_sources(variable):
    """Paths listed in ``set(<variable> ...)`` of cmake/sources.cmake."""
    text = (ROOT / "cmake" / "sources.cmake").read_text()
    match = re.search(r"set\(\s*" + re.escape(variable) + r"\s+(.*?)\)", text, re.S)
    if match is None:
        raise RuntimeError(f"cmake/sources.cmake has no set({variable} ...)")
    return [line.split("#")[0].strip() for line in match.group(1).splitlines() if line.split("#")[0].strip()]


def read_version():
    """``__version__`` of syntaxkernels/__init__.py: the one place the version is written (``info`` prints it,
    the package metadata carries it)."""
    text = (ROOT / "syntaxkernels" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if match is None:
        raise RuntimeError('syntaxkernels/__init__.py has no line __version__ = "..."')
    return match.group(1)


#: Memory one compiler process may take on these sources: cc1plus peaks at 2.3 GB on the bindings (torch 2.13
#: headers, -O3; README.md, "What the build needs"), plus a margin for the rest of the machine.
COMPILE_JOB_BYTES = int(2.5 * 2**30)


def available_memory() -> Optional[int]:
    """Bytes of memory available for new processes (``MemAvailable`` of /proc/meminfo, else the free physical
    pages), None when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def build_jobs(environ: Mapping[str, str], cpus: int, available: Optional[int]) -> Tuple[Optional[int], str]:
    """``(jobs, why)``: the parallel compile jobs to run and why. ``MAX_JOBS`` in ``environ`` wins (``jobs`` None:
    left as set). Else ninja's default, one job per core plus two, capped so that ``jobs * COMPILE_JOB_BYTES`` fits
    in ``available`` bytes (at least one job); unknown memory leaves ninja's default."""
    if environ.get("MAX_JOBS"):
        return None, f"MAX_JOBS={environ['MAX_JOBS']} is set"
    default = max(1, cpus) + 2
    if available is None:
        return default, f"{cpus} cores, memory unknown"
    by_memory = max(1, available // COMPILE_JOB_BYTES)
    jobs = min(default, by_memory)
    return jobs, (f"{available / 2**30:.1f} GiB available, ~{COMPILE_JOB_BYTES / 2**30:.1f} GiB per compiler, "
                  f"{cpus} cores")


def cap_build_jobs(environ=os.environ) -> None:
    """Set ``MAX_JOBS`` in ``environ`` (read by torch's BuildExtension when it runs ninja) to :func:`build_jobs`'
    choice unless it is set, and say so on stderr."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs, why = build_jobs(environ, cpus, available_memory())
    if jobs is not None:
        environ["MAX_JOBS"] = str(jobs)
    print(f"syntaxkernels: compiling with MAX_JOBS={environ.get('MAX_JOBS')} ({why}; set MAX_JOBS to choose)",
          file=sys.stderr, flush=True)


def extensions():
    from torch.utils.cpp_extension import CUDA_HOME, CppExtension, CUDAExtension
    import torch

    sources = read_sources("SYNTAXKERNELS_CORE_SOURCES") + read_sources("SYNTAXKERNELS_BINDING_SOURCES")
    cxx_flags = ["-O3"]  # the language standard comes from torch (C++17 or C++20, by version)
    force_cuda = os.environ.get("FORCE_CUDA", "0") == "1"
    use_cuda = force_cuda or (torch.version.cuda is not None and CUDA_HOME is not None)
    if use_cuda:
        return [
            CUDAExtension(
                "syntaxkernels._C",
                sources + read_sources("SYNTAXKERNELS_CUDA_SOURCES"),
                include_dirs=[str(ROOT / "csrc")],
                define_macros=[("WITH_CUDA", None)],
                extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
            )
        ]
    return [
        CppExtension(
            "syntaxkernels._C",
            sources,
            include_dirs=[str(ROOT / "csrc")],
            extra_compile_args={"cxx": cxx_flags},
        )
    ]


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    class Build(BuildExtension):
        """torch's BuildExtension (ninja when available, which honours MAX_JOBS), with MAX_JOBS capped by the
        memory available before it compiles (:func:`cap_build_jobs`)."""

        def build_extensions(self):
            cap_build_jobs()
            super().build_extensions()

    return Build.with_options(use_ninja=True)


EXTRAS = {
    "test": ["pytest", "hypothesis", "scipy", "networkx", "pytest-benchmark", "pytest-timeout", "transformers",
             "tokenizers", "stanza", "pyflakes", "matplotlib", "spacy", "tree-sitter", "tree-sitter-python",
             "datasets"],
    "bench": ["scipy", "networkx", "pytest", "pytest-benchmark", "transformers"],  # benchmarks/*.py
    # syntaxkernels.integrations.transformers (transformers 5: its attention and mask interfaces)
    "transformers": ["transformers>=5"],
    "plot": ["matplotlib"],  # python -m syntaxkernels show, syntaxkernels.show
    "spacy": ["spacy"],  # sk.trees.from_spacy / sk.trees.parse with a spaCy pipeline
}

setup(
    name="syntaxkernels",
    version=read_version(),
    description="Fast syntax-tree-aware attention for PyTorch: Triton kernels and a C++ tree-distance builder",
    license_expression="Apache-2.0",
    license_files=["LICENSE"],
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["syntaxkernels", "syntaxkernels.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.6", "numpy", "triton>=3.2; platform_system == 'Linux'"],
    extras_require=EXTRAS,
    ext_modules=extensions(),
    cmdclass={"build_ext": build_ext_class()},
    include_package_data=False,
    zip_safe=False,
)
