"""DistributedDataParallel training of tiny syntax models: 2 CPU processes, gloo backend, localhost.

For each method (bias, subnetwork, gat with the structural-probe loss) every rank trains a transformers
BERT token classifier on its own shard of the data for a few steps. Checked on every step:

- the syntax parameters' gradients after ``backward`` are identical on both ranks (all-gathered) and equal
  the mean of the ranks' local gradients (computed first under ``no_sync``), which differ between ranks;
- after the optimizer steps, every parameter of the two replicas is identical and the syntax parameters
  have moved;
- for "gat" (GAT and probe on the root, syntax heads in the layers), FSDP2 (``fully_shard`` per encoder
  layer and on the model) trains from the same start on the same data to the same parameters as DDP;
- "gat" on DistilBERT too (layers at ``distilbert.transformer.layer``, found through ``encoder_layers``).
"""
import os
import signal
import socket
import sys
import warnings
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
GAT = {"gat_config": {"num_layers": 2, "num_heads": 2, "head_dim": 8, "window": 2, "probe_rank": 4}}
METHODS = [  # (method, kwargs, family): BERT for every method, DistilBERT (its own layout) for "gat"
    ("bias", {"per_head": True}, "bert"),
    ("subnetwork", {"masks": {"max_distance": 2}}, "bert"),
    ("gat", GAT, "bert"),
    ("gat", GAT, "distilbert"),
]
STEPS = 3
WORLD = 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shard(rank: int, step: int):
    """A batch that differs per rank and step: random trees (parents before children), padded on the right."""
    import syntaxkernels as sk

    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = [10, 7, 9]
    heads = [[-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)] for n in lengths]
    trees = sk.TreeBatch.from_heads(heads)
    N = trees.max_len
    mask = (torch.arange(N)[None, :] < trees.lengths[:, None]).long()
    ids = torch.randint(3, SMALL["vocab_size"], (len(lengths), N), generator=g)
    labels = torch.randint(0, SMALL["num_labels"], ids.shape, generator=g).masked_fill(mask == 0, -100)
    pos = torch.randint(0, 18, ids.shape, generator=g)
    return ids, mask, trees, labels, pos


def _gather(t: torch.Tensor):
    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t.contiguous())
    return out


def _loss(model, method, batch):
    from syntaxkernels.integrations.transformers import syntax_aux_loss

    ids, mask, trees, labels, pos = batch
    extra = {"syntax_pos": pos} if method == "gat" else {}
    loss = model(input_ids=ids, attention_mask=mask, syntax_trees=trees, labels=labels, **extra).loss
    if method == "gat":
        loss = loss + 0.1 * syntax_aux_loss(model)
    return loss


