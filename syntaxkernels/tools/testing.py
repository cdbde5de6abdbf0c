"""Helpers for checking a fused op against the reference: the one test framework of the pytest suite
(``python_tests/``) and of ``python -m syntaxkernels verify`` (``syntaxkernels/tools/checks/``).

The rule (one tolerance table, here): the kernel's error against a float64 reference may be at most
``factor`` (2) times the error of the same computation done by the reference in the kernel's dtype, plus a
small absolute floor per dtype for outputs that the low-precision reference happens to get exactly. The
bias-scale gradient, one scalar that sums every bucket's error, has its own rule
(:func:`compare_bias_scale_gradient`).

Shared by both: the distance-bias attention case builder (:func:`bias_attention_case`), its forward + backward
runner (:func:`bias_attention_grads`) and comparison (:func:`compare_bias_attention`), and
:func:`copy_into_torch_layer` (an encoder layer's weights into ``nn.TransformerEncoderLayer``).
"""
from __future__ import annotations

import contextlib
import os
import sys
import random
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = ["ABS_FLOOR", "error_bound", "assert_close_to_reference", "compare_to_reference", "count_host_reads",
           "HOST_READS", "GRADIENTS", "bias_attention_case", "bias_attention_grads", "compare_bias_scale_gradient",
           "compare_bias_attention", "assert_bias_attention_close", "copy_into_torch_layer", "wordpiece_tokenizer"]

ABS_FLOOR: Dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 2e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def error_bound(ref_lowp: torch.Tensor, ref_fp64: torch.Tensor, dtype: torch.dtype, factor: float = 2.0) -> float:
    """``factor * max|ref_lowp - ref_fp64| + ABS_FLOOR[dtype]`` (scaled by the reference's magnitude)."""
    base = (ref_lowp.detach().double() - ref_fp64.detach().double()).abs().max().item() if ref_fp64.numel() else 0.0
    magnitude = max(1.0, ref_fp64.detach().abs().max().item()) if ref_fp64.numel() else 1.0
    return factor * base + ABS_FLOOR[dtype] * magnitude


def compare_to_reference(actual: torch.Tensor, ref_fp64: torch.Tensor, ref_lowp: torch.Tensor,
                         factor: float = 2.0):
    """``(ok, error, bound)`` for one tensor."""
    if actual.shape != ref_fp64.shape:
        return False, float("inf"), 0.0
    if not torch.isfinite(actual.detach()).all():
        return False, float("nan"), 0.0
    err = (actual.detach().double() - ref_fp64.detach().double()).abs().max().item() if actual.numel() else 0.0
    bound = error_bound(ref_lowp, ref_fp64, actual.dtype, factor)
    return err <= bound, err, bound


def assert_close_to_reference(actual: torch.Tensor, ref_fp64: torch.Tensor, ref_lowp: torch.Tensor, name: str = "",
                              factor: float = 2.0) -> None:
    """Raise ``AssertionError`` naming ``name`` when ``actual`` is further from the fp64 reference than allowed."""
    ok, err, bound = compare_to_reference(actual, ref_fp64, ref_lowp, factor)
    if not ok:
        raise AssertionError(f"{name}: max abs error {err:.3e} > bound {bound:.3e} (dtype {actual.dtype}, shape "
                             f"{tuple(actual.shape)})")


#: Tensor methods that read a value back to the host (a device synchronisation on a GPU tensor).
HOST_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "numpy", "cpu")


@contextlib.contextmanager
def count_host_reads() -> Iterator[List[str]]:
    """Record every host read (:data:`HOST_READS`) that the package's runtime code (not its tools) makes inside the block.

    Yields a list that fills with ``"method at file:line"`` entries; reads made by other code (tests, Triton's
    interpreter, PyTorch) are not recorded. On a GPU each recorded read would stall the stream and break
    CUDA-graph capture, so a valid call of a fused op should record none.
    """
    tools = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(tools)  # the runtime: syntaxkernels/ without its tools (this file among them)
    reads: List[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name, original):
        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            filename = os.path.abspath(frame.f_code.co_filename)
            if filename.startswith(package + os.sep) and not filename.startswith(tools + os.sep):
                reads.append(f"{name} at {os.path.relpath(filename, package)}:{frame.f_lineno}")
            return original(self, *args, **kwargs)
        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# ------------------------------------------------------------------------------ distance-bias attention cases

#: Names of the gradients :func:`bias_attention_grads` returns, in the order of the op's differentiable inputs.
GRADIENTS = ("dq", "dk", "dv", "dtable", "dbias_scale")

