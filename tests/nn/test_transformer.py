"""scaled_dot_product_attention, MultiheadAttention and the Transformer modules against PyTorch
with its weights loaded (values and gradients), finite differences in float64, and the errors."""
import copy

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.ops import attention as at
from tests.helpers import check_grad

torch = pytest.importorskip("torch")
TF = torch.nn.functional
R = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _torch_reference_path():
    """PyTorch's fused fast paths (nested tensors zero padded positions) are off: the reference is
    its documented math."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


@pytest.fixture
def interpreted():
    """The numpy backend (the oracle) for tests of module semantics: compiling each small graph's
    kernels would take most of a minute. The SDPA tests and test_compiled_encoder_layer run the
    default backend's generated kernels."""
    mg.set_backend("numpy")


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def _compare(ours, theirs, inputs, kwargs=None, torch_kwargs=None, atol=1e-5):
    """ours(*inputs) against theirs(*inputs): outputs, input gradients and, for modules, every
    parameter's gradient (through the same random projection)."""
    kwargs = kwargs or {}
    mine = [mg.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    reference = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    got = ours(*mine, **{k: _ours(v) for k, v in kwargs.items()})
    want = theirs(*reference, **(torch_kwargs or {k: _theirs(v) for k, v in kwargs.items()}))
    got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=atol)
    projection = R.standard_normal(got.shape).astype(np.float32)
    (got * mg.tensor(projection)).sum().backward()
    (want * torch.tensor(projection)).sum().backward()
    for a, b in zip(mine, reference):
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=10 * atol)
    if isinstance(ours, nn.Module):
        theirs_by_name = dict(theirs.named_parameters())
        for name, parameter in ours.named_parameters():
            np.testing.assert_allclose(parameter.grad.numpy(), theirs_by_name[name].grad.numpy(), rtol=1e-4,
                                       atol=10 * atol, err_msg=name)


def _ours(value):
    return mg.tensor(value) if isinstance(value, np.ndarray) else value


def _theirs(value):
    return torch.tensor(value) if isinstance(value, np.ndarray) else value


def _loaded(ours, theirs):
    """ours with theirs' weights, both in eval mode (dropout off); the state_dicts' keys and shapes
    must be the same."""
    state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    ours_shapes = [(k, tuple(v.shape)) for k, v in ours.state_dict().items()]
    assert ours_shapes == [(k, v.shape) for k, v in state.items()]
    ours.load_state_dict(state)
    return ours.eval(), theirs.eval()


# ---- scaled_dot_product_attention --------------------------------------------------------------

_bool_mask = R.random((3, 5)) > 0.4
_bool_mask[0] = False                                         # a fully masked row: zeros, as torch
_float_mask = R.standard_normal((2, 3, 5)).astype(np.float32)
_float_mask[1, 2] = -np.inf
SDPA = {
    "plain": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {}),
    "unbatched": ([(3, 4), (5, 4), (5, 6)], {}),
    "heads_broadcast": ([(2, 1, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6)], {}),
    "causal_short_query": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"is_causal": True}),
    "causal_long_query": ([(2, 5, 4), (2, 3, 4), (2, 3, 6)], {"is_causal": True}),
    "bool_mask_broadcast": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"attn_mask": _bool_mask}),
    "float_mask": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"attn_mask": _float_mask}),
    "scale": ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"scale": 0.3}),
    "grouped_query": ([(2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 6)], {"enable_gqa": True}),
}


@pytest.mark.parametrize("name", sorted(SDPA))
def test_sdpa_against_torch(name):
    shapes, kwargs = SDPA[name]
    _compare(F.scaled_dot_product_attention, TF.scaled_dot_product_attention, [f32(*s) for s in shapes],
             kwargs)


def test_sdpa_float_mask_gradient_and_fully_masked_rows():
    q, k, v = f32(2, 3, 4), f32(2, 5, 4), f32(2, 5, 6)
    mask = _float_mask.copy()
    mask[0, 1] = -np.inf
    _compare(lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
             lambda q, k, v, mask: TF.scaled_dot_product_attention(q, k, v, attn_mask=mask), [q, k, v, mask])
    out = F.scaled_dot_product_attention(mg.tensor(q), mg.tensor(k), mg.tensor(v), attn_mask=mg.tensor(mask))
    assert not out.numpy()[0, 1].any() and not np.isnan(out.numpy()).any()


