"""A look at what was learned: ``syntaxkernels.show`` and ``python -m syntaxkernels show``.

The values the panels show must be the model's parameters (or, on a batch, what the model's attention does),
the PNG must be a real image, and every kind of source (module, save_pretrained directory, state-dict file,
checkpoint dict, pickled module) must give the same figures.
"""
import importlib.util
import json
import math
import sys

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.show import attention_by_distance, learned_syntax, plot_learned

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib is not installed (pip install matplotlib, or the [plot] "
                                             "or [test] extra)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    import matplotlib.image

    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert image.std() > 0.01  # not a blank canvas


class TwoLayers(torch.nn.Module):
    """A user model holding sk.nn modules: a shared table in layer 0, a per-head one in layer 1."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([
            sk.nn.SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=4)),
            sk.nn.SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=6, log_distance=2),
                                            per_head=True),
        ])

    def forward(self, x, trees):
        for layer in self.layers:
            x = x + layer(x, trees)
        return x


def _randomised(module, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("distance_bias", "bias_scale", "topical.query")) or "syntax_proj" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
    return module


def test_learned_values_are_the_parameters_of_a_module():
    model = _randomised(TwoLayers())
    learned = learned_syntax(model)
    assert [b.layer for b in learned.bias] == [0, 1]
    for b, layer in zip(learned.bias, model.layers):
        assert torch.equal(b.table, layer.distance_bias.detach())
        assert b.bias_scale == float(layer.bias_scale.detach())
        assert torch.allclose(b.values, layer.distance_bias.detach() * layer.bias_scale.detach())
        assert b.bucket_names == layer.buckets.bucket_names()
    assert learned.bias[0].bucket_names == ["0", "1", "2", "3", ">=4", "unreachable"]
    assert learned.bias[1].per_head and learned.bias[1].values.shape == (2, learned.bias[1].buckets.num_buckets)
    text = learned.summary()
    assert "layer 1: bias scale c" in text and "head 1:" in text


@needs_matplotlib
def test_plot_writes_a_png_of_the_parameters(tmp_path):
    model = _randomised(TwoLayers())
    out = tmp_path / "bias.png"
    learned, figure = plot_learned(model, out)
    _assert_png(out)
    # one panel per layer plus the bias-scale panel, labelled
    axes = [ax for ax in figure.axes if ax.get_visible() and ax.get_title()]
    titles = [ax.get_title() for ax in axes]
    assert titles[0].startswith("layer 0: distance bias") and titles[1].startswith("layer 1: distance bias")
    assert "learned bias scale per layer" in titles
    bars = axes[0]
    assert [t.get_text() for t in bars.get_xticklabels()] == model.layers[0].buckets.bucket_names()
    assert bars.get_xlabel() == "tree distance (bucket)" and bars.get_ylabel()
    heights = [p.get_height() for p in bars.patches]
    assert heights == pytest.approx(learned.bias[0].values.tolist())
    heat = axes[1].images[0].get_array()
    assert torch.allclose(torch.as_tensor(heat.data), learned.bias[1].values)
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_attention_by_distance_on_a_batch():
    torch.manual_seed(0)
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=4))
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2, 3, 4], [-1, 0, 1]])
    x = torch.randn(2, 6, 16)
    (fresh,) = attention_by_distance(layer, {"x": x, "trees": trees}).mass
    assert torch.allclose(fresh.learned, fresh.plain)  # zero table: the same attention
    assert float(fresh.learned.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(fresh.pairs.sum()) == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        layer.distance_bias[1] = 30.0  # every token attends its tree neighbours
    (strong,) = learned_syntax(layer, batch={"x": x, "trees": trees}).mass
    assert float(strong.learned[1]) == pytest.approx(1.0, abs=1e-4)
    assert torch.allclose(strong.plain, fresh.plain, atol=1e-6)
    assert layer.training  # the mode is restored
    assert "attend" not in vars(layer)  # the instrumentation is removed
    # share of pairs: item 1 (3 tokens, a chain) and item 0 (6 tokens): by hand for bucket 0 (the diagonal)
    assert float(strong.pairs[0]) == pytest.approx((6 * (1 / 6) + 3 * (1 / 3)) / 9)


def test_topical_mixing_weights_per_relation():
    torch.manual_seed(0)
    masks = sk.MaskSpec(max_distance=2)
    module = sk.nn.SyntaxBertSelfAttention(16, 2, masks=masks, variant="package")
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2, 3], [-1, 0]])
    x = torch.randn(2, 5, 16)
    (fresh,) = learned_syntax(module, batch={"x": x, "trees": trees}).topical
    assert fresh.relations == masks.names
    assert torch.allclose(fresh.sharpness, torch.zeros(2))  # query zeros: a plain average
    # a fresh module averages the non-empty sub-networks: the weights follow from the masks alone
    nonempty = sk.reference.syntax_masks(trees, masks).any(-1)  # [B, M, N]
    share = nonempty.float() / nonempty.sum(1, keepdim=True).clamp(min=1)  # 1/K where present
    expected = share.sum(dim=(0, 2)) / nonempty.sum(dim=(0, 2))
    present = nonempty.any(2).any(0)  # relations some token has (parent_2 needs a grandchild: item 0 has one)
    assert present.all()
    assert torch.allclose(fresh.weights, expected.expand(2, -1), atol=1e-6)
    assert torch.allclose(fresh.relative, torch.ones(2, masks.num_masks), atol=1e-5)
    # a relation no token has is NaN, not 0
    (lonely,) = learned_syntax(module, batch={"x": x[1:, :2], "trees": sk.TreeBatch.from_heads([[-1, 0]])}).topical
    assert torch.isnan(lonely.relative[:, masks.names.index("parent_2")]).all()
    assert not torch.isnan(lonely.relative[:, masks.names.index("full")]).any()

    _randomised(module)
    (trained,) = learned_syntax(module).topical
    u = torch.matmul(module.topical.key_weight, module.topical.query[:, :, None])[:, :, 0] / math.sqrt(8)
    assert torch.allclose(trained.sharpness, u.norm(dim=-1).detach())
    assert trained.weights is None  # measured only on a batch


# -------------------------------------------------------------------------------- transformers checkpoints

SMALL = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             num_labels=3)


def _trained_bert(method, steps=3, **kwargs):
    """A tiny BERT with syntax attention, trained for a few steps so that its syntax parameters moved."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL))
    enable_syntax_attention(model, method, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0, 4], [-1, 0, 1, 2]])
    mask = (torch.arange(6) < trees.lengths[:, None]).long()
    ids = torch.randint(1, 50, (2, 6)) * mask
    labels = (trees.heads.clamp(min=0) % 3).masked_fill(mask == 0, -100)
    batch = dict(input_ids=ids, attention_mask=mask, syntax_trees=trees)
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, batch