#: Largest mismatch of ``c * dscale == sum(table * dtable)``, relative (see :func:`compare_bias_scale_gradient`).
IDENTITY_RTOL = 1e-5

#: Relative floor of the half-precision bias-scale gradient bound (of ``|dscale|`` in float64).
SCALE_FLOOR = 1e-4

#: Floor of the float32 table gradient's error per bucket, relative to ``max(1, max |dtable_fp64|)``. A bucket sums up
#: to ``B * H * N^2`` terms, and the float32 reference's own error on one bucket varies by more than 10x with its
#: summation order, which changes from run to run (autograd's index accumulation runs on threads): 4.6e-6 to 9.0e-5 in
#: four runs of one call (N = 512, B = 4, H = 8), where the C++ kernels' fixed order gives 4.1e-5. The rule's "twice the
#: reference's error" taken from a lucky run is then tighter than float32 summation allows.
TABLE_FLOOR = 1e-4


def bias_attention_case(B: int, H: int, N: int, D: int, dtype: torch.dtype = torch.float32, *,
                        Dv: Optional[int] = None, lengths: Optional[Sequence[int]] = None, per_head: bool = False,
                        buckets=None, seed: int = 0, roots: int = 2, heads: Optional[Sequence[Sequence[int]]] = None,
                        isolated: Sequence[Tuple[int, int]] = (), bias_scale: float = 0.9,
                        kv_heads: Optional[int] = None) -> dict:
    """The inputs of one distance-bias attention call (CPU tensors, float32), the same for every seed.

    Trees: the given ``heads`` rows (one list of 0-based heads per item, ``-1`` a root), else ``roots`` random
    trees per item (:func:`syntaxkernels.tools.workloads.random_forest` drawing from ``random.Random(seed)``).
    ``isolated``: ``(b, i)`` tokens made unreachable from every token, themselves included (with a window their
    query rows have no allowed key). Then q, k, v, table are drawn in that order from a ``torch.Generator``
    seeded with ``seed``.

    Returns a dict:

    - ``q``, ``k`` ``[B, H, N, D]``, ``v`` ``[B, H, N, Dv]`` (``Dv`` defaults to ``D``): standard normal; with
      ``kv_heads`` k and v have that many heads (grouped-query attention);
    - ``distance`` uint8 ``[B, N, N]``: the trees' distances, 255 (unreachable) past each item's length;
    - ``lengths`` int64 ``[B]`` (default ``N`` each);
    - ``table`` ``[T]``, or ``[H, T]`` with ``per_head``: standard normal, ``T = buckets.num_buckets``;
    - ``bias_scale`` float32 ``[1]``: the bias strength c;
    - ``buckets``: the ``BucketSpec`` (default ``BucketSpec()``);
    - ``dtype``: the dtype the case is meant to run in (the caller casts; nothing here is in it).
    """
    import syntaxkernels as sk
    from .workloads import random_forest

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lengths = [N] * B if lengths is None else list(lengths)
    if heads is None:
        heads = [random_forest(rng, L, num_trees=roots) if L else [] for L in lengths]
    buckets = buckets or sk.BucketSpec()
    distance = torch.full((B, N, N), 255, dtype=torch.uint8)
    if N and any(lengths):
        built = sk.tree_distance(heads, torch.tensor(lengths))
        distance[:, :built.shape[-1], :built.shape[-1]] = built
    for b, i in isolated:
        distance[b, i, :] = 255
        distance[b, :, i] = 255
    H_kv = H if kv_heads is None else kv_heads
    q = torch.randn(B, H, N, D, generator=gen)
    k = torch.randn(B, H_kv, N, D, generator=gen)
    v = torch.randn(B, H_kv, N, Dv or D, generator=gen)
    T = buckets.num_buckets
    table = torch.randn((H, T) if per_head else (T,), generator=gen)
    return dict(q=q, k=k, v=v, distance=distance, table=table, bias_scale=torch.tensor([bias_scale]),
                lengths=torch.tensor(lengths), buckets=buckets, dtype=dtype)


