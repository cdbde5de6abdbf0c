"""Host work per layer: what one attention layer's forward and backward cost the CPU that drives the GPU, and how
many device kernels it launches, measured on a machine without a GPU.

Every Triton launch is compiled for a GPU family (``fake_gpu``: Triton's driver replaced, as the inspection does)
and goes through the package's own launch path up to the driver's launch call, which is skipped
(``ops._primitives._DIRECT_LAUNCH_OVERRIDE``): the Python of the op, the autograd Function, the dispatcher, the
launchers, the argument assembly of every launch, and the aten calls between them all run, on CPU tensors. What is
left out: the driver's ``cuLaunchKernel`` inside Triton's C launcher (a few microseconds a launch on a GPU host)
and the host side of the aten kernels' own launches (they run on the CPU here, on small tensors).

Figures (per workload, one layer forward + backward, the way a model calls it: ``nn.DistanceBias.attend`` on the
batch's plan, q, k, v split from ``[B, N, H * D]`` projections, a shared table and a learnable strength, gradients
for the projections and the parameters):

- ``host_us``: the CPU time of the layer (the fastest of 7 rounds ; this process's only: other work on the machine does not count), on a
  batch cut to two of its rows with 2 heads of 16 (same N, the
  same kernels and configs: the host path does not depend on B, H or D beyond their divisibility, and tiny tensors
  keep the aten kernels' own work, which runs on the GPU elsewhere, out of the figure: on the CPU a layout copy of
  the full layer's tensors alone costs hundreds of microseconds);
- ``round_trips``: that time over a bare ``autograd.Function`` round trip (forward and backward of an identity
  Function) timed in the same process: the figure to compare across machines;
- ``op_us`` / ``op_round_trips``: the layer's time less the same layer with an identity Function in place of the
  attention (the heads' views, transposes and reshapes and the autograd engine stay): the op's own host work;
- ``triton`` / ``aten`` / ``copies``: device kernels of one layer at the full batch (Triton launches; aten kernels,
  views and allocations not counted, nor a dropout seed's draw on torch's CPU generator; of those, the copies), for a
  layer after the first (the batch's plan already holds what the first derived) and for the first (``first_*``).

``inspect --host --dropout P`` times layers with attention dropout (a seed drawn every call, as ``nn`` draws it);
``--position-buckets NUM_BUCKETS:MAX_DISTANCE`` layers with T5's relative-position term.

The launchers replay their recorded host work as a model's layers do (:mod:`syntaxkernels.ops._replay`: the warm-up
calls of :func:`_median_time` record each shape class, the timed calls replay it).

``python -m syntaxkernels inspect --host`` prints them; a model of the host path, not a GPU measurement.
"""
from __future__ import annotations

import collections
import contextlib
import textwrap
import time
from typing import Callable, Dict, List, Sequence

__all__ = ["HOST_WORKLOADS", "bare_round_trip_us", "host_report", "format_host_report", "count_device_kernels"]

#: The workloads of the host report (``tools.workloads`` names).
HOST_WORKLOADS = ("sentences", "pairs", "finetune-512", "sentences-packed")

#: aten ops that launch no device kernel (views, metadata, allocations).
_NO_KERNEL = {"empty", "empty_strided", "view", "as_strided", "transpose", "t", "unsqueeze", "squeeze", "expand",
              "select", "slice", "detach", "alias", "_reshape_alias", "permute", "_unsafe_view", "unbind", "split",
              "lift_fresh", "new_empty", "new_empty_strided", "empty_like", "set_", "unfold", "view_as", "reshape",
              "is_same_size", "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel",
              "sym_storage_offset", "size", "stride", "dim", "is_contiguous", "numel", "result_type"}
_COPIES = {"clone", "copy_", "_to_copy", "contiguous"}
#: The dropout seed's draw (:func:`syntaxkernels.nn.draw_dropout_seed`: ``random_`` of torch's CPU generator into an
#: int64 scalar and its ``item``): host work on a CPU scalar whatever the model's device, no device kernel.
_SEED_DRAW = {"random_", "_local_scalar_dense"}


