"""Values and gradients agree with PyTorch (skipped when torch is not installed).

The same method call is made on a metagraph Tensor and a torch tensor built from the same data,
over several shapes and dtypes; float gradients are compared through a random projection.
"""

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

R = np.random.default_rng(17)
SHAPES = [(5,), (3, 4), (2, 3, 4), (1, 4, 1)]

UNARY = [
    "neg",
    "abs",
    "exp",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
    "square",
    "exp2",
]
POSITIVE = ["log", "log2", "sqrt", "rsqrt", "reciprocal"]
REDUCTIONS = [
    ("sum", {}),
    ("sum", {"dim": -1}),
    ("mean", {"dim": 0, "keepdim": True}),
    ("amax", {"dim": -1}),
    ("amin", {"dim": 0}),
    ("prod", {"dim": -1}),
    ("var", {"dim": -1}),
    ("std", {}),
    ("logsumexp", {"dim": -1}),
    ("argmax", {"dim": -1}),
    ("argmin", {}),
    ("cumsum", {"dim": 0}),
]
BINARY = [
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "remainder",
    "floor_divide",
    "pow",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
]


def pair(array, dtype):
    torch_dtype = getattr(torch, np.dtype(dtype).name if dtype != bool else "bool")
    return mg.tensor(array.astype(dtype)), torch.tensor(array.astype(dtype), dtype=torch_dtype)


def compare(ours, theirs, rtol, atol):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    ours = ours.numpy()
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(
        ours.astype(np.float64), theirs.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
    )


def compare_grads(fn_ours, fn_theirs, arrays, dtype=np.float64, rtol=1e-6):
    ours = [mg.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    out_o, out_t = fn_ours(*ours), fn_theirs(*theirs)
    projection = R.standard_normal(tuple(out_t.shape))
    (out_o * mg.tensor(projection)).sum().backward()
    (out_t * torch.tensor(projection)).sum().backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", UNARY + POSITIVE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary(name, shape, dtype):
    data = R.uniform(0.1, 3, shape) if name in POSITIVE else R.uniform(-3, 3, shape)
    ours, theirs = pair(data, dtype)
    rtol = 2e-6 if dtype == np.float32 else 1e-12
    compare(getattr(ours, name)(), getattr(theirs, name)(), rtol=rtol, atol=rtol)
    if dtype == np.float64 and name not in ("floor", "ceil", "round", "trunc", "sign"):
        compare_grads(lambda t: getattr(t, name)(), lambda t: getattr(t, name)(), [data])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name, kwargs", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_reductions(name, kwargs, shape, dtype):
    if np.dtype(dtype).kind == "i" and name in ("mean", "var", "std", "logsumexp"):
        pytest.skip("PyTorch refuses these on integers too")
    data = R.uniform(-3, 3, shape) if np.dtype(dtype).kind == "f" else R.integers(-4, 5, shape)
    ours, theirs = pair(data, dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    compare(getattr(ours, name)(**kwargs), getattr(theirs, name)(**kwargs), rtol=rtol, atol=rtol)
    if dtype == np.float64 and name not in ("argmax", "argmin"):
        compare_grads(lambda t: getattr(t, name)(**kwargs), lambda t: getattr(t, name)(**kwargs), [data])


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1))])
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.float32),
        (np.float64, np.float32),
        (np.int64, np.int32),
        (np.int32, np.float32),
        (np.uint8, np.int8),
    ],
)
def test_binary(name, shapes, dtypes):
    kinds = [np.dtype(d).kind for d in dtypes]
    a = R.uniform(0.5, 3, shapes[0]) if kinds[0] == "f" else R.integers(1, 6, shapes[0])
    b = R.uniform(0.5, 3, shapes[1]) if kinds[1] == "f" else R.integers(1, 6, shapes[1])
    (oa, ta), (ob, tb) = pair(a, dtypes[0]), pair(b, dtypes[1])
    compare(getattr(oa, name)(ob), getattr(ta, name)(tb), rtol=1e-6, atol=1e-6)
    if kinds == ["f", "f"] and name not in ("floor_divide", "lt", "le", "gt", "ge", "eq", "ne"):
        compare_grads(lambda x, y: getattr(x, name)(y), lambda x, y: getattr(x, name)(y), [a, b])


@pytest.mark.parametrize("scalar", [2, 2.5, -1, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8, np.uint8, np.int64, bool])
@pytest.mark.parametrize("op", ["__add__", "__mul__", "__rsub__", "__truediv__", "__rtruediv__", "__pow__"])
def test_scalar_operands(op, dtype, scalar):
    data = R.integers(1, 4, (3, 2))
    ours, theirs = pair(data, dtype)
    try:
        want = getattr(theirs, op)(scalar)
    except RuntimeError:
        with pytest.raises(mg.MetagraphError):
            getattr(ours, op)(scalar).numpy()
        return
    compare(getattr(ours, op)(scalar), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "key",
    [
        (0,),
        (slice(None), 1),
        (slice(None, None, -1), None, slice(1, 3)),
        (Ellipsis, -1),
        ([0, 2],),
        (slice(None), [1, 0, 1], [2, 2, 0]),
    ],
)
def test_getitem(key):
    data = R.uniform(-1, 1, (3, 4, 5))
    ours, theirs = pair(data, np.float64)
    ours_key = tuple(mg.tensor(k) if isinstance(k, list) else k for k in key)
    theirs_key = tuple(torch.tensor(k) if isinstance(k, list) else k for k in key)
    if any(isinstance(k, slice) and k.step and k.step < 0 for k in key):
        theirs_key = tuple(slice(None) if isinstance(k, slice) and k.step and k.step < 0 else k for k in key)
        compare(ours[ours_key], torch.flip(theirs, [0])[theirs_key], 0, 0)
        return
    compare(ours[ours_key], theirs[theirs_key], 0, 0)
    compare_grads(lambda t: t[ours_key], lambda t: t[theirs_key], [data])


