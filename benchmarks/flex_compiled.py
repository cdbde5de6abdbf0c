"""FlexAttention's backward as Inductor compiles it, read like our kernels: instructions per score element and per
valid pair, beside ours, on the named workloads, for GPUs this machine lacks.

    python benchmarks/flex_compiled.py --workload sentences,packed,long-8192 --arch 80,90 --head-dim 64,128

What it does, per (workload, head dim, GPU family):

1. Traces ``flex_attention`` with the score_mod a user writes for our bias (``score + table[bucket[b, i, j]]``: an
   int32 bucket tensor ``[B, N, N]``, an fp32 table of the buckets) and a padding block mask (``i < length[b]``
   and ``j < length[b]``; on a packed workload ``doc[i] == doc[j]``), at the workload's real shape
   (``B, 12 heads, N, D``, bf16), through AOTAutograd with Inductor's decompositions, on the CPU (nothing runs:
   the forward and backward are captured, not executed).
2. Lowers the backward graph with Inductor for a CUDA device that does not exist here (fake tensors on
   ``cuda``, the device's properties and Triton's target set to the family: an A100 for sm_80, an H100 for
   sm_90), so Inductor picks the block sizes, warps and stages it picks on that GPU, and takes the generated
   template kernel out of the module before it is loaded.
3. Compiles that kernel for the family as a launch would (``syntaxkernels.tools.inspection.fake_gpu``) and
   reads its four main loops from the SASS (dQ over partial and full blocks, dK/dV over partial and full
   blocks), counting non-tensor-core instructions per iteration on the cheapest path, as our inspection does.
4. Walks the workload's block mask (128 x 128 sparse blocks) as the kernel's loops do (the trip counts of
   ``bwd_dq_inner`` / ``bwd_dkdv_inner``) and weights each loop by its trips: instructions per valid
   (query, key) pair and per score element computed.

Rows shorter than Flex's blocks (padded sentences) leave no loop in its compiled code: there each trip is charged
the full-block loops' cost compiled at N = 1024 (no mask, no bounds), a floor for Flex, printed with ``>=``.

Ours, on the same workload, family and head dim, come from ``inspect_workload`` (the backward kernels'
tile-weighted cost per valid pair and per score element: the inspection's ``bwd`` and ``bwd/el``). Both are models
read from the SASS,
not timings; Flex's atomic table-gradient writes (one ``RED`` per element, on a dozen addresses per head) count as
one instruction each, their contention not at all.

The Inductor part patches torch internals for the length of one call (a fake CUDA device); it is tested against
torch 2.13 only (the version the project pins), and a failure is reported per case, not raised.
"""
import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
from unittest import mock

import torch

HEADS = 12
SPARSE = 128  # Flex's default block-mask block

# What Inductor reads off the device when it picks a config: the two families' flagship parts.
_DEVICES = {
    80: dict(name="NVIDIA A100-SXM4-80GB", major=8, minor=0, multi_processor_count=108,
             shared_memory_per_block_optin=166912, L2_cache_size=40 << 20),
    90: dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
             shared_memory_per_block_optin=232448, L2_cache_size=50 << 20),
}


class _Props:
    """``torch.cuda.get_device_properties`` of a GPU that is not here."""

    def __init__(self, arch):
        for key, value in _DEVICES[arch].items():
            setattr(self, key, value)
        self.total_memory = 80 << 30
        self.max_threads_per_multi_processor = 2048
        self.max_threads_per_block = 1024
        self.warp_size = 32
        self.regs_per_multiprocessor = 65536
        self.shared_memory_per_multiprocessor = self.shared_memory_per_block_optin + 1024
        self.shared_memory_per_block = 49152
        self.gcnArchName = ""


# The generated kernels' sources while this process runs (Triton reads a kernel's source from its file).
_KERNEL_FOLDER = tempfile.TemporaryDirectory(prefix="flex_kernels_")


class _Captured(Exception):
    pass


def _patched(obj, **attributes):
    """``obj``'s attributes set for the length of a ``with`` (created where missing, removed after)."""
    return mock.patch.multiple(obj, create=True, **attributes)


