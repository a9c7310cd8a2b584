"""matmul in all of PyTorch's forms."""
import numpy as np
import pytest

import metagraph as mg
from tests.helpers import Case, case_tests, needs

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


@pytest.mark.parametrize("backend", ["numpy", "c", "llvm", "bang"])
@pytest.mark.parametrize("a_shape, b_shape", [((8, 8), (8, 0)), ((0, 8), (8, 8)), ((8, 0), (0, 8)),
                                              ((2, 0, 3), (3, 5)), ((64, 0), (0, 256))])
def test_matmul_with_a_zero_size_dimension_and_its_gradients(backend, a_shape, b_shape):
    """A value with no elements needs no kernel; a sum over nothing is 0."""
    needs(backend)
    mg.set_backend(backend)
    a = mg.tensor(R.standard_normal(a_shape), requires_grad=True)
    b = mg.tensor(R.standard_normal(b_shape), requires_grad=True)
    out = a @ b
    (out * mg.tensor(R.standard_normal(out.shape))).sum().backward()
    np.testing.assert_array_equal(out.numpy(), np.zeros(a_shape[:-1] + b_shape[-1:]))
    assert a.grad.shape == a_shape and b.grad.shape == b_shape
    np.testing.assert_array_equal(a.grad.numpy(), np.zeros(a_shape))
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(b_shape))