def bias_attention_grads(op: Callable, case: dict, dtype: torch.dtype, grad_out: torch.Tensor, device="cpu",
                         **kw) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """One forward and backward of ``op`` on ``case`` (:func:`bias_attention_case`): ``(out, grads)``.

    ``op`` takes the arguments of :func:`syntaxkernels.syntax_bias_attention` (``q, k, v, distance, table``,
    ``buckets=``, ``bias_scale=``, ``lengths=`` and ``**kw``); q, k, v go in ``dtype`` and the table and bias scale
    in float32 (float64 when ``dtype`` is float64), all on ``device``. ``grad_out`` ``[B, H, N, Dv]`` is the
    output's gradient. ``out`` ``[B, H, N, Dv]``; ``grads`` maps :data:`GRADIENTS` to the gradients of q, k, v
    (their shapes, ``dtype``), the table (its shape) and the bias scale (``[1]``).
    """
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (case[n].to(device, dtype).detach().requires_grad_() for n in ("q", "k", "v"))
    table = case["table"].to(device, pdtype).detach().requires_grad_()
    c = case["bias_scale"].to(device, pdtype).detach().requires_grad_()
    out = op(q, k, v, case["distance"].to(device), table, buckets=case["buckets"], bias_scale=c,
             lengths=case["lengths"].to(device), **kw)
    grads = torch.autograd.grad(out, (q, k, v, table, c), grad_out.to(device, dtype))
    return out, dict(zip(GRADIENTS, grads))


def compare_bias_scale_gradient(dscale: torch.Tensor, dtable: torch.Tensor, table: torch.Tensor, bias_scale: float,
                                ref_fp64: Tuple[torch.Tensor, torch.Tensor],
                                ref_lowp: Tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype,
                                factor: float = 2.0) -> Tuple[bool, float, float, float]:
    """``(ok, err, bound, mismatch)`` for the bias-scale gradient ``dscale`` (one scalar, ``[1]``).

    ``dtable`` is the same run's table gradient and ``table`` the table (both ``[T]`` or ``[H, T]``),
    ``bias_scale`` the strength c, ``dtype`` that of q, k, v; ``ref_fp64`` and ``ref_lowp`` are the reference's
    ``(dscale, dtable)`` computed in float64 and in ``dtype``. With ``s_ij = q_i.k_j * scale + c *
    table[bucket(d_ij)]`` and ``G[t]`` the sum of dS over the pairs in bucket t: ``dtable = c * G`` and
    ``dscale = sum_t table[t] * G[t]``. ``ok`` needs both:

    1. **Identity**: ``c * dscale`` equals ``S = sum(table * dtable)`` of the same run up to rounding,
       ``|c * dscale - S| <= IDENTITY_RTOL * min(sum |table * dtable|, |c| + |S|)``: the first term is the scale
       of the sum's rounding (it has no cancellation), the second that of ``dscale`` itself. A scale gradient
       that is missing, zero, of the wrong sign, scaled or computed from other sums fails.
       ``mismatch = |c * dscale - S| / sum |table * dtable|``.
    2. **Error**: ``err = |dscale - dscale_fp64| <= bound``. The plain rule on the one scalar is a coin toss: the
       reference's own scalar in ``dtype`` can be right by luck (its bucket errors cancel), and a kernel that sums
       in another order is then "wrong" by an error no bucket has (seen in fp32 at N = 512). The bound is
       ``factor`` times the error the reference's per-bucket errors give when none cancels,
       ``propagated = factor * sum |table| * |dtable_lowp - dtable_fp64| / |c|``: in fp16 and bf16 plus
       ``SCALE_FLOOR`` of the value (``propagated + SCALE_FLOOR * |dscale_fp64|``), in float32 and float64 at
       least the plain rule (``max(error_bound(dscale_lowp, dscale_fp64, dtype, factor), propagated)``, the
       plain rule's floor serving where the reference's bucket errors are all zero).
    """
    c = float(bias_scale)
    t = table.detach().double().cpu()
    got_t = dtable.detach().double().cpu()
    got_c = dscale.detach().double().cpu().reshape(())
    ref_c, ref_t = (x.detach().double().cpu() for x in ref_fp64)
    low_c, low_t = (x.detach().double().cpu() for x in ref_lowp)
    products = t * got_t
    total, magnitude = products.sum().item(), products.abs().sum().item()
    gap = abs(c * got_c.item() - total)
    mismatch = gap / max(magnitude, 1e-30)
    identity = gap <= IDENTITY_RTOL * min(magnitude, abs(c) + abs(total))
    err = abs(got_c.item() - ref_c.reshape(()).item())
    propagated = factor * (t.abs() * (low_t - ref_t).abs()).sum().item() / abs(c)
    if dtype in (torch.float16, torch.bfloat16):
        bound = propagated + SCALE_FLOOR * abs(ref_c.reshape(()).item())
    else:
        bound = max(error_bound(low_c, ref_c, dtype, factor), propagated)
    ok = identity and err <= bound and bool(torch.isfinite(got_c))
    return ok, err, bound, mismatch


