"""Reductions: dim as int, tuple or None, keepdim, dtypes, and PyTorch's (values, indices)."""

import numpy as np
import pytest

import metagraph as mg
from tests.helpers import Case, case_tests, run_forward

R = np.random.default_rng(5)
X = R.uniform(-2, 2, (3, 4, 5))
POS = R.uniform(0.5, 1.5, (3, 4))


def logsumexp(a, axis=None, keepdims=False):
    peak = a.max(axis=axis, keepdims=True)
    out = np.log(np.exp(a - peak).sum(axis=axis, keepdims=True)) + peak
    return out if keepdims else np.squeeze(out, axis=axis)


CASES = {
    "sum_all": Case(lambda a: a.sum(), np.sum, X),
    "sum_dim": Case(lambda a: a.sum(1), lambda a: a.sum(1), X),
    "sum_neg_dim_keepdim": Case(lambda a: a.sum(-1, keepdim=True), lambda a: a.sum(-1, keepdims=True), X),
    "sum_tuple": Case(lambda a: mg.sum(a, (0, 2)), lambda a: a.sum((0, 2)), X),
    "mean": Case(lambda a: a.mean((1, 2), keepdim=True), lambda a: a.mean((1, 2), keepdims=True), X),
    "prod": Case(lambda a: a.prod(1), lambda a: a.prod(1), POS),
    "prod_all": Case(lambda a: a.prod(), np.prod, POS),
    "amax": Case(lambda a: a.amax((0, 1)), lambda a: a.max((0, 1)), X),
    "amin": Case(lambda a: a.amin(2, keepdim=True), lambda a: a.min(2, keepdims=True), X),
    "max_all": Case(lambda a: a.max(), np.max, X),
    "min_all": Case(lambda a: mg.min(a), np.min, X),
    "max_dim": Case(lambda a: a.max(1), lambda a: (a.max(1), a.argmax(1)), X),
    "min_dim_keepdim": Case(
        lambda a: a.min(0, keepdim=True), lambda a: (a.min(0, keepdims=True), a.argmin(0)[None]), X
    ),
    "var": Case(lambda a: a.var(1), lambda a: a.var(1, ddof=1), X),
    "var_biased": Case(lambda a: a.var((0, 2), correction=0), lambda a: a.var((0, 2)), X),
    "var_all": Case(lambda a: a.var(), lambda a: a.var(ddof=1), X),
    "std": Case(lambda a: a.std(2, keepdim=True), lambda a: a.std(2, ddof=1, keepdims=True), X),
    "logsumexp": Case(lambda a: a.logsumexp(1), lambda a: logsumexp(a, 1), X * 30),
    "logsumexp_keepdim": Case(
        lambda a: mg.logsumexp(a, (0, 2), keepdim=True), lambda a: logsumexp(a, (0, 2), True), X
    ),
}

INDEX_CASES = {
    "argmax_all": Case(lambda a: a.argmax(), lambda a: np.array(a.argmax()), X),
    "argmax_dim": Case(lambda a: a.argmax(1), lambda a: a.argmax(1), X),
    "argmin_keepdim": Case(lambda a: a.argmin(-1, keepdim=True), lambda a: a.argmin(-1)[..., None], X),
    "argmax_ties_first": Case(
        lambda a: a.argmax(1), lambda a: a.argmax(1), np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    ),
    "argmax_nan": Case(
        lambda a: a.argmax(1), lambda a: np.array([1, 0]), np.array([[1.0, np.nan, 3.0], [2.0, 2.0, 0.0]])
    ),
    "sum_int": Case(
        lambda a: a.sum(0), lambda a: a.sum(0).astype(np.int64), R.integers(-5, 5, (3, 4)).astype(np.int32)
    ),
    "sum_bool": Case(lambda a: a.sum(), lambda a: np.array(a.sum(), dtype=np.int64), R.random((3, 4)) < 0.5),
    "prod_int": Case(lambda a: a.prod(1), lambda a: a.prod(1), R.integers(-3, 4, (3, 4))),
    "amax_int": Case(lambda a: a.amax(1), lambda a: a.max(1), R.integers(-50, 50, (3, 4)).astype(np.int8)),
    "amin_uint8": Case(lambda a: a.amin(1), lambda a: a.min(1), R.integers(0, 255, (3, 4)).astype(np.uint8)),
    "any": Case(lambda a: a.any(1), lambda a: a.any(1), R.random((3, 4)) < 0.2),
    "all": Case(lambda a: a.all(), lambda a: np.array(a.all()), R.random((3, 4)) < 0.9),
    "any_int": Case(lambda a: mg.any(a, 0), lambda a: a.any(0), R.integers(0, 2, (3, 4))),
    "mean_float16": Case(
        lambda a: a.mean(1),
        lambda a: a.astype(np.float32).mean(1).astype(np.float16),
        R.uniform(0, 1, (4, 300)).astype(np.float16),
        rtol=2e-3,
    ),
}


test_forward, test_float32, test_gradient = case_tests(CASES)


@pytest.mark.parametrize("name", sorted(INDEX_CASES))
def test_indices_and_integer_reductions(name):
    run_forward(INDEX_CASES[name])


def test_max_dim_gradient_goes_to_the_chosen_index():
    x = mg.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)
    values, _ = x.max(1)
    (g,) = mg.grad(values.sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [[0, 1, 0], [1, 0, 0]])


def test_amax_gradient_is_shared_among_ties():
    x = mg.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)
    (g,) = mg.grad(x.amax(1).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [[0, 0.5, 0.5], [0.5, 0.5, 0]])


def test_mean_of_integers_is_an_error():
    with pytest.raises(TypeError, match="mean"):
        mg.tensor([1, 2, 3]).mean()


@pytest.mark.parametrize("dim", [3, -4, (0, 0)])
def test_bad_dim_names_the_op(dim):
    with pytest.raises(IndexError, match="sum"):
        mg.ones(2, 3, 4).sum(dim)


def test_logsumexp_of_all_minus_inf_is_minus_inf():
    x = mg.tensor([[-np.inf, -np.inf], [0.0, -np.inf]])
    np.testing.assert_array_equal(x.logsumexp(1).numpy(), [-np.inf, 0.0])


@pytest.mark.parametrize("op, call", [
    ("argmax", lambda x: mg.argmax(x)),
    ("argmin", lambda x: x.argmin(1)),
    ("max", lambda x: x.max()),
    ("max", lambda x: x.max(1)),
    ("min", lambda x: x.min(1)),
    ("amin", lambda x: x.amin(1)),
    ("amax", lambda x: x.amax(1)),
])
def test_a_maximum_or_minimum_over_an_empty_dimension_names_its_op(op, call):
    with pytest.raises(IndexError, match=rf"^{op}: cannot reduce over dimension \d of size 0"):
        call(mg.zeros(3, 0))


def test_sums_over_an_empty_dimension_are_the_identity_and_softmax_of_nothing_is_empty():
    x = mg.zeros(3, 0)
    assert x.sum(1).tolist() == [0, 0, 0] and x.prod(1).tolist() == [1, 1, 1]
    assert mg.logsumexp(x, 1).tolist() == [-np.inf] * 3            # as PyTorch's
    assert mg.nn.functional.softmax(x, 1).shape == (3, 0)
    assert mg.nn.functional.log_softmax(mg.zeros(0, 4), 0).shape == (0, 4)