def _fresh_model(method, kwargs, family="bert"):
    import transformers

    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    torch.manual_seed(0)
    if family == "distilbert":
        config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=100,
                                               dropout=0.0, attention_dropout=0.0, num_labels=SMALL["num_labels"])
        model = transformers.DistilBertForTokenClassification(config)
    else:
        model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL))
    enable_syntax_attention(model, method, **kwargs)
    with torch.no_grad():  # non-zero syntax parameters, so every one of them gets a gradient
        for p in syntax_parameters(model).values():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _train_ddp(rank, method, kwargs, family):
    """DDP steps with the gradient checks; returns the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syntaxkernels.integrations.transformers import syntax_parameters

    model = _fresh_model(method, kwargs, family)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    names = sorted(syntax_parameters(model))
    params = dict(model.named_parameters())
    start = {n: params[n].detach().clone() for n in names}
    for step in range(STEPS):
        batch = _shard(rank, step)
        optimizer.zero_grad()
        with ddp.no_sync():
            _loss(ddp, method, batch).backward()
        local = {n: params[n].grad.detach().clone() for n in names}
        optimizer.zero_grad()
        _loss(ddp, method, batch).backward()
        for n in names:
            synced = _gather(params[n].grad)
            torch.testing.assert_close(synced[0], synced[1], atol=0, rtol=0, msg=f"{method} {n}")
            locals_ = _gather(local[n])
            mean = (locals_[0] + locals_[1]) / WORLD
            torch.testing.assert_close(params[n].grad, mean, atol=1e-6, rtol=1e-5, msg=f"{method} {n}")
        differs = any(not torch.equal(*_gather(local[n])) for n in names)
        assert differs, f"{method}: the ranks' local gradients should differ (different data)"
        optimizer.step()
    for n, p in model.named_parameters():
        replicas = _gather(p.detach())
        assert torch.equal(replicas[0], replicas[1]), f"{method}: replicas differ at {n}"
    for n in names:
        # A bias added to every key shifts each query's scores by one constant: softmax ignores it, so its gradient
        # is zero (the paper and release variants have it, as the release's nn.Linear does).
        if n.endswith("syntax_proj.k.bias"):
            continue
        assert not torch.equal(params[n].detach(), start[n]), f"{method}: {n} did not train"
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_fsdp(rank, method, kwargs, family):
    """FSDP2 (``fully_shard`` per encoder layer, then the whole model) steps; returns the full parameters."""
    from torch.distributed.fsdp import fully_shard

    from syntaxkernels.integrations.transformers import encoder_layers

    model = _fresh_model(method, kwargs, family)
    for layer in encoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        _loss(model, method, _shard(rank, step)).backward()
        optimizer.step()
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def _worker(rank: int, port: int, log_dir: str):
    # This rank's native stderr (fd 2, where the C++ runtime writes before an abort) goes to a file the parent
    # reads: it decides whether a crash is the known abort, and it replays the file either way.
    log = os.open(os.path.join(log_dir, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)
    os.close(log)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        for method, kwargs, family in METHODS:
            ddp_params = _train_ddp(rank, method, kwargs, family)
            if method != "gat":
                continue
            # FSDP2 from the same start on the same data reaches the same parameters, on both ranks.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # FSDP2's note about the model returning a view
                fsdp_params = _train_fsdp(rank, method, kwargs, family)
            assert fsdp_params.keys() == ddp_params.keys()
            for n, p in fsdp_params.items():
                replicas = _gather(p)
                assert torch.equal(replicas[0], replicas[1]), f"FSDP replicas differ at {n}"
                torch.testing.assert_close(p, ddp_params[n], atol=1e-5, rtol=1e-4, msg=f"FSDP vs DDP: {n}")
            dist.barrier()
    finally:
        dist.destroy_process_group()


#: The one native crash that gets a second attempt. One CI run on a loaded 2-core machine saw a worker abort
#: (SIGABRT) with this message from the C++ runtime and no Python error; it did not reproduce in 12 later runs.
KNOWN_ABORT = "terminate called without an active exception"


def _spawn(log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        mp.spawn(_worker, args=(_free_port(), str(log_dir)), nprocs=WORLD, join=True)
    finally:
        for path in sorted(log_dir.glob("rank*.stderr")):  # nothing a worker printed is hidden
            text = path.read_text(errors="replace")
            if text.strip():
                sys.stderr.write(f"--- {path.name} ---\n{text}")


def known_native_abort(exc: BaseException, log_dir: Path) -> Optional[str]:
    """A description of the crash when ``exc`` is a worker killed by SIGABRT whose stderr holds
    :data:`KNOWN_ABORT`; None for anything else (a failed assertion, another signal, an exit code, another
    message), which must fail the test."""
    if not isinstance(exc, mp.ProcessExitedException) or exc.exit_code != -signal.SIGABRT:
        return None
    path = log_dir / f"rank{exc.error_index}.stderr"
    text = path.read_text(errors="replace") if path.exists() else ""
    if KNOWN_ABORT not in text:
        return None
    return f"rank {exc.error_index} (pid {exc.error_pid}) aborted with SIGABRT: {KNOWN_ABORT!r}"


@pytest.mark.long_on_cpu
def test_ddp_and_fsdp_gloo_two_processes_keep_syntax_parameters_in_sync(tmp_path):
    # A failed assertion in a worker raises ProcessRaisedException and is never retried; neither is any other
    # signal or exit code. Only the known native abort gets one fresh attempt on a new port, and says so.
    try:
        _spawn(tmp_path / "attempt1")
    except mp.ProcessExitedException as exc:
        why = known_native_abort(exc, tmp_path / "attempt1")
        if why is None:
            raise
        message = f"retrying the DDP/FSDP run once: {why} (the known native abort; any other crash fails)"
        print(message, file=sys.stderr)
        warnings.warn(message, RuntimeWarning)
        _spawn(tmp_path / "attempt2")


@pytest.mark.parametrize("exit_code, text, retried", [
    (-signal.SIGABRT, f"...\n{KNOWN_ABORT}\n", True),
    (-signal.SIGABRT, "free(): invalid pointer\n", False),      # another native abort
    (-signal.SIGSEGV, f"{KNOWN_ABORT}\n", False),                # another signal
    (1, f"{KNOWN_ABORT}\n", False),                              # an exit code, not a signal
])
def test_only_the_known_abort_is_retried(tmp_path, exit_code, text, retried):
    (tmp_path / "rank1.stderr").write_text(text)
    exc = mp.ProcessExitedException("process 1 terminated", error_index=1, error_pid=123, exit_code=exit_code)
    assert (known_native_abort(exc, tmp_path) is not None) == retried
    raised = mp.ProcessRaisedException("AssertionError: replicas differ", error_index=1, error_pid=123)
    assert known_native_abort(raised, tmp_path) is None
