"""Errors a new user runs into: each names the argument, what was expected and what was passed (issue 20, point 4).

Every case here used to give a message about something else (a distance shape, a self-loop, a raw IndexError, a
file called '.'); the tests pin the new message and that valid inputs still pass.
"""
import re

import pytest
import torch

import syntaxkernels as sk

TREES = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0, 2, 2]])  # B = 2, N = 5


# ------------------------------------------------------------------------------- layouts of x and of q, k, v


@pytest.mark.parametrize("make", [
    lambda: sk.nn.SyntaxBiasedSelfAttention(32, 4),
    lambda: sk.nn.SyntaxBertSelfAttention(32, 4),
    lambda: sk.nn.SyntaxGAT(32, num_layers=1, num_heads=2, head_dim=8, window=2),
], ids=["bias", "subnetwork", "gat"])
def test_sequence_first_x_is_reported_as_x(make):
    module = make()
    x = torch.randn(2, 5, 32)
    module(x, TREES)  # batch-major is fine
    message = "x must have shape [B, N, E] = [2, 5, 32] to match the trees (B = 2 sequences of N = 5 tokens), " \
              "got (5, 2, 32); it looks sequence-first [N, B, E]: pass x.transpose(0, 1)"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        module(x.transpose(0, 1), TREES)
    with pytest.raises(ValueError, match=re.escape("x must have shape [B, N, E] = [2, 5, 32]") + ".*got \\(2, 4, 32\\)$"):
        module(x[:, :4], TREES)  # another N: no transposition hint
    if isinstance(module, sk.nn.SyntaxBiasedSelfAttention):
        with pytest.raises(ValueError, match="it looks sequence-first"):
            module(x.transpose(0, 1), TREES.distance)  # a distance tensor as the trees


@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_names_src_and_its_layout(batch_first):
    layer = sk.nn.SyntaxTransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=batch_first).eval()
    x = torch.randn(2, 5, 32)
    good, bad = (x, x.transpose(0, 1)) if batch_first else (x.transpose(0, 1), x)
    assert layer(good, TREES).shape == good.shape
    hint = "pass src.transpose(0, 1)" if batch_first else "build the layer with batch_first=True"
    layout = "[B, N, E] = [2, 5, 32]" if batch_first else "[N, B, E] = [5, 2, 32]"
    with pytest.raises(ValueError, match=re.escape(f"src must have shape {layout}") + ".*" + re.escape(hint)):
        layer(bad, TREES)


@pytest.mark.parametrize("op", ["bias", "subnetwork", "window"])
def test_q_in_token_major_layout_is_reported_as_q(op):
    q = torch.randn(2, 4, 5, 8)  # [B, H, N, D]
    table = torch.zeros(sk.BucketSpec().num_buckets)

    def run(t):
        if op == "bias":
            return sk.syntax_bias_attention(t, t, t, TREES.distance, table, buckets=sk.BucketSpec())
        if op == "subnetwork":
            return sk.syntax_subnetwork_attention(t, t, t, TREES, sk.MaskSpec())
        return sk.ops.syntax_window_attention(t, t, t, TREES, window=2)

    run(q)
    message = ("q, k, v must be [B, H, N, D] (heads before tokens) with N = 5 tokens as in distance (2, 5, 5); "
               "got q of shape (2, 5, 4, 8), which looks like [B, N, H, D]: pass q.transpose(1, 2) (and k, v "
               "likewise)")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        run(q.transpose(1, 2).contiguous())
    # A distance of another size is still reported as the distance, with q's shape for reference.
    with pytest.raises(ValueError, match=re.escape("distance must have shape [B, N, N] = [2, 6, 6] for q of shape "
                                                   "[B, H, N, D] = [2, 4, 6, 8], got (2, 5, 5)")):
        sk.syntax_bias_attention(*(torch.randn(2, 4, 6, 8),) * 3, TREES.distance, table, buckets=sk.BucketSpec())


# ------------------------------------------------------------------------------------------ heads conventions


@pytest.mark.parametrize("heads", [[[2, 0, 2]], [[2, 3, 0]], torch.tensor([[2, 0, 2]])],
                         ids=["self-loop", "out-of-range", "tensor"])
