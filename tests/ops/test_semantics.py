"""PyTorch's semantics at the edges: special values (+-0, +-inf, NaN, huge, tiny) in the forward
value and the gradient of pow, the activations, division with a rounding mode and max pooling,
compared with torch in float64 and float32."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

DTYPES = [(np.float64, 1e-12), (np.float32, 1e-5)]
BASES = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -2.0, -0.5, 1e-30, 1e30, 2.0, 0.5, 3.0]
EXPONENTS = [0, 1, 2, 3, -1, -2, 0.5, -0.3, 2.5, 3.0, -3.0]


def assert_same(got, want, rtol, atol=0.0, signed_zeros=True):
    """Equal within rtol, NaN where torch has NaN, and (optionally) zeros of torch's sign."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if signed_zeros:
        zeros = want == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def _pow_pairs(dtype):
    """Every base with every scalar exponent, and every base with every exponent as a tensor."""
    bases = np.array(BASES, dtype)
    exponents = np.array(EXPONENTS + [np.nan], dtype)
    return np.repeat(bases, len(exponents)), np.tile(exponents, len(bases))


@pytest.mark.parametrize("dtype, rtol", DTYPES)
@pytest.mark.parametrize("exponent", EXPONENTS)
def test_pow_with_a_scalar_exponent_is_torchs_at_special_values(dtype, rtol, exponent):
    x = np.array(BASES, dtype)
    ours, theirs = mg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = ours ** exponent
    (grad,) = mg.grad(y.sum(), [ours])
    (theirs ** exponent).sum().backward()
    assert_same(y.numpy(), (torch.tensor(x) ** exponent).numpy(), rtol)
    assert_same(grad.numpy(), theirs.grad.numpy(), rtol)


@pytest.mark.parametrize("dtype, rtol", DTYPES)
def test_pow_with_a_tensor_exponent_is_torchs_with_both_gradients(dtype, rtol):
    x, e = _pow_pairs(dtype)
    ours = [mg.tensor(x, requires_grad=True), mg.tensor(e, requires_grad=True)]
    theirs = [torch.tensor(x, requires_grad=True), torch.tensor(e, requires_grad=True)]
    y = ours[0] ** ours[1]
    grads = mg.grad(y.sum(), ours)
    (theirs[0] ** theirs[1]).sum().backward()
    assert_same(y.numpy(), (torch.tensor(x) ** torch.tensor(e)).numpy(), rtol)
    for grad, t in zip(grads, theirs):
        assert_same(grad.numpy(), t.grad.numpy(), rtol)


def test_pow_of_negative_bases_to_integer_powers_is_exact():
    x = mg.tensor([-2.0, -3.0, -0.5], requires_grad=True)
    for exponent in (3, 3.0, mg.tensor([3.0, 3.0, 3.0])):
        assert (x ** exponent).tolist() == [-8.0, -27.0, -0.125]
    (grad,) = mg.grad((x ** mg.tensor([3.0, 3.0, 3.0])).sum(), [x])
    assert grad.tolist() == [12.0, 27.0, 0.75]
    assert (mg.tensor([-2, 3]) ** 3).tolist() == [-8, 27]


def test_pow_zero_keeps_its_history_with_a_zero_gradient():
    x = mg.tensor([0.0, 2.0, np.inf, np.nan], requires_grad=True)
    y = x ** 0
    assert y.requires_grad and y.tolist() == [1.0, 1.0, 1.0, 1.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0, 0.0]


SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 2.0, -2.0, 30.0, -30.0, 350.0, -350.0, 1e10, -1e10,
           1e30, -1e30, np.nan]