def test_sdpa_gradients_against_finite_differences():
    mask = _bool_mask.copy()
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mg.tensor(mask)),
               R.standard_normal((2, 3, 4)), R.standard_normal((2, 5, 4)), R.standard_normal((2, 5, 3)))
    check_grad(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.7),
               R.standard_normal((3, 2)), R.standard_normal((4, 2)), R.standard_normal((4, 2)),
               R.standard_normal((3, 4)))


def test_sdpa_dropout_draws_from_metagraphs_generator_only_when_asked():
    q, k, v = (mg.tensor(f32(2, 3, 4)) for _ in range(3))
    mg.manual_seed(3)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    mg.manual_seed(3)
    keep = mg.rand(2, 3, 3).numpy() >= 0.4
    weights = F.scaled_dot_product_attention(q, k, mg.tensor(np.eye(3, dtype=np.float32)).expand(2, 3, 3))
    want = (weights.numpy() * keep / 0.6) @ v.numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    mg.manual_seed(3)
    F.scaled_dot_product_attention(q, k, v)                      # no dropout: no random numbers
    np.testing.assert_array_equal(mg.rand(2, 3, 3).numpy() >= 0.4, keep)
    assert not F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy().any()


@pytest.mark.parametrize("shapes, kwargs, kind, match", [
    ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"is_causal": True, "attn_mask": np.ones((3, 5), bool)},
     mg.ArgumentError, "should not be given with is_causal"),
    ([(2, 3, 4), (2, 5, 3), (2, 5, 6)], {}, mg.ShapeError, r"same embedding size .* key \(2, 5, 3\)"),
    ([(2, 3, 4), (2, 5, 4), (2, 4, 6)], {}, mg.ShapeError, "same sequence length"),
    ([(4,), (5, 4), (5, 6)], {}, mg.ShapeError, "at least 2 dimensions"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"attn_mask": np.ones((4, 5), bool)}, mg.ShapeError,
     "cannot be broadcast"),
    ([(2, 3, 4), (2, 5, 4), (2, 5, 6)], {"attn_mask": np.ones((3, 5), np.int64)}, mg.DTypeError,
     "attn_mask must be bool or of the query's dtype"),
    ([(2, 3, 3, 4), (2, 2, 5, 4), (2, 2, 5, 6)], {"enable_gqa": True}, mg.ShapeError,
     "multiple of the key's"),
])
def test_sdpa_errors_name_the_op_and_the_shapes(shapes, kwargs, kind, match):
    with pytest.raises(kind, match=match) as error:
        F.scaled_dot_product_attention(*[mg.tensor(f32(*s)) for s in shapes], **{k: _ours(v) for k, v in
                                                                                   kwargs.items()})
    assert str(error.value).startswith("scaled_dot_product_attention: ") and "test_transformer.py" in \
        str(error.value)


def test_sdpa_needs_one_float_dtype():
    with pytest.raises(mg.DTypeError, match="one floating-point dtype"):
        F.scaled_dot_product_attention(mg.ones(3, 4), mg.ones(3, 4), mg.ones(3, 4, dtype=mg.float64))
    assert at.weights_shape(mg.ones(2, 1, 3, 4).node, mg.ones(4, 5, 4).node) == (2, 4, 3, 5)


# ---- MultiheadAttention ------------------------------------------------------------------------

