"""Element-wise composites: forward against numpy, float32 too, gradients by finite differences."""

import math

import numpy as np
import pytest

import metagraph as mg
from tests import reference
from tests.helpers import Case, case_tests, run_forward

R = np.random.default_rng(11)


def f(*shape, low=-2.0, high=2.0):
    return R.uniform(low, high, shape)


def away(*shape, low=-2.0, high=2.0, gap=0.2):
    """Values at least `gap` from zero (and from integers' kinks)."""
    x = R.uniform(low, high, shape)
    return np.where(np.abs(x) < gap, gap + 0.1, x)


def frac(*shape):
    """Values away from integers and half-integers (where rounding jumps)."""
    return np.floor(f(*shape, low=-5, high=5)) + R.uniform(0.1, 0.4, shape) * R.choice([1, 2], shape)


def ints(*shape, low=-9, high=10):
    return R.integers(low, high, shape)


def bools(*shape):
    return R.random(shape) < 0.5


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


CASES = {
    "add_broadcast": Case(lambda a, b: a + b, np.add, f(3, 4), f(4)),
    "sub_scalar": Case(lambda a: 2.5 - a, lambda a: 2.5 - a, f(3, 4)),
    "mul_broadcast": Case(lambda a, b: a * b, np.multiply, f(3, 1, 4), f(5, 1)),
    "div": Case(lambda a, b: a / b, np.divide, f(3, 4), away(3, 4)),
    "rdiv": Case(lambda a: 1.5 / a, lambda a: 1.5 / a, away(5)),
    "floor_divide": Case(lambda a, b: a // b, np.floor_divide, frac(6), away(6, low=1, high=3)),
    "remainder": Case(lambda a, b: a % b, np.mod, frac(6), away(6, low=1.1, high=2.9)),
    "pow_square": Case(lambda a: a**2, lambda a: a**2, f(3, 4)),
    "pow_cube_negative": Case(lambda a: a**3, lambda a: a**3, f(6)),
    "pow_negative_int": Case(lambda a: a**-2, lambda a: a**-2.0, away(6)),
    "pow_half": Case(lambda a: a**0.5, np.sqrt, f(6, low=0.1)),
    "pow_fraction": Case(lambda a: a**1.7, lambda a: a**1.7, f(6, low=0.1)),
    "pow_tensor": Case(lambda a, b: a**b, np.power, f(6, low=0.2), f(6)),
    "rpow": Case(lambda a: 2.0**a, lambda a: 2.0**a, f(6)),
    "neg": Case(lambda a: -a, np.negative, f(3, 4)),
    "abs": Case(lambda a: abs(a), np.abs, away(3, 4)),
    "exp": Case(mg.exp, np.exp, f(3, 4, low=-5, high=5)),
    "exp2": Case(mg.exp2, np.exp2, f(3, 4)),
    "log": Case(mg.log, np.log, f(3, 4, low=0.1, high=5)),
    "log2": Case(mg.log2, np.log2, f(3, 4, low=0.1, high=5)),
    "sqrt": Case(mg.sqrt, np.sqrt, f(3, 4, low=0.1)),
    "rsqrt": Case(mg.rsqrt, lambda a: 1 / np.sqrt(a), f(3, 4, low=0.1)),
    "sin": Case(mg.sin, np.sin, f(3, 4, low=-6, high=6)),
    "cos": Case(mg.cos, np.cos, f(3, 4, low=-6, high=6)),
    "tan": Case(mg.tan, np.tan, f(3, 4, low=-1.2, high=1.2)),
    "tanh": Case(mg.tanh, np.tanh, np.concatenate([f(6, low=-0.1, high=0.1), f(6, low=-9, high=9)])),
    "sigmoid": Case(mg.sigmoid, sigmoid, np.concatenate([f(6), f(4, low=-40, high=40)])),
    "erf": Case(mg.erf, reference.erf, f(8, low=-3, high=3), rtol=1e-6, atol=1e-7),
    "erfc": Case(lambda a: 1 - mg.erf(a), lambda a: 1 - reference.erf(a), f(8, low=-3, high=3)),
    "relu": Case(mg.relu, lambda a: np.maximum(a, 0), away(3, 4)),
    "gelu": Case(
        mg.gelu,
        lambda a: a * 0.5 * (1 + reference.erf(a / math.sqrt(2))),
        f(8, low=-4, high=4),
    ),
    "gelu_tanh": Case(
        lambda a: mg.gelu(a, approximate="tanh"),
        lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
        f(8, low=-4, high=4),
    ),
    "silu": Case(mg.silu, lambda a: a * sigmoid(a), f(3, 4, low=-6, high=6)),
    "softplus": Case(
        mg.softplus,
        lambda a: np.where(a > 20, a, np.log1p(np.exp(a))),
        np.concatenate([f(6, low=-30, high=19), [25.0, -25.0]]),
    ),
    "softplus_beta": Case(
        lambda a: mg.softplus(a, beta=2.0, threshold=5.0),
        lambda a: np.where(2 * a > 5, a, np.log1p(np.exp(2 * a)) / 2),
        f(8, low=-4, high=4),
    ),
    "floor": Case(mg.floor, np.floor, frac(3, 4)),
    "ceil": Case(mg.ceil, np.ceil, frac(3, 4)),
    "round": Case(mg.round, np.round, frac(6)),
    "round_half_even": Case(mg.round, np.round, np.array([0.5, 1.5, 2.5, -0.5, -1.5]), grad=False),
    "round_decimals": Case(
        lambda a: a.round(1), lambda a: np.round(a, 1), np.array([0.123, 1.26, -2.71]), grad=False
    ),
    "trunc": Case(mg.trunc, np.trunc, frac(3, 4)),
    "sign": Case(mg.sign, np.sign, away(6)),
    "sign_zero_nan": Case(mg.sign, np.sign, np.array([0.0, -0.0, np.nan, 3.0]), grad=False),
    "clamp": Case(lambda a: a.clamp(-0.5, 0.7), lambda a: np.clip(a, -0.5, 0.7), away(3, 4, gap=0)),
    "clamp_min": Case(lambda a: mg.clamp(a, min=0.3), lambda a: np.maximum(a, 0.3), f(3, 4)),
    "maximum": Case(mg.maximum, np.maximum, f(3, 4), f(4)),
    "minimum": Case(mg.minimum, np.minimum, f(3, 4), f(3, 1)),
    "where": Case(lambda c, a, b: mg.where(c, a, b), np.where, bools(3, 4), f(3, 4), f(4)),
    "where_scalar": Case(
        lambda c, a: mg.where(c, a, 0.5), lambda c, a: np.where(c, a, 0.5), bools(3, 4), f(3, 4)
    ),
    "square": Case(lambda a: a.square(), np.square, f(5)),
    "reciprocal": Case(mg.reciprocal, np.reciprocal, away(5)),
}

INT_CASES = {
    "int_floor_divide": Case(
        lambda a, b: a // b, np.floor_divide, ints(3, 4), np.where(ints(3, 4) == 0, 2, 7)
    ),
    "int_remainder": Case(lambda a, b: a % b, np.mod, ints(3, 4), np.array([3, -4, 5, -2])),
    "int_pow": Case(lambda a: a**3, lambda a: a**3, ints(3, 4)),
    "int_true_div": Case(lambda a, b: a / b, lambda a, b: (a / b).astype(np.float32), ints(6), np.full(6, 4)),
    "lt": Case(lambda a, b: a < b, np.less, ints(3, 4, low=0, high=3), ints(3, 4, low=0, high=3)),
    "le": Case(lambda a, b: a <= b, np.less_equal, ints(3, 4, low=0, high=3), ints(3, 4, low=0, high=3)),
    "gt": Case(lambda a, b: a > b, np.greater, ints(3, 4, low=0, high=3), ints(4, low=0, high=3)),
    "ge": Case(lambda a, b: a >= b, np.greater_equal, ints(3, 4, low=0, high=3), ints(3, 4, low=0, high=3)),
    "eq": Case(lambda a, b: a == b, np.equal, ints(3, 4, low=0, high=3), ints(3, 4, low=0, high=3)),
    "ne": Case(lambda a, b: a != b, np.not_equal, ints(3, 4, low=0, high=3), ints(3, 4, low=0, high=3)),
    "eq_nan": Case(lambda a: a == a, lambda a: a == a, np.array([1.0, np.nan])),
    "le_nan": Case(lambda a: a <= 1.0, lambda a: a <= 1.0, np.array([1.0, np.nan, 2.0])),
    "bitwise_and": Case(lambda a, b: a & b, np.bitwise_and, ints(3, 4), ints(3, 4)),
    "bitwise_or": Case(lambda a, b: a | b, np.bitwise_or, ints(3, 4), ints(3, 4)),
    "bitwise_xor": Case(lambda a, b: a ^ b, np.bitwise_xor, ints(3, 4), ints(3, 4)),
    "bitwise_not": Case(lambda a: ~a, np.invert, ints(3, 4)),
    "bool_and": Case(lambda a, b: a & b, np.logical_and, bools(3, 4), bools(3, 4)),
    "bool_not": Case(lambda a: ~a, np.logical_not, bools(3, 4)),
    "logical_or": Case(mg.logical_or, np.logical_or, ints(5, low=0, high=2), bools(5)),
    "logical_xor": Case(mg.logical_xor, np.logical_xor, bools(5), bools(5)),
    "logical_not": Case(mg.logical_not, np.logical_not, ints(5, low=0, high=2)),
    "int_abs": Case(lambda a: abs(a), np.abs, ints(6)),
    "int_minimum": Case(mg.minimum, np.minimum, ints(6), ints(6)),
    "uint8_minimum": Case(
        mg.minimum,
        np.minimum,
        ints(6, low=0, high=255).astype(np.uint8),
        ints(6, low=0, high=255).astype(np.uint8),
    ),
    "int_sign": Case(mg.sign, np.sign, ints(6)),
    "int_clamp": Case(lambda a: a.clamp(-3, 4), lambda a: np.clip(a, -3, 4), ints(8)),
}


test_forward, test_float32, test_gradient = case_tests(CASES)


@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_integer_and_logic(name):
    run_forward(INT_CASES[name])


def test_relu_gradient_at_zero_is_zero():
    x = mg.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    (g,) = mg.grad(mg.relu(x).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), [0, 0, 1])


