"""The GPU suite's graph-replay step (benchmarks/gpu_suite.sh): CUDA graphs and ``torch.compile(mode=
"reduce-overhead")`` replay a distance-bias layer exactly with other batches, and what a layer costs the host.

    python benchmarks/gpu_checks/graph_replay.py --json RESULT.json [--dry-run]

For three batch kinds (padded sentences: the short-row kernels; N = 200 with a window: the tiled kernels and the
plan's tile lists and bucket sets; a packed batch), a layer's forward and backward (q, k, v split from [B, N, H*D]
projections, a shared table and a strength, ``nn.DistanceBias.attend`` on the batch's plan) is

1. captured in a CUDA graph after a warm-up, then replayed with two other batches of the same shapes copied into the
   captured plan (``plan.copy_``; their ``short_rows``, which picks the tiles, set to the captured batch's) and
   other inputs copied into the captured tensors: the output and every gradient must equal an eager call's bit for
   bit;
2. compiled with ``torch.compile(mode="reduce-overhead")`` and called with each batch: compared with eager (the
   largest difference is recorded; equality is required);
3. timed: the host time of an eager layer (forward and backward, the device idle: a small batch) over a bare
   autograd round trip, and the graph replay's time.

Exit status 1 when a replay differs. ``--dry-run`` (no GPU) builds the batches and checks the plan copies on CPU.
"""
import argparse
import json
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--json", required=True)
p.add_argument("--dry-run", action="store_true")
args = p.parse_args()

import torch  # noqa: E402

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.nn import DistanceBias  # noqa: E402

H, D = 12, 64


def chain(n):
    return [-1] + list(range(n - 1))


def star(n):
    return [-1] + [0] * (n - 1)