def _trace_backward(B, N, D, lengths, docs):
    """The backward graph of one Flex call at this shape and its example inputs (captured, not run)."""
    import torch.nn.attention.flex_attention as flex
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    captured = {}

    def forward_compiler(gm, example_inputs):
        outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        metas = [o.meta["val"] if o is not None else None for o in outputs]

        def run(*args):  # empty outputs of the traced shapes: nothing is computed
            return [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype) if m is not None else None
                    for m in metas]
        run._boxed_call = False
        return run

    def backward_compiler(gm, example_inputs):
        captured["graph"], captured["inputs"] = gm, list(example_inputs)
        raise _Captured()

    if docs is None:
        lengths_t = torch.tensor(lengths, dtype=torch.int32)

        def mask_mod(b, h, i, j):
            return (i < lengths_t[b]) & (j < lengths_t[b])
    else:
        docs_t = torch.tensor(docs, dtype=torch.int32)

        def mask_mod(b, h, i, j):
            return docs_t[i] == docs_t[j]
    block_mask = create_block_mask(mask_mod, B, 1, N, N, device="cpu")
    bucket = torch.zeros(B, N, N, dtype=torch.int32)
    table = torch.zeros(16, requires_grad=True)

    def call(q, k, v):
        def score_mod(score, b, h, i, j):
            return score + table[bucket[b, i, j]]
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    q, k, v = (torch.empty(B, HEADS, N, D, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                           decompositions=select_decomp_table())
    with _patched(flex, _validate_device=lambda *a: None):
        torch._dynamo.reset()
        out = torch.compile(call, backend=backend, fullgraph=True, dynamic=False)(q, k, v)
        try:
            out.sum().backward()
        except _Captured:
            pass
        except Exception as exc:  # AOTAutograd may wrap the compiler's exception
            if "graph" not in captured:
                raise
            del exc
    if "graph" not in captured:
        raise RuntimeError("the backward graph was not captured")
    return captured["graph"], captured["inputs"]


def _inductor_source(gm, inputs, arch):
    """The Python module Inductor generates for ``gm`` on a CUDA device of family ``arch`` (not loaded)."""
    import torch._inductor.codecache as codecache
    import torch._inductor.config as inductor_config
    import torch._inductor.fx_utils as fx_utils
    import torch._inductor.scheduler as scheduler
    import torch.utils._triton as torch_triton
    from torch._guards import TracingContext, tracing
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    hop = sys.modules["torch._higher_order_ops.flex_attention"]
    props = _Props(arch)
    target = GPUTarget("cuda", arch, 32)

    class Driver:
        def get_current_target(self):
            return target

        def get_current_device(self):
            return 0

        def get_current_stream(self, *args):
            return 0

    def permute_strides(out, query_strides):  # the fake op without its copy (a copy needs a CUDA device guard)
        from torch._inductor.ir import get_fill_order
        order = list(get_fill_order(query_strides))
        strides = hop._construct_strides(out.shape, order)
        if strides[-1] != 1:
            order.remove(len(out.shape) - 1)
            strides = hop._construct_strides(out.shape, [len(out.shape) - 1] + order)
        return out.new_empty_strided(out.shape, strides)

    source = {}

    def load_by_key_path(key, path, *args, **kwargs):
        with open(path) as f:
            source["text"] = f.read()
        raise _Captured()

    cuda = torch.cuda
    patches = [
        _patched(cuda, is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
                 get_device_properties=lambda *a, **k: props, _get_device_properties=lambda *a, **k: props,
                 get_device_capability=lambda *a, **k: (props.major, props.minor),
                 get_device_name=lambda *a, **k: props.name, is_bf16_supported=lambda *a, **k: True,
                 _lazy_init=lambda: None, is_initialized=lambda: True,
                 get_rng_state=lambda *a, **k: torch.zeros(16, dtype=torch.uint8),
                 set_rng_state=lambda *a, **k: None, _exchange_device=lambda d: 0,
                 _maybe_exchange_device=lambda d: 0),
        _patched(torch._C, _cuda_getDevice=lambda: 0, _cuda_setDevice=lambda d: None),
        _patched(torch_triton, triton_backend=lambda: make_backend(target), has_triton=lambda: True),
        _patched(scheduler, has_triton=lambda: True),
        _patched(hop, _permute_strides=permute_strides),
        _patched(fx_utils.FakeTensorUpdater, incremental_update=lambda self: None),
        _patched(codecache.PyCodeCache, load_by_key_path=staticmethod(load_by_key_path)),
        _patched(driver, _active=Driver()),
        _patched(inductor_config, compile_threads=1, max_autotune=False, fx_graph_cache=False),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        torch_triton.triton_hash_with_backend.cache_clear()
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            fakes = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                     if isinstance(t, torch.Tensor) else t for t in inputs]
        try:
            with tracing(TracingContext(mode)), mode:
                compile_fx_inner(gm, fakes, is_backward=True)
        except Exception as exc:  # noqa: BLE001 - the module was written before the load we stopped
            if "text" not in source:
                raise
            del exc
    torch_triton.triton_hash_with_backend.cache_clear()  # (its hash was the fake backend's)
    return source["text"]


def _template_kernel(module_text, arch):
    """``(JITFunction, num_warps, num_stages, signature, constants)`` of the generated template kernel."""
    # The first module Inductor loads is the template's own (the kernel of the chosen config); a whole graph's
    # module holds it as ``async_compile.triton('name', '''source''')``.
    found = re.search(r"(\w+) = async_compile\.triton\('(\w*_tem_\w+)', '''(.*?)'''", module_text, re.S)
    if found:
        name, text = found.group(2), found.group(3)
    elif "flex_attention_backward" in module_text and "@triton_heuristics.template" in module_text:
        text = module_text
        name = re.search(r"@triton\.jit\ndef (\w+)\(", text).group(1)
    else:
        raise RuntimeError("no template kernel in Inductor's module")
    options = {key: int(re.search(key + r"=(\d+)", text).group(1)) for key in ("num_warps", "num_stages")}
    signature = re.findall(r"'(\w+)': '([^']+)'", re.search(r"'signature': \{(.*?)\}", text).group(1))
    constants = dict(re.findall(r"'(BLOCK_[MN][12])': (\d+)", text))
    body = re.sub(r"@triton_heuristics\.\w+\((?:.|\n)*?\n\)\n@triton\.jit", "@triton.jit", text, count=1)
    path = os.path.join(_KERNEL_FOLDER.name, f"{name}_sm{arch}_{len(os.listdir(_KERNEL_FOLDER.name))}.py")
    with open(path, "w") as f:
        f.write(body)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name), options, signature, {k: int(v) for k, v in constants.items()}