def test_one_based_heads_point_to_from_conllu_heads(heads):
    with pytest.raises(ValueError, match=r"^batch item 0, token \d: .*; batch item 0 has no root \(no head is -1\): "
                                         r"CoNLL-U heads \(1-based, 0 = root\) convert with sk.trees.from_conllu_heads"):
        sk.TreeBatch.from_heads(heads)
    with pytest.raises(ValueError, match="from_conllu_heads"):
        sk.tree_distance(heads)
    fixed = sk.trees.from_conllu_heads(heads)
    assert sk.TreeBatch.from_heads(fixed).lengths.tolist() == [3]


def test_errors_of_rooted_items_get_no_hint():
    for heads in ([[-1, 1]], [[-1, 0], [-1, 2, 3, 1]], [[-1, 0, 3]]):
        with pytest.raises(ValueError) as error:
            sk.TreeBatch.from_heads(heads)
        assert "from_conllu_heads" not in str(error.value)
    with pytest.raises(ValueError, match="^batch item 1, token 0: self-loop .*batch item 1 has no root"):
        sk.TreeBatch.from_heads([[-1, 0], [0, 1]])  # the second item, padded in a batch: still named


def test_align_points_to_from_conllu_heads():
    with pytest.raises(ValueError, match="self-loop .*the sentence has no root .*from_conllu_heads"):
        sk.trees.align_to_tokens([2, 0, 2], [None, 0, 1, 2, None])
    assert len(sk.trees.align_to_tokens(sk.trees.from_conllu_heads([2, 0, 2]), [None, 0, 1, 2, None])) == 5


# ----------------------------------------------------------------------------------------------- POS ids


def test_out_of_range_pos_ids_name_the_item_and_token():
    gat = sk.nn.SyntaxGAT(32, num_layers=1, num_heads=2, head_dim=8, window=2, variant="package")
    x = torch.randn(2, 5, 32)
    pos = torch.zeros(2, 5, dtype=torch.int64)
    gat(x, TREES, pos=pos)
    for value in (18, -1):
        bad = pos.clone()
        bad[1, 3] = value
        with pytest.raises(ValueError, match=re.escape(f"pos: batch item 1, token 3: POS id {value} is outside 0..17 "
                                                       "(this SyntaxGAT has num_pos_tags = 18")):
            gat(x, TREES, pos=bad)
    with pytest.raises(ValueError, match="pos must hold integer POS ids"):
        gat(x, TREES, pos=pos.float())


# ----------------------------------------------------------------------------------------------- read_conllu


def test_read_conllu_empty_string_and_directory(tmp_path):
    for empty in ("", "   "):
        with pytest.raises(ValueError, match=re.escape(f"read_conllu: path_or_text is {empty!r}, neither a file name "
                                                       "nor CoNLL-U text")):
            sk.trees.read_conllu(empty)
    with pytest.raises(IsADirectoryError, match=re.escape(f"read_conllu: {str(tmp_path)!r} is a directory, expected "
                                                          "the path of a CoNLL-U file") + "$"):
        sk.trees.read_conllu(tmp_path)
    (tmp_path / "a.conllu").write_text("1\tHi\t_\tINTJ\t_\t_\t0\troot\t_\t_\n")
    with pytest.raises(IsADirectoryError, match=r"\(it holds a.conllu\)$"):
        sk.trees.read_conllu(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(f"read_conllu: no such file {str(tmp_path / 'b.conllu')!r}")):
        sk.trees.read_conllu(tmp_path / "b.conllu")
    assert sk.trees.read_conllu(tmp_path / "a.conllu")[0].words == ["Hi"]


# ----------------------------------------------------------------------------- padding against the trees (HF)


def test_left_padding_is_named_as_such():
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                           intermediate_size=64, vocab_size=100))
    enable_syntax_attention(model, "bias")
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0]])
    ids = torch.randint(3, 100, (2, 5))
    left = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    with pytest.raises(ValueError, match=re.escape("batch item 1: the attention mask pads on the left (it attends "
                                                   "positions 2..4 of N = 5); syntax attention needs right padding")):
        model(input_ids=ids, attention_mask=left, syntax_trees=trees)
    holes = torch.tensor([[1] * 5, [1, 1, 0, 1, 1]])
    with pytest.raises(ValueError, match=re.escape("the attention mask does not pad on the right (it attends "
                                                   "positions 0..1, 3..4 of N = 5)")):
        model(input_ids=ids, attention_mask=holes, syntax_trees=trees)
    with pytest.raises(ValueError, match=re.escape("batch item 1: syntax_trees has 3 tokens but the attention mask "
                                                   "attends 4 (of N = 5)")):
        model(input_ids=ids, attention_mask=torch.tensor([[1] * 5, [1, 1, 1, 1, 0]]), syntax_trees=trees)