ACTIVATIONS = {
    "relu": (mg.relu, torch.relu),
    "abs": (mg.abs, torch.abs),
    "sigmoid": (mg.sigmoid, torch.sigmoid),
    "tanh": (mg.tanh, torch.tanh),
    "erf": (mg.erf, torch.erf),
    "gelu": (F.gelu, TF.gelu),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh")),
    "silu": (F.silu, TF.silu),
    "softplus": (F.softplus, TF.softplus),
    "leaky_relu": (F.leaky_relu, TF.leaky_relu),
    "clamp": (lambda x: x.clamp(-1.5, 1.5), lambda x: x.clamp(-1.5, 1.5)),
    "sin": (mg.sin, torch.sin),
    "cos": (mg.cos, torch.cos),
    "sign": (mg.sign, torch.sign),
}


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-6), (np.float32, 1e-4)])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values_and_gradients_are_torchs_at_zero_large_and_nan(name, dtype, rtol):
    """Gradients that underflow may be tiny where torch's are 0 (atol); torch's sign(NaN) is 0,
    numpy's and ours NaN, so sign's value is checked elsewhere."""
    ours, theirs = ACTIVATIONS[name]
    x = np.array(SPECIAL, dtype)
    t = torch.tensor(x, requires_grad=True)
    want = theirs(t)
    want.sum().backward()
    a = mg.tensor(x, requires_grad=True)
    got = ours(a)
    (grad,) = mg.grad(got.sum(), [a])
    if name != "sign":
        assert_same(got.numpy(), want.detach().numpy(), rtol, atol=1e-12, signed_zeros=False)
    assert_same(grad.numpy(), t.grad.numpy(), rtol, atol=1e-12, signed_zeros=False)


def test_abs_relu_and_softplus_at_the_kinks():
    x = mg.tensor([-0.0, 0.0, np.nan, -1.0, 1.0], requires_grad=True)
    assert np.signbit(mg.abs(x).numpy()).tolist() == [False] * 5
    (grad,) = mg.grad(mg.abs(x).sum(), [x])
    assert grad.tolist() == [0.0, 0.0, 0.0, -1.0, 1.0]
    assert np.isnan(mg.relu(x).numpy()[2])
    (grad,) = mg.grad(mg.relu(x).sum(), [x])
    assert grad.tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]
    zero = mg.tensor([0.0], requires_grad=True)
    (grad,) = mg.grad(F.softplus(zero).sum(), [zero])
    assert grad.tolist() == [0.5]
    assert F.softplus(mg.tensor([-30.0], dtype=mg.float32)).item() == pytest.approx(np.exp(-30.0), rel=1e-6)


