"""matmul in all of PyTorch's forms."""
import numpy as np
import pytest

import metagraph as mg
from tests.helpers import Case, case_tests

R = np.random.default_rng(2)


def f(*shape):
    return R.uniform(-1, 1, shape)


CASES = {
    "vector_vector": Case(lambda a, b: a @ b, np.matmul, f(5), f(5)),
    "matrix_matrix": Case(lambda a, b: a @ b, np.matmul, f(3, 5), f(5, 4)),
    "vector_matrix": Case(lambda a, b: mg.matmul(a, b), np.matmul, f(5), f(5, 2)),
    "matrix_vector": Case(lambda a, b: a.matmul(b), np.matmul, f(3, 5), f(5)),
    "batched": Case(lambda a, b: a @ b, np.matmul, f(2, 3, 5), f(2, 5, 4)),
    "broadcast_batch": Case(lambda a, b: a @ b, np.matmul, f(2, 1, 3, 5), f(4, 5, 2)),
    "batched_vector": Case(lambda a, b: a @ b, np.matmul, f(2, 3, 5), f(5)),
    "size_one": Case(lambda a, b: a @ b, np.matmul, f(1, 1), f(1, 7)),
    "dot": Case(lambda a, b: a.dot(b), np.dot, f(4), f(4)),
}


test_forward, test_float32, test_gradient = case_tests(CASES)


def test_integer_matmul():
    a, b = R.integers(-5, 5, (3, 4)), R.integers(-5, 5, (4, 2))
    np.testing.assert_array_equal((mg.tensor(a) @ mg.tensor(b)).numpy(), a @ b)


@pytest.mark.parametrize("a, b, match", [
    ((3, 4), (5, 2), r"\(3, 4\) and \(5, 2\)"),
    ((2, 3, 4), (3, 4, 2), "cannot be broadcast"),
    ((), (3,), "at least 1 dimension"),
])
def test_shape_errors(a, b, match):
    with pytest.raises(mg.ShapeError, match=match):
        mg.ones(*a) @ mg.ones(*b)


def test_dtype_mismatch():
    with pytest.raises(TypeError, match="same dtype"):
        mg.ones(2, 2) @ mg.ones(2, 2, dtype=mg.float64)