_POINTER = {"*bf16": torch.bfloat16, "*fp16": torch.float16, "*fp32": torch.float32, "*i32": torch.int32,
            "*i64": torch.int64, "*i8": torch.int8, "*u8": torch.uint8, "*i1": torch.bool}


def _loops(kernel, options, signature, arch):
    """The kernel's four tile loops (program order: dQ partial, dQ full, dK/dV partial, dK/dV full), each
    ``{"other": cheapest-path non-tensor-core instructions, "every": every branch, "ex2": ...}`` per
    iteration and thread, and the compiled kernel's registers, spills and shared memory."""
    from syntaxkernels.tools import inspection

    args = [torch.empty(64, dtype=_POINTER[t]) if t.startswith("*") else 1024 for _, t in signature]
    with inspection.fake_gpu(arch):
        compiled = kernel.run(*args, grid=(1,), warmup=True, **options)
    sass, resources = inspection._disassemble(compiled.asm["cubin"])
    _, loops = inspection.analyse_sass(sass)
    tile_loops = inspection._tile_loops(loops, [l for l in loops if l.tensor_core])
    if not tile_loops:
        raise _NoLoops()
    if len(tile_loops) != 4:
        raise RuntimeError(f"expected 4 tile loops (dQ and dK/dV, partial and full blocks), found {len(tile_loops)}")
    named = dict(zip(("dq_partial", "dq_full", "dkdv_partial", "dkdv_full"), tile_loops))
    # The order the template writes them in: dQ (three products a trip) before dK/dV (four), partial blocks (the
    # mask) before full ones. Checked, not assumed: ptxas could lay the branches out otherwise.
    dq, dkdv = (named["dq_partial"], named["dq_full"]), (named["dkdv_partial"], named["dkdv_full"])
    if not (dq[0].tensor_core == dq[1].tensor_core < dkdv[0].tensor_core == dkdv[1].tensor_core
            and dq[0].shortest_other > dq[1].shortest_other and dkdv[0].shortest_other > dkdv[1].shortest_other):
        raise RuntimeError("the tile loops are not in the template's order (dQ partial, dQ full, dK/dV partial, "
                           "dK/dV full)")
    return ({key: {"other": l.shortest_other, "every": l.instructions - l.tensor_core, "ex2": l.ex2}
             for key, l in named.items()},
            {"registers": resources["REG"], "spill": max(resources["STACK"], resources["LOCAL"], 0),
             "shared": resources["SHARED"], "warps": options["num_warps"], "stages": options["num_stages"]})


