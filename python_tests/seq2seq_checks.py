"""Checks shared by the encoder-decoder tests of the transformers integration (test_integration_t5.py,
test_integration_translation.py): each takes a syntax model (after ``enable_syntax_attention``) and one batch's
keyword arguments, and asserts one promise."""
import copy

import torch

import syntaxkernels as sk


def check_gradient_checkpointing(model, **inputs):
    """Gradient checkpointing (layers recomputed in the backward, with the keyword arguments they got) gives the same
    loss and the same gradient for every parameter as the model without it (training mode)."""
    twin = copy.deepcopy(model)
    model.train()
    twin.train()
    twin.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert twin.get_encoder().gradient_checkpointing
    la = model(**inputs).loss
    lb = twin(**inputs).loss
    la.backward()
    lb.backward()
    torch.testing.assert_close(lb, la)
    grads_a = dict(model.named_parameters())
    for name, p in twin.named_parameters():
        if p.grad is not None or grads_a[name].grad is not None:
            torch.testing.assert_close(p.grad, grads_a[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def check_autocast_bf16(model, **inputs):
    """Under CPU autocast (bf16) the loss is finite and near the fp32 loss."""
    with torch.no_grad():
        full = model(**inputs).loss
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(**inputs).loss
    assert torch.isfinite(half)
    torch.testing.assert_close(half.float(), full, rtol=5e-2, atol=5e-2)


def check_padded_batch_equals_each_sentence_alone(encoder, ids, mask, heads):
    """The encoder's states of a right-padded batch (``ids, mask [B, N]``, token trees ``heads``) equal each
    sentence's states run alone, on its valid tokens."""
    with torch.no_grad():
        both = encoder(input_ids=ids, attention_mask=mask, syntax_trees=sk.TreeBatch.from_heads(heads))
        for b, row in enumerate(heads):
            n = len(row)
            alone = encoder(input_ids=ids[b:b + 1, :n], syntax_trees=sk.TreeBatch.from_heads([row]))
            torch.testing.assert_close(both.last_hidden_state[b, :n], alone.last_hidden_state[0], rtol=1e-5,
                                       atol=1e-5)