def _is_seed_scalar(tensor) -> bool:
    import torch

    return isinstance(tensor, torch.Tensor) and tensor.dim() == 0 and tensor.dtype == torch.int64


def _identity_function():
    import torch

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Identity


def _median_time(fn: Callable[[], None], reps: int, rounds: int = 7) -> float:
    """Seconds of CPU time this process spends per call of ``fn``: the fastest of ``rounds`` rounds of ``reps`` calls
    (the round least disturbed by other work: on a shared machine caches and clocks still move). CPU time rather
    than wall time, so that other processes' work does not count (the host path is single-threaded; the tiny
    tensors keep torch's thread pool out of it)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(reps):
            fn()
        times.append((time.process_time() - start) / reps)
    return min(times)


def bare_round_trip_us() -> float:
    """Microseconds of a bare ``autograd.Function`` round trip: an identity Function's forward and its backward
    through ``torch.autograd.grad`` on a 4-element tensor."""
    import torch

    identity = _identity_function()
    x = torch.zeros(4, requires_grad=True)
    grad = torch.zeros(4)
    return _median_time(lambda: torch.autograd.grad(identity.apply(x), (x,), grad), 2000) * 1e6


def count_device_kernels(fn: Callable[[], None]) -> Dict[str, object]:
    """The device kernels ``fn`` launches: ``{"triton": [kernel names], "aten": Counter of aten ops, "copies":
    int}``. Triton launches are counted at the package's launch function; aten kernels with a dispatch mode (the
    package's ``torch.library`` ops are opened, so the aten calls inside them count)."""
    from torch._library.custom_ops import OPDEFS
    from torch.utils._python_dispatch import TorchDispatchMode

    from syntaxkernels.ops import _primitives

    aten: collections.Counter = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "syntaxkernels":
                with self:
                    return OPDEFS[func._schema.name]._init_fn(*args, **kwargs)
            name = func.__name__.split(".")[0]
            if name not in _NO_KERNEL and not (name in _SEED_DRAW and _is_seed_scalar(args[0] if args else None)):
                aten[func.__name__] += 1
            return func(*args, **kwargs)

    triton: List[str] = []
    previous = _primitives._DIRECT_LAUNCH_OVERRIDE

    def record(compiled, g0, g1, g2, args):
        triton.append(compiled.name)

    # Every launch goes through the direct path; its first launch of a specialisation compiles (not counted by the
    # override): run once first so that each launch below is a cache hit.
    fn()
    _primitives._DIRECT_LAUNCH_OVERRIDE = record
    try:
        with Count():
            fn()
    finally:
        _primitives._DIRECT_LAUNCH_OVERRIDE = previous
    copies = sum(n for name, n in aten.items() if name.split(".")[0] in _COPIES)
    return {"triton": triton, "aten": aten, "copies": copies}


@contextlib.contextmanager
def _compiled_not_run(arch: int):
    """Launches compiled for ``sm_<arch>`` and not run: the fake driver, the direct launch path with its final
    driver call skipped, and the Triton path for CPU tensors."""
    from syntaxkernels.ops import _primitives
    from syntaxkernels.tools.inspection import _kernels_on_cpu_tensors, fake_gpu

    import torch

    previous = _primitives._DIRECT_LAUNCH_OVERRIDE
    _primitives._DIRECT_LAUNCH_OVERRIDE = lambda compiled, g0, g1, g2, args: None
    # The aten ops after the kernels run on the CPU here, standing in for their launches: one intra-op thread, so that
    # a tiny product (the position table's gradient) does not time a thread pool's wake-up on a loaded machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with fake_gpu(arch), _kernels_on_cpu_tensors():
            yield
    finally:
        _primitives._DIRECT_LAUNCH_OVERRIDE = previous
        torch.set_num_threads(threads)