def _division_operands(dtype):
    rng = np.random.default_rng(5)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.1, -0.1, 3.0, -7.0, 0.3, 1e-3])
    a = np.concatenate([np.repeat(special, len(special)), np.arange(-300.0, 300.0),
                        rng.standard_normal(3000) * 1e3])
    b = np.concatenate([np.tile(special, len(special)), np.tile(np.linspace(-3, 3, 100), 6),
                        rng.standard_normal(3000)])
    a, b = a.astype(dtype), b.astype(dtype)
    limit = 2.0 ** 22 if dtype == np.float32 else 2.0 ** 51    # past it, torch's floor rounds too
    with np.errstate(all="ignore"):
        keep = ~(np.abs(a.astype(np.float64) / b.astype(np.float64)) >= limit)
    return a[keep], b[keep]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_floor_and_trunc_division_and_remainder_of_floats_are_torchs(dtype):
    a, b = _division_operands(dtype)
    ta, tb = torch.tensor(a), torch.tensor(b)
    for mode in ("floor", "trunc"):
        got = mg.div(mg.tensor(a), mg.tensor(b), rounding_mode=mode)
        assert_same(got.numpy(), torch.div(ta, tb, rounding_mode=mode).numpy(), 0)
    assert_same((mg.tensor(a) // mg.tensor(b)).numpy(), torch.floor_divide(ta, tb).numpy(), 0)
    assert_same((mg.tensor(a) % mg.tensor(b)).numpy(), torch.remainder(ta, tb).numpy(), 0)
    assert (mg.tensor(np.array([1.0], dtype)) // 0.1).item() == 9.0     # not floor(1 / 0.1)


def test_remainder_gradient_is_torchs_and_a_zero_remainder_has_the_sign_of_a():
    a, b = [4.0, -4.0, 5.0, -0.0, 4.0, 0.3], [2.0, 2.0, -2.0, 3.0, -2.0, 0.1]
    ours = [mg.tensor(a, requires_grad=True), mg.tensor(b, requires_grad=True)]
    theirs = [torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)]
    rest = ours[0] % ours[1]
    grads = mg.grad(rest.sum(), ours)
    (theirs[0] % theirs[1]).sum().backward()
    assert_same(rest.numpy(), (torch.tensor(a) % torch.tensor(b)).numpy(), 1e-15)
    for grad, t in zip(grads, theirs):
        assert_same(grad.numpy(), t.grad.numpy(), 0, signed_zeros=False)


def test_integer_division_modes_are_torchs_and_division_by_zero_raises_when_run():
    a = np.array([7, -7, 7, -7, 0, 6, -6, 1], np.int64)
    b = np.array([2, 2, -2, -2, 3, 3, -4, 5], np.int64)
    for mode in ("floor", "trunc"):
        got = mg.div(mg.tensor(a), mg.tensor(b), rounding_mode=mode)
        assert got.dtype == mg.int64
        assert got.tolist() == torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode).tolist()
    quotient = mg.tensor([1, 2]).div(mg.tensor([1, 0]), rounding_mode="trunc")
    with pytest.raises(RuntimeError, match="integer division by zero"):
        quotient.numpy()
    with pytest.raises(mg.ArgumentError, match="rounding_mode must be"):
        mg.div(mg.tensor([1.0]), 2.0, rounding_mode="round")


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounded_division_has_a_zero_gradient_and_keeps_its_history(mode):
    a = mg.tensor([5.0, -5.0, 0.3], requires_grad=True)
    b = mg.tensor([2.0, 2.0, 0.1], requires_grad=True)
    y = a.div(b, rounding_mode=mode)
    assert y.requires_grad
    ga, gb = mg.grad(y.sum(), [a, b])
    assert ga.tolist() == [0.0] * 3 and gb.tolist() == [0.0] * 3


def test_max_pool_gives_the_gradient_to_the_first_maximum_as_torch():
    rng = np.random.default_rng(3)
    cases = [(np.round(rng.random((2, 3, 7, 7)) * 2), dict(kernel_size=3, stride=2, padding=1)),
             (np.ones((1, 1, 3, 3)), dict(kernel_size=2, stride=1)),
             (np.ones((1, 1, 2, 2)), dict(kernel_size=2, stride=1, padding=1)),
             (np.full((1, 1, 2, 2), -np.inf), dict(kernel_size=2, padding=1))]
    for x, kwargs in cases:
        ours, theirs = mg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y = F.max_pool2d(ours, **kwargs)
        y.sum().backward()
        TF.max_pool2d(theirs, **kwargs).sum().backward()
        np.testing.assert_array_equal(y.numpy(), TF.max_pool2d(torch.tensor(x), **kwargs).numpy())
        np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
        _, indices = F.max_pool2d(mg.tensor(x), return_indices=True, **kwargs)
        _, want = TF.max_pool2d(torch.tensor(x), return_indices=True, **kwargs)
        np.testing.assert_array_equal(indices.numpy(), want.numpy())


def test_amax_and_full_max_share_the_gradient_among_ties_as_torch():
    x = np.array([[3.0, 3.0, 1.0], [2.0, 5.0, 5.0]])
    for ours, theirs in ((lambda t: t.amax(), lambda t: t.amax()), (lambda t: t.max(), lambda t: t.max()),
                         (lambda t: t.amax(dim=1).sum(), lambda t: t.amax(dim=1).sum())):
        a, t = mg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        (grad,) = mg.grad(ours(a), [a])
        theirs(t).backward()
        np.testing.assert_array_equal(grad.numpy(), t.grad.numpy())