def _syntax_tensors(model, suffix):
    return {name: p.detach() for name, p in model.named_parameters() if name.endswith(suffix)}


@needs_matplotlib
@pytest.mark.long_on_cpu
def test_cli_show_on_a_save_pretrained_directory(tmp_path, capsys):
    from syntaxkernels.__main__ import main

    model, _ = _trained_bert("bias", buckets={"max_distance": 5})
    model.save_pretrained(tmp_path / "model")
    out, values = tmp_path / "bias.png", tmp_path / "values.json"
    assert main(["show", str(tmp_path / "model"), "--out", str(out), "--json", str(values)]) == 0
    _assert_png(out)
    printed = capsys.readouterr().out
    assert "layer 1: bias scale c" in printed and f"wrote {out}" in printed
    data = json.loads(values.read_text())
    tables = _syntax_tensors(model, "distance_bias")
    scales = _syntax_tensors(model, "bias_scale")
    assert len(data["bias"]) == 2
    for entry in data["bias"]:
        name = entry["name"]
        assert torch.allclose(torch.tensor(entry["table"]), tables[name + ".distance_bias"])
        assert entry["bias_scale"] == pytest.approx(float(scales[name + ".bias_scale"]))
        assert entry["bucket_names"] == sk.BucketSpec(max_distance=5).bucket_names()
    assert not torch.equal(tables[data["bias"][0]["name"] + ".distance_bias"], torch.zeros(7))  # it trained