def GELU(x):
    return TF.gelu(x[0])


NN = [
    (
        lambda x: F.conv2d(x[0], x[1], stride=2, padding=1),
        lambda x: TF.conv2d(x[0], x[1], stride=2, padding=1),
        [(2, 3, 9, 8), (4, 3, 3, 3)],
    ),
    (
        lambda x: F.conv2d(x[0], x[1], x[2], dilation=2, groups=3, padding="same"),
        lambda x: TF.conv2d(x[0], x[1], x[2], dilation=2, groups=3, padding="same"),
        [(1, 6, 7, 7), (3, 2, 3, 3), (3,)],
    ),
    (
        lambda x: F.conv_transpose2d(x[0], x[1], stride=2, padding=1, output_padding=1),
        lambda x: TF.conv_transpose2d(x[0], x[1], stride=2, padding=1, output_padding=1),
        [(2, 4, 5, 5), (4, 3, 3, 3)],
    ),
    (lambda x: F.max_pool2d(x[0], 3, 2, 1), lambda x: TF.max_pool2d(x[0], 3, 2, 1), [(2, 3, 9, 9)]),
    (
        lambda x: F.avg_pool2d(x[0], 3, 2, 1, ceil_mode=True),
        lambda x: TF.avg_pool2d(x[0], 3, 2, 1, ceil_mode=True),
        [(2, 3, 8, 8)],
    ),
    (
        lambda x: F.adaptive_avg_pool2d(x[0], (3, 5)),
        lambda x: TF.adaptive_avg_pool2d(x[0], (3, 5)),
        [(2, 3, 7, 9)],
    ),
    (
        lambda x: F.interpolate(x[0], scale_factor=2, mode="bilinear"),
        lambda x: TF.interpolate(x[0], scale_factor=2, mode="bilinear"),
        [(1, 2, 4, 5)],
    ),
    (
        lambda x: F.layer_norm(x[0], (5,), x[1], x[2]),
        lambda x: TF.layer_norm(x[0], (5,), x[1], x[2]),
        [(3, 4, 5), (5,), (5,)],
    ),
    (
        lambda x: F.group_norm(x[0], 2, x[1], x[2]),
        lambda x: TF.group_norm(x[0], 2, x[1], x[2]),
        [(3, 4, 2, 2), (4,), (4,)],
    ),
    (
        lambda x: F.batch_norm(x[0], None, None, x[1], x[2], training=True),
        lambda x: TF.batch_norm(x[0], None, None, x[1], x[2], training=True),
        [(4, 3, 2, 2), (3,), (3,)],
    ),
    (lambda x: F.gelu(x[0]), GELU, [(4, 6)]),
    (
        lambda x: F.silu(x[0]) + F.softplus(x[0] * 10),
        lambda x: TF.silu(x[0]) + TF.softplus(x[0] * 10),
        [(4, 6)],
    ),
    (lambda x: F.log_softmax(x[0], 1), lambda x: TF.log_softmax(x[0], 1), [(4, 6)]),
    (
        lambda x: F.binary_cross_entropy_with_logits(x[0] * 20, x[1].sigmoid()),
        lambda x: TF.binary_cross_entropy_with_logits(x[0] * 20, x[1].sigmoid()),
        [(4, 6), (4, 6)],
    ),
    (lambda x: x[0] @ x[1], lambda x: x[0] @ x[1], [(2, 1, 3, 4), (5, 4, 2)]),
]


@pytest.mark.parametrize("index", range(len(NN)))
def test_nn_functional(index):
    fn_ours, fn_theirs, shapes = NN[index]
    arrays = [R.uniform(-1, 1, s) for s in shapes]
    ours = fn_ours([mg.tensor(a) for a in arrays])
    theirs = fn_theirs([torch.tensor(a) for a in arrays])
    compare(ours, theirs, rtol=1e-6, atol=1e-6)
    # erf is a fit with 1.2e-7 relative error (float32 precision); its slope is a little less exact
    rtol = 1e-5 if fn_theirs is GELU else 1e-6
    compare_grads(lambda *t: fn_ours(t), lambda *t: fn_theirs(t), arrays, rtol=rtol)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"label_smoothing": 0.1},
        {"ignore_index": 2, "reduction": "sum"},
        {"weight": [0.5, 1, 2, 1.5]},
        {"weight": [0.5, 1, 2, 1.5], "label_smoothing": 0.3},
    ],
)
def test_cross_entropy(kwargs):
    logits = R.uniform(-3, 3, (6, 4))
    target = np.array([0, 2, 3, 1, 2, 0])
    ours_kw = {k: mg.tensor(np.array(v)) if isinstance(v, list) else v for k, v in kwargs.items()}
    theirs_kw = {k: torch.tensor(np.array(v)) if isinstance(v, list) else v for k, v in kwargs.items()}
    compare(
        F.cross_entropy(mg.tensor(logits), mg.tensor(target), **ours_kw),
        TF.cross_entropy(torch.tensor(logits), torch.tensor(target), **theirs_kw),
        1e-7,
        1e-7,
    )
    compare_grads(
        lambda x: F.cross_entropy(x, mg.tensor(target), **ours_kw),
        lambda x: TF.cross_entropy(x, torch.tensor(target), **theirs_kw),
        [logits],
    )