def compare_bias_attention(case: dict, got, ref_fp64, ref_lowp, dtype: torch.dtype, factor: float = 2.0):
    """Rows ``(name, ok, err, bound, mismatch)`` for the output and each of :data:`GRADIENTS` of one run.

    ``got``, ``ref_fp64`` and ``ref_lowp`` are ``(out, grads)`` as :func:`bias_attention_grads` returns them, for
    the op under test in ``dtype`` and the reference in float64 and in ``dtype``. Every tensor but the bias-scale
    gradient by :func:`compare_to_reference` (``mismatch`` None); ``dbias_scale`` by
    :func:`compare_bias_scale_gradient` with ``case``'s table and bias scale.
    """
    runs = [dict(run[1], out=run[0]) for run in (got, ref_fp64, ref_lowp)]
    if dtype == torch.float32:  # (a float32 bucket sum's error depends on its order: TABLE_FLOOR)
        runs[2]["dtable"] = _table_floor(runs[2]["dtable"], runs[1]["dtable"])
    rows = []
    for name in ("out",) + GRADIENTS:
        if name == "dbias_scale":
            rows.append((name, *compare_bias_scale_gradient(
                runs[0][name], runs[0]["dtable"], case["table"], case["bias_scale"],
                (runs[1][name], runs[1]["dtable"]), (runs[2][name], runs[2]["dtable"]), dtype, factor)))
        else:
            rows.append((name, *compare_to_reference(*(r[name] for r in runs), factor), None))
    return rows


def _table_floor(low: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The float32 reference's table gradient with every bucket's error at least :data:`TABLE_FLOOR` (of
    ``max(1, max |ref|)``), in its own direction: the error a float32 bucket sum has in a typical summation order,
    which the bounds of ``dtable`` and (through the per-bucket errors) ``dscale`` are then taken from."""
    low64, ref64 = low.detach().double(), ref.detach().double()
    floor = TABLE_FLOOR * max(1.0, ref64.abs().max().item()) if ref64.numel() else 0.0
    error = low64 - ref64
    widened = torch.where(error.abs() < floor, torch.where(error < 0, -floor, floor), error)
    return ref64 + widened


def assert_bias_attention_close(case: dict, got, ref_fp64, ref_lowp, dtype: torch.dtype) -> None:
    """Raise ``AssertionError`` naming the first of :func:`compare_bias_attention`'s rows that fails."""
    for name, ok, err, bound, mismatch in compare_bias_attention(case, got, ref_fp64, ref_lowp, dtype):
        if not ok:
            identity = "" if mismatch is None else f"; c * dscale vs sum(table * dtable): {mismatch:.1e}"
            raise AssertionError(f"{name}: max abs error {err:.3e} > bound {bound:.3e}{identity} (dtype {dtype})")


# ---------------------------------------------------------------------------------------- encoder layers


def copy_into_torch_layer(ours, theirs) -> None:
    """Copy a ``SyntaxTransformerEncoderLayer``'s weights into a ``torch.nn.TransformerEncoderLayer`` of the same
    sizes: q, k, v projections ``[E, E]`` each (and biases ``[E]``) stacked into ``in_proj_weight [3E, E]``
    (``in_proj_bias [3E]``); ``out_proj``, ``linear1``, ``linear2``, ``norm1``, ``norm2`` as they are."""
    attn = ours.self_attn
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        theirs.self_attn.out_proj.load_state_dict(attn.out_proj.state_dict())
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(theirs, name).load_state_dict(getattr(ours, name).state_dict())


def wordpiece_tokenizer(texts: Sequence[str], folder, vocab_size: int, min_frequency: int = 1):
    """A fast BERT WordPiece tokenizer (lowercase, ``[CLS]``/``[SEP]``/``[PAD]``/``[UNK]``) trained on ``texts`` and
    saved in ``folder``: the treebank tests' and the miniature experiments' tokenizer (needs ``tokenizers`` and
    ``transformers``)."""
    import pathlib

    import tokenizers
    import transformers

    path = pathlib.Path(folder) / "tok.json"
    wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=min_frequency)
    wordpiece.save(str(path))
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), cls_token="[CLS]", sep_token="[SEP]",
                                                pad_token="[PAD]", unk_token="[UNK]")
