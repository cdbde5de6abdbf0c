"""The package imports and works without Triton and without the C++ extension; the CLI runs and says what it
checks; verify's checks can fail."""
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def blocking(*modules):
    """Python code that makes importing any of ``modules`` (and their submodules) fail, as if not installed."""
    return textwrap.dedent(
        f"""
        import importlib.abc, sys
        class _Missing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {modules!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, _Missing())
        """
    )


BLOCK_TRITON = blocking("triton")


def _run(code, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.long_on_cpu
def test_import_without_triton_warns_and_runs_the_cpp_kernels_or_the_reference():
    code = BLOCK_TRITON + textwrap.dedent(
        """
        import warnings, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import syntaxkernels as sk
            sk.syntax_bias_attention  # the ops load on first use, and say once that Triton is missing
        assert any("triton" in str(w.message) for w in caught), [str(w.message) for w in caught]
        trees = sk.TreeBatch.from_heads([[1, -1, 1], [-1, 0]])
        q = torch.randn(2, 2, 3, 8)
        table = torch.randn(sk.BucketSpec().num_buckets)
        out = sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), lengths=trees.lengths)
        ref = sk.reference.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(),
                                                 lengths=trees.lengths)
        # float32 on CPU: the C++ kernels, as with Triton (float64 and inputs they do not take: the reference)
        from syntaxkernels import _ext
        assert sk.ops.bias_attention.implementation(q, q) == ("cpp" if _ext.available() else "reference")
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
        assert torch.equal(sk.syntax_bias_attention(q.double(), q.double(), q.double(), trees.distance, table.double(),
                                                    buckets=sk.BucketSpec(), lengths=trees.lengths),
                           sk.reference.syntax_bias_attention(q.double(), q.double(), q.double(), trees.distance,
                                                              table.double(), buckets=sk.BucketSpec(),
                                                              lengths=trees.lengths))
        out, nonempty = sk.syntax_subnetwork_attention(q, q, q, trees, sk.MaskSpec())
        assert out.shape == (2, sk.MaskSpec().num_masks, 2, 3, 8)
        try:
            sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), lengths=trees.lengths,
                                     backend="triton")
        except RuntimeError as exc:
            assert "triton" in str(exc)
        else:
            raise AssertionError("backend='triton' without triton must raise")
        try:  # the same validation as with Triton
            sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), deterministic="yes")
        except ValueError as exc:
            assert "deterministic" in str(exc)
        else:
            raise AssertionError("deterministic='yes' must raise without triton too")
        print("OK")
        """
    )
    result = _run(code)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr


@pytest.mark.long_on_cpu
def test_packed_calls_without_triton_match_the_padded_reference():
    """Without Triton, packed batches (cu_seqlens, a PackedTreeBatch) still work: the bias op, the sub-networks and
    the window attention equal the reference on the same sequences padded, with gradients; "triton" raises."""
    code = BLOCK_TRITON + textwrap.dedent(
        """
        import warnings, torch
        warnings.simplefilter("ignore")
        import syntaxkernels as sk
        from syntaxkernels.trees import PackedTreeBatch
        import sys
        rows = [[1, -1, 1, 2], [-1], [-1, 0, 0, 1, 1, 2]]
        packed = PackedTreeBatch.from_heads(rows)
        padded = sk.TreeBatch.from_heads(rows)
        seq, pos = packed.sequence.long(), packed.positions.long()
        torch.manual_seed(0)
        T, H, D, N = packed.num_tokens, 2, 8, padded.distance.shape[1]
        q, k, v = (torch.randn(T, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
        buckets = sk.BucketSpec()
        table = torch.randn(buckets.num_buckets, dtype=torch.float64, requires_grad=True)

        def lay_out(x):  # [T, H, D] -> [S, H, N, D], zeros past each length
            y = x.new_zeros((len(rows), N) + tuple(x.shape[1:]))
            return y.index_put((seq, pos), x).transpose(1, 2)

        for kw in (dict(), dict(window=2, causal=True)):
            out = sk.syntax_bias_attention(q, k, v, packed.distance, table, buckets=buckets,
                                           cu_seqlens=packed.cu_seqlens, **kw)
            ref = sk.reference.syntax_bias_attention(lay_out(q), lay_out(k), lay_out(v), padded.distance, table,
                                                     buckets=buckets, lengths=padded.lengths, **kw)
            ref = ref.transpose(1, 2)[seq, pos]
            assert out.shape == (T, H, D) and torch.allclose(out, ref, atol=1e-12), (out - ref).abs().max()
            g = torch.randn_like(out)
            got = torch.autograd.grad(out, (q, k, v, table), g)
            want = torch.autograd.grad(ref, (q, k, v, table), g)
            assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want)), kw
        out, nonempty = sk.syntax_subnetwork_attention(q, k, v, packed, sk.MaskSpec())
        ref, ref_nonempty = sk.reference.syntax_subnetwork_attention(lay_out(q), lay_out(k), lay_out(v), padded,
                                                                     sk.MaskSpec())
        assert torch.allclose(out, ref.permute(0, 3, 1, 2, 4)[seq, pos], atol=1e-12)
        assert torch.equal(nonempty, ref_nonempty.transpose(1, 2)[seq, pos])
        out = sk.ops.syntax_window_attention(q.float(), k.float(), v.float(), packed, window=1)
        ref = sk.reference.gat_attention(lay_out(q), lay_out(k), lay_out(v), padded.distance, window=1,
                                         lengths=padded.lengths).transpose(1, 2)[seq, pos]
        assert torch.allclose(out.double(), ref, atol=1e-5), (out.double() - ref).abs().max()
        for call in (lambda: sk.syntax_bias_attention(q, k, v, packed.distance, table, buckets=buckets,
                                                      cu_seqlens=packed.cu_seqlens, backend="triton"),
                     lambda: sk.syntax_subnetwork_attention(q, k, v, packed, sk.MaskSpec(), backend="triton")):
            try:
                call()
            except RuntimeError as exc:
                assert "triton" in str(exc)
            else:
                raise AssertionError("backend='triton' without triton must raise")
        try:  # the packed checks hold without triton too
            sk.syntax_bias_attention(q, k, v, packed.distance[:-1], table, buckets=buckets,
                                     cu_seqlens=packed.cu_seqlens)
        except ValueError as exc:
            assert "sum n_s^2" in str(exc)
        else:
            raise AssertionError("a short packed distance must raise")
        assert "triton" not in sys.modules
        print("OK")
        """
    )
    result = _run(code)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr


@pytest.mark.long_on_cpu
def test_without_triton_each_op_runs_its_cpp_path_and_info_says_so():
    """Without Triton every op still runs what it runs with Triton on CPU tensors: the sub-network op (relation
    masks and dense masks) takes the C++ edge kernels and the SDPA CPU kernel, not the reference; each op's
    ``implementation`` says so, and ``info`` reports what runs (asked from those functions)."""
    from syntaxkernels import _ext

    if not (_ext.available() and hasattr(_ext.load(), "edge_attention_forward")):
        pytest.skip("the C++ extension is not built")
    code = BLOCK_TRITON + textwrap.dedent(
        """
        import warnings, torch
        warnings.simplefilter("ignore")
        import syntaxkernels as sk
        from syntaxkernels import reference
        from syntaxkernels.__main__ import _backends
        from syntaxkernels.ops import subnetwork_attention
        trees = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0]])
        q, k, v = (torch.randn(2, 2, 4, 8, requires_grad=True) for _ in range(3))
        for name, implementation in sk.ops.IMPLEMENTATION.items():
            assert implementation(q, v) == "cpp", name
            assert implementation(q.double(), v.double()) == ("reference" if name == "syntax_bias_attention"
                                                              else "cpp"), name
        want, want_flags = reference.syntax_subnetwork_attention(q, k, v, trees, sk.MaskSpec())
        ran = []
        real = subnetwork_attention._SubnetworkCPU.apply
        subnetwork_attention._SubnetworkCPU.apply = lambda *a: ran.append(1) or real(*a)
        reference.syntax_subnetwork_attention = None  # the reference must not run
        out, flags = sk.syntax_subnetwork_attention(q, k, v, trees, sk.MaskSpec())
        assert ran == [1]
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(flags, want_flags)
        out.sum().backward()
        assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
        rows = {name: (cpu, gpu) for name, cpu, gpu in _backends(torch, False)}
        for name in sk.ops.__all__:
            assert rows[name][0].startswith("C++ kernels"), rows[name]
        print("OK")
        """
    )
    result = _run(code)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr


@pytest.mark.long_on_cpu
def test_cli_info_and_verify(tmp_path):
    result = _run("import sys; from syntaxkernels.__main__ import main; sys.exit(main(['info']))")
    assert result.returncode == 0, result.stderr
    for key in ("torch", "C++ extension", "OS", "CPU", "C++ compiler", "CUDA", "treebank",
                "syntax_bias_attention", "syntax_subnetwork_attention", "tree_distance"):
        assert key in result.stdout, (key, result.stdout)
    from syntaxkernels import _ext

    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip().startswith("syntax_")}
    for op in ("syntax_bias_attention", "syntax_subnetwork_attention", "syntax_window_attention"):  # C++ on CPU
        assert ("C++ kernels" if _ext.available() else "PyTorch reference") in rows[op], rows[op]
    assert all(len(line) <= 100 for line in result.stdout.splitlines()), result.stdout
    out = tmp_path / "verify.json"
    result = subprocess.run([sys.executable, "-m", "syntaxkernels", "verify", "--select", "tree", "--json", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["results"]
    assert rows and all(r["status"] in ("pass", "skip") for r in rows)
    assert any(r["status"] == "pass" for r in rows)
    # progress on stderr, one line per check; the table and the legend fit 100 columns
    assert sum(line.startswith("[") for line in result.stderr.splitlines()) == len(rows), result.stderr
    assert all(len(line) <= 100 for line in result.stdout.splitlines()), result.stdout
    assert "passed" in result.stdout
    assert "err/bound" not in result.stdout  # no bias check ran: no legend of the bias checks' figures


def test_cli_verify_fails_on_mismatch(monkeypatch):
    from syntaxkernels.tools import checks
    from syntaxkernels.tools.checks import Check

    class Fake:
        CHECKS = [Check("always-wrong", lambda device: (False, "planted mismatch"))]

    monkeypatch.setattr(checks, "_modules", lambda: iter([("fake", Fake, None)]))
    from syntaxkernels.__main__ import main

    assert main(["verify", "--device", "cpu", "--no-interpret"]) == 1


def test_cli_verify_table_wraps_details_without_cutting_figures(monkeypatch, capsys):
    from syntaxkernels.tools import checks
    from syntaxkernels.tools.checks import Check

    detail = ", ".join(f"d{i} {i}.123456e-02/{i}.654321e-01" for i in range(12))

    class Fake:
        CHECKS = [Check("a check with a long detail", lambda device: (True, detail))]

    monkeypatch.setattr(checks, "_modules", lambda: iter([("fake", Fake, None)]))
    from syntaxkernels.__main__ import main

    assert main(["verify", "--device", "cpu", "--no-interpret"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines())
    for i in range(12):  # every figure whole, on some line
        assert f"d{i} {i}.123456e-02/{i}.654321e-01" in out


def test_cli_verify_prints_the_bias_legend_only_when_a_bias_check_ran(monkeypatch, capsys):
    from syntaxkernels.tools import checks
    from syntaxkernels.tools.checks import Check

    def fake(names):
        class Fake:
            CHECKS = [Check(name, lambda device: (True, "out 1.0e-03/2.0e-03")) for name in names]
        monkeypatch.setattr(checks, "_modules", lambda: iter([("fake", Fake, None)]))

    from syntaxkernels.__main__ import main

    fake(["trees: something"])
    assert main(["verify", "--device", "cpu", "--no-interpret"]) == 0
    assert "err/bound" not in capsys.readouterr().out
    fake(["trees: something", "bias_attention.fake"])
    assert main(["verify", "--device", "cpu", "--no-interpret"]) == 0
    assert "err/bound" in capsys.readouterr().out


def test_cli_select_matching_nothing_says_so(capsys):
    from syntaxkernels.__main__ import main

    assert main(["verify", "--select", "no-such-check", "--no-interpret"]) == 2
    err = capsys.readouterr().err
    assert "no check matches --select 'no-such-check'" in err and "bias_attention" in err
    assert main(["bench", "--select", "no-such-bench"]) == 2
    assert "no benchmark matches" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the behaviour without CUDA")
@pytest.mark.parametrize("command", ["verify", "bench"])
def test_cli_cuda_without_cuda_is_one_line(command, capsys):
    from syntaxkernels.__main__ import main

    assert main([command, "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "CUDA is not available" in captured.err


def test_cli_rejects_an_unknown_device(capsys):
    from syntaxkernels.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["verify", "--device", "gpu"])
    assert exc.value.code == 2 and "expected cpu, cuda or cuda:N" in capsys.readouterr().err


def test_cli_help_needs_neither_torch_nor_triton():
    """The command line is parsed before torch or Triton is imported (here they cannot be)."""
    code = blocking("torch", "triton", "numpy") + textwrap.dedent(
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("cli", {os.path.join(ROOT, "syntaxkernels", "__main__.py")!r})
        cli = sys.modules["cli"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cli)
        for argv in (["--help"], ["verify", "--help"], ["bench", "--help"], ["info", "--help"], ["inspect", "--help"]):
            try:
                cli.build_parser().parse_args(argv)
            except SystemExit as exc:
                assert exc.code == 0, argv
        print("OK")
        """
    )
    result = _run(code)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
    assert "usage: python -m syntaxkernels verify" in result.stdout
    assert "usage: python -m syntaxkernels inspect" in result.stdout


def test_package_import_and_cli_help_are_fast():
    """``import syntaxkernels`` loads nothing heavy (names load on first use), so ``python -m syntaxkernels --help``
    answers without importing torch or Triton."""
    import subprocess

    code = "import sys, syntaxkernels; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
    result = subprocess.run([sys.executable, "-m", "syntaxkernels", "--help"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0 and "inspect" in result.stdout, result.stderr


@pytest.mark.parametrize("block_scipy", [False, True], ids=["with-scipy", "without-scipy"])
@pytest.mark.long_on_cpu
def test_cli_bench_runs(block_scipy, tmp_path):
    """``bench`` runs to the end on a fresh install: without scipy its rows say why they are missing."""
    out = tmp_path / "bench.json"
    code = (blocking("scipy") if block_scipy else "") + textwrap.dedent(
        f"""
        import sys
        from syntaxkernels.__main__ import main
        sys.exit(main(["bench", "--select", "tree_distance", "--json", {str(out)!r}]))
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    timed = [r for r in rows if "batch_ms" in r]
    assert timed and all(r["pairs_per_s"] > 0 for r in timed)
    # it says how big the batches it times are
    assert all(re.match(r"\d+ batches of 32 sentences \(padded to N = \d+-\d+ tokens", r["timed"]) for r in timed)
    assert "timed: " in result.stdout and " batches of 32 sentences" in result.stdout
    for note in (r for r in rows if "note" in r):  # a multi-threaded row slower than 1 thread says why
        assert note["provider"].startswith("C++, ") and "starts its threads on every call" in note["note"]
        assert f"{note['provider']}: note: not faster than 1 thread" in result.stdout
    scipy_row = next(r for r in rows if r.get("provider") == "scipy shortest_path")
    if block_scipy:
        assert "scipy is not installed" in scipy_row["skipped"] and "skipped: scipy is not installed" in result.stdout
        assert not any("vs_scipy" in r for r in timed) and "vs_scipy" not in result.stdout
    else:
        assert scipy_row["vs_scipy"] == 1.0 and all(r["vs_scipy"] > 0 for r in timed)


def test_bench_reports_a_missing_optional_module_and_keeps_going(monkeypatch):
    from syntaxkernels.tools import checks
    from syntaxkernels.tools.checks import Bench

    def needs_missing():
        raise ModuleNotFoundError("No module named 'networkx'", name="networkx")

    class Fake:
        BENCHES = [Bench("needs networkx", lambda device, quick: needs_missing()),
                   Bench("broken", lambda device, quick: 1 / 0),
                   Bench("fine", lambda device, quick: [dict(provider="x", ms=1.0)])]

    monkeypatch.setattr(checks, "_modules", lambda: iter([("fake", Fake, None)]))
    rows = checks.run_benches("cpu", quick=True)
    assert rows[0] == dict(bench="needs networkx", skipped=rows[0]["skipped"]) and "networkx is not installed" in \
        rows[0]["skipped"]
    assert "ZeroDivisionError" in rows[1]["error"]
    assert rows[2] == dict(bench="fine", provider="x", ms=1.0)


# ------------------------------------------------------------------------------------ verify's checks can fail


def test_bias_scale_gradient_is_checked():
    """A missing, zero, wrongly signed or wrongly scaled bias-scale gradient fails the comparison."""
    from syntaxkernels.tools.checks import bias_attention as check

    inp = check._inputs("cpu", 2, 2, 9, 8, torch.float32, lengths=[9, 5])
    grad_out = torch.randn(2, 2, 9, 8, generator=torch.Generator().manual_seed(1))
    got = check._grads(inp, torch.float32, "reference", grad_out)
    assert got[5].abs().item() > 0
    ok, detail = check._against_reference(inp, torch.float32, grad_out, got)
    assert ok and "dscale" in detail, detail
    for wrong in (torch.zeros_like(got[5]), -got[5], 1.01 * got[5]):
        ok, detail = check._against_reference(inp, torch.float32, grad_out, got[:5] + [wrong])
        assert not ok and "dscale" in detail and "FAIL" in detail, detail


@pytest.mark.long_on_cpu
def test_no_undefined_names_in_code_that_runs_only_on_a_gpu():
    """Static check of every Python file of the package, its benchmarks and tests: no undefined name. Code that
    runs only with CUDA (timing benches, GPU branches) never executes on a CPU machine, so a name left behind by
    a refactor would otherwise surface first on a GPU host."""
    pytest.importorskip("pyflakes", reason="pyflakes is in the [test] extra")
    from pyflakes import api, messages, reporter

    class Collect(reporter.Reporter):
        def __init__(self):
            super().__init__(None, None)
            self.found = []

        def flake(self, message):
            if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)):
                self.found.append(str(message))

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.found.append(f"{filename}:{lineno}: {msg}")

        def unexpectedError(self, filename, msg):
            self.found.append(f"{filename}: {msg}")

    collect = Collect()
    for folder in ("syntaxkernels", "benchmarks", "python_tests"):
        api.checkRecursive([os.path.join(ROOT, folder)], collect)
    assert not collect.found, "\n".join(collect.found)


def _once_ms(fn):
    import time

    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.long_on_cpu
def test_timing_benches_check_each_size_before_timing_it(monkeypatch):
    """The GPU timing benches run (here at toy sizes, on the kernel device) and time only what agrees with the
    reference: a wrong kernel raises instead of giving a row."""
    import syntaxkernels as sk
    from conftest import KERNEL_DEVICE
    from syntaxkernels.tools import workloads
    from syntaxkernels.tools.checks import bias_attention as bias_check
    from syntaxkernels.tools.checks import subnetwork_attention as subnet_check

    rows = bias_check.time_rows(KERNEL_DEVICE, [24], _once_ms, heads=1, dim=16, tokens=48)
    assert [r["backend"] for r in rows] == ["triton", "reference"] and all(r["fwd_bwd_ms"] > 0 for r in rows)
    sentences = workloads.generated_sentences(20, max_length=9)
    rows = subnet_check.time_rows(KERNEL_DEVICE, sentences, [32], _once_ms, heads=1, dim=16, tokens=64)
    assert [r["provider"] for r in rows] == ["syntaxkernels", "reference"] and rows[0]["batch"] == 2

    real_grads = bias_check._grads

    def off_by_a_lot(inp, dtype, backend, grad_out, **kw):
        out = real_grads(inp, dtype, backend, grad_out, **kw)
        return [out[0] * 1.1, *out[1:]] if backend == "triton" else out

    monkeypatch.setattr(bias_check, "_grads", off_by_a_lot)
    with pytest.raises(RuntimeError, match="not timed"):
        bias_check.time_rows(KERNEL_DEVICE, [24], _once_ms, heads=1, dim=16, tokens=48)
    real_op = sk.syntax_subnetwork_attention
    monkeypatch.setattr(sk, "syntax_subnetwork_attention",
                        lambda *a, **kw: (lambda out, flags: (out * 1.1, flags))(*real_op(*a, **kw)))
    with pytest.raises(RuntimeError, match="not timed"):
        subnet_check.time_rows(KERNEL_DEVICE, sentences, [32], _once_ms, heads=1, dim=16, tokens=64)


triton_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                        reason="program order matters only under TRITON_INTERPRET=1")


@triton_interpreter
def test_shuffled_program_order_runs_every_program_once_in_another_order():
    import triton
    import triton.language as tl

    from syntaxkernels.tools.checks import shuffled_program_order

    @triton.jit
    def arrival(COUNTER, ORDER, TOTAL, BLOCK: tl.constexpr):
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        tl.store(ORDER + pid, tl.atomic_add(COUNTER, 1))
        offs = tl.arange(0, BLOCK)
        tl.atomic_add(TOTAL + offs * 0, tl.load(ORDER + pid + offs * 0), mask=offs < 1)

    def run(seed=None):
        counter = torch.zeros(1, dtype=torch.int32)
        order = torch.full((6 * 5,), -1, dtype=torch.int32)
        total = torch.zeros(1, dtype=torch.int32)
        if seed is None:
            arrival[(6, 5)](counter, order, total, BLOCK=2)
        else:
            with shuffled_program_order(seed):
                arrival[(6, 5)](counter, order, total, BLOCK=2)
        return order

    natural = run()
    assert natural.tolist() == list(range(30))
    shuffled = [run(seed) for seed in (1, 2)]
    for order in shuffled:
        assert sorted(order.tolist()) == list(range(30))  # every program ran exactly once
        assert order.tolist() != list(range(30))
    assert shuffled[0].tolist() != shuffled[1].tolist()
    assert run().tolist() == list(range(30))  # back to index order after the context


@triton_interpreter
def test_shuffled_order_exposes_an_order_dependent_float_sum():
    """The determinism check's means: float atomics summed in program order give other bits in another order."""
    import triton
    import triton.language as tl

    from syntaxkernels.tools.checks import shuffled_program_order

    @triton.jit
    def accumulate(X, OUT):
        pid = tl.program_id(0)
        tl.atomic_add(OUT, tl.load(X + pid))

    x = torch.tensor([1e8, 1.0, -1e8, 3.0, 1e-3, 7.0, -2.5e7, 0.5] * 8, dtype=torch.float32)

    def run(seed):
        out = torch.zeros(1, dtype=torch.float32)
        with shuffled_program_order(seed):
            accumulate[(x.numel(),)](x, out)
        return out.item()

    assert len({run(seed) for seed in range(1, 6)}) > 1


def test_determinism_check_fails_when_runs_differ(monkeypatch):
    from syntaxkernels.tools.checks import bias_attention as check

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the check's CPU path (the fake below runs no kernel)
    calls = []
    real = check._grads

    def fake(inp, dtype, backend, grad_out, **kw):
        if backend == "triton":
            backend = "reference"
            calls.append(kw.get("deterministic"))
        out = real(inp, dtype, backend, grad_out, **kw)
        if kw.get("deterministic") and len(calls) == 3:  # the third deterministic run is off by one ulp
            out[4] = torch.nextafter(out[4], torch.full_like(out[4], float("inf")))
        return out

    monkeypatch.setattr(check, "_grads", fake)
    monkeypatch.setattr(check, "_shape", lambda device, small, large: (2, 2, 12, 8))
    ok, detail = check.check_deterministic("cpu")
    assert not ok and "dtable differ" in detail, detail
    calls.clear()
    monkeypatch.setattr(check, "_grads", lambda *a, **kw: real(*a[:2], "reference", *a[3:], **kw))
    ok, detail = check.check_deterministic("cpu")
    assert ok and "bit-identical" in detail and "control" in detail, detail


def test_torch_compile_sees_no_lru_cache_in_dispatch():
    import syntaxkernels as sk

    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0, 0]])
    buckets = sk.BucketSpec()
    table = torch.zeros(buckets.num_buckets)
    q = torch.randn(2, 2, 4, 16)

    def attention(q):
        return sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=buckets, lengths=trees.lengths,
                                        backend="reference")

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(attention, fullgraph=True, backend="eager")(q)
    assert not [str(w.message) for w in caught if "lru_cache" in str(w.message)]