E, HEADS, L, S, N = 8, 2, 3, 4, 2
_padding = np.array([[False, False, True, False], [False, True, True, True]])
MHA = {
    "default": ({}, {}),
    "batch_first": ({"batch_first": True}, {}),
    "no_weights": ({}, {"need_weights": False}),
    "per_head_weights": ({}, {"average_attn_weights": False}),
    "kdim_vdim": ({"kdim": 5, "vdim": 6}, {}),
    "no_bias": ({"bias": False}, {}),
    "bias_kv_zero_attn": ({"add_bias_kv": True, "add_zero_attn": True, "batch_first": True},
                          {"key_padding_mask": _padding, "attn_mask": R.random((L, S)) > 0.7}),
    "padding_mask": ({}, {"key_padding_mask": _padding}),
    "padding_mask_no_weights": ({}, {"key_padding_mask": _padding, "need_weights": False}),
    "float_masks": ({}, {"attn_mask": f32(N * HEADS, L, S), "key_padding_mask": f32(N, S)}),
    "causal_hint": ({}, {"attn_mask": np.triu(np.ones((L, S), bool), 1), "is_causal": True,
                         "need_weights": False}),
}


@pytest.mark.parametrize("name", sorted(MHA))
@pytest.mark.usefixtures("interpreted")
def test_multihead_attention_against_torch(name):
    options, kwargs = MHA[name]
    ours, theirs = _loaded(nn.MultiheadAttention(E, HEADS, **options),
                           torch.nn.MultiheadAttention(E, HEADS, **options))

    def shape(length, size):
        return (N, length, size) if options.get("batch_first") else (length, N, size)
    inputs = [f32(*shape(L, E)), f32(*shape(S, options.get("kdim", E))),
              f32(*shape(S, options.get("vdim", E)))]
    _compare(ours, theirs, inputs, kwargs)
    got = ours(*[mg.tensor(a) for a in inputs], **{k: _ours(v) for k, v in kwargs.items()})[1]
    want = theirs(*[torch.tensor(a) for a in inputs], **{k: _theirs(v) for k, v in kwargs.items()})[1]
    if want is None:
        assert got is None
    else:
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("interpreted")
def test_multihead_self_attention_unbatched_and_fully_masked_rows():
    ours, theirs = _loaded(nn.MultiheadAttention(E, HEADS), torch.nn.MultiheadAttention(E, HEADS))
    mask = f32(HEADS, L, L)
    _compare(lambda x: ours(x, x, x, attn_mask=mg.tensor(mask)),
             lambda x: theirs(x, x, x, attn_mask=torch.tensor(mask)), [f32(L, E)])
    padding = np.ones((1, S), bool)                    # every key masked: NaN with weights, 0 without
    q, k = f32(L, 1, E), f32(S, 1, E)
    for need_weights in (True, False):
        got = ours(mg.tensor(q), mg.tensor(k), mg.tensor(k), key_padding_mask=mg.tensor(padding),
                   need_weights=need_weights)[0]
        want = theirs(torch.tensor(q), torch.tensor(k), torch.tensor(k),
                      key_padding_mask=torch.tensor(padding), need_weights=need_weights)[0]
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), equal_nan=True)


@pytest.mark.usefixtures("interpreted")
def test_multihead_attention_initialisation_and_state():
    mha = nn.MultiheadAttention(12, 3, add_bias_kv=True)
    assert list(mha.state_dict()) == list(torch.nn.MultiheadAttention(12, 3, add_bias_kv=True).state_dict())
    bound = (6 / (12 + 36)) ** 0.5
    assert 0 < np.abs(mha.in_proj_weight.numpy()).max() <= bound
    assert not mha.in_proj_bias.numpy().any() and not mha.out_proj.bias.numpy().any()
    assert mha.bias_k.numpy().any() and mha.q_proj_weight is None
    separate = nn.MultiheadAttention(12, 3, kdim=4, vdim=5, bias=False)
    assert separate.in_proj_weight is None and separate.in_proj_bias is None
    assert [(k, v.shape) for k, v in separate.state_dict().items()] == [
        ("q_proj_weight", (12, 12)), ("k_proj_weight", (12, 4)), ("v_proj_weight", (12, 5)),
        ("out_proj.weight", (12, 12))]


