"""Several relations per score: ``sk.RelationBatch`` (R distances as one uint8 code per pair, a table and a strength
per relation) on the distance-bias op, against the float64 reference computed relation by relation (``distance
[B, R, N, N]``): forward and every gradient (q, k, v, each relation's table, each strength), padded and packed, on
the C++ kernels and the Triton kernels (the interpreter on a CPU machine), the one-tile short rows and the tiled
kernels; the codes, the directed tree relations, the module, CUDA-graph style ``copy_``, and the errors."""
import random

import pytest
import torch

import syntaxkernels as sk
from syntaxkernels import reference
from syntaxkernels.nn import DistanceBias, SyntaxBiasedSelfAttention
from syntaxkernels.ops.bias_attention import configs
from syntaxkernels.trees import GraphBatch, RelationBatch, pack_padded
from syntaxkernels.trees.relations import CODE_BUCKETS, code_buckets, relation_codes

from conftest import CPP, TRITON

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC5 = sk.BucketSpec(max_distance=5)  # 7 buckets
SPEC3 = sk.BucketSpec(max_distance=3)  # 5 buckets


def random_heads(rng, n):
    return [-1 if i == 0 else rng.randrange(i) for i in range(n)] if n else []


def relation_case(seed=0, sizes=(7, 3, 0, 5), per_head=True, H=2, D=16):
    """Two parses of each item (two random trees) and a directed graph over the same tokens; q, k, v, per-relation
    tables (of different lengths) and strengths, float64."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    first = sk.TreeBatch.from_heads([random_heads(rng, n) for n in sizes])
    second = sk.TreeBatch.from_heads([random_heads(rng, n) for n in sizes])
    edges = [[(rng.randrange(n), rng.randrange(n)) for _ in range(n)] if n else [] for n in sizes]
    graph = GraphBatch.from_edges(edges, list(sizes), directed=True)
    plans = [first, second, graph]
    specs = [SPEC5, SPEC5, SPEC3]
    B, N = first.distance.shape[:2]
    q, k, v, grad = (torch.randn(B, H, N, D, dtype=torch.float64) for _ in range(4))
    shape = (H,) if per_head else ()
    tables = [torch.randn(*shape, s.num_buckets, dtype=torch.float64) for s in specs]
    scales = torch.tensor([0.7, 1.3, -0.6], dtype=torch.float64)
    return dict(plans=plans, specs=specs, q=q, k=k, v=v, grad=grad, tables=tables, scales=scales,
                lengths=first.kernel_lengths, sizes=sizes)


def spec_run(case, dtype=torch.float64):
    """The specification: the reference on ``[B, R, N, N]``, relation by relation."""
    inputs = [case[n].to(dtype).requires_grad_() for n in ("q", "k", "v")]
    tables = [t.clone().requires_grad_() for t in case["tables"]]
    scales = case["scales"].clone().requires_grad_()
    distance = torch.stack([p.distance for p in case["plans"]], 1)
    out = reference.syntax_bias_attention(*inputs, distance, tables, buckets=case["specs"], bias_scale=scales,
                                          lengths=case["lengths"])
    grads = torch.autograd.grad(out, inputs + tables + [scales], case["grad"].to(dtype))
    return out, grads


def check(got, want, atol=3e-5):
    out, grads = got
    out_ref, grads_ref = want
    torch.testing.assert_close(out.double().cpu(), out_ref.double(), atol=atol, rtol=1e-4)
    for i, (g, r) in enumerate(zip(grads, grads_ref)):
        torch.testing.assert_close(g.double().cpu(), r.double(), atol=atol, rtol=1e-4, msg=lambda m: f"grad {i}: {m}")
        if r.abs().max() > 1e-3:
            assert g.abs().max() > 0, f"gradient {i} is all zeros"


# -- the codes --------------------------------------------------------------------------------------------------

def test_codes_hold_each_relations_bucket():
    rng = random.Random(3)
    d = [torch.tensor([[rng.choice([0, 1, 2, 4, 9, 254, 255]) for _ in range(6)] for _ in range(6)],
                      dtype=torch.uint8)[None] for _ in range(3)]
    specs = [SPEC5, SPEC3, sk.BucketSpec(max_distance=2, unreachable_bucket=False)]  # 7 x 5 x 3 = 105 codes
    code = relation_codes(d, specs)
    table = code_buckets(specs)
    assert code.dtype == torch.uint8 and table.shape == (3, 256)
    assert int(code.max()) < 105
    for r, spec in enumerate(specs):
        assert torch.equal(table[r][code.long()], spec.lut()[d[r].long()]), r


def test_too_many_codes_and_mismatched_plans_are_refused():
    a = sk.TreeBatch.from_heads([[-1, 0, 1]])
    with pytest.raises(ValueError, match="more than the 256"):
        RelationBatch.from_plans([a, a], sk.BucketSpec(max_distance=20))
    with pytest.raises(ValueError, match="does not match"):
        RelationBatch.from_plans([a, sk.TreeBatch.from_heads([[-1, 0, 1, 2]])])
    with pytest.raises(ValueError, match="lengths differ"):
        RelationBatch.from_plans([sk.TreeBatch.from_heads([[-1, 0, 1], [-1]]),
                                  sk.TreeBatch.from_heads([[-1, 0, 1], [-1, 0]])])
    with pytest.raises(ValueError, match="packed plan among"):
        RelationBatch.from_plans([a, sk.TreeBatch.from_heads([[-1, 0, 1]], packed=True)])
    with pytest.raises(TypeError):
        RelationBatch.from_plans([a.distance])


def test_reference_of_relations_is_the_sum_of_each_relations_bias():
    """The specification itself against a hand-written dense computation (one bias per relation, summed)."""
    case = relation_case(per_head=False)
    out, _ = spec_run(case)
    q, k, v = case["q"], case["k"], case["v"]
    bias = sum(c * t[s.lut()[p.distance.long()]] for p, s, t, c in
               zip(case["plans"], case["specs"], case["tables"], case["scales"]))
    scores = q @ k.transpose(-1, -2) / 4.0 + bias[:, None]
    valid = torch.arange(q.shape[2])[None] < case["lengths"][:, None]
    allowed = (valid[:, :, None] & valid[:, None, :])[:, None]
    p = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    want = (p @ v).masked_fill(~valid[:, None, :, None], 0.0)
    torch.testing.assert_close(out, want)


# -- the fused paths against the specification --------------------------------------------------------------------

def run(case, plan, backend, device, dtype=torch.float32, per_head_table_tensor=False):
    inputs = [case[n].to(device, dtype).requires_grad_() for n in ("q", "k", "v")]
    tables = [t.to(device, torch.float32).requires_grad_() for t in case["tables"]]
    scales = case["scales"].to(device, torch.float32).requires_grad_()
    out = sk.syntax_bias_attention(*inputs, plan.to(device), tables, buckets=case["specs"], bias_scale=scales,
                                   backend=backend)
    grads = torch.autograd.grad(out, inputs + tables + [scales], case["grad"].to(device, dtype))
    return out, grads


@pytest.mark.parametrize("per_head", [True, False], ids=["per_head", "shared"])
@pytest.mark.parametrize("short_rows", [True, False], ids=["short_rows", "tiled"])
@pytest.mark.parametrize("path", [CPP, TRITON])
def test_padded_relations_match_the_reference(monkeypatch, path, short_rows, per_head):
    backend, device = path
    if backend == "auto" and not short_rows:
        pytest.skip("the C++ kernels have one path")
    monkeypatch.setattr(configs, "_SHORT_ROWS", short_rows)
    case = relation_case(per_head=per_head)
    plan = RelationBatch.from_plans(case["plans"], case["specs"])
    assert plan.symmetric is False  # the directed graph relation
    got = run(case, plan, backend, device)
    check(got, spec_run(case))
    assert torch.all(got[0][2] == 0)  # the empty item


@pytest.mark.parametrize("path", [CPP, TRITON])
def test_packed_relations_match_the_padded_reference(path):
    """The same relations packed (each item's sequence end to end, empty sequences too) against the padded
    specification: the packed output and q, k, v gradients are the padded ones' valid rows; the tables' and the
    strengths' gradients are the padded ones."""
    backend, device = path
    case = relation_case(seed=1, per_head=True)
    packed = [sk.TreeBatch.from_heads(_heads_of(p), packed=True) for p in case["plans"][:2]]
    packed.append(GraphBatch.from_edges(_edges_of(case["plans"][2]), list(case["sizes"]), directed=True,
                                        packed=True))
    plan = RelationBatch.from_plans(packed, case["specs"])
    assert plan.is_packed and plan.num_relations == 3
    lengths = case["lengths"]
    inputs = [pack_padded(case[n].transpose(1, 2), lengths).to(device, torch.float32).requires_grad_()
              for n in ("q", "k", "v")]
    tables = [t.to(device, torch.float32).requires_grad_() for t in case["tables"]]
    scales = case["scales"].to(device, torch.float32).requires_grad_()
    out = sk.syntax_bias_attention(*inputs, plan.to(device), tables, buckets=case["specs"], bias_scale=scales,
                                   backend=backend)
    grad = pack_padded(case["grad"].transpose(1, 2), lengths).to(device, torch.float32)
    grads = torch.autograd.grad(out, inputs + tables + [scales], grad)
    ref_out, ref_grads = spec_run(case)
    want = [pack_padded(t.transpose(1, 2), lengths) for t in [ref_out] + list(ref_grads[:3])]
    check((out, grads), (want[0], want[1:] + list(ref_grads[3:])))


def _heads_of(tree_batch):
    return [tree_batch.heads[b, :int(n)].tolist() for b, n in enumerate(tree_batch.lengths)]


def _edges_of(graph):
    return [[tuple(e) for e in graph.edges[b].tolist() if e[0] >= 0] for b in range(graph.num_items)]


@pytest.mark.parametrize("path", [CPP, TRITON])
def test_causal_relations_and_a_bare_four_dimensional_distance(path):
    """``distance [B, R, N, N]`` with ``lengths`` (a plan made per call) and a causal layer, one table shape for all
    relations (``[R, H, T]``) and one strength for all."""
    backend, device = path
    case = relation_case(seed=2)
    case["specs"] = [SPEC5, SPEC5]
    case["plans"] = case["plans"][:2]
    case["tables"] = [t[..., :7] for t in case["tables"][:2]]
    distance = torch.stack([p.distance for p in case["plans"]], 1)
    table = torch.stack(case["tables"]).float().to(device).requires_grad_()
    scale = torch.tensor([0.8], device=device, requires_grad=True)
    inputs = [case[n].to(device, torch.float32).requires_grad_() for n in ("q", "k", "v")]
    out = sk.syntax_bias_attention(*inputs, distance.to(device), table, buckets=SPEC5, bias_scale=scale,
                                   lengths=case["lengths"].to(device), causal=True, backend=backend)
    grads = torch.autograd.grad(out, inputs + [table, scale], case["grad"].to(device, torch.float32))
    ins = [case[n].clone().requires_grad_() for n in ("q", "k", "v")]
    t64, c64 = table.detach().double().cpu().requires_grad_(), scale.detach().double().cpu().requires_grad_()
    ref = reference.syntax_bias_attention(*ins, distance, t64, buckets=SPEC5, bias_scale=c64,
                                          lengths=case["lengths"], causal=True)
    check((out, grads), (ref, torch.autograd.grad(ref, ins + [t64, c64], case["grad"])))


# -- the module ---------------------------------------------------------------------------------------------------

def test_module_with_relations_equals_the_op_and_refuses_one_distance():
    case = relation_case(seed=4)
    plan = RelationBatch.from_plans(case["plans"], case["specs"])
    layer = SyntaxBiasedSelfAttention(32, 2, buckets=case["specs"], per_head=True, relations=3)
    assert layer.distance_bias.shape == (3, 2, 7) and layer.bias_scale.shape == (3,)
    with torch.no_grad():
        layer.distance_bias.normal_()
        layer.bias_scale.copy_(case["scales"])
    x = torch.randn(plan.distance.shape[0], plan.distance.shape[1], 32)
    out = layer(x, plan)
    q, k, v = (p(x).view(*x.shape[:2], 2, 16).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    tables = [layer.distance_bias[r, :, :s.num_buckets].double() for r, s in enumerate(case["specs"])]
    distance = torch.stack([p.distance for p in case["plans"]], 1)
    want = reference.syntax_bias_attention(q.double(), k.double(), v.double(), distance, tables,
                                           buckets=case["specs"], bias_scale=layer.bias_scale.double(),
                                           lengths=case["lengths"])
    want = layer.out_proj(want.transpose(1, 2).reshape(*x.shape).float())
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    out.sum().backward()
    assert layer.distance_bias.grad[:, :, :5].abs().sum() > 0
    assert torch.all(layer.distance_bias.grad[2, :, 5:] == 0)  # relation 2 uses 5 of the 7 entries
    with pytest.raises(ValueError, match="takes 3 relations"):
        layer(x, case["plans"][0])
    with pytest.raises(ValueError, match="takes no relations"):
        DistanceBias(2).attend(q, k, v, plan)
    with pytest.raises(ValueError, match="more than the 256"):
        DistanceBias(2, buckets=sk.BucketSpec(max_distance=20), relations=2)


# -- directed tree relations ---------------------------------------------------------------------------------------

def brute_steps(heads, i, j):
    """Steps up from i to the lowest common ancestor and down from it to j."""
    def ancestors(t):
        out = [t]
        while heads[t] >= 0:
            t = heads[t]
            out.append(t)
        return out
    ai, aj = ancestors(i), ancestors(j)
    common = next(a for a in ai if a in aj)
    return ai.index(common), aj.index(common)


def test_directed_tree_relations_are_steps_up_and_down():
    rng = random.Random(7)
    heads = [random_heads(rng, n) for n in (9, 4, 1)]
    trees = sk.TreeBatch.from_heads(heads)
    plan = RelationBatch.directed_tree(trees, max_steps=3)
    assert plan.num_relations == 2 and plan.symmetric is False
    up = plan.code_buckets[0][plan.distance.long()]
    down = plan.code_buckets[1][plan.distance.long()]
    unreachable = SPEC3.lut()[255]
    for b, h in enumerate(heads):
        for i in range(trees.distance.shape[1]):
            for j in range(trees.distance.shape[1]):
                if i >= len(h) or j >= len(h):
                    assert up[b, i, j] == unreachable and down[b, i, j] == unreachable
                    continue
                u, d = brute_steps(h, i, j)
                assert (int(up[b, i, j]), int(down[b, i, j])) == (min(u, 3), min(d, 3)), (b, i, j)
    with pytest.raises(ValueError, match="1..14"):
        RelationBatch.directed_tree(trees, max_steps=15)
    chain = sk.TreeBatch.from_heads([[-1] + list(range(255))])
    with pytest.raises(ValueError, match="batch item 0"):
        RelationBatch.directed_tree(chain)


# -- plans, errors ------------------------------------------------------------------------------------------------

def test_copy_into_a_captured_relation_plan_gives_the_new_batchs_result():
    """CUDA-graph replay copies a new batch into the captured plan (``copy_``): the op then computes the new batch."""
    a, b = relation_case(seed=8), relation_case(seed=9)
    captured = RelationBatch.from_plans(a["plans"], a["specs"])
    new = RelationBatch.from_plans(b["plans"], b["specs"])
    captured.copy_(new)
    q, k, v = (b[n].float() for n in ("q", "k", "v"))
    tables = [t.float() for t in b["tables"]]
    got = sk.syntax_bias_attention(q, k, v, captured, tables, buckets=b["specs"], bias_scale=b["scales"].float())
    want = sk.syntax_bias_attention(q, k, v, new, tables, buckets=b["specs"], bias_scale=b["scales"].float())
    assert torch.equal(got, want)


def test_relation_call_errors():
    case = relation_case()
    plan = RelationBatch.from_plans(case["plans"], case["specs"])
    q, k, v = (case[n].float() for n in ("q", "k", "v"))
    tables = [t.float() for t in case["tables"]]
    with pytest.raises(ValueError, match="window applies to one distance"):
        sk.syntax_bias_attention(q, k, v, plan, tables, buckets=case["specs"], window=2)
    with pytest.raises(ValueError, match="differ from the RelationBatch"):
        sk.syntax_bias_attention(q, k, v, plan, tables, buckets=SPEC5)
    with pytest.raises(ValueError, match="relation 2: its table has 7 entries"):
        sk.syntax_bias_attention(q, k, v, plan, [tables[0], tables[1], tables[0]], buckets=case["specs"])
    with pytest.raises(ValueError, match="1 or R = 3 elements"):
        sk.syntax_bias_attention(q, k, v, plan, tables, buckets=case["specs"], bias_scale=torch.ones(2))
    with pytest.raises(ValueError, match="2 tables for 3 relations"):
        sk.syntax_bias_attention(q, k, v, plan, tables[:2], buckets=case["specs"])
    # with the code's own buckets the table is one entry per code: the op on one distance, the code
    code_table = plan.code_table(tables, case["scales"].float())
    assert code_table.shape == (2, 256)
    direct = sk.syntax_bias_attention(q, k, v, plan, code_table, buckets=CODE_BUCKETS)
    torch.testing.assert_close(direct, sk.syntax_bias_attention(q, k, v, plan, tables, buckets=case["specs"],
                                                                bias_scale=case["scales"].float()))


# -- the transformers integration -----------------------------------------------------------------------------------

def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     vocab_size=100)
    torch.manual_seed(0)
    return transformers.BertForTokenClassification(config).eval()


def test_transformers_model_takes_a_relation_batch(tmp_path):
    """``enable_syntax_attention(model, "bias", relations=2)``: fresh, the unpatched model's logits; with the second
    relation's table at zero, the one-distance model's on the first parse (same weights); gradients reach both
    relations' tables; save / load_syntax_model round trip."""
    import copy

    from syntaxkernels.integrations.transformers import (enable_syntax_attention, load_syntax_model,
                                                         syntax_parameters)

    first = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0, 4, 5], [-1, 0, 0, 2]])
    second = sk.TreeBatch.from_heads([[-1, 0, 0, 0, 3, 3, 5], [-1, 0, 1, 1]])
    relations = RelationBatch.from_plans([first, second], SPEC5)
    ids = torch.randint(4, 100, (2, 7))
    mask = (torch.arange(7)[None] < first.lengths[:, None]).long()
    plain = _tiny_bert()
    model = copy.deepcopy(plain)
    enable_syntax_attention(model, "bias", buckets=SPEC5, relations=2)
    valid = mask.bool()  # (padding tokens' outputs are not compared: the syntax layers zero their rows)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, syntax_trees=relations).logits[valid],
                               plain(input_ids=ids, attention_mask=mask).logits[valid], atol=1e-5, rtol=1e-5)
    single = copy.deepcopy(plain)
    enable_syntax_attention(single, "bias", buckets=SPEC5)
    params, single_params = syntax_parameters(model), syntax_parameters(single)
    with torch.no_grad():
        for name, p in params.items():
            p.normal_(0.0, 0.5)
            if name.endswith("distance_bias"):
                p[1] = 0.0
                single_params[name].copy_(p[0])
            else:
                single_params[name].copy_(p[:1])
    got = model(input_ids=ids, attention_mask=mask, syntax_trees=relations).logits
    want = single(input_ids=ids, attention_mask=mask, syntax_trees=first).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    table = next(p for n, p in params.items() if n.endswith("distance_bias"))
    assert table.grad[0].abs().sum() > 0 and table.grad[1].abs().sum() > 0
    with pytest.raises(ValueError, match="takes 2 relations"):
        model(input_ids=ids, attention_mask=mask, syntax_trees=first)
    with pytest.raises(ValueError, match="relations takes no window"):
        enable_syntax_attention(copy.deepcopy(plain), "bias", relations=2, window=3)
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(type(model), tmp_path).eval()
    assert loaded.config.syntax_attention["relations"] == 2
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask, syntax_trees=relations).logits, got,
                               atol=1e-6, rtol=1e-6)


