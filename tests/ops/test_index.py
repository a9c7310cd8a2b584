"""Indexing: getitem/setitem as numpy does them, gather/scatter, one_hot, cumsum, reindex strings."""

import numpy as np
import pytest

import metagraph as mg
from tests.helpers import Case, case_tests, needs

R = np.random.default_rng(9)
X = R.uniform(-1, 1, (4, 5, 6))
IDX = np.array([[2, 0], [-1, 3]])


def setitem(key, value):
    def fn(a):
        out = a * 1.0
        out[key] = value if not isinstance(value, np.ndarray) else mg.tensor(value)
        return out

    def ref(a):
        out = a.copy()
        out[key] = value
        return out

    return fn, ref


KEYS = {
    "int": 1,
    "negative_int": (-1, 2),
    "slice": (slice(1, 3), slice(None, None, 2)),
    "negative_step": (slice(None, None, -1), 0, slice(4, 0, -2)),
    "none_ellipsis": (None, Ellipsis, 1),
    "ellipsis_middle": (0, Ellipsis, None),
    "int_tensor": IDX,
    "tensor_and_slice": (slice(0, 2), IDX),
    "adjacent_tensors": (slice(None), np.array([0, 4]), np.array([1, -1])),
    "separated_tensors": (np.array([0, 3]), slice(None), np.array([1, 5])),
    "list": [0, 2, 2],
    "bool_mask": X[:, 0, 0] > 0,
}

CASES = {
    f"getitem_{name}": Case(lambda a, k=key: a[k], lambda a, k=key: a[k], X) for name, key in KEYS.items()
}
CASES.update(
    {
        "setitem_slice": Case(*setitem((slice(1, 3), 0), 7.0), X),
        "setitem_broadcast": Case(*setitem((Ellipsis, slice(None, None, 2)), np.arange(3.0)), X),
        "setitem_tensor_index": Case(*setitem((np.array([0, 2]),), 0.5), X),
        "gather": Case(
            lambda a, i: a.gather(1, i),
            lambda a, i: np.take_along_axis(a, i, 1),
            X,
            R.integers(0, 5, (4, 3, 6)),
        ),
        "gather_smaller": Case(
            lambda a, i: mg.gather(a, 2, i),
            lambda a, i: np.take_along_axis(a[:2, :3], i, 2),
            X,
            R.integers(-6, 6, (2, 3, 4)) % 6,
        ),
        "scatter_add": Case(
            lambda a, i, s: a.scatter_add(0, i, s),
            lambda a, i, s: _scatter_add(a, 0, i, s),
            X[0],
            R.integers(0, 5, (3, 6)),
            X[1, :4],
        ),
        "index_select": Case(
            lambda a, i: a.index_select(2, i), lambda a, i: a[:, :, i], X, np.array([5, 0, 0, 2])
        ),
        "index_add": Case(
            lambda a, i, s: a.index_add(0, i, s),
            lambda a, i, s: _index_add(a, i, s),
            X[:, :2],
            np.array([1, 1, 3]),
            X[1:, 2:4],
        ),
        "cumsum": Case(lambda a: a.cumsum(2), lambda a: np.cumsum(a, 2), X),
        "cumsum_dim0": Case(lambda a: mg.cumsum(a, 0), lambda a: np.cumsum(a, 0), X),
        "masked_fill": Case(
            lambda a, m: a.masked_fill(m, -2.0), lambda a, m: np.where(m, -2.0, a), X, X > 0.3
        ),
        "reindex_strings": Case(
            lambda a: a.reindex([4, 7, 3], ["i0", "i1-1", "i2*2"], overflow_value=0.5), lambda a: _shift(a), X
        ),
        "reindex_reduce_strings": Case(
            lambda a: a.reindex_reduce("add", [4, 3], ["i0", "i1 // 2"]),
            lambda a: a[..., 0::2].sum(1)[:, :3] * 0 + _pairsum(a),
            X,
        ),
        "reindex_reduce_min": Case(
            lambda a: mg.reindex_reduce(a, "min", [4], ["i0"]), lambda a: a.min((1, 2)), X
        ),
        "reindex_select_expression": Case(
            lambda a: a.reindex([6], ["i0 if i0 < 4 else 3", "0", "i0 % 6"]),
            lambda a: a[np.minimum(np.arange(6), 3), 0, np.arange(6)],
            X,
        ),
        "reindex_extras": Case(
            lambda a, i: a.reindex([2, 2, 6], ["@e0(i0, i1)", "i1", "i2"], extras=[mg.tensor(i)]),
            lambda a, i: a[i[:, :, None], np.arange(2)[None, :, None], np.arange(6)],
            X,
            np.array([[0, 3], [1, 2]]),
        ),
    }
)


def _scatter_add(a, dim, index, src):
    out = a.copy()
    for pos in np.ndindex(index.shape):
        target = list(pos)
        target[dim] = index[pos]
        out[tuple(target)] += src[pos]
    return out


def _index_add(a, index, source):
    out = a.copy()
    for k, i in enumerate(index):
        out[i] += source[k]
    return out


def _shift(a):
    out = np.full((4, 7, 3), 0.5)
    out[:, 1:6, :] = a[:, :, 0::2]
    return out