def padded(rows, N, device):
    heads = torch.full((len(rows), N), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        heads[i, :len(r)] = torch.tensor(r)
    return sk.TreeBatch.from_heads(heads, torch.tensor([len(r) for r in rows])).to(device)


def batches(kind, device):
    """Three batches of one shape class: the captured one and two others."""
    if kind == "sentences":
        N = 40
        shapes = [[chain(40), chain(23), star(31), chain(9)] * 2, [star(40), chain(7), chain(33), star(12)] * 2,
                  [chain(40), star(40), chain(1), chain(20)] * 2]
        return [padded(rows, N, device) for rows in shapes], None
    if kind == "window-200":
        N = 200
        shapes = [[chain(200), star(150)], [star(200), chain(90)], [chain(200), chain(200)]]
        return [padded(rows, N, device) for rows in shapes], 3
    lengths = [30, 12, 50, 7]  # packed: the same lengths (the shape class), other trees
    shapes = [[chain(n) for n in lengths], [star(n) for n in lengths], [chain(n) if i % 2 else star(n)
                                                                       for i, n in enumerate(lengths)]]
    return [sk.TreeBatch.from_heads(rows, packed=True).to(device) for rows in shapes], None


def make_layer(trees, window, device, dtype=torch.bfloat16):
    layer = DistanceBias(H, backend="auto").to(device)
    torch.nn.init.normal_(layer.distance_bias, std=0.5)
    if trees.is_packed:
        T = trees.num_tokens
        x = [torch.randn(T, H * D, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]
        grad = torch.randn(T, H * D, device=device, dtype=dtype)
    else:
        B, N = trees.distance.shape[:2]
        x = [torch.randn(B, N, H * D, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]
        grad = torch.randn(B, N, H * D, device=device, dtype=dtype)

    def step(batch):
        if batch.is_packed:
            T = batch.num_tokens
            q, k, v = (t.view(T, H, D) for t in x)
            out = layer.attend(q, k, v, batch, window=window)
            merged = out.reshape(T, H * D)
        else:
            B, N = batch.distance.shape[:2]
            q, k, v = (t.view(B, N, H, D).transpose(1, 2) for t in x)
            out = layer.attend(q, k, v, batch, window=window)
            merged = out.transpose(1, 2).reshape(B, N, H * D)
        grads = torch.autograd.grad(merged, x + list(layer.parameters()), grad)
        return [merged] + list(grads)
    return layer, x, grad, step


def check_graphs(kind, device):
    group, window = batches(kind, device)
    captured = group[0]
    for other in group[1:]:  # one row class for the graph (plan.short_rows picks the tiles: part of the class)
        other.short_rows = captured.short_rows
    layer, x, grad, step = make_layer(captured, window, device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: the plan derives what the layers read
        for _ in range(3):
            step(captured)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(captured)
    worst = 0.0
    equal = True
    for other in group[1:]:
        gen = torch.Generator(device=device).manual_seed(len(other.distance.shape) + other.distance.numel())
        new_x = [torch.randn(t.shape, device=device, dtype=t.dtype, generator=gen) for t in x]
        new_grad = torch.randn(grad.shape, device=device, dtype=grad.dtype, generator=gen)
        captured.copy_(other)
        with torch.no_grad():
            for t, n in zip(x, new_x):
                t.copy_(n)
            grad.copy_(new_grad)
        graph.replay()
        replayed = [t.clone() for t in static]
        eager = step(other)
        for a, b in zip(replayed, eager):
            equal &= torch.equal(a, b)
            worst = max(worst, (a.float() - b.float()).abs().max().item())
    return dict(kind=kind, graph_equal=bool(equal), graph_max_diff=worst)


def check_compiled(kind, device):
    group, window = batches(kind, device)
    layer, x, grad, step = make_layer(group[0], window, device)
    compiled = torch.compile(step, mode="reduce-overhead")
    worst, equal = 0.0, True
    for batch in group + group:  # every batch twice: compiled, then replayed
        got = [t.clone() for t in compiled(batch)]
        want = step(batch)
        for a, b in zip(got, want):
            equal &= torch.equal(a, b)
            worst = max(worst, (a.float() - b.float()).abs().max().item())
    return dict(kind=kind, compiled_equal=bool(equal), compiled_max_diff=worst)


def host_times(device):
    """Host microseconds of one eager layer (sentences, 2 rows: the device idles) and of a graph replay, and a bare
    autograd round trip, each the median of 7 rounds of 50."""
    from syntaxkernels.tools.host import bare_round_trip_us

    trees = padded([chain(40), chain(23)], 40, device)
    layer, x, grad, step = make_layer(trees, None, device)

    def timed(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        rounds = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(50):
                fn()
            rounds.append((time.perf_counter() - t) / 50 * 1e6)  # host time: launches are asynchronous
            torch.cuda.synchronize()
        return sorted(rounds)[3]

    eager = timed(lambda: step(trees))
    round_trip = bare_round_trip_us()
    return dict(eager_layer_host_us=eager, round_trip_us=round_trip, round_trips=eager / round_trip)


result = {"dry_run": args.dry_run}
failed = False
if args.dry_run or not torch.cuda.is_available():
    for kind in ("sentences", "window-200", "packed"):
        group, _ = batches(kind, "cpu")
        group[1].short_rows = group[0].short_rows
        group[0].copy_(group[1])
        assert torch.equal(group[0].distance, group[1].distance)
    result["checked"] = "batches and plan copies on CPU (no GPU)"
    failed = not args.dry_run
else:
    result["graphs"] = [check_graphs(k, "cuda") for k in ("sentences", "window-200", "packed")]
    result["compiled"] = []
    for k in ("sentences", "window-200", "packed"):
        try:
            result["compiled"].append(check_compiled(k, "cuda"))
        except Exception as exc:  # noqa: BLE001 - recorded
            result["compiled"].append(dict(kind=k, error=f"{type(exc).__name__}: {exc}"[:500]))
    result["host"] = host_times("cuda")
    failed = not all(g["graph_equal"] for g in result["graphs"]) or not all(
        c.get("compiled_equal", False) for c in result["compiled"])
json.dump(result, open(args.json, "w"), indent=1)
print(json.dumps(result, indent=1))
sys.exit(1 if failed else 0)