def test_out_of_range_syntax_pos_is_named_syntax_pos():
    transformers = pytest.importorskip("transformers")
    from syntaxkernels.integrations.transformers import enable_syntax_attention

    model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                           intermediate_size=64, vocab_size=100))
    enable_syntax_attention(model, "gat", gat_config=dict(num_layers=1, num_heads=2, head_dim=8, window=2),
                            variant="package")
    ids = torch.randint(3, 100, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.int64)
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0, 2, 2]])
    with pytest.raises(ValueError, match=re.escape("syntax_pos: batch item 0, token 1: POS id 40 is outside 0..17")):
        model(input_ids=ids, attention_mask=mask, syntax_trees=trees, syntax_pos=torch.tensor([[0, 40, 0, 0, 0]] * 2))


# ------------------------------------------------------------------- lengths against the trees (the op itself)


RAGGED = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0]])  # lengths 5 and 3, N = 5


def _bias_call(lengths, distance=None, backend="auto", **kw):
    q = torch.randn(2, 2, 5, 8)
    table = torch.zeros(sk.BucketSpec().num_buckets)
    distance = RAGGED.distance if distance is None else distance
    return sk.syntax_bias_attention(q, q, q, distance, table, buckets=sk.BucketSpec(), lengths=lengths,
                                    backend=backend, **kw)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_lengths_that_disagree_with_the_trees_name_the_item_and_both_lengths(backend):
    """The trees' lengths come from the distance's diagonal (0 for their tokens, 255 for padding), whatever the
    backend; the trees' own lengths, as a tensor, a list or a key-padding mask, pass."""
    _bias_call(RAGGED.lengths, backend=backend)
    _bias_call([5, 3], backend=backend)
    _bias_call(RAGGED.key_padding_mask(), backend=backend)
    message = ("batch item 1: lengths[1] = 4 but the trees of distance have 3 tokens (a tree distance's diagonal is "
               "0 for the trees' tokens, 255 for padding); pass the TreeBatch's lengths (lengths=trees.lengths), or the "
               "TreeBatch itself")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        _bias_call(torch.tensor([5, 4]), backend=backend)
    with pytest.raises(ValueError, match=re.escape("batch item 0: lengths[0] = 4 but the trees of distance have 5")):
        _bias_call([4, 3], backend=backend)
    with pytest.raises(ValueError, match=re.escape("batch item 1: lengths is None (all N = 5 tokens attend) but the "
                                                   "trees of distance have 3 tokens")):
        _bias_call(None, backend=backend)
    mask = RAGGED.key_padding_mask().clone()
    mask[1, 3] = False  # one more valid token in item 1
    with pytest.raises(ValueError, match=re.escape("batch item 1: lengths[1] = 4 but the trees of distance have 3")):
        _bias_call(mask, backend=backend)


def test_lengths_check_applies_to_the_distances_the_package_built():
    """tree_distance's result is checked like a TreeBatch's; a distance the package did not build (its padding is
    unknown: here the same values in another tensor) is taken as given, as before."""
    built = sk.tree_distance([[-1, 0, 1, 1, 0], [-1, 0, 0]])
    with pytest.raises(ValueError, match="batch item 1: lengths\\[1\\] = 5 but the trees of distance have 3"):
        _bias_call([5, 5], distance=built)
    _bias_call([5, 5], distance=RAGGED.distance.clone())
    _bias_call(None, distance=RAGGED.distance.clone())