def test_sigmoid_and_softplus_gradients_stay_finite_far_out():
    x = mg.tensor([-200.0, -90.0, 90.0, 200.0], requires_grad=True)
    for fn in (mg.sigmoid, mg.softplus, mg.tanh, mg.silu):
        (g,) = mg.grad(fn(x).sum(), [x])
        assert np.all(np.isfinite(g.numpy())), fn.__name__


def test_floor_of_huge_and_special_values():
    x = np.array([1e30, -1e30, np.inf, -np.inf, np.nan, 2.0**40 + 0.5], dtype=np.float64)
    np.testing.assert_array_equal(mg.floor(mg.tensor(x)).numpy(), np.floor(x))
    np.testing.assert_array_equal(
        mg.floor(mg.tensor(x.astype(np.float32))).numpy(), np.floor(x.astype(np.float32))
    )


def test_pow_negative_base_fraction_is_nan_and_zero_exponent_is_one():
    x = mg.tensor([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(np.isnan((x ** mg.tensor([0.5, 0.5, 0.5])).numpy()), [True, False, False])
    np.testing.assert_array_equal((x ** mg.tensor([0.0, 0.0, 0.0])).numpy(), [1, 1, 1])
    np.testing.assert_array_equal((x ** mg.tensor([3.0, 2.0, 2.0])).numpy(), [-8, 0, 9])


def test_integer_overflow_wraps_like_torch():
    a = mg.tensor([250], dtype=mg.uint8)
    assert (a + 10).tolist() == [4]
    b = mg.tensor([2**62], dtype=mg.int64)
    assert (b * 2).numpy()[0] == np.int64(-(2**63))


def test_shared_constants_keep_the_sign_of_zero_of_numpy_scalars():
    ones = mg.tensor(np.ones(3, dtype=np.float32))
    assert not np.signbit((ones * np.float32(0.0)).numpy()).any()
    assert np.signbit((ones * np.float32(-0.0)).numpy()).all()     # not the cached +0.0 constant
    assert np.signbit((ones * -0.0).numpy()).all()


def test_fill_takes_scalars_and_zero_d_arrays_and_names_anything_else():
    assert mg.zeros(2).fill_(np.array(3.0)).numpy().tolist() == [3.0, 3.0]
    assert mg.zeros(2, dtype=mg.int32).fill_(np.int64(7)).numpy().tolist() == [7, 7]
    for bad in ([1.0], None, np.array([3.0]), "x"):
        with pytest.raises(mg.DTypeError, match="const: unsupported scalar"):
            mg.zeros(2).fill_(bad)
    t = mg.zeros(2)
    assert t.fill_(mg.tensor(3.0)).numpy().tolist() == [3.0, 3.0]     # a 0-d tensor, as in PyTorch
    with pytest.raises(mg.ShapeError, match="fill_"):
        t.fill_(mg.tensor([3.0]))