def _layer(trees, heads: int, head_dim: int, dtype, plain: bool = False, position=None,
           dropout: float = 0.0) -> Callable[[], None]:
    """One distance-bias layer as a model runs it (module docstring), forward and backward. ``plain``: the same
    layer with an identity autograd Function in place of the attention (the views, transposes and reshapes of the
    heads, the engine): the baseline that :func:`host_report` takes off to give the op's own host work.
    ``position``: a :class:`~syntaxkernels.specs.RelativePositionSpec`, T5's term as T5 calls it (its own learnable
    ``[H, P]`` table, unscaled scores). ``dropout``: attention dropout of that probability (the layer draws a seed
    every call, :func:`syntaxkernels.nn.draw_dropout_seed`; the plain baseline draws none)."""
    import torch

    from syntaxkernels.nn import DistanceBias
    from syntaxkernels.trees import PackedTreeBatch

    E = heads * head_dim
    layer = DistanceBias(heads, backend="triton")
    params = tuple(layer.parameters())
    extra = {}
    if position is not None:
        table = torch.zeros(heads, position.num_buckets, requires_grad=True)
        extra = dict(position_buckets=position, position_table=table, scale=1.0)
        params += (table,)
    if dropout > 0.0:
        extra["dropout_p"] = dropout
    if plain:
        identity = _identity_function()

        class Attend:  # q, k, v -> one autograd Function (as the op is one) that returns q, reading k and v
            @staticmethod
            def attend(q, k, v, trees, **extra):
                return identity.apply(q) + 0 * (k.sum() + v.sum())
        layer = Attend()
        params = ()
    if isinstance(trees, PackedTreeBatch):  # a packed row: [T, E] projections as [T, H, D]
        T = trees.num_tokens
        x = [torch.zeros(T, E, dtype=dtype, requires_grad=True) for _ in range(3)]
        grad = torch.zeros(T, E, dtype=dtype)

        def step():
            q, k, v = (t.view(T, heads, head_dim) for t in x)
            out = layer.attend(q, k, v, trees, **extra)
            torch.autograd.grad(out.reshape(T, E), tuple(x) + params, grad)
        return step
    B, N = trees.distance.shape[:2]
    x = [torch.zeros(B, N, E, dtype=dtype, requires_grad=True) for _ in range(3)]
    grad = torch.zeros(B, N, E, dtype=dtype)

    def step():
        q, k, v = (t.view(B, N, heads, head_dim).transpose(1, 2) for t in x)
        out = layer.attend(q, k, v, trees, **extra)
        torch.autograd.grad(out.transpose(1, 2).reshape(B, N, E), tuple(x) + params, grad)
    return step


def _batches(name: str):
    """``(full batch, a two-row cut of it with the same N)`` of a workload (packed: eight sequences)."""
    import syntaxkernels as sk
    from syntaxkernels.tools.workloads import named_workload

    workload = named_workload(name)
    if workload.packed:
        return (sk.TreeBatch.from_heads(workload.heads, packed=True),
                sk.TreeBatch.from_heads(workload.heads[:8], packed=True))
    full = workload.tree_batch()
    longest = max(range(len(workload.heads)), key=lambda i: len(workload.heads[i]))
    rows = [workload.heads[longest], workload.heads[(longest + 1) % len(workload.heads)]]
    cut = sk.TreeBatch.from_heads(rows)
    if cut.max_len < full.max_len:  # pad to the workload's N (a fixed-N workload)
        import torch

        heads = torch.full((2, full.max_len), -1, dtype=torch.int64)
        lengths = torch.tensor([len(r) for r in rows])
        for i, r in enumerate(rows):
            heads[i, :len(r)] = torch.tensor(r)
        cut = sk.TreeBatch.from_heads(heads, lengths)
    cut.short_rows = full.short_rows  # (the cut stands for the batch: the whole batch's tiles)
    return full, cut


#: Heads and head dim of the timed layer (module docstring).
TIMED_HEADS, TIMED_HEAD_DIM = 2, 16


