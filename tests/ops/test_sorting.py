"""sort, argsort, topk, the running scans, scatter_reduce, scatter and nonzero against PyTorch."""
import numpy as np
import pytest

import metagraph as mg

torch = pytest.importorskip("torch")
R = np.random.default_rng(11)

TIES = np.array([[3.0, 1.0, 2.0, 1.0, np.nan, 0.0, 2.0],
                 [5.0, 5.0, -1.0, 2.0, 2.0, 7.0, np.nan]])
ZEROS = np.array([[2.0, 0.0, 3.0, 0.0, -1.5], [0.5, -2.0, 1.5, 0.0, 4.0]])


def _check(ours, theirs, arrays, grad=True, rtol=1e-9, atol=1e-9):
    """Every output's values, and the gradient of sum(values * probe) of the first, in float64."""
    mine = [mg.tensor(a, requires_grad=grad) for a in arrays]
    torchs = [torch.tensor(a, requires_grad=grad) for a in arrays]
    out, expected = ours(*mine), theirs(*torchs)
    out = out if isinstance(out, tuple) else (out,)
    expected = tuple(expected) if isinstance(expected, tuple) else (expected,)
    for a, b in zip(out, expected):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=atol)
    if not grad:
        return
    probe = R.uniform(-1, 1, expected[0].shape)
    (out[0] * mg.tensor(probe)).sum().backward()
    (expected[0] * torch.tensor(probe)).sum().backward()
    for a, b in zip(mine, torchs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_ties_and_nan(dim, descending):
    _check(lambda x: mg.sort(x, dim, descending, stable=True),
           lambda x: torch.sort(x, dim=dim, descending=descending, stable=True), [TIES])


def test_sort_integers_bool_and_argsort():
    ints = R.integers(-3, 4, (3, 6))
    _check(lambda x: mg.sort(x, 1), lambda x: torch.sort(x, dim=1, stable=True), [ints], grad=False)
    flags = ints > 0
    _check(lambda x: x.argsort(dim=1, descending=True),
           lambda x: torch.argsort(x, dim=1, descending=True, stable=True), [flags], grad=False)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = R.permutation(24).reshape(4, 6) / 4.0         # distinct: topk's tie order is unspecified
    _check(lambda t: t.topk(3, dim=1, largest=largest), lambda t: t.topk(3, dim=1, largest=largest), [x])
    _check(lambda t: mg.topk(t, 2, dim=0, largest=largest), lambda t: torch.topk(t, 2, 0, largest), [x])


@pytest.mark.parametrize("dim", [0, 1])
def test_cumprod_with_zeros(dim):
    _check(lambda x: mg.cumprod(x, dim), lambda x: torch.cumprod(x, dim), [ZEROS])


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin(name):
    _check(lambda x: getattr(mg, name)(x, 1), lambda x: getattr(torch, name)(x, 1), [TIES])
    ints = R.integers(-2, 3, (2, 7))
    _check(lambda x: getattr(x, name)(0), lambda x: getattr(x, name)(0), [ints], grad=False)


def test_logcumsumexp_far_apart_and_minus_inf():
    x = np.array([[-1000.0, 0.0, 3.0, -np.inf, 2.0], [1.0, 2.0, -5.0, 700.0, 0.5]])
    _check(lambda t: t.logcumsumexp(1), lambda t: torch.logcumsumexp(t, 1), [x])


def test_scans_finite_differences():
    for x, fn in ((ZEROS, lambda t: mg.cumprod(t, 1)), (ZEROS, lambda t: mg.logcumsumexp(t, 1)),
                  (ZEROS + np.arange(5) * 0.1, lambda t: mg.sort(t, 1)[0])):       # no ties
        t = mg.tensor(x, requires_grad=True)
        weights = mg.tensor(np.arange(x.size, dtype=np.float64).reshape(x.shape))
        (fn(t) * weights).sum().backward()
        numeric, eps = np.zeros_like(x), 1e-6
        for i in np.ndindex(x.shape):
            for sign in (1, -1):
                shifted = x.copy()
                shifted[i] += sign * eps
                numeric[i] += sign * (fn(mg.tensor(shifted)) * weights).sum().item() / (2 * eps)
        np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=1e-6, atol=1e-7)


INDEX = np.array([[0, 1, 0], [3, 3, 3]])
SRC = np.array([[2.0, 0.0, -3.0], [1.0, 4.0, 4.0]])        # torch wants src shaped as index for grads
SELF = np.array([[1.0, 2.0, 4.0, 4.0], [5.0, 4.0, 7.0, 4.0], [0.0, -1.0, 2.0, 0.0]])


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self):
    index = mg.tensor(INDEX)
    _check(lambda x, s: mg.scatter_reduce(x, 1, index, s, reduce, include_self),
           lambda x, s: x.scatter_reduce(1, torch.tensor(INDEX), s, reduce, include_self=include_self),
           [SELF, SRC])


def test_scatter_reduce_integer_mean():
    x, src = R.integers(-9, 9, (2, 4)), R.integers(-9, 9, (2, 3))
    _check(lambda a, b: a.scatter_reduce(1, mg.tensor(INDEX), b, "mean"),
           lambda a, b: a.scatter_reduce(1, torch.tensor(INDEX), b, "mean"), [x, src], grad=False)


def test_scatter_out_of_place_and_in_place():
    index = np.array([[2, 0, 1, 0]])
    _check(lambda x, s: x.scatter(0, mg.tensor(index), s), lambda x, s: x.scatter(0, torch.tensor(index), s),
           [SELF, SRC[:1, :3].repeat(2, axis=1)[:, :4]])
    ours, theirs = mg.tensor(SELF), torch.tensor(SELF)
    ours.scatter_(1, mg.tensor(INDEX), 7.5)
    theirs.scatter_(1, torch.tensor(INDEX), 7.5)
    ours.scatter_add_(1, mg.tensor(INDEX), mg.tensor(SRC))
    theirs.scatter_add_(1, torch.tensor(INDEX), torch.tensor(SRC))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy())


def test_nonzero():
    x = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, -1.0]])
    np.testing.assert_array_equal(mg.nonzero(mg.tensor(x)).numpy(), torch.nonzero(torch.tensor(x)).numpy())
    for a, b in zip(mg.tensor(x).nonzero(as_tuple=True), torch.tensor(x).nonzero(as_tuple=True)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert mg.nonzero(mg.zeros(0, 2)).shape == (0, 2)
    assert mg.nonzero(mg.tensor(3.0)).shape == torch.nonzero(torch.tensor(3.0)).shape == (1, 0)


def test_named_results():
    x = mg.tensor([[3.0, 1.0, 2.0]])
    assert x.sort().indices.tolist() == [[1, 2, 0]]
    assert mg.topk(x, 1).values.tolist() == [[3.0]]
    assert x.cummax(1).indices.tolist() == [[0, 0, 0]]


@pytest.mark.parametrize("bad", [[0, 5, 1], [-1, 0, 0]])
@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_an_index_out_of_range_raises_as_pytorchs_does(backend, bad):
    mg.set_backend(backend)
    x, src, index = mg.zeros(5), mg.ones(3), mg.tensor(bad)
    for call in (lambda: x.scatter_reduce(0, index, src, "sum"), lambda: x.scatter(0, index, src)):
        with pytest.raises(IndexError, match="out of bounds"):
            call().numpy()