# ------------------------------------------------------------------------------------------------ packaging


@pytest.mark.long_on_cpu
def test_license_version_changelog_and_extras():
    """Apache-2.0 in LICENSE and in the installed metadata; one version (syntaxkernels.__version__, which setup.py
    reads and `info` prints); a CHANGELOG; the [transformers] extra, which the README's transformers section names."""
    import re
    from importlib import metadata

    import syntaxkernels

    license_text = open(os.path.join(ROOT, "LICENSE")).read()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    meta = metadata.metadata("syntaxkernels")
    assert meta["License-Expression"] == "Apache-2.0", "reinstall (pip install --no-build-isolation -e .)"
    assert any(f.endswith("LICENSE") for f in meta.get_all("License-File") or []), meta.get_all("License-File")
    assert metadata.version("syntaxkernels") == syntaxkernels.__version__
    setup_text = open(os.path.join(ROOT, "setup.py")).read()
    assert "version=read_version()" in setup_text and not re.search(r"version=['\"]", setup_text)
    assert f"## {syntaxkernels.__version__}" in open(os.path.join(ROOT, "CHANGELOG.md")).read()
    info = _run("import sys; from syntaxkernels.__main__ import main; sys.exit(main(['info']))")
    assert info.returncode == 0 and re.search(rf"^syntaxkernels\s+{re.escape(syntaxkernels.__version__)} ",
                                              info.stdout, re.M), info.stdout
    assert "transformers" in (meta.get_all("Provides-Extra") or [])
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("transformers>=5") and 'extra == "transformers"' in r for r in requires), requires
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("### Plug into a transformers model", 1)[1].split("```python", 1)[0]
    assert '".[transformers]"' in section, section