def _block_classes(N, lengths, docs):
    """Per batch item, ``[nb, nb]`` 0 (empty), 1 (partial), 2 (full) of the 128 x 128 sparse blocks."""
    nb = math.ceil(N / SPARSE)
    items = []
    if docs is None:
        for length in lengths:
            # A block is full when all of its 128 x 128 pairs are allowed, those past N included (the block mask
            # is built on N rounded up to whole blocks, where the lengths exclude them).
            edges = [(s * SPARSE, (s + 1) * SPARSE) for s in range(nb)]
            inside = [lo < length for lo, _ in edges]
            whole = [hi <= length for _, hi in edges]
            items.append([[0 if not (inside[a] and inside[c]) else 2 if whole[a] and whole[c] else 1
                           for c in range(nb)] for a in range(nb)])
    else:
        # Positions past N (N rounded up to whole blocks) match nothing.
        doc_q = torch.cat([torch.tensor(docs), torch.full((nb * SPARSE - N,), -1)])
        doc_k = torch.cat([torch.tensor(docs), torch.full((nb * SPARSE - N,), -2)])
        grid = []
        for a in range(nb):
            qa = doc_q[a * SPARSE:(a + 1) * SPARSE]
            row = []
            for c in range(nb):
                kc = doc_k[c * SPARSE:(c + 1) * SPARSE]
                same = qa[:, None] == kc[None, :]
                row.append(2 if bool(same.all()) else 1 if bool(same.any()) else 0)
            grid.append(row)
        items.append(grid)
    return items