def test_index_select_and_repeat_interleave():
    case = relation_case(seed=10)
    plan = RelationBatch.from_plans(case["plans"], case["specs"])
    picked = plan.index_select([3, 0, 0])
    assert torch.equal(picked.distance, plan.distance[[3, 0, 0]])
    assert torch.equal(picked.kernel_lengths, plan.kernel_lengths[[3, 0, 0]])
    assert picked.buckets == plan.buckets and picked.symmetric == plan.symmetric
    repeated = plan.repeat_interleave(2)
    assert torch.equal(repeated.distance, plan.distance.repeat_interleave(2, 0))
    assert repeated.distance.stride(1) % 16 == 0  # (the aligned rows kept)
    with pytest.raises(ValueError, match="item numbers must be in 0..3"):
        plan.index_select([4])
    with pytest.raises(ValueError, match="repeats must be an int"):
        plan.repeat_interleave(0)


def test_beam_search_repeats_a_relation_batch():
    """A decoder-only model with ``relations=2``: ``generate(num_beams=2)`` repeats each item's relations per beam
    (item b's beams next to each other): the first step's logits are a forward on the repeated prompts and
    relations, which differs from one whose relations are repeated in the other order."""
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention, syntax_parameters

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=100)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    enable_syntax_attention(model, "bias", buckets=SPEC5, relations=2)
    with torch.no_grad():
        for p in syntax_parameters(model).values():
            p.normal_(0.0, 2.0)
    first = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 3], [1, 2, -1, 2, 2]], leak_free=True)
    second = sk.TreeBatch.from_heads([[-1, 0, 0, 0, 0], [-1, 0, 1, 2, 3]], leak_free=True)
    relations = RelationBatch.from_plans([first, second], SPEC5)
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        out = model.generate(ids, syntax_trees=relations, num_beams=2, max_new_tokens=1, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        want = model(ids.repeat_interleave(2, 0), syntax_trees=relations.repeat_interleave(2)).logits[:, -1]
        other = model(ids.repeat_interleave(2, 0), syntax_trees=relations.index_select([0, 1, 0, 1])).logits[:, -1]
    torch.testing.assert_close(out.logits[0], want, atol=1e-5, rtol=1e-5)
    assert (want - other).abs().max() > 1e-3


@pytest.mark.parametrize("path", [CPP, TRITON])
def test_two_parses_averaged_with_one_tied_table(path):
    """Several parses averaged: the same table for both relations and strengths 1/2 (``bias = (t[b1] + t[b2]) / 2``):
    the shared table's gradient is both relations' (autograd adds them), against the reference."""
    backend, device = path
    case = relation_case(seed=11, per_head=False)
    plans, spec = case["plans"][:2], SPEC5
    plan = RelationBatch.from_plans(plans, spec)
    table = case["tables"][0].float().to(device).requires_grad_()
    inputs = [case[n].to(device, torch.float32).requires_grad_() for n in ("q", "k", "v")]
    half = torch.full((2,), 0.5, device=device)
    out = sk.syntax_bias_attention(*inputs, plan.to(device), [table, table], buckets=spec, bias_scale=half,
                                   backend=backend)
    grads = torch.autograd.grad(out, inputs + [table], case["grad"].to(device, torch.float32))
    ins = [case[n].clone().requires_grad_() for n in ("q", "k", "v")]
    t64 = case["tables"][0].clone().requires_grad_()
    distance = torch.stack([p.distance for p in plans], 1)
    ref = reference.syntax_bias_attention(*ins, distance, [t64, t64], buckets=spec, bias_scale=half.double().cpu(),
                                          lengths=case["lengths"])
    check((out, grads), (ref, torch.autograd.grad(ref, ins + [t64], case["grad"])))


def test_transformers_model_takes_one_bucket_spec_per_relation(tmp_path):
    """``enable_syntax_attention(..., buckets=[spec_0, spec_1], relations=2)``: each relation's table its own length
    (a code model's relations are binned differently): the layer hands the op each relation's first ``T_r`` entries
    (the rest of the ``[R, max T_r]`` parameter gets no gradient), the second relation's structure changes the output,
    save / load round trip; a wrong count of specs is a ValueError. (The op with per-relation specs is checked
    against the reference above.)"""
    import copy

    from syntaxkernels.integrations.transformers import (enable_syntax_attention, load_syntax_model,
                                                         syntax_parameters)

    small = sk.BucketSpec(max_distance=2)
    first = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0, 4, 5], [-1, 0, 0, 2]])
    second = sk.TreeBatch.from_heads([[-1, 0, 0, 0, 3, 3, 5], [-1, 0, 1, 1]])
    ids = torch.randint(4, 100, (2, 7))
    mask = (torch.arange(7)[None] < first.lengths[:, None]).long()
    plain = _tiny_bert()
    model = copy.deepcopy(plain)
    enable_syntax_attention(model, "bias", buckets=[SPEC5, small], relations=2)
    assert model.config.syntax_attention["buckets"][1]["max_distance"] == 2
    params = syntax_parameters(model)
    table = next(p for n, p in params.items() if n.endswith("distance_bias"))
    assert table.shape == (2, SPEC5.num_buckets)
    with torch.no_grad():
        for p in params.values():
            p.normal_(0.0, 0.5)
    plan = RelationBatch.from_plans([first, second], [SPEC5, small])
    got = model(input_ids=ids, attention_mask=mask, syntax_trees=plan).logits
    layer = next(m for m in model.modules() if isinstance(m, sk.nn.DistanceBias))
    assert [t.shape[-1] for t in layer._table()] == [SPEC5.num_buckets, small.num_buckets]
    got.sum().backward()
    assert table.grad[1, small.num_buckets:].abs().sum() == 0 and table.grad[1, :small.num_buckets].abs().sum() > 0
    model.save_pretrained(tmp_path)
    loaded = load_syntax_model(type(model), tmp_path).eval()
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask, syntax_trees=plan).logits, got,
                               atol=1e-6, rtol=1e-6)
    other = model(input_ids=ids, attention_mask=mask,
                  syntax_trees=RelationBatch.from_plans([first, first], [SPEC5, small])).logits
    assert (other - got).abs().max() > 1e-5  # the second relation is read (float noise: ~1e-7)
    with pytest.raises(ValueError, match="holds 3 BucketSpecs for relations = 2"):
        enable_syntax_attention(copy.deepcopy(plain), "bias", buckets=[SPEC5, small, small], relations=2)
    with pytest.raises(TypeError, match="buckets must be a BucketSpec"):
        enable_syntax_attention(copy.deepcopy(plain), "bias", buckets=[SPEC5, small])  # a list needs relations