@pytest.mark.parametrize("slower", [True, False])
def test_bench_says_why_more_threads_are_slower(monkeypatch, slower):
    from syntaxkernels import _ext
    from syntaxkernels.tools.checks import trees as tree_checks

    if not _ext.available():
        pytest.skip("needs the C++ extension")
    monkeypatch.setattr(tree_checks, "has_scipy", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    times = iter([1e-4, 2e-4 if slower else 0.5e-4, 1e-2])  # C++ 1 thread, C++ 2 threads, Python (in that order)
    monkeypatch.setattr(tree_checks, "time_per_batch", lambda *args, **kwargs: next(times))
    rows = tree_checks.bench_tree_distance("cpu", quick=True)
    notes = [r for r in rows if "note" in r]
    if slower:
        assert len(notes) == 1 and notes[0]["provider"] == "C++, 2 threads", rows
        assert notes[0]["note"].startswith("not faster than 1 thread here (200 vs 100 us a batch): the builder "
                                           "starts its threads on every call")
    else:
        assert not notes, notes


def test_treebatch_repr_is_a_summary():
    import syntaxkernels as sk

    small = sk.TreeBatch.from_heads([[-1, 0], [-1]])
    assert repr(small) == "TreeBatch(batch_size=2, max_len=2, lengths=[2, 1], device=cpu)"
    big = sk.TreeBatch.from_heads([[-1, 0, 1][: 1 + i % 3] for i in range(2001)])
    big.window_lists(2)
    text = repr(big)
    assert text == ("TreeBatch(batch_size=2001, max_len=3, lengths min/mean/max=1/2.0/3, tokens=4002, "
                    "derived=1, device=cpu)"), text


def test_bench_prints_the_data_of_rows_that_carry_a_note(capsys):
    """A bench row with figures and a note shows its figures in the table and its note once, under it; a row that
    is only a note is a note (and is not counted as a row)."""
    from syntaxkernels.tools.commands import _print_bench

    rows = [dict(bench="b", kernel="fwd", instr=14.6, note="model, not a measurement"),
            dict(bench="b", kernel="dq", instr=14.4, note="model, not a measurement"),
            dict(bench="b", provider="C++", note="only a note")]
    _print_bench(rows)
    out = capsys.readouterr().out
    assert "14.6" in out and "14.4" in out
    assert out.count("model, not a measurement") == 1 and "C++: note: only a note" in out


def _runtime_modules():
    """Every module of the package outside its tooling (``syntaxkernels/tools/``) and the command line."""
    package = os.path.join(ROOT, "syntaxkernels")
    names = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d not in ("tools", "__pycache__"))
        for f in sorted(files):
            if f.endswith(".py") and f != "__main__.py":
                parts = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.long_on_cpu