@pytest.mark.usefixtures("interpreted")
def test_multihead_attention_errors():
    with pytest.raises(mg.ArgumentError, match="divisible"):
        nn.MultiheadAttention(10, 3)
    mha = nn.MultiheadAttention(E, HEADS)
    x = mg.ones(L, N, E)
    with pytest.raises(mg.ShapeError, match=r"attn_mask of shape \(4, 4\) should be \(3, 3\)"):
        mha(x, x, x, attn_mask=mg.ones(4, 4))
    with pytest.raises(mg.ShapeError, match=r"key_padding_mask of shape \(2, 3\)"):
        mha(x, x, x, key_padding_mask=mg.ones(3, 2, dtype=mg.bool))
    with pytest.raises(mg.ShapeError, match="embedding size 8"):
        mha(mg.ones(L, N, 6), x, x)
    with pytest.raises(mg.ArgumentError, match="is_causal is a hint"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(mg.DTypeError, match="attn_mask must be bool or of the query's dtype"):
        mha(x, x, x, attn_mask=mg.ones(L, L, dtype=mg.int64))


# ---- Transformer layers ----------------------------------------------------------------------

D, FF = 8, 16


def _sequences(batch_first, length):
    return f32(N, length, D) if batch_first else f32(length, N, D)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.usefixtures("interpreted")
def test_encoder_layer_against_torch(batch_first, norm_first):
    options = dict(dim_feedforward=FF, batch_first=batch_first, norm_first=norm_first)
    ours, theirs = _loaded(nn.TransformerEncoderLayer(D, HEADS, **options),
                           torch.nn.TransformerEncoderLayer(D, HEADS, **options))
    causal = np.triu(np.ones((5, 5), bool), 1)          # True: not attended (bool masks match torch's)
    padding = np.array([[False] * 5, [False] * 3 + [True] * 2])
    x = _sequences(batch_first, 5)
    _compare(ours, theirs, [x], {"src_mask": causal, "src_key_padding_mask": padding})
    _compare(ours, theirs, [x], {"src_mask": causal, "is_causal": True})


def test_compiled_encoder_layer():
    """The default backend's kernels for a whole layer, forward and backward, masks included."""
    options = dict(dim_feedforward=FF, batch_first=True, norm_first=True, activation="gelu")
    ours, theirs = _loaded(nn.TransformerEncoderLayer(D, HEADS, **options),
                           torch.nn.TransformerEncoderLayer(D, HEADS, **options))
    padding = np.array([[False] * 5, [False] * 3 + [True] * 2])
    _compare(ours, theirs, [_sequences(True, 5)], {"src_key_padding_mask": padding})


@pytest.mark.parametrize("activation", ["gelu", nn.GELU(), F.silu])
@pytest.mark.usefixtures("interpreted")
def test_encoder_layer_activations(activation):
    if activation == "gelu":
        reference = "gelu"
    else:
        reference = torch.nn.GELU() if isinstance(activation, nn.Module) else TF.silu
    ours, theirs = _loaded(nn.TransformerEncoderLayer(D, HEADS, FF, activation=activation),
                           torch.nn.TransformerEncoderLayer(D, HEADS, FF, activation=reference))
    _compare(ours, theirs, [_sequences(False, 5)])


@pytest.mark.parametrize("batch_first, norm_first", [(False, False), (True, True)])
@pytest.mark.usefixtures("interpreted")
def test_decoder_layer_against_torch(batch_first, norm_first):
    options = dict(dim_feedforward=FF, batch_first=batch_first, norm_first=norm_first, bias=not norm_first)
    ours, theirs = _loaded(nn.TransformerDecoderLayer(D, HEADS, **options),
                           torch.nn.TransformerDecoderLayer(D, HEADS, **options))
    padding = np.array([[False] * 5, [False] * 3 + [True] * 2])
    tgt_mask = np.triu(np.ones((4, 4), bool), 1)
    inputs = [_sequences(batch_first, 4), _sequences(batch_first, 5)]
    _compare(ours, theirs, inputs, {"tgt_mask": tgt_mask, "memory_key_padding_mask": padding,
                                    "tgt_key_padding_mask": np.zeros((N, 4), bool)})
    _compare(ours, theirs, inputs, {"tgt_mask": tgt_mask, "tgt_is_causal": True,
                                    "memory_mask": f32(4, 5)})


@pytest.mark.usefixtures("interpreted")
def test_encoder_clones_its_layer():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF)
    encoder = nn.TransformerEncoder(layer, 2, nn.LayerNorm(D), enable_nested_tensor=False)
    first, second = encoder.layers
    assert first is not layer and first.linear1.weight is not second.linear1.weight
    np.testing.assert_array_equal(first.linear1.weight.numpy(), second.linear1.weight.numpy())
    theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(D, HEADS, FF), 2,
                                         torch.nn.LayerNorm(D), enable_nested_tensor=False)
    ours, theirs = _loaded(encoder, theirs)
    padding = np.array([[False] * 5, [False] * 4 + [True]])
    _compare(ours, theirs, [_sequences(False, 5)], {"src_key_padding_mask": padding})
    assert first.linear1.weight.grad is not None and not np.array_equal(first.linear1.weight.grad.numpy(),
                                                                        second.linear1.weight.grad.numpy())


