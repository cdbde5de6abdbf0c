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


def check_seq2seq_beam_search(plain, syntax, randomise, ids, mask, source_heads, start: int, decoder_trees: bool):
    """:func:`check_beam_search` on an encoder-decoder model: the source trees ``source_heads`` to the encoder and, with
    ``decoder_trees``, two different leak-free trees of a 3-token decoder prompt (``start`` its first token) repeated
    per beam."""
    inputs = dict(input_ids=ids, attention_mask=mask,
                  decoder_input_ids=torch.tensor([[start, 17, 33], [start, 41, 8]]))
    trees = {"syntax_trees": (source_heads, False)}
    if decoder_trees:
        trees["decoder_syntax_trees"] = ([[-1, 0, 1], [-1, 0, 0]], True)
    check_beam_search(plain, syntax, randomise, inputs, trees,
                      tiled=("decoder_syntax_trees",) if decoder_trees else ())


def check_beam_search(plain, syntax, randomise, inputs, trees, tiled=(), beams=3, sequences=2):
    """``generate`` with ``num_beams=beams`` and ``num_return_sequences=sequences`` on a syntax model whose forward
    takes trees (``trees``: keyword -> ``(rows of heads, one per batch item, leak_free)``; ``inputs``: generate's tensor
    inputs, batch B first), the trees expanded per beam as transformers expands the tensors (item b's copies next to
    each other):

    - fresh syntax parameters: the unpatched model's sequences and scores;
    - ``randomise(syntax)`` (nonzero tables): the first step's logits and scores equal a forward on the inputs and
      trees repeated by hand (``repeat_interleave``; trees built from the repeated rows of heads), which differs from
      the unpatched model's and from a forward with the trees of ``tiled`` repeated the other way (``[t0, t1, t0,
      t1, ...]``: the items of ``tiled`` must have different trees of one length).
    """
    import torch.nn.functional as F

    B = next(iter(inputs.values())).shape[0]

    def build(order, tile=()):
        return {key: sk.TreeBatch.from_heads([rows[i] for i in (tiled_order if key in tile else order)],
                                             leak_free=leak_free) for key, (rows, leak_free) in trees.items()}

    kw = dict(max_new_tokens=3, num_beams=beams, num_return_sequences=sequences, do_sample=False, output_scores=True,
              output_logits=True, return_dict_in_generate=True)
    interleaved = [b for b in range(B) for _ in range(beams)]
    tiled_order = [b for _ in range(beams) for b in range(B)]
    with torch.no_grad():
        want = plain.generate(**inputs, **kw)
        got = syntax.generate(**inputs, **build(range(B)), **kw)
        assert got.sequences.shape[0] == B * sequences
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(torch.stack(got.scores), torch.stack(want.scores), rtol=1e-4, atol=1e-4)
        randomise(syntax)
        got = syntax.generate(**inputs, **build(range(B)), **kw)
        assert got.sequences.shape[0] == B * sequences
        repeated = {key: value.repeat_interleave(beams, dim=0) for key, value in inputs.items()}
        first = syntax(**repeated, **build(interleaved)).logits[:, -1]
        torch.testing.assert_close(got.logits[0], first, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.scores[0], F.log_softmax(first, -1), rtol=1e-5, atol=1e-5)
        assert (first - plain(**repeated).logits[:, -1]).abs().max() > 1e-3  # the trees matter
        if tiled:
            wrong = syntax(**repeated, **build(interleaved, tiled)).logits[:, -1]
            assert (first - wrong).abs().max() > 1e-3  # and so does their order


def check_torch_compile(model, extra=(), **inputs):
    """``torch.compile(model, backend="aot_eager", fullgraph=True)`` (dynamo and AOT autograd, no code generation; one
    graph: the hooks, the trees and the syntax ops traced without a break) of a training forward with source and
    target trees gives the eager logits on the valid target positions, and its backward the eager gradients of
    every syntax parameter and of the parameters named in ``extra``."""
    from syntaxkernels.integrations.transformers import syntax_parameters

    torch._dynamo.reset()
    model.train()
    valid = inputs["decoder_attention_mask"].bool()
    named = dict(model.named_parameters())
    watched = {**syntax_parameters(model), **{name: named[name] for name in extra}}
    out = model(**inputs).logits
    out[valid].sum().backward()
    grads = {name: p.grad.clone() for name, p in watched.items()}
    model.zero_grad()
    got = torch.compile(model, backend="aot_eager", fullgraph=True)(**inputs).logits
    torch.testing.assert_close(got[valid], out[valid], rtol=1e-5, atol=1e-5)
    got[valid].sum().backward()
    for name, p in watched.items():
        assert grads[name].abs().sum() > 0, name
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-5, msg=name)
    torch._dynamo.reset()