def _trips(N, items, constants):
    """Loop trips of the whole batch (one head): dQ programs walk key blocks of BLOCK_N2 over their query block's
    partial then full sparse blocks, dK/dV programs query blocks of BLOCK_M1 over their key block's; each
    loop capped as the template caps it (``min(blocks * multiple, cdiv(len, BLOCK))``)."""
    m1, n1, m2, n2 = (constants[k] for k in ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"))
    trips = dict(dq_partial=0, dq_full=0, dkdv_partial=0, dkdv_full=0)
    nb = math.ceil(N / SPARSE)
    for grid in items:
        for q_block in range(math.ceil(N / m2)):
            a = q_block * m2 // SPARSE
            for kind, cls in (("partial", 1), ("full", 2)):
                count = sum(1 for c in range(nb) if grid[a][c] == cls)
                trips[f"dq_{kind}"] += min(count * (SPARSE // n2), max(math.ceil(N / n2), 1))
        for k_block in range(math.ceil(N / n1)):
            c = k_block * n1 // SPARSE
            for kind, cls in (("partial", 1), ("full", 2)):
                count = sum(1 for a in range(nb) if grid[a][c] == cls)
                trips[f"dkdv_{kind}"] += min(count * (SPARSE // m1), max(math.ceil(N / m1), 1))
    return trips


class _NoLoops(Exception):
    pass


def _compiled_kernel(B, N, head_dim, lengths, docs, arch):
    gm, inputs = _trace_backward(B, N, head_dim, lengths, docs)
    return _template_kernel(_inductor_source(gm, inputs, arch), arch)


def flex_case(workload, head_dim, arch):
    """Flex's backward on one workload: loops, trips, and instructions per valid pair and per element."""
    if workload.packed:
        lengths = workload.lengths
        N, B = sum(lengths), 1
        docs = [i for i, length in enumerate(lengths) for _ in range(length)]
    else:
        N, B, lengths, docs = workload.N, workload.batch_size, workload.lengths, None
    kernel, options, signature, constants = _compiled_kernel(B, N, head_dim, lengths, docs, arch)
    bound = False
    try:
        loops, resources = _loops(kernel, options, signature, arch)
    except _NoLoops:
        # Rows shorter than a block: every loop runs at most once and the compiler leaves no loop to read. The
        # floor: each trip at the full-block loops' cost of the same family and head dim (N = 1024, no padding:
        # no mask, no bounds), which the short rows' masked, bounded code can only exceed.
        bound = True
        floor_kernel, options, floor_signature, _ = _compiled_kernel(1, 1024, head_dim, [1024], None, arch)
        loops, resources = _loops(floor_kernel, options, floor_signature, arch)
        loops = dict(loops, dq_partial=loops["dq_full"], dkdv_partial=loops["dkdv_full"])
    trips = _trips(N, _block_classes(N, lengths, docs), constants)
    threads = 32 * options["num_warps"]  # (the warps of the kernel the loops were read from)
    area = {k: constants["BLOCK_M1"] * constants["BLOCK_N1"] if k.startswith("dkdv")
            else constants["BLOCK_M2"] * constants["BLOCK_N2"] for k in trips}
    valid = sum(n * n for n in lengths)
    cost = {k: trips[k] * loops[k]["other"] * threads for k in trips}  # thread-instructions of each loop's trips
    every = sum(trips[k] * loops[k]["every"] * threads for k in trips)
    elements = {kind: sum(trips[k] * area[k] for k in trips if k.startswith(kind)) for kind in ("dq", "dkdv")}
    per_element = sum(sum(cost[k] for k in trips if k.startswith(kind)) / max(elements[kind], 1)
                      for kind in ("dq", "dkdv"))
    instr = sum(cost.values())
    return dict(workload=workload.name, head_dim=head_dim, arch=arch, blocks=constants, loops=loops, trips=trips,
                lower_bound=bound,
                resources=resources, valid_pairs=valid, per_valid_pair=instr / valid,
                per_valid_pair_every=every / valid, per_element=per_element,
                area=elements["dkdv"] / valid)


def ours_case(workload_name, head_dim, arch):
    """Our backward on the same workload: tile-weighted instructions per valid pair and per score element (the
    inspection's ``bwd`` and ``bwd/el``)."""
    from syntaxkernels.tools import inspection

    reports = inspection.inspect_workload(workload_name, "bf16", head_dim, arch)
    rows = inspection.workload_summary(reports)
    if not rows:
        raise RuntimeError("no inspection rows")
    row = rows[0]
    return dict(per_valid_pair=row.get("bwd_instr"), per_element=row.get("bwd_element"),
                per_valid_pair_layer=row.get("bwd_layer_instr"), errors=[r.error for r in reports if r.error])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="sentences,packed,long-8192")
    parser.add_argument("--arch", default="80,90")
    parser.add_argument("--head-dim", default="64,128")
    parser.add_argument("--json", default="", help="also write every figure to this file")
    args = parser.parse_args(argv)
    from syntaxkernels.tools import inspection

    results = []
    print(f"FlexAttention's backward compiled by Inductor (torch {torch.__version__}) vs ours; non-tensor-core "
          "thread-instructions from the SASS, a model, not a timing", flush=True)
    header = (f"{'workload':<18}{'D':>4}{'sm':>4} {'flex blocks':<16}{'reg':>4}{'spill':>6} {'flex/vp':>8}"
              f"{'flex/el':>8} {'ours/vp':>8} {'ratio':>6} {'layer':>6} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for name in args.workload.split(","):
        workload = inspection._workload(name)
        for head_dim in (int(d) for d in args.head_dim.split(",")):
            for arch in (int(a) for a in args.arch.split(",")):
                try:
                    flex = flex_case(workload, head_dim, arch)
                    ours = ours_case(name, head_dim, arch)
                except Exception as exc:  # noqa: BLE001 - one case's failure is reported, the others go on
                    print(f"{name:<18}{head_dim:>4}{arch:>4} ERROR {type(exc).__name__}: {exc}"[:200], flush=True)
                    results.append(dict(workload=name, head_dim=head_dim, arch=arch, error=str(exc)))
                    continue
                ratio = ours["per_valid_pair"] / flex["per_valid_pair"] if ours["per_valid_pair"] else None
                layer = ours["per_valid_pair_layer"]
                layer_ratio = layer / flex["per_valid_pair"] if layer else None
                b = flex["blocks"]
                blocks = f"{b['BLOCK_M1']}x{b['BLOCK_N1']}/{b['BLOCK_M2']}x{b['BLOCK_N2']}"
                at_least = ">=" if flex["lower_bound"] else ""
                print(f"{name:<18}{head_dim:>4}{arch:>4} {blocks:<16}{flex['resources']['registers']:>4}"
                      f"{flex['resources']['spill']:>6} {at_least + format(flex['per_valid_pair'], '.1f'):>8}"
                      f"{at_least + format(flex['per_element'], '.1f'):>8} {ours['per_valid_pair']:>8.1f}"
                      f" {('<=' if at_least else '') + format(ratio, '.2f'):>6} {layer:>6.1f}"
                      f" {('<=' if at_least else '') + format(layer_ratio, '.2f'):>6}", flush=True)
                results.append(dict(flex=flex, ours=ours, ratio=ratio, layer_ratio=layer_ratio))
    print("flex/vp: Flex's dQ and dK/dV loops (cheapest path) weighted by their trips over the workload's block "
          "mask, per valid pair; flex/el: the same per score element its loops compute (dQ and dK/dV added); "
          "ours/vp: the inspection's tile-weighted backward per valid pair (dQ, dK/dV, table gradient, block "
          "metadata; short-row kernels where they run); ratio: ours/vp over flex/vp; layer, ratio: ours without the "
          "block-metadata kernels (a layer after the batch's first: the structure plan keeps their tile bucket sets "
          "and lists for the batch's other layers, as Flex's block mask is built once per batch and not counted in "
          "flex/vp) and its ratio to flex/vp; '>=': rows shorter than Flex's "
          "blocks leave no loop in its compiled code, so each trip is charged the full-block loops' cost at N = 1024 "
          "(no mask, no bounds): a floor for Flex, a ceiling for the ratio; reg/spill: that kernel's")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