def test_lengths_check_on_device_data_is_a_device_assertion(monkeypatch):
    """Where reading the data would synchronise (a GPU: forced here by treating CPU tensors as device memory), the
    check is queued as a device-side assertion instead (torch._assert_async, which raises at once on CPU): the
    same helper as the transformers integration's mask check, so a valid batch costs no host read."""
    from syntaxkernels import _validation
    from syntaxkernels.tools.testing import count_host_reads

    monkeypatch.setattr(_validation, "_on_host", lambda tensor: False)
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0]])  # fresh tensors: nothing cached yet
    with count_host_reads() as reads:
        _bias_call(trees.lengths, distance=trees.distance)
    assert reads == [], reads
    with pytest.raises(RuntimeError, match="syntax_bias_attention: lengths differ from the trees of distance"):
        _bias_call(torch.tensor([5, 4]), distance=trees.distance)
    with pytest.raises(RuntimeError, match="syntax_bias_attention: lengths differ from the trees of distance"):
        _bias_call(None, distance=trees.distance)


def test_lengths_check_runs_once_per_plan(monkeypatch):
    """The check runs when a plan is made from bare tensors (every such call makes one); a TreeBatch passed as
    the plan is its own lengths' source: nothing is checked, layer after layer."""
    from syntaxkernels import _validation

    calls = []
    original = _validation.check_lengths_agree
    monkeypatch.setattr(_validation, "check_lengths_agree", lambda *a, **k: calls.append(1) or original(*a, **k))
    trees = sk.TreeBatch.from_heads([[-1, 0, 1, 1, 0], [-1, 0, 0]])
    for _ in range(3):
        _bias_call(None, distance=trees)
    assert calls == []
    for _ in range(2):
        _bias_call(trees.lengths, distance=trees.distance)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="batch item 1"):  # other lengths: checked again
        _bias_call(torch.tensor([5, 4]), distance=trees.distance)


# ------------------------------------------------------------------------------- checks run once per shape class


needs_extension = pytest.mark.skipif(not sk._ext.available(), reason="the C++ extension is not loaded")


@needs_extension
def test_a_check_runs_once_per_shape_class_and_never_hides_an_error():
    """``check_once``: a layer after the first with the same shapes (and equal other arguments of the same class)
    skips the op's shape checks; another shape, dtype, value or class of value runs them again, so a bad input
    always raises."""
    from syntaxkernels import _validation as V

    calls = []

    def check(x, window):
        calls.append(window)
        V.check_window(window)

    x = torch.zeros(2, 3)
    V.check_once(check, x, 1)
    V.check_once(check, torch.ones(2, 3), 1)                       # same class: skipped
    assert calls == [1]
    for args in ((torch.zeros(3, 2), 1), (x.t(), 1), (x.double(), 1), (x, 2)):  # shape, strides, dtype, value
        V.check_once(check, *args)
    assert calls == [1, 1, 1, 1, 2]
    for bad in (True, 1.0, 255):  # equal to a passed value (True == 1 == 1.0) or new: the check runs and raises
        with pytest.raises(ValueError, match="window must be None or an int"):
            V.check_once(check, x, bad)
        with pytest.raises(ValueError, match="window must be None or an int"):
            V.check_once(check, x, bad)  # (an error is never remembered)
    assert calls == [1, 1, 1, 1, 2, True, True, 1.0, 1.0, 255, 255]
    V.check_once(check, {"x": x}, 1)  # an unhashable argument: runs every time
    V.check_once(check, {"x": x}, 1)
    assert calls[-2:] == [1, 1]


@needs_extension
def test_the_bias_op_checks_every_call_of_a_new_shape_class():
    q = torch.randn(2, 2, 5, 8)
    table = torch.zeros(sk.BucketSpec().num_buckets)
    sk.syntax_bias_attention(q, q, q, TREES, table, buckets=sk.BucketSpec())
    with pytest.raises(ValueError, match="table must have shape"):
        sk.syntax_bias_attention(q, q, q, TREES, table[:-1], buckets=sk.BucketSpec())
    with pytest.raises(ValueError, match="window must be None or an int"):
        sk.syntax_bias_attention(q, q, q, TREES, table, buckets=sk.BucketSpec(), window=True)
    sk.syntax_bias_attention(q, q, q, TREES, table, buckets=sk.BucketSpec(), window=1)
    with pytest.raises(ValueError, match="window must be None or an int"):
        sk.syntax_bias_attention(q, q, q, TREES, table, buckets=sk.BucketSpec(), window=True)