def _pairsum(a):
    out = np.zeros((4, 3))
    for j in range(5):
        out[:, j // 2] += a[:, j, 0]
    return out


CASES["reindex_reduce_strings"] = Case(
    lambda a: a[:, :, 0].reindex_reduce("add", [4, 3], ["i0", "i1 // 2"]), _pairsum, X
)


test_forward, test_gradient = case_tests(CASES, float32=False)


def test_integer_key_forms_match_numpy():
    x = mg.tensor(X)
    assert x[np.int64(2)].shape == (5, 6)
    assert x[mg.tensor(1)].shape == (5, 6)
    np.testing.assert_array_equal(x[mg.tensor([1, 3])].numpy(), X[[1, 3]])


def test_one_hot():
    labels = mg.tensor([0, 2, 1, 2])
    np.testing.assert_array_equal(mg.one_hot(labels).numpy(), np.eye(3, dtype=np.int64)[[0, 2, 1, 2]])
    assert mg.one_hot(labels, 5).shape == (4, 5)


def test_cumsum_of_ints_is_int64():
    out = mg.tensor([1, 2, 3], dtype=mg.int32).cumsum(0)
    assert out.dtype == mg.int64 and out.tolist() == [1, 3, 6]


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (lambda x: x[4], IndexError, "out of bounds"),
        (lambda x: x[0, 0, 0, 0], IndexError, "too many indices"),
        (lambda x: x[..., ...], IndexError, "single ellipsis"),
        (lambda x: x[mg.tensor([0, 9])].numpy(), IndexError, "out of bounds"),
        (lambda x: x.gather(1, mg.tensor(np.full((4, 5, 6), 7))).numpy(), IndexError, "out of bounds"),
        (lambda x: x[mg.tensor([0.5])], IndexError, "integer or bool"),
        (lambda x: x.reindex([2], ["i0 + j", "0", "0"]), ValueError, "unknown name 'j'"),
        (lambda x: x.reindex([2], ["i0", "i1", "i2"]), ValueError, "i1 is out of range"),
        (lambda x: x.reindex([2], ["__import__('os')", "0", "0"]), ValueError, "unknown function"),
        (lambda x: x.reindex([2], ["i0.real", "0", "0"]), ValueError, "unsupported syntax"),
    ],
)
def test_errors(bad, error, match):
    with pytest.raises(error, match=match):
        bad(mg.tensor(X))


def test_setitem_on_leaf_requiring_grad_is_refused():
    x = mg.tensor(X, requires_grad=True)
    with pytest.raises(mg.MetagraphError, match="in-place"):
        x[0] = 1.0
    with mg.no_grad():
        x[0] = 1.0
    assert x.requires_grad and x.is_leaf and x[0].sum().item() == 30.0


def test_division_by_zero_inside_an_index_expression_is_an_error():
    x = mg.tensor(np.arange(6.0))
    with pytest.raises(mg.MetagraphError, match="divide"):
        x.reindex([6], ["i0 // (i0 - 2)"]).numpy()


def test_setitem_takes_lists_and_arrays_as_pytorch_does():
    x = mg.zeros(3, 2)
    x[0] = [1, 2]
    x[1] = np.array([3.0, 4.0])
    x[2, 1] = np.array(5.0)
    np.testing.assert_array_equal(x.numpy(), [[1, 2], [3, 4], [0, 5]])
    with pytest.raises(mg.ShapeError, match="setitem"):
        x[0] = [1, 2, 3]


OUT_OF_RANGE = {
    "gather": lambda x, i: x.gather(1, mg.tensor([[i]])),
    "scatter_add": lambda x, i: x.scatter_add(1, mg.tensor([[i]]), mg.ones(1, 1, dtype=mg.float64)),
    "index_select": lambda x, i: x.index_select(1, mg.tensor([i])),
    "index_add": lambda x, i: x.index_add(1, mg.tensor([i]), mg.ones(3, 1, dtype=mg.float64)),
    "one_hot": lambda x, i: mg.one_hot(mg.tensor([0, i]), 4),
}


@pytest.mark.parametrize("backend", ["numpy", "c", "llvm", "bang"])
@pytest.mark.parametrize("op", sorted(OUT_OF_RANGE))
@pytest.mark.parametrize("index", [-1, 4])
def test_a_negative_or_too_large_index_is_an_error_as_in_pytorch(backend, op, index):
    needs(backend)
    mg.set_backend(backend)
    with pytest.raises(IndexError, match=rf"^{op}: .*out of bounds"):
        OUT_OF_RANGE[op](mg.tensor(np.zeros((3, 4))), index).numpy()


def test_indexing_with_a_tensor_wraps_negative_indices_as_pytorch_does():
    x = mg.tensor(X)
    np.testing.assert_array_equal(x[mg.tensor([-1, -4])].numpy(), X[[-1, -4]])
    x[mg.tensor([-1])] = 0.0
    assert not x.numpy()[-1].any()


def test_one_hot_rejects_what_it_cannot_infer():
    with pytest.raises(ValueError, match="one_hot: cannot infer the number of classes from an empty"):
        mg.one_hot(mg.tensor(np.zeros(0, np.int64)))
    assert mg.one_hot(mg.tensor(np.zeros(0, np.int64)), 3).shape == (0, 3)


@pytest.mark.parametrize("shape, key, match", [
    ((3,), lambda: mg.tensor([True, False]), r"mask \[2\] at index 0 does not match .* \[3\]"),
    ((10,), lambda: [True, False], r"mask \[2\] at index 0 does not match .* \[10\]"),
    ((2, 3, 4), lambda: (0, mg.tensor(np.ones((3, 3), bool))), r"mask \[3, 3\] at index 1"),
])
def test_a_bool_mask_must_have_the_shape_of_the_dimensions_it_indexes(shape, key, match):
    with pytest.raises(IndexError, match=match):
        mg.zeros(*shape)[key()]
    assert mg.arange(10.0)[[True] * 10].shape == (10,)
