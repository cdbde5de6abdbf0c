"""transformers integration: enable_syntax_attention on BERT / RoBERTa / XLM-RoBERTa built from tiny configs.

What is checked: the promise each method makes for fresh parameters (bias and gat: unchanged outputs;
subnetwork with only ``full``: unchanged; subnetwork with relation masks: the average of the sub-networks),
that trees change the outputs once the syntax parameters are non-zero, that gradients reach every syntax
parameter, save_pretrained / load_syntax_model round trips, and the errors. No hub downloads.
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import syntaxkernels as sk  # noqa: E402
from syntaxkernels import reference  # noqa: E402
from syntaxkernels.integrations.transformers import (  # noqa: E402
    ATTN_IMPLEMENTATION,
    SyntaxSubnetworks,
    FAMILIES,
    enable_syntax_attention,
    encoder_layers,
    load_syntax_model,
    syntax_aux_loss,
    syntax_parameters,
    token_pos_ids,
)

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)
HEADS = [[-1, 0, 1, 1, 0, 4, 5, 4, 0], [-1, 0, 0, 2, 2, 0]]  # [CLS]-rooted token trees, lengths 9 and 6
GAT_SMALL = dict(num_layers=2, num_heads=2, head_dim=8, window=2)


ARCHS = ["bert", "roberta", "xlmr", "camembert", "electra", "distilbert"]  # one per encoder row of FAMILIES


def _config(arch: str, **overrides):
    if arch == "bert":
        return transformers.BertConfig(**SMALL, **overrides)
    if arch == "roberta":
        return transformers.RobertaConfig(**SMALL, pad_token_id=1, **overrides)
    if arch == "camembert":
        return transformers.CamembertConfig(**SMALL, pad_token_id=1, **overrides)
    if arch == "electra":  # embeddings narrower than the encoder: embeddings_project maps 16 -> 32
        return transformers.ElectraConfig(**SMALL, embedding_size=16, **overrides)
    if arch == "distilbert":
        names = {"hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout"}
        return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=100,
                                             **{names.get(k, k): v for k, v in overrides.items()})
    return transformers.XLMRobertaConfig(**SMALL, pad_token_id=1, **overrides)


def _model(arch: str = "bert", head: str = "base", attn_implementation: str = "sdpa", **overrides):
    classes = {
        "bert": (transformers.BertModel, transformers.BertForTokenClassification),
        "roberta": (transformers.RobertaModel, transformers.RobertaForTokenClassification),
        "xlmr": (transformers.XLMRobertaModel, transformers.XLMRobertaForTokenClassification),
        "camembert": (transformers.CamembertModel, transformers.CamembertForTokenClassification),
        "electra": (transformers.ElectraModel, transformers.ElectraForTokenClassification),
        "distilbert": (transformers.DistilBertModel, transformers.DistilBertForTokenClassification),
    }[arch]
    cls = classes[0] if head == "base" else classes[1]
    model = cls(_config(arch, **overrides))
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def _batch(arch: str = "bert"):
    trees = sk.TreeBatch.from_heads(HEADS)
    N = trees.max_len
    low = 4  # RoBERTa's padding_idx is 1
    ids = torch.randint(low, SMALL["vocab_size"], (2, N))
    mask = (torch.arange(N)[None, :] < trees.lengths[:, None]).long()
    return ids, mask, trees


def _randomise(model):
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 0.5)


def _hidden(model, **inputs):
    out = model(**inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


def _fresh_pair(arch, method, attn_implementation="sdpa", **kwargs):
    """(unpatched model, patched copy with fresh syntax parameters)."""
    plain = _model(arch, attn_implementation=attn_implementation)
    patched = copy.deepcopy(plain)
    enable_syntax_attention(patched, method, **kwargs)
    return plain, patched.eval()


# ---------------------------------------------------------------------------------------------- promises at init


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("per_head", [False, True])
def test_fresh_bias_is_plain_attention(arch, attn_implementation, per_head):
    plain, patched = _fresh_pair(arch, "bias", attn_implementation, per_head=per_head)
    ids, mask, trees = _batch(arch)
    ref = _hidden(plain, input_ids=ids, attention_mask=mask)
    out = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    valid = mask.bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert patched.config._attn_implementation == ATTN_IMPLEMENTATION
    table = syntax_parameters(patched)[next(n for n in syntax_parameters(patched) if n.endswith("distance_bias"))]
    assert table.shape == ((4, sk.BucketSpec().num_buckets) if per_head else (sk.BucketSpec().num_buckets,))
    assert torch.count_nonzero(table) == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_gat_is_plain_attention_everywhere(arch):
    plain, patched = _fresh_pair(arch, "gat", gat_config=dict(GAT_SMALL, probe_rank=4), syntax_heads=2,
                                 targets=("k", "v"), variant="package")  # paper/release: test_papers.py
    ids, mask, trees = _batch(arch)
    pos = torch.randint(0, 18, ids.shape)
    ref = _hidden(plain, input_ids=ids, attention_mask=mask)
    out = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=pos)
    # The syntax heads use ordinary attention, so even padding positions match.
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_fresh_subnetwork_full_only_is_plain_attention():
    full_only = sk.MaskSpec(parent=False, child=False, sibling=False, full=True)
    plain, patched = _fresh_pair("bert", "subnetwork", masks=full_only)
    ids, mask, trees = _batch()
    valid = mask.bool()
    ref = _hidden(plain, input_ids=ids, attention_mask=mask)
    out = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    torch.testing.assert_close(out[valid], ref[valid], atol=1e-5, rtol=1e-5)


def test_fresh_subnetwork_averages_the_subnetworks():
    """With relation masks a fresh layer is the mean of the non-empty sub-networks (not plain attention)."""
    plain, patched = _fresh_pair("bert", "subnetwork", variant="package")
    ids, mask, trees = _batch()
    valid = mask.bool()
    ref = _hidden(plain, input_ids=ids, attention_mask=mask)
    out = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    assert (out[valid] - ref[valid]).abs().max() > 1e-3

    masks = sk.MaskSpec()
    layer = SyntaxSubnetworks(num_heads=4, head_dim=8, masks=masks, variant="package")
    q, k, v = (torch.randn(2, 4, trees.max_len, 8) for _ in range(3))
    got = layer(q, k, v, trees, None)
    outputs, nonempty = reference.syntax_subnetwork_attention(q, k, v, trees, masks)
    weights = nonempty.permute(0, 2, 1).float()  # [B, N, M]
    mean = torch.einsum("bmhnd,bnm->bhnd", outputs, weights) / weights.sum(-1).clamp(min=1)[:, None, :, None]
    torch.testing.assert_close(got, mean, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- trees matter


@pytest.mark.parametrize("method", ["bias", "subnetwork", "gat"])
def test_trees_change_outputs_once_parameters_are_nonzero(method):
    kwargs = {"gat_config": GAT_SMALL} if method == "gat" else {}
    plain, patched = _fresh_pair("bert", method, **kwargs)
    _randomise(patched)
    ids, mask, trees = _batch()
    other = sk.TreeBatch.from_heads([[-1, 0, 0, 0, 0, 0, 0, 0, 0], [-1, 0, 1, 2, 3, 4]])  # star / chain
    valid = mask.bool()
    ref = _hidden(plain, input_ids=ids, attention_mask=mask)
    out = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    out_other = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=other)
    assert (out[valid] - ref[valid]).abs().max() > 1e-3
    assert (out[valid] - out_other[valid]).abs().max() > 1e-3


def test_pos_tags_reach_the_gat():
    _, patched = _fresh_pair("bert", "gat", gat_config=GAT_SMALL)
    _randomise(patched)
    ids, mask, trees = _batch()
    a = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees,
                syntax_pos=torch.zeros_like(ids))
    b = _hidden(patched, input_ids=ids, attention_mask=mask, syntax_trees=trees,
                syntax_pos=torch.full_like(ids, 5))
    assert (a - b).abs().max() > 1e-4


@pytest.mark.parametrize("method", ["bias", "subnetwork", "gat"])
@pytest.mark.long_on_cpu
def test_gradients_reach_every_syntax_parameter(method):
    kwargs = {"gat_config": dict(GAT_SMALL, probe_rank=4)} if method == "gat" else {}
    model = _model("bert", head="tokens", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    enable_syntax_attention(model, method, **kwargs)
    model.train()
    _randomise(model)  # at init some gradients are zero by design (bias_scale with a zero table, the GAT's
    # task gradient with zero injection weights); test_fresh_bias_table_gets_a_gradient covers init
    ids, mask, trees = _batch()
    labels = torch.randint(0, 2, ids.shape).masked_fill(~mask.bool(), -100)
    extra = {"syntax_pos": torch.randint(0, 18, ids.shape)} if method == "gat" else {}
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees, labels=labels, **extra)
    loss = out.loss
    aux = syntax_aux_loss(model)
    if method == "gat":
        assert aux is not None and torch.isfinite(aux)
        loss = loss + 0.1 * aux
    else:
        assert aux is None
    loss.backward()
    params = syntax_parameters(model)
    assert params
    for name, p in params.items():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_fresh_bias_table_gets_a_gradient():
    """A zero-initialised table still learns: its gradient is non-zero from the first step."""
    model = _model("bert", head="tokens", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    enable_syntax_attention(model, "bias")
    ids, mask, trees = _batch()
    labels = torch.randint(0, 2, ids.shape).masked_fill(~mask.bool(), -100)
    model(input_ids=ids, attention_mask=mask, syntax_trees=trees, labels=labels).loss.backward()
    table = model.bert.encoder.layer[1].attention.self.syntax.distance_bias
    assert table.grad.abs().sum() > 0


@pytest.mark.parametrize("arch", ["bert", "camembert", "electra", "distilbert"])
@pytest.mark.long_on_cpu
def test_layers_subset_and_gradient_checkpointing(arch):
    plain = _model(arch, head="tokens", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = copy.deepcopy(plain)
    enable_syntax_attention(model, "gat", gat_config=GAT_SMALL, layers=[1])
    layers = encoder_layers(model)
    attention = "attention" if arch == "distilbert" else "attention.self"
    in_layers = [n for n in syntax_parameters(model) if ".layer." in n]
    assert in_layers and all(f".layer.1.{attention}.syntax." in n for n in in_layers), in_layers
    _randomise(model)
    ids, mask, trees = _batch(arch)
    model.train()
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in syntax_parameters(model).items()}
    model.zero_grad()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert layers[1].gradient_checkpointing
    out_ckpt = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    out_ckpt.sum().backward()
    torch.testing.assert_close(out_ckpt, out)
    for name, p in syntax_parameters(model).items():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch,method,kwargs", [
    ("bert", "bias", dict(per_head=True, buckets=sk.BucketSpec(max_distance=6, log_distance=3), window=5)),
    ("roberta", "subnetwork", dict(masks=sk.MaskSpec(max_distance=2, pairwise=True), layers=[0])),
    ("xlmr", "gat", dict(gat_config=dict(GAT_SMALL, probe_rank=3), syntax_heads=2, targets=("q", "k", "v"))),
    ("camembert", "bias", dict(per_head=True)),
    ("electra", "gat", dict(gat_config=dict(GAT_SMALL, probe_rank=3))),
    ("distilbert", "subnetwork", dict(masks=sk.MaskSpec(max_distance=2))),
    ("distilbert", "gat", dict(gat_config=dict(GAT_SMALL, probe_rank=3), layers=[1])),
])
def test_save_pretrained_round_trip(tmp_path, arch, method, kwargs):
    model = _model(arch, head="tokens")
    enable_syntax_attention(model, method, **kwargs)
    _randomise(model)
    ids, mask, trees = _batch(arch)
    extra = {"syntax_pos": torch.randint(0, 18, ids.shape)} if method == "gat" else {}
    expected = model(input_ids=ids, attention_mask=mask, syntax_trees=trees, **extra).logits
    expected_aux = syntax_aux_loss(model)
    model.save_pretrained(tmp_path)

    cls = type(model)
    loaded = load_syntax_model(cls, tmp_path).eval()
    assert loaded.config.syntax_attention == model.config.syntax_attention
    assert loaded.config._attn_implementation == ATTN_IMPLEMENTATION
    before, after = syntax_parameters(model), syntax_parameters(loaded)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], atol=0, rtol=0)
    got = loaded(input_ids=ids, attention_mask=mask, syntax_trees=trees, **extra).logits
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    if expected_aux is not None:
        torch.testing.assert_close(syntax_aux_loss(loaded), expected_aux)

    # The base model class reads the same checkpoint (its names lack the head's prefix).
    base = load_syntax_model(transformers.AutoModel, tmp_path).eval()
    for name, p in syntax_parameters(base).items():
        torch.testing.assert_close(p, before[f"{model.base_model_prefix}.{name}"], atol=0, rtol=0)


def test_plain_from_pretrained_refuses_to_reenable(tmp_path):
    model = _model("bert", head="tokens")
    enable_syntax_attention(model, "bias")
    model.save_pretrained(tmp_path)
    plain = transformers.BertForTokenClassification.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load_syntax_model"):
        enable_syntax_attention(plain, "bias")


@pytest.mark.parametrize("method", ["bias", "gat"])
def test_plain_from_pretrained_never_gives_a_model_that_ignores_its_trees(tmp_path, method):
    """With the integration imported, a plain from_pretrained of a syntax checkpoint (head class or Auto class)
    loads, but its first forward, with or without trees, raises and says to use load_syntax_model; saving the
    model load_syntax_model gave keeps that protection."""
    model = _model("bert", head="tokens")
    enable_syntax_attention(model, method, **({"gat_config": GAT_SMALL} if method == "gat" else {}))
    _randomise(model)
    model.save_pretrained(tmp_path)
    ids, mask, trees = _batch()
    for cls in (transformers.BertForTokenClassification, transformers.AutoModelForTokenClassification,
                transformers.AutoModel):
        plain = cls.from_pretrained(tmp_path)
        for inputs in (dict(syntax_trees=trees), {}):
            with pytest.raises(ValueError, match="load_syntax_model"):
                plain(input_ids=ids, attention_mask=mask, **inputs)
    plain.set_attn_implementation("sdpa")  # what the message offers for using it as a plain model on purpose
    assert _hidden(plain, input_ids=ids, attention_mask=mask).shape[:2] == ids.shape
    loaded = load_syntax_model(transformers.BertForTokenClassification, tmp_path)
    again = tmp_path / "again"
    loaded.save_pretrained(again)
    with pytest.raises(ValueError, match="load_syntax_model"):
        transformers.BertForTokenClassification.from_pretrained(again)(input_ids=ids, attention_mask=mask,
                                                                        syntax_trees=trees)
    reloaded = load_syntax_model(transformers.BertForTokenClassification, again).eval()
    torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits,
                               model.eval()(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits)


@pytest.mark.long_on_cpu
def test_plain_from_pretrained_without_the_integration_refuses_to_load(tmp_path):
    """A process that never imports syntaxkernels: transformers itself refuses the checkpoint, and its message
    names load_syntax_model."""
    import subprocess
    import sys

    model = _model("bert", head="tokens")
    enable_syntax_attention(model, "bias")
    model.save_pretrained(tmp_path)
    code = ("import sys, transformers\n"
            "try:\n"
            f"    transformers.BertForTokenClassification.from_pretrained({str(tmp_path)!r})\n"
            "except ValueError as e:\n"
            "    print(e); sys.exit(3)\n"
            "assert 'syntaxkernels' not in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "load_syntax_model" in run.stdout, run.stdout


def test_load_syntax_model_needs_a_syntax_checkpoint(tmp_path):
    _model("bert", head="tokens").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="syntax_attention"):
        load_syntax_model(transformers.BertForTokenClassification, tmp_path)


def test_load_syntax_model_is_quiet(tmp_path, caplog):
    """No tensor-parallel "layers were not sharded" message and no report of the syntax keys it restores."""
    model = _model("bert", head="tokens")
    enable_syntax_attention(model, "gat", gat_config=dict(GAT_SMALL, probe_rank=3))
    model.save_pretrained(tmp_path)
    caplog.clear()
    with caplog.at_level("INFO"):
        load_syntax_model(transformers.BertForTokenClassification, tmp_path)
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "not sharded" not in said and "LOAD REPORT" not in said, said
    # the filter is only for that: the plain class still reports the syntax keys it does not know
    with caplog.at_level("INFO"):
        transformers.BertForTokenClassification.from_pretrained(tmp_path)
    assert "UNEXPECTED" in "\n".join(r.getMessage() for r in caplog.records)


def test_load_report_filter_lets_other_reports_through():
    import logging

    from syntaxkernels.integrations.checkpoint import SyntaxKeysReportFilter

    def record(rows):
        table = "Key | Status |  | \n----+----+--+-\n" + "\n".join(f"{k} | {s} |  | " for k, s in rows)
        message = f"\x1b[1mBertModel LOAD REPORT\x1b[0m from: x\n{table}\n\nNotes:\n- UNEXPECTED: ..."
        return logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1, message, None, None)

    keep = SyntaxKeysReportFilter().filter
    syntax = [("encoder.layer.{0, 1}.attention.self.syntax.distance_bias", "UNEXPECTED"),
              ("encoder.syntax_gat.layers.0.weight", "UNEXPECTED"), ("encoder.syntax_probe.proj", "UNEXPECTED")]
    assert not keep(record(syntax))
    assert keep(record(syntax + [("encoder.layer.0.output.dense.weight", "MISSING")]))
    assert keep(record(syntax + [("pooler.extra", "UNEXPECTED")]))
    assert keep(logging.LogRecord("x", logging.WARNING, __file__, 1, "something else", None, None))


def test_enabling_one_model_leaves_others_built_from_the_same_config():
    config = _config("bert")
    first, second = transformers.BertModel(config).eval(), transformers.BertModel(config).eval()
    for m in (first, second):
        m.set_attn_implementation("sdpa")
    before = (config.to_dict(), config._attn_implementation)
    ids, mask, trees = _batch()
    plain = _hidden(second, input_ids=ids, attention_mask=mask)

    enable_syntax_attention(first, "bias")
    assert (config.to_dict(), config._attn_implementation) == before  # the shared object is untouched
    assert second.config is config and getattr(config, "syntax_attention", None) is None
    assert first.config is not config and first.config.syntax_attention["method"] == "bias"
    assert all(getattr(m, "config", first.config) is first.config for m in first.modules())
    torch.testing.assert_close(_hidden(second, input_ids=ids, attention_mask=mask), plain, atol=0, rtol=0)

    enable_syntax_attention(second, "subnetwork")  # used to raise "already enabled"
    assert first.config.syntax_attention["method"] == "bias"
    assert second.config.syntax_attention["method"] == "subnetwork"
    _hidden(first, input_ids=ids, attention_mask=mask, syntax_trees=trees)


# ---------------------------------------------------------------------------------------------- errors


def test_family_table_names_real_classes_and_layouts():
    """Every row of FAMILIES is a transformers class of that model_type, laid out as the row says; the README
    and docs/api.md name every supported family."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    readme, api = (root / "README.md").read_text(), (root / "docs" / "api.md").read_text()
    # the decoder rows: test_integration_decoders.py; ModernBERT (its base model runs the layers):
    # test_integration_modernbert.py; T5 / mT5 (encoder-decoder): test_integration_t5.py; BART, mBART, Marian, M2M100:
    # test_integration_translation.py
    encoders = [f for f in FAMILIES if not f.causal and f.encoder and not f.seq2seq]
    assert len({f.model_type for f in FAMILIES}) == len(FAMILIES) and len(encoders) == len(ARCHS)
    for family, arch in zip(encoders, ARCHS):
        model = _model(arch)
        assert type(model).__name__ == family.base_class and model.config.model_type == family.model_type
        layers = encoder_layers(model)
        assert len(layers) == 2
        module = layers[0]
        for name in family.self_attention.split("."):
            module = getattr(module, name)
        assert all(isinstance(getattr(module, p), torch.nn.Linear) for p in family.projections), family
        short = family.name.split(" (")[0]
        assert short in readme and short in api, short


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", ["bias", "gat"])
def test_autocast_bf16_stays_close_to_fp32(arch, method):
    """Under CPU autocast (bf16) the syntax model runs and stays near its fp32 outputs on the valid tokens."""
    model = _model(arch)
    enable_syntax_attention(model, method, **({"gat_config": GAT_SMALL} if method == "gat" else {}))
    _randomise(model)
    model.eval()
    ids, mask, trees = _batch(arch)
    ref = _hidden(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _hidden(model, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    valid = mask.bool()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float()[valid], ref[valid], atol=0.1, rtol=0.05)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.long_on_cpu
def test_torch_compile_matches_eager(arch):
    """torch.compile (aot_eager: traced through dynamo and AOT autograd, no code generation) of a "bias" model:
    forward and syntax gradients equal eager; so do a "gat" model's (compiled after the "bias" one in the same
    process: the C++ edge backward's fake once gave other strides than the real op, which broke it)."""
    torch._dynamo.reset()
    model = _model(arch, head="tokens", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    enable_syntax_attention(model, "bias", per_head=True)
    _randomise(model)
    ids, mask, trees = _batch(arch)
    out = model(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in syntax_parameters(model).items()}
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager")
    got = compiled(input_ids=ids, attention_mask=mask, syntax_trees=trees).logits
    torch.testing.assert_close(got, out, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    for name, p in syntax_parameters(model).items():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()
    gat = _model(arch)
    enable_syntax_attention(gat, "gat", gat_config=GAT_SMALL)
    _randomise(gat)
    ref = _hidden(gat, input_ids=ids, attention_mask=mask, syntax_trees=trees)
    ref.sum().backward()
    grads = {n: p.grad.clone() for n, p in syntax_parameters(gat).items() if p.grad is not None}
    gat.zero_grad()
    got = _hidden(torch.compile(gat, backend="aot_eager"), input_ids=ids, attention_mask=mask, syntax_trees=trees)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    assert grads
    for name, grad in grads.items():
        torch.testing.assert_close(syntax_parameters(gat)[name].grad, grad, atol=1e-5, rtol=1e-4)


def test_unsupported_architecture():
    opt = transformers.OPTModel(transformers.OPTConfig(hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                                       num_attention_heads=4, vocab_size=100, word_embed_proj_dim=32))
    with pytest.raises(ValueError, match="not supported"):
        enable_syntax_attention(opt, "bias")
    with pytest.raises(TypeError, match="PreTrainedModel"):  # not a transformers model at all: a wrong type
        enable_syntax_attention(torch.nn.Linear(2, 2), "bias")
    decoder = transformers.BertModel(_config("bert", is_decoder=True))
    with pytest.raises(ValueError, match="encoders only"):
        enable_syntax_attention(decoder, "bias")


def test_argument_errors():
    model = _model()
    with pytest.raises(ValueError, match="method"):
        enable_syntax_attention(model, "syntax")
    with pytest.raises(ValueError, match="masks applies"):
        enable_syntax_attention(model, "bias", masks=sk.MaskSpec())
    with pytest.raises(ValueError, match="buckets, per_head, window and relations apply to method='bias'"):
        enable_syntax_attention(model, "gat", window=3)
    with pytest.raises(ValueError, match="buckets, per_head, window and relations apply to method='bias'"):
        enable_syntax_attention(model, "subnetwork", relations=2)
    with pytest.raises(ValueError, match="layers"):
        enable_syntax_attention(model, "bias", layers=[5])
    with pytest.raises(ValueError, match="gat_config has unknown keys"):
        enable_syntax_attention(model, "gat", gat_config={"heads": 2})
    with pytest.raises(ValueError, match="syntax_heads"):
        enable_syntax_attention(model, "gat", syntax_heads=9)
    assert getattr(model.config, "syntax_attention", None) is None  # nothing half-enabled
    enable_syntax_attention(model, "bias")
    with pytest.raises(ValueError, match="already enabled"):
        enable_syntax_attention(model, "bias")


def test_argument_error_types_leave_the_model_unchanged():
    """TypeError for an argument of the wrong kind, ValueError for a wrong value; nothing is half-enabled."""
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cases = [
        (TypeError, "buckets must be a BucketSpec", dict(method="bias", buckets=[10])),
        (TypeError, "masks must be a MaskSpec", dict(method="subnetwork", masks="parent")),
        (TypeError, "gat_config must be a dict", dict(method="gat", gat_config=[("num_layers", 1)])),
        (TypeError, "syntax_heads must be an int", dict(method="gat", syntax_heads=1.5)),
        (ValueError, "backend", dict(method="bias", backend="cuda")),
        (ValueError, "window must be None or an int in 0..254", dict(method="bias", window=255)),
        (ValueError, "window", dict(method="gat", gat_config=dict(GAT_SMALL, window=-1))),
        (ValueError, "syntax_heads must be an int in 1..4", dict(method="gat", syntax_heads=0)),
        (ValueError, "targets must name at least one", dict(method="gat", targets=())),
        (ValueError, "targets must be distinct names", dict(method="gat", targets=("q", "o"))),
        (ValueError, "layers", dict(method="bias", layers=[0, 0])),
    ]
    for error, match, kwargs in cases:
        with pytest.raises(error, match=match):
            enable_syntax_attention(model, **kwargs)
        assert getattr(model.config, "syntax_attention", None) is None, kwargs
        assert not syntax_parameters(model) and not hasattr(model.encoder, "syntax_hook_handle"), kwargs
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_syntax_children_are_the_nn_building_blocks():
    """The per-layer parts are sk.nn's DistanceBias / Subnetworks / SyntaxHeads (with transformers' calling
    convention); their parameter names in the state dict are the documented ones."""
    expected = {
        "bias": (sk.nn.DistanceBias, {"distance_bias", "bias_scale"}),
        "subnetwork": (sk.nn.Subnetworks, {"topical.query", "topical.key_weight", "topical.value_weight"}),
        "gat": (sk.nn.SyntaxHeads, {"syntax_proj.q.weight", "syntax_proj.k.weight"}),
    }
    for method, (block, names) in expected.items():
        model = _model("bert", head="tokens")
        enable_syntax_attention(model, method, **({"gat_config": GAT_SMALL} if method == "gat" else {}))
        part = model.bert.encoder.layer[1].attention.self.syntax
        assert isinstance(part, block), method
        prefix = "bert.encoder.layer.1.attention.self.syntax."
        assert {prefix + n for n in names} <= set(model.state_dict()), method
    assert isinstance(model.bert.encoder.syntax_gat, sk.nn.SyntaxGAT)


@pytest.mark.long_on_cpu
def test_pos_tags_live_in_their_own_module_without_transformers():
    import subprocess
    import sys

    from syntaxkernels.integrations import transformers as integration
    from syntaxkernels.integrations import upos

    assert integration.token_pos_ids is upos.token_pos_ids and integration.UPOS_TAGS is upos.UPOS_TAGS
    code = ("import sys; from syntaxkernels.integrations.upos import token_pos_ids; "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    s = sk.trees.Sentence(words=["Hi"], heads=[-1], upos=["INTJ"])
    with pytest.raises(ValueError, match="texts has 1 items but word_ids has 2"):
        token_pos_ids([s], [[0], [0]])
    with pytest.raises(ValueError, match="batch item 0, token 1: word id 1 out of range"):
        token_pos_ids([s], [[None, 1]])
    with pytest.raises(TypeError, match="batch item 0: expected a Sentence"):
        token_pos_ids([["not a sentence"]], [[0]])
    assert token_pos_ids([[s, s]], [[None, 0, 1, None]], variant="package").tolist() == [[0, 7, 7, 0]]  # two
    assert token_pos_ids([[s, s]], [[None, 0, 1, None]]).tolist() == [[18, 7, 7, 19]]  # sentences, one text


@pytest.mark.parametrize("layout", ["bin", "sharded"])
def test_load_syntax_model_from_other_checkpoint_layouts(tmp_path, layout):
    """pytorch_model.bin and sharded safetensors (an index and several files)."""
    model = _model("bert", head="tokens")
    enable_syntax_attention(model, "gat", gat_config=dict(GAT_SMALL, probe_rank=3))
    _randomise(model)
    if layout == "bin":  # the older format, written by hand: config.json + pytorch_model.bin
        model.save_pretrained(tmp_path)
        (tmp_path / "model.safetensors").unlink()
        torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    else:
        model.save_pretrained(tmp_path, max_shard_size="20KB")
        assert (tmp_path / "model.safetensors.index.json").exists()
        assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    loaded = load_syntax_model(transformers.BertForTokenClassification, tmp_path)
    before, after = syntax_parameters(model), syntax_parameters(loaded)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], atol=0, rtol=0)


def test_checkpoint_reading_errors(tmp_path):
    from syntaxkernels.integrations.checkpoint import read_tensors, restore_parameters

    with pytest.raises(ValueError, match="no model.safetensors"):
        read_tensors(str(tmp_path), ["x"])
    model = _model("bert", head="tokens")
    enable_syntax_attention(model, "bias")
    model.save_pretrained(tmp_path)
    names = list(syntax_parameters(model))
    assert set(read_tensors(str(tmp_path), names + ["absent"])) == set(names)
    other = _model("bert", head="tokens")
    enable_syntax_attention(other, "bias", per_head=True)  # distance_bias [H, T] instead of [T]
    with pytest.raises(ValueError, match="has shape .* the model expects"):
        restore_parameters(other, str(tmp_path), list(syntax_parameters(other)), other.base_model_prefix)
    gat = _model("bert", head="tokens")
    enable_syntax_attention(gat, "gat", gat_config=GAT_SMALL)
    with pytest.raises(ValueError, match="lacks syntax parameters"):
        restore_parameters(gat, str(tmp_path), list(syntax_parameters(gat)), gat.base_model_prefix)


def test_forward_errors():
    model = _model()
    enable_syntax_attention(model, "bias")
    ids, mask, trees = _batch()
    with pytest.raises(ValueError, match="syntax_trees"):
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(TypeError, match="TreeBatch"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=HEADS)
    with pytest.raises(ValueError, match="cover the token sequence"):
        model(input_ids=ids[:, :7], attention_mask=mask[:, :7], syntax_trees=trees)
    with pytest.raises(ValueError, match="batch item 1"):
        model(input_ids=ids, attention_mask=torch.ones_like(mask), syntax_trees=trees)
    with pytest.raises(ValueError, match="batch item 1"):
        model(input_ids=ids, syntax_trees=trees)  # padding in the trees but no attention mask
    with pytest.raises(ValueError, match="method='gat'"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=torch.zeros_like(ids))
    gat = _model()
    enable_syntax_attention(gat, "gat", gat_config=GAT_SMALL)
    with pytest.raises(TypeError, match="syntax_pos must be an int64 tensor"):
        gat(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=ids.tolist())
    with pytest.raises(ValueError, match=r"syntax_pos must have shape \[B, N\]"):
        gat(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=ids[:, :3])
    model.set_attn_implementation("eager")
    with pytest.raises(RuntimeError, match="set_attn_implementation"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=trees)


def test_token_pos_ids():
    s = sk.trees.Sentence(words=["A", "dog", "barks"], heads=[1, 2, -1], upos=["DET", "NOUN", "VERB"])
    ids = token_pos_ids([s], [[None, 0, 1, 1, 2, None]], width=7, variant="package")
    assert ids.tolist() == [[0, 6, 8, 8, 16, 0, 0]]
    # The paper and the release: 0 padding, 18 [CLS], 19 [SEP], 20 a tag outside UPOS.
    s.upos[0] = "???"
    ids = token_pos_ids([s], [[None, 0, 1, 1, 2, None, None]], variant="release", lengths=[6])
    assert ids.tolist() == [[18, 20, 8, 8, 16, 19, 0]]


@pytest.mark.long_on_cpu
def test_ud_sentences_end_to_end(ud_dev_path, tmp_path):
    """CoNLL-U -> a fast WordPiece tokenizer -> TreeCollator -> a few training steps of each method."""
    pytest.importorskip("tokenizers")
    from syntaxkernels.tools.testing import wordpiece_tokenizer

    sentences = [s for s in sk.trees.read_conllu(ud_dev_path) if 3 <= len(s) <= 20][:16]
    tok = wordpiece_tokenizer([" ".join(s.words) for s in sentences], tmp_path, vocab_size=120)
    collate = sk.trees.TreeCollator(tokenizer=tok)
    batch = collate(sentences[:8])
    assert batch["input_ids"].shape[1] > max(len(s) for s in sentences[:8])  # words split into pieces
    pos = token_pos_ids(batch["sentences"], batch["word_ids"], width=batch["input_ids"].shape[1])
    for method, kwargs in [("bias", {}), ("subnetwork", {}), ("gat", {"gat_config": dict(GAT_SMALL, probe_rank=4)})]:
        config = transformers.BertConfig(**dict(SMALL, vocab_size=len(tok)), num_labels=len(sk.integrations
                                         .transformers.UPOS_TAGS) + 1)
        model = transformers.BertForTokenClassification(config)
        enable_syntax_attention(model, method, **kwargs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        extra = {"syntax_pos": pos} if method == "gat" else {}
        labels = pos.masked_fill(batch["attention_mask"] == 0, -100)
        losses = []
        for _ in range(4):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        syntax_trees=batch["trees"], labels=labels, **extra)
            loss = out.loss + (0.01 * syntax_aux_loss(model) if method == "gat" else 0.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(out.loss.detach()))
        assert all(torch.isfinite(torch.tensor(losses)))
        assert losses[-1] < losses[0], (method, losses)
