"""One test per meta-op row: forward against numpy, gradient against finite differences."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.expr import Const, Extra, Var, parse
from metagraph.ops.table import TABLE, apply
from metagraph.tensor import Tensor
from tests.helpers import check_forward, check_grad

R = np.random.default_rng(7)


def row(name, **attrs):
    return lambda *ts: Tensor(apply(name, *[t.node for t in ts], **attrs))


def f64(*shape, low=-2.0, high=2.0):
    return R.uniform(low, high, shape)


def ints(*shape, low=-9, high=10, dtype=np.int64):
    return R.integers(low, high, shape).astype(dtype)


def nonzero_ints(*shape):
    x = ints(*shape)
    return np.where(x == 0, 3, x)


def away_from_zero(*shape):
    x = f64(*shape)
    return np.where(np.abs(x) < 0.2, 0.5, x)


def reindex_ref(x, shape, fn, fill):
    out = np.full(shape, fill, x.dtype)
    for i in np.ndindex(shape):
        j = fn(*i)
        if all(0 <= a < n for a, n in zip(j, x.shape)):
            out[i] = x[j]
    return out


def scatter_ref(x, shape, fn, op):
    out = np.full(shape, 0.0 if op == "add" else -np.inf)
    for i in np.ndindex(x.shape):
        j = fn(*i)
        if all(0 <= a < n for a, n in zip(j, shape)):
            out[j] = out[j] + x[i] if op == "add" else max(out[j], x[i])
    return out


CONV_MAP = tuple(parse(e, 4) for e in ("i0", "i1*2+i3-1"))        # a strided, padded window
FLIP_MAP = (Var(1), Const(2) - Var(0))                              # transpose + flip
EXTRA_MAP = (Extra(0, (Var(0),)), Var(1))                            # gather rows by index

ROW_CASES = {
    "neg": (row("neg"), np.negative, [f64(3, 4)]),
    "recip": (row("recip"), np.reciprocal, [away_from_zero(3, 4)]),
    "sqrt": (row("sqrt"), np.sqrt, [f64(3, 4, low=0.1)]),
    "exp2": (row("exp2"), np.exp2, [f64(3, 4)]),
    "log2": (row("log2"), np.log2, [f64(3, 4, low=0.1)]),
    "sin": (row("sin"), np.sin, [f64(3, 4, low=-4, high=4)]),
    "cos": (row("cos"), np.cos, [f64(3, 4, low=-4, high=4)]),
    "pow": (row("pow"), np.power, [f64(3, 4, low=0.1), f64(3, 4)]),
    "cast": (row("cast", dtype=mg.float32), lambda x: x.astype(np.float32), [f64(3, 4)]),
    "add": (row("add"), np.add, [f64(3, 4), f64(3, 4)]),
    "mul": (row("mul"), np.multiply, [f64(3, 4), f64(3, 4)]),
    "max": (row("max"), np.maximum, [f64(3, 4), f64(3, 4)]),
    "cmplt": (row("cmplt"), np.less, [f64(3, 4), f64(3, 4)]),
    "cmpne": (row("cmpne"), np.not_equal, [ints(3, 4, low=0, high=2), ints(3, 4, low=0, high=2)]),
    "where": (row("where"), np.where, [R.random((3, 4)) < 0.5, f64(3, 4), f64(3, 4)]),
    "reduce": (row("reduce", op="add", axes=(0, 2), keepdim=False),
               lambda x: x.sum(axis=(0, 2)), [f64(2, 3, 4)]),
    "reindex": (row("reindex", shape=(2, 3, 4, 3), index_map=CONV_MAP, fill=0.0, checked=False),
                lambda x: reindex_ref(x, (2, 3, 4, 3), lambda a, b, c, d: (a, b * 2 + d - 1), 0.0),
                [f64(2, 7)]),
    "reindex_reduce": (row("reindex_reduce", op="add", shape=(4, 3), index_map=FLIP_MAP, checked=False),
                       lambda x: scatter_ref(x, (4, 3), lambda a, b: (b, 2 - a), "add"), [f64(3, 5)]),
    "idiv": (row("idiv"), np.floor_divide, [ints(3, 4), nonzero_ints(3, 4)]),
    "mod": (row("mod"), np.mod, [ints(3, 4), -nonzero_ints(3, 4)]),
    "and": (row("and"), np.bitwise_and, [ints(3, 4), ints(3, 4)]),
    "or": (row("or"), np.bitwise_or, [ints(3, 4), ints(3, 4)]),
    "xor": (row("xor"), np.bitwise_xor, [ints(3, 4), ints(3, 4)]),
    "contiguous": (row("contiguous"), lambda x: x, [f64(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(ROW_CASES))
def test_row_forward(name):
    fn, ref, arrays = ROW_CASES[name]
    check_forward(fn, ref, *arrays, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(n for n in ROW_CASES if TABLE[n].grad is not None
                                         and n != "cast"))
def test_row_gradient(name):
    fn, _, arrays = ROW_CASES[name]
    if not any(a.dtype.kind == "f" for a in arrays):
        pytest.skip("integer row")
    check_grad(fn, *arrays)


def test_cast_gradient_is_cast_back():
    x = mg.tensor(f64(3, 4), requires_grad=True)
    g, = mg.grad((row("cast", dtype=mg.float32)(x) * 3.0).sum(), [x])
    assert g.dtype == mg.float64
    np.testing.assert_array_equal(g.numpy(), np.full((3, 4), 3.0))
    i = mg.tensor(ints(3, 4))
    assert not row("cast", dtype=mg.float32)(i).requires_grad


def test_sources():
    const = Tensor(apply("const", value=2.5, shape=(2, 3), dtype=mg.float64))
    np.testing.assert_array_equal(const.numpy(), np.full((2, 3), 2.5))
    index = Tensor(apply("index", shape=(2, 3), axis=1, dtype=mg.int32))
    np.testing.assert_array_equal(index.numpy(), np.broadcast_to(np.arange(3, dtype=np.int32), (2, 3)))


@pytest.mark.parametrize("op", ["add", "mul", "max"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_ops(op, keepdim):
    x = f64(3, 4, 2, low=0.5)
    ref = {"add": np.sum, "mul": np.prod, "max": np.max}[op]
    fn = row("reduce", op=op, axes=(1,), keepdim=keepdim)
    check_forward(fn, lambda a: ref(a, axis=1, keepdims=keepdim), x, rtol=1e-12)
    check_grad(fn, x)


def test_reduce_mul_gradient_is_exact_with_zeros():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    t = mg.tensor(x, requires_grad=True)
    g, = mg.grad(Tensor(apply("reduce", t.node, op="mul", axes=(1,), keepdim=False)).sum(), [t])
    np.testing.assert_array_equal(g.numpy(), [[0, 6, 0], [0, 0, 0], [8, 4, 2]])


def test_reduce_max_shares_gradient_among_ties():
    t = mg.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]], requires_grad=True)
    g, = mg.grad(Tensor(apply("reduce", t.node, op="max", axes=(1,), keepdim=False)).sum(), [t])
    np.testing.assert_array_equal(g.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])


def test_max_splits_ties():
    a = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = mg.tensor([2.0, 2.0, 1.0], requires_grad=True)
    ga, gb = mg.grad(Tensor(apply("max", a.node, b.node)).sum(), [a, b])
    np.testing.assert_array_equal(ga.numpy(), [0, 0.5, 1])
    np.testing.assert_array_equal(gb.numpy(), [1, 0.5, 0])


def test_reindex_with_extras_and_fill():
    x = f64(4, 3)
    idx = np.array([3, 0, 0, 2])
    fn = lambda t, i: Tensor(apply("reindex", t.node, i.node, shape=(4, 3), index_map=EXTRA_MAP,  # noqa
                                   fill=0.0, checked=True))
    check_forward(fn, lambda a, i: a[i], x, idx)
    check_grad(fn, x, idx)


def test_reindex_reduce_max():
    x = f64(3, 5)
    fn = row("reindex_reduce", op="max", shape=(4, 3), index_map=FLIP_MAP, checked=False)
    check_forward(fn, lambda a: scatter_ref(a, (4, 3), lambda p, q: (q, 2 - p), "max"), x)
    check_grad(fn, x)


def _ops_in(node, seen=None):
    seen = set() if seen is None else seen
    if node.id in seen:
        return set()
    seen.add(node.id)
    ops = {node.op}
    for source in node.inputs:
        ops |= _ops_in(source, seen)
    return ops


@pytest.mark.parametrize("name", sorted(ROW_CASES) + ["reduce_mul", "reduce_max", "scatter_max"])
def test_gradient_closure(name):
    """Applying a row's gradient rule builds only table ops."""
    variants = {"reduce_mul": (row("reduce", op="mul", axes=(1,), keepdim=False), [f64(3, 4)]),
                "reduce_max": (row("reduce", op="max", axes=(0,), keepdim=True), [f64(3, 4)]),
                "scatter_max": (row("reindex_reduce", op="max", shape=(4, 3), index_map=FLIP_MAP,
                                    checked=False), [f64(3, 5)])}
    fn, arrays = variants[name] if name in variants else (ROW_CASES[name][0], ROW_CASES[name][2])
    tensors = [mg.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = fn(*tensors)
    if not out.requires_grad:
        pytest.skip("no gradient flows through this row")
    rule = TABLE[out.node.op].grad
    grads = rule(mg.ones(out.shape, dtype=out.dtype).node, out.node, *out.node.inputs)
    for grad in grads:
        if grad is not None:
            assert _ops_in(grad) <= set(TABLE), _ops_in(grad) - set(TABLE)


def test_every_row_is_tested():
    # (copy moves a value between devices, which backend.realize does: tests/backends/test_devices.py)
    untested = set(TABLE) - set(ROW_CASES) - {"const", "index", "buffer", "copy"}
    assert not untested
