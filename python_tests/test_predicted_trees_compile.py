"""torch.compile of a trees="predicted" model: what happens to the host-side tree decoding.

Checked on a tiny BERT (CPU, aot_eager: dynamo and AOT autograd, no code generation): a compiled forward without
trees gives the eager logits (the trees are predicted and decoded as in eager mode); it runs as several graphs,
broken where the trees are made on the host (the Chu-Liu/Edmonds decoding of ``decode_tree``, a C++ call, and
``TreeBatch.from_heads``); ``fullgraph=True`` therefore raises; with trees given (training), the compiled forward and
backward of ``task loss + syntax_aux_loss`` equal eager ones. docs/api.md ("Predicted trees") says the same.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels.integrations.transformers import (  # noqa: E402
    enable_syntax_attention,
    syntax_aux_loss,
    syntax_parameters,
)

SMALL = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, vocab_size=100,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
HEADS = [[-1, 0, 1, 1, 0, 4, 0], [-1, 0, 0, 2, 0]]


def _model():
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL, num_labels=3))
    enable_syntax_attention(model, "bias", trees="predicted", predictor_layer=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero tables and biaffine weights, so the trees change the outputs
        for p in syntax_parameters(model).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def _batch():
    gold = sk.TreeBatch.from_heads(HEADS)
    ids = torch.randint(4, SMALL["vocab_size"], (len(HEADS), gold.max_len), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(gold.max_len)[None, :] < gold.lengths[:, None]).long()
    return ids, mask, gold


@pytest.mark.long_on_cpu
def test_compiled_forward_without_trees_breaks_at_the_host_decoding_and_equals_eager():
    torch._dynamo.reset()
    model = _model().eval()
    ids, mask, gold = _batch()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        assert not torch.equal(ref, model(input_ids=ids, attention_mask=mask, syntax_trees=gold).logits)
        got = torch.compile(model, backend="aot_eager")(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    assert explained.graph_break_count > 0
    where = {frame.name for reason in explained.break_reasons for frame in reason.user_stack}
    assert "decode_tree" in where and "from_heads" in where, where
    torch._dynamo.reset()
    with pytest.raises((torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)), torch.no_grad():
        torch.compile(model, backend="aot_eager", fullgraph=True)(input_ids=ids, attention_mask=mask)
    torch._dynamo.reset()


@pytest.mark.long_on_cpu
def test_compiled_training_step_with_trees_given_equals_eager():
    torch._dynamo.reset()
    ids, mask, gold = _batch()
    labels = torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(3)).masked_fill(mask == 0, -100)
    results = []
    for compile_it in (False, True):
        model = _model().train()
        run = torch.compile(model, backend="aot_eager") if compile_it else model
        loss = run(input_ids=ids, attention_mask=mask, syntax_trees=gold, labels=labels).loss + syntax_aux_loss(model)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (eager_loss, eager_grads), (loss, grads) = results
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    assert set(grads) == set(eager_grads) and any(".syntax." in n for n in grads)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    torch._dynamo.reset()