def test_the_runtime_never_imports_the_tools():
    """Importing every runtime module, running the ops on CPU tensors (forward and backward) and ``info`` loads
    nothing of ``syntaxkernels.tools``: the tooling is reached only through the verify/bench/inspect commands."""
    modules = _runtime_modules()
    assert "syntaxkernels.ops" in modules and "syntaxkernels.nn" in modules and len(modules) > 20, modules
    code = textwrap.dedent(
        f"""
        import contextlib, importlib, io, sys
        import torch
        skipped = []
        for name in {modules!r}:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:  # an optional dependency (transformers, ...): its module is skipped
                if (exc.name or "").startswith("syntaxkernels"):
                    raise
                skipped.append(name)
        import syntaxkernels as sk
        from syntaxkernels.__main__ import main

        trees = sk.TreeBatch.from_heads([[1, -1, 1, 2], [-1, 0]])
        q = torch.randn(2, 2, 4, 16, requires_grad=True)
        table = torch.zeros(sk.BucketSpec().num_buckets, requires_grad=True)
        out = sk.syntax_bias_attention(q, q, q, trees.distance, table, buckets=sk.BucketSpec(), lengths=trees.lengths)
        sub, _ = sk.syntax_subnetwork_attention(q, q, q, trees, sk.MaskSpec())
        layer = sk.nn.SyntaxBiasedSelfAttention(16, 2)
        y = layer(torch.randn(2, 4, 16), trees)
        (out.sum() + sub.sum() + y.sum()).backward()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["info"]) == 0
        loaded = sorted(m for m in sys.modules if m.startswith("syntaxkernels.tools"))
        assert not loaded, loaded
        print("OK", skipped)
        """
    )
    result = _run(code)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr


def _imports_of_tools(tree, package):
    """``(line, inside a function)`` of every import in ``tree`` (a module of ``package``) that reaches
    ``syntaxkernels.tools``, absolute or relative, and of every string that names a tools module."""
    import ast

    def is_tools(name):
        return name == "syntaxkernels.tools" or name.startswith("syntaxkernels.tools.")

    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in child.names]
            elif isinstance(child, ast.Constant) and isinstance(child.value, str):
                names = [child.value]
            if any(is_tools(n) for n in names):
                found.append((child.lineno, nested))
            visit(child, nested)

    visit(tree, False)
    return found


def test_no_runtime_file_imports_the_tools():
    """The seam, read from the sources: no file of the package outside ``syntaxkernels/tools/`` imports the tools
    (nor names a tools module to import), except ``__main__.py``, and it only inside a function (when a tool
    command runs)."""
    import ast

    package = os.path.join(ROOT, "syntaxkernels")
    offenders = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d not in ("tools", "__pycache__")]
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as source:
                tree = ast.parse(source.read(), path)
            package_name = os.path.relpath(folder, ROOT).replace(os.sep, ".")
            for line, in_function in _imports_of_tools(tree, package_name):
                if not (f == "__main__.py" and folder == package and in_function):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{line}")
    assert not offenders, offenders
    with open(os.path.join(package, "__main__.py"), encoding="utf-8") as source:
        assert _imports_of_tools(ast.parse(source.read()), "syntaxkernels"), "__main__ no longer reaches the tools"