def test_every_kind_of_source_gives_the_same_figures(tmp_path):
    model, _ = _trained_bert("bias", per_head=True)
    model.save_pretrained(tmp_path / "model")
    torch.save(model.state_dict(), tmp_path / "state.pt")
    torch.save({"model": model.state_dict(), "step": 3}, tmp_path / "checkpoint.pt")
    torch.save(model, tmp_path / "module.pt")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "weights.safetensors"))

    reference = learned_syntax(model)
    sources = [tmp_path / "model", tmp_path / "state.pt", tmp_path / "checkpoint.pt",
               tmp_path / "weights.safetensors", model.state_dict()]
    for source in sources:
        learned = learned_syntax(source)
        assert [b.name for b in learned.bias] == [b.name for b in reference.bias], source
        for got, want in zip(learned.bias, reference.bias):
            assert torch.equal(got.table, want.table) and got.bias_scale == want.bias_scale
            assert got.bucket_names == want.bucket_names
    # a state dict does not record the buckets: the default scheme is assumed, and a note says so
    assert any("buckets assumed" in n for n in learned_syntax(tmp_path / "state.pt").notes)
    assert not learned_syntax(tmp_path / "model").notes  # the directory's config.json has them
    # a pickled module only when trusted
    with pytest.raises(ValueError, match="trusted=True.*--trust-pickle"):
        learned_syntax(tmp_path / "module.pt")
    trusted = learned_syntax(tmp_path / "module.pt", trusted=True)
    assert torch.equal(trusted.bias[1].table, reference.bias[1].table)


def test_directory_with_a_batch_and_other_methods(tmp_path):
    model, batch = _trained_bert("subnetwork", masks={"max_distance": 2}, variant="package")
    model.save_pretrained(tmp_path / "sub")
    learned = learned_syntax(tmp_path / "sub", batch=batch)
    assert [t.layer for t in learned.topical] == [0, 1]
    for t in learned.topical:
        assert t.relations == sk.MaskSpec(max_distance=2).names
        assert t.weights.shape == t.relative.shape == (4, len(t.relations))
        assert not torch.allclose(t.relative, torch.ones_like(t.relative))  # it trained: not a plain average
    queries = _syntax_tensors(model, "topical.query")
    assert torch.allclose(learned.topical[0].sharpness,
                          learned_syntax(model).topical[0].sharpness)
    assert float(learned.topical[0].sharpness.abs().sum()) > 0 and len(queries) == 2

    gat, _ = _trained_bert("gat", gat_config={"num_layers": 1, "num_heads": 2, "head_dim": 8, "num_pos_tags": 0})
    learned = learned_syntax(gat.state_dict())
    weights = _syntax_tensors(gat, "syntax_proj.q.weight")
    assert [g.layer for g in learned.injection] == [0, 1]
    for g in learned.injection:
        assert g.norms["q"] == pytest.approx(float(weights[g.name + ".syntax_proj.q.weight"].norm()))

    bias, bias_batch = _trained_bert("bias")
    measured = learned_syntax(bias, batch=bias_batch)
    assert [m.layer for m in measured.mass] == [0, 1]
    for m in measured.mass:
        assert float(m.learned.sum()) == pytest.approx(1.0, abs=1e-5)