def host_report(names: Sequence[str] = HOST_WORKLOADS, arch: int = 90, dtype: str = "bf16", head_dim: int = 64,
                heads: int = 12, reps: int = 30, position=None, dropout: float = 0.0) -> List[dict]:
    """One row per workload (module docstring), launches compiled for ``sm_<arch>``; each row carries the bare
    round trip measured in the same process. ``position``: layers with T5's relative-position term (a
    :class:`~syntaxkernels.specs.RelativePositionSpec`; the plain baseline is the same); ``dropout``: layers with
    attention dropout of that probability (``inspect --host --dropout P``)."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    round_trip = bare_round_trip_us()
    rows = []
    with _compiled_not_run(arch):
        for name in names:
            full, cut = _batches(name)
            kw = dict(position=position, dropout=dropout)
            first = count_device_kernels(_layer(full, heads, head_dim, torch_dtype, **kw))  # (+ the plan)
            later = count_device_kernels(_layer(full, heads, head_dim, torch_dtype, **kw))
            host_us = _median_time(_layer(cut, TIMED_HEADS, TIMED_HEAD_DIM, torch_dtype, **kw), reps) * 1e6
            plain_us = _median_time(_layer(cut, TIMED_HEADS, TIMED_HEAD_DIM, torch_dtype, plain=True), reps) * 1e6
            rows.append(dict(workload=name, arch=arch, dtype=dtype, head_dim=head_dim, heads=heads, dropout=dropout,
                             position=None if position is None else f"{position.num_buckets}:{position.max_distance}",
                             shape=tuple(full.distance.shape[:2]) if not full.is_packed else (full.num_tokens,),
                             host_us=host_us, round_trip_us=round_trip, round_trips=host_us / round_trip,
                             plain_us=plain_us, op_us=host_us - plain_us,
                             op_round_trips=(host_us - plain_us) / round_trip,
                             triton=len(later["triton"]), aten=sum(later["aten"].values()), copies=later["copies"],
                             kernels=list(later["triton"]), aten_ops=dict(later["aten"]),
                             first_triton=len(first["triton"]), first_aten=sum(first["aten"].values())))
    return rows


def format_host_report(rows: Sequence[dict]) -> str:
    """The rows as a table, with the conditions and what each column means."""
    from syntaxkernels._table import WIDTH
    from syntaxkernels._table import table as text_table

    if not rows:
        return "no workloads"
    r0 = rows[0]
    layer = "".join([f"; attention dropout {r0['dropout']:g}" if r0.get("dropout") else "",
                     f"; T5's term {r0['position']}" if r0.get("position") else ""])
    lines = textwrap.wrap(f"Host work per layer (forward + backward), launches compiled for sm_{r0['arch']} and not "
                          f"run; {r0['dtype']}, H = {r0['heads']}, D = {r0['head_dim']}{layer}; bare autograd round "
                          f"trip {r0['round_trip_us']:.1f} us on this machine.", WIDTH)
    table = [dict(workload=r["workload"], shape="x".join(map(str, r["shape"])), host_us=f"{r['host_us']:.0f}",
                  round_trips=f"{r['round_trips']:.1f}", op_us=f"{r['op_us']:.0f}",
                  op_round_trips=f"{r['op_round_trips']:.1f}", triton=r["triton"], aten=r["aten"], copies=r["copies"],
                  first_layer=f"{r['first_triton']} + {r['first_aten']}") for r in rows]
    columns = ["workload", "shape", "host_us", "round_trips", "op_us", "op_round_trips", "triton", "aten", "copies",
               "first_layer"]
    lines += text_table(table, columns, right=columns[2:])
    legend = ("host_us: one layer's host CPU time (the fastest of 7 rounds, a two-row cut of the batch with 2 heads of 16: the same N "
              "and kernels); round_trips: host_us / the bare round trip; op_us, op_round_trips: host_us less the same "
              "layer with an identity Function in place of the attention (its views, transposes, reshapes and the "
              "autograd engine stay), i.e. the op's own host work; triton / aten / copies: device kernels of a layer "
              "after the first (the batch's plan holds what the first derived); first_layer: Triton + aten kernels of "
              "the first layer. The launchers replay the host work recorded on their first call of the shape "
              "class, as a model's layers do after the first step (ops._replay). Not included: the driver's launch "
              "call (cuLaunchKernel) of each kernel.")
    lines += textwrap.wrap(legend, WIDTH)
    for r in rows:
        kernels = f"{r['workload']}: {', '.join(r['kernels'])}" + (f"; aten {r['aten_ops']}" if r["aten_ops"] else "")
        lines += textwrap.wrap(kernels, WIDTH, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