@pytest.mark.usefixtures("interpreted")
def test_decoder_and_transformer_against_torch():
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    want_mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask.numpy(), want_mask.numpy())
    ours, theirs = _loaded(nn.TransformerDecoder(nn.TransformerDecoderLayer(D, HEADS, FF), 2),
                           torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(D, HEADS, FF), 2))
    _compare(ours, theirs, [_sequences(False, 4), _sequences(False, 5)], {"tgt_mask": mask.numpy()})
    ours, theirs = _loaded(nn.Transformer(D, HEADS, 1, 1, FF, batch_first=True),
                           torch.nn.Transformer(D, HEADS, 1, 1, FF, batch_first=True))
    _compare(ours, theirs, [_sequences(True, 5), _sequences(True, 4)], {"tgt_mask": mask.numpy()})
    with pytest.raises(mg.ShapeError, match="batch sizes"):
        ours(mg.ones(2, 5, D), mg.ones(3, 4, D))


@pytest.mark.usefixtures("interpreted")
def test_training_mode_applies_dropout_and_eval_does_not():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.5)
    x = mg.tensor(_sequences(False, 5))
    assert not np.allclose(layer(x).numpy(), layer(x).numpy())
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


@pytest.mark.usefixtures("interpreted")
def test_deepcopy_makes_new_leaves():
    """copy.deepcopy(module): new parameters holding equal values, whose gradients stay apart."""
    linear = nn.Linear(3, 2)
    clone = copy.deepcopy(linear)
    assert clone.weight is not linear.weight and isinstance(clone.weight, nn.Parameter)
    x = mg.tensor(f32(4, 3))
    (linear(x).sum() + 2 * clone(x).sum()).backward()
    np.testing.assert_allclose(clone.weight.grad.numpy(), 2 * linear.weight.grad.numpy(), rtol=1e-6)


def _layer_activation(kind, framework):
    """The activation argument of a layer built by `framework` (metagraph's nn or torch.nn)."""
    if kind == "function":
        return F.silu if framework is nn else TF.silu
    if kind == "module_with_parameters":
        return framework.PReLU()
    return kind


@pytest.mark.parametrize("cls", ["TransformerEncoderLayer", "TransformerDecoderLayer"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "function", "module_with_parameters"])
def test_layer_registration_order_is_torchs(cls, norm_first, batch_first, activation):
    """The layers share one constructor; the submodules stay registered in PyTorch's order, so the
    state_dict's keys (and shapes) come in PyTorch's order, a callable activation's parameters last."""
    options = dict(dim_feedforward=FF, norm_first=norm_first, batch_first=batch_first)
    ours = getattr(nn, cls)(D, HEADS, activation=_layer_activation(activation, nn), **options)
    theirs = getattr(torch.nn, cls)(D, HEADS, activation=_layer_activation(activation, torch.nn), **options)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    assert [name for name, _ in ours.named_modules()] == [name for name, _ in theirs.named_modules()]
    assert ours.norm_first == norm_first and ours.self_attn.batch_first == batch_first