def test_show_errors_say_what_is_wrong(tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match="no such file or directory"):
        learned_syntax(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a saved syntax model"):
        learned_syntax(tmp_path / "plain")
    with pytest.raises(ValueError, match="no syntax parameters"):
        learned_syntax({"encoder.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="has 12 entries but the buckets"):
        learned_syntax({"a.distance_bias": torch.zeros(12)}, buckets=sk.BucketSpec(max_distance=4))
    with pytest.raises(TypeError, match="source must be"):
        learned_syntax(3)
    with pytest.raises(ValueError, match="batch= needs a model"):
        learned_syntax({"a.distance_bias": torch.zeros(12)}, batch={})
    with pytest.raises(ValueError, match="holds no tensors"):
        learned_syntax({"optimizer": {"lr": 1}})
    # the CLI says it in one line and exits 2
    from syntaxkernels.__main__ import main

    assert main(["show", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "syntaxkernels show: no such file or directory" in capsys.readouterr().err
    # without matplotlib: an ImportError saying how to install it
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install matplotlib.*\[plot\]"):
        plot_learned({"a.distance_bias": torch.zeros(12)})
    assert main(["show", str(tmp_path / "missing")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err


@needs_matplotlib
def test_plot_subnetwork_and_gat_panels(tmp_path):
    import matplotlib.pyplot as plt

    model, batch = _trained_bert("subnetwork", masks={"max_distance": 2}, variant="package")
    learned, figure = plot_learned(model, tmp_path / "sub.png", batch=batch)
    _assert_png(tmp_path / "sub.png")
    panels = {ax.get_title(): ax for ax in figure.axes if ax.get_title()}
    heat = panels["layer 1: topical mixing weights"]
    assert torch.allclose(torch.as_tensor(heat.images[0].get_array().data), learned.topical[1].relative)
    assert [t.get_text() for t in heat.get_xticklabels()] == sk.MaskSpec(max_distance=2).names
    sharp = panels["topical query sharpness (0 = plain average)"]
    assert torch.allclose(torch.as_tensor(sharp.images[0].get_array().data),
                          torch.stack([t.sharpness for t in learned.topical]))
    plt.close(figure)

    gat, _ = _trained_bert("gat", gat_config={"num_layers": 1, "num_heads": 2, "head_dim": 8, "num_pos_tags": 0})
    learned, figure = plot_learned(gat, tmp_path / "gat.png")
    _assert_png(tmp_path / "gat.png")
    (ax,) = [ax for ax in figure.axes if ax.get_title() == "syntax-head injection strength"]
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([g.norms[t] for t in ("k", "q") for g in learned.injection])
    plt.close(figure)


CONLLU = """1\tThe\t_\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\t_\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\t_\tVERB\t_\t_\t0\troot\t_\t_
4\tdown\t_\tADV\t_\t_\t3\tadvmod\t_\t_

1\tDogs\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_
2\tbark\t_\tVERB\t_\t_\t0\troot\t_\t_

"""


@needs_matplotlib
def test_cli_show_runs_the_saved_model_on_conllu_sentences(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from syntaxkernels.__main__ import main
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    conllu = tmp_path / "small.conllu"
    conllu.write_text(CONLLU)
    wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(["the cat sat down", "dogs bark"], vocab_size=60, min_frequency=1)
    wordpiece.save(str(tmp_path / "tok.json"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tok.json"), cls_token="[CLS]",
                                                     sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(transformers.BertConfig(**dict(SMALL, vocab_size=len(tokenizer))))
    enable_syntax_attention(model, "bias")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("distance_bias"):
                p[1] = 5.0  # lean on tree neighbours
    model.save_pretrained(tmp_path / "model")
    args = ["show", str(tmp_path / "model"), "--out", str(tmp_path / "b.png"), "--conllu", str(conllu)]
    assert main(args) == 2  # no tokenizer in the directory: says how to give one
    assert "holds no tokenizer: pass --tokenizer" in capsys.readouterr().err
    tokenizer.save_pretrained(tmp_path / "model")
    assert main(args + ["--json", str(tmp_path / "v.json")]) == 0
    _assert_png(tmp_path / "b.png")
    mass = json.loads((tmp_path / "v.json").read_text())["mass"]
    assert [m["layer"] for m in mass] == [0, 1]
    for m in mass:
        learned, plain = m["learned"], m["plain"]
        assert sum(learned) == pytest.approx(1.0, abs=1e-4)
        assert learned[1] > plain[1] + 0.2  # the bias at distance 1 pulls attention to the neighbours
    assert "attention share by distance" in capsys.readouterr().out


@needs_matplotlib
def test_cli_show_on_a_state_dict_file_with_its_buckets(tmp_path, capsys):
    from syntaxkernels.__main__ import main

    model, _ = _trained_bert("bias", buckets={"max_distance": 6, "log_distance": 3})
    torch.save(model.state_dict(), tmp_path / "state.pt")
    base = ["show", str(tmp_path / "state.pt"), "--out", str(tmp_path / "s.png"), "--json", str(tmp_path / "v.json")]
    assert main(base + ["--max-distance", "6", "--log-distance", "3"]) == 0
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["bias"][0]["bucket_names"] == sk.BucketSpec(max_distance=6, log_distance=3).bucket_names()
    assert data["notes"] == []
    capsys.readouterr()
    assert main(base + ["--max-distance", "9"]) == 2  # 12 buckets, not this table's 6
    assert "pass the BucketSpec it was trained with" in capsys.readouterr().err
    assert main(base) == 0  # inferred from the table length, and the figure says so
    assert "buckets assumed" in capsys.readouterr().out


@needs_matplotlib
def test_every_layer_shares_one_scale_and_a_negligible_bias_is_marked(tmp_path, capsys):
    """Layer 0 learned a clear bias, layer 1 almost nothing (|c * table| <= 0.0035, what a fine-tuning learning rate
    leaves): both panels span the same range, layer 1 is marked too small to change attention, and that mark is
    right: its bias moves no attention share by more than e^spread - 1."""
    from syntaxkernels.show import NEGLIGIBLE_BIAS, bias_scale_limit

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([sk.nn.SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=4))
                                  for _ in range(2)])
    with torch.no_grad():
        layers[0].distance_bias.copy_(torch.tensor([0.0, 1.5, -0.4, 0.2, 0.0, -2.0]))
        layers[1].distance_bias.copy_(torch.tensor([0.0, 0.0035, -0.0035, 0.001, 0.0, 0.002]))
    learned, figure = plot_learned(layers, tmp_path / "b.png")
    assert [b.negligible for b in learned.bias] == [False, True]
    assert learned.bias[1].spread == pytest.approx(0.007, abs=1e-6) and learned.bias[0].spread == pytest.approx(3.5)
    assert bias_scale_limit(learned.bias) == pytest.approx(2.0)
    bars = [ax for ax in figure.axes if ax.get_title().startswith("layer")]
    assert bars[0].get_ylim() == bars[1].get_ylim() == pytest.approx((-2.1, 2.1))
    assert "too small to change attention" in bars[1].get_title() and "too small" not in bars[0].get_title()
    assert "too small to change attention" in learned.summary()
    # a model that learned nothing at all: the range stays at the threshold (flat bars, not magnified noise)
    with torch.no_grad():
        layers[0].distance_bias.zero_()
    assert bias_scale_limit(learned_syntax(layers).bias) == NEGLIGIBLE_BIAS
    with torch.no_grad():  # just above the threshold: marked as able to change attention
        layers[0].distance_bias.copy_(torch.tensor([0.0, 0.6, -0.6, 0.0, 0.0, 0.0]) * NEGLIGIBLE_BIAS)
    assert not learned_syntax(layers).bias[0].negligible
    import matplotlib.pyplot as plt

    plt.close(figure)
    # the bound behind the mark: on a batch, layer 1's bias moves each bucket's attention share by < 1% of itself
    trees = sk.TreeBatch.from_heads([[1, -1, 1, 2, 3, 4, 0, 6], [-1, 0, 1, 1]])
    (mass,) = attention_by_distance(layers[1], {"x": torch.randn(2, 8, 16), "trees": trees}).mass
    limit = math.exp(learned.bias[1].spread) - 1
    assert torch.all((mass.learned - mass.plain).abs() <= limit * mass.plain + 1e-7)


def test_cli_json_has_the_spread_and_the_mark(tmp_path, capsys):
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2, buckets=sk.BucketSpec(max_distance=4))
    path = tmp_path / "state.pt"
    torch.save(layer.state_dict(), path)
    from syntaxkernels.__main__ import main

    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    assert main(["show", str(path), "--out", str(tmp_path / "o.png"), "--json", str(tmp_path / "o.json"),
                 "--max-distance", "4"]) == 0
    (row,) = json.loads((tmp_path / "o.json").read_text())["bias"]
    assert row["spread"] == 0.0 and row["negligible"] is True
    assert "too small to change attention" in capsys.readouterr().out


def test_several_relations_show_one_table_each(tmp_path):
    """A layer of R relations gives R panels: relation r's own table entries, strength and buckets, from the module
    and from a saved directory alike (one BucketSpec for all relations, or one each)."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=50, max_position_embeddings=32)
    specs = [sk.BucketSpec(max_distance=4), sk.BucketSpec(max_distance=2)]
    for buckets in (specs, specs[0]):
        torch.manual_seed(0)
        model = transformers.BertModel(config)
        enable_syntax_attention(model, "bias", buckets=buckets, relations=2, layers=[1])
        _randomised(model)
        layer = next(m for m in model.modules() if isinstance(m, sk.nn.DistanceBias))
        directory = tmp_path / ("per_relation" if isinstance(buckets, list) else "shared")
        model.save_pretrained(directory)
        for source in (model, directory):
            learned = learned_syntax(source)
            assert [b.relation for b in learned.bias] == [0, 1]
            assert [b.layer for b in learned.bias] == [1, 1]
            for r, b in enumerate(learned.bias):
                spec = specs[r] if isinstance(buckets, list) else buckets
                assert b.buckets == spec and len(b.bucket_names) == spec.num_buckets
                c = float(layer.bias_scale.detach()[r])
                assert b.bias_scale == pytest.approx(c)
                want = c * layer.distance_bias.detach()[r, :spec.num_buckets]
                torch.testing.assert_close(b.values, want)
            assert "layer 1 relation 1: bias scale" in learned.summary()
