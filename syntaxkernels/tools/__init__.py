"""Developer tooling of syntaxkernels: what ``python -m syntaxkernels verify``, ``bench`` and ``inspect`` run.

Nothing here is needed to use the ops, the modules or the tree builders. The runtime (``syntaxkernels`` and
every module outside this folder) never imports this subpackage; the one way in from the package is the
command line, ``syntaxkernels/__main__.py``, which imports a tool only when its command runs.
Tests, benchmarks and the GPU suite import these modules directly.

- :mod:`.commands`: the ``verify``, ``bench`` and ``inspect`` commands (``__main__`` parses their arguments and
  calls the function of the command's name here);
- :mod:`.checks`: the self-checks and quick benchmarks behind ``verify`` and ``bench``;
- :mod:`.inspection`: every fused kernel compiled as launched for GPUs this machine lacks, and a cost model
  read from its SASS (``inspect``);
- :mod:`.workloads`: the trees and named batches the checks, the inspection, the tests and the benchmarks
  use (treebank sentences or generated trees).

Modules here reach the runtime by absolute imports (``from syntaxkernels.ops import ...``), and each other
by relative ones. Their tables are printed by ``syntaxkernels._table.table`` (the command line's ``info`` prints
one too, without the tools).
"""
