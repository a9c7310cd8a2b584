"""ops/special.py against PyTorch: values and gradients at ordinary and special points (0, +-inf,
NaN, domain edges), accuracy over a wide range, gradients by finite differences in float64, and
the small tensor API (devices, new_*, inference_mode, allclose). Run on the numpy oracle, but for
the accuracy test, which runs the compiled kernels too."""
import math

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn as nn
import metagraph.nn.functional as F
from tests.helpers import check_grad

torch = pytest.importorskip("torch")
TF = torch.nn.functional
R = np.random.default_rng(5)
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 2.0, -2.0, 1e-30,
           1e30, -1e30, 0.66, 2.414213562373095]
UNARY = ["asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p"]
ACTIVATIONS = {
    "elu": ({"alpha": 1.5}, {"alpha": 1.5}), "selu": ({}, {}), "celu": ({"alpha": 0.7}, {"alpha": 0.7}),
    "mish": ({}, {}), "hardswish": ({}, {}), "hardsigmoid": ({}, {}),
}


@pytest.fixture(autouse=True)
def _oracle():
    mg.set_backend("numpy")          # conftest restores the backend


def both(values, dtype, fn_mg, fn_torch):
    """Value and gradient of sum(fn) from metagraph and from torch at the same points."""
    array = np.array(values, dtype=dtype)
    x = mg.tensor(array, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    y, want = fn_mg(x), fn_torch(t)
    y.sum().backward()
    want.sum().backward()
    return (y.numpy(), x.grad.numpy()), (want.detach().numpy(), t.grad.numpy())


def close(got, want, rtol, atol):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def ordinary(name):
    if name in ("asin", "acos", "atanh"):
        return R.uniform(-0.99, 0.99, 12)
    if name == "acosh":
        return R.uniform(1.01, 30, 12)
    if name == "log1p":
        return R.uniform(-0.99, 30, 12)
    return R.uniform(-8, 8, 12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", UNARY)
def test_unary_against_torch(name, dtype):
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    values = list(ordinary(name)) + SPECIAL
    (y, g), (wy, wg) = both(values, dtype, getattr(mg, name), getattr(torch, name))
    close(y, wy, rtol, 0)
    # gradients where the value is defined (outside the domain torch's formula gives numbers for a
    # NaN value; ours are NaN); a tiny atol, as torch's 1/sqrt(1 + x^2) is 0 at 1e30 in float32
    defined = ~np.isnan(wy)
    close(g[defined], wg[defined], 1e-4 if dtype == np.float32 else 1e-9, 1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["atan", "asin", "acos", "asinh", "atanh", "log1p"])
def test_accuracy_wide_range(name, dtype):
    """A few ulps of numpy over magnitudes 1e-30 .. 1e30 (compiled kernels and the oracle)."""
    x = np.concatenate([R.uniform(-1, 1, 500), np.exp(R.uniform(-69, 69, 500)) * R.choice([-1, 1], 500)])
    x = x.astype(dtype)
    if name == "log1p":
        x = np.abs(x) - 0.5
    reference = {"atan": np.arctan, "asin": np.arcsin, "acos": np.arccos, "asinh": np.arcsinh,
                 "atanh": np.arctanh, "log1p": np.log1p}[name]
    with np.errstate(invalid="ignore", divide="ignore"):
        want = reference(x.astype(np.float64))
    for backend in ("numpy", "c"):
        mg.set_backend(backend)
        got = getattr(mg, name)(mg.tensor(x)).numpy().astype(np.float64)
        close(got, want, 4 * np.finfo(dtype).eps, 0)


@pytest.mark.parametrize("name", UNARY)
def test_unary_gradient_finite_differences(name):
    check_grad(getattr(mg, name), ordinary(name)[:5])


def test_sinh_cosh_large_arguments():
    """Finite up to their largest values, where e^x itself overflows."""
    x = np.array([88.9, -89.0, 710.0], dtype=np.float64)
    for dtype in (np.float32, np.float64):
        close(mg.cosh(mg.tensor(x[:2].astype(dtype))).numpy(), np.cosh(x[:2]).astype(dtype), 1e-5, 0)
        close(mg.sinh(mg.tensor(x[:2].astype(dtype))).numpy(), np.sinh(x[:2]).astype(dtype), 1e-5, 0)


def test_atan2_against_torch():
    zs = [0.0, -0.0, 1.0, -1.0, 2.5, -0.3, math.inf, -math.inf, math.nan]
    y, x = np.meshgrid(zs, zs)
    got = mg.atan2(mg.tensor(y), mg.tensor(x)).numpy()
    close(got, torch.atan2(torch.tensor(y), torch.tensor(x)).numpy(), 1e-6, 0)
    assert (np.signbit(got) == np.signbit(np.arctan2(y, x)))[~np.isnan(got)].all()
    yv, xv = R.uniform(-3, 3, (2, 6))
    (_, g), (_, wg) = both(yv, np.float64, lambda a: mg.atan2(a, mg.tensor(xv)),
                           lambda a: torch.atan2(a, torch.tensor(xv)))
    close(g, wg, 1e-12, 0)
    check_grad(lambda a, b: mg.atan2(a, b), yv[:4], xv[:4])
    assert mg.tensor([1.0]).atan2(mg.tensor([1.0])).item() == pytest.approx(math.pi / 4)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_against_torch(name):
    mine, theirs = ACTIVATIONS[name]
    values = list(R.uniform(-6, 6, 12)) + [0.0, 3.0, -3.0, math.inf, -math.inf, math.nan, -1e-6, 40.0]
    for dtype, rtol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        (y, g), (wy, wg) = both(values, dtype, lambda x: getattr(F, name)(x, **mine),
                                lambda t: getattr(TF, name)(t, **theirs))
        close(y, wy, rtol, 1e-30)
        number = ~np.isnan(np.array(values))       # torch's gradient at NaN is an artifact (0 or 1)
        # torch's float64 mish and hardsigmoid gradients hold float32 constants: 1e-6, not 1e-12
        close(g[number], wg[number], 1e-5 if dtype == np.float32 else 1e-6, 1e-30)
    check_grad(lambda x: getattr(F, name)(x, **mine), R.uniform(-4, 4, 6))


def test_modules():
    x = np.array([[-2.0, 0.5, 0.0], [3.0, -0.1, 7.0]], dtype=np.float32)
    for module, reference in [(nn.ELU(0.5), torch.nn.ELU(0.5)), (nn.SELU(), torch.nn.SELU()),
                              (nn.CELU(2.0), torch.nn.CELU(2.0)), (nn.Mish(), torch.nn.Mish()),
                              (nn.Hardswish(), torch.nn.Hardswish()),
                              (nn.Hardsigmoid(), torch.nn.Hardsigmoid()),
                              (nn.Softplus(beta=2, threshold=5), torch.nn.Softplus(beta=2, threshold=5))]:
        close(module(mg.tensor(x)).numpy(), reference(torch.tensor(x)).numpy(), 1e-6, 1e-7)


def test_prelu():
    x = R.uniform(-2, 2, (2, 3, 4))
    for num in (1, 3):
        layer, reference = nn.PReLU(num, init=0.1), torch.nn.PReLU(num, init=0.1).double()
        y, want = layer(mg.tensor(x, requires_grad=True)), reference(torch.tensor(x))
        close(y.numpy(), want.detach().numpy(), 1e-12, 0)
        y.sum().backward()
        want.sum().backward()
        close(layer.weight.grad.numpy(), reference.weight.grad.numpy(), 1e-6, 0)   # a float32 weight
    with pytest.raises(mg.ShapeError):
        F.prelu(mg.tensor(x), mg.ones(2))
    check_grad(F.prelu, x[:1, :, :2], np.array([0.2, -0.5, 1.5]))


def test_floating_point_tests():
    values = np.array([0.0, -1.5, math.inf, -math.inf, math.nan], dtype=np.float32)
    x, t = mg.tensor(values), torch.tensor(values)
    for name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf"):
        assert (getattr(mg, name)(x).numpy() == getattr(torch, name)(t).numpy()).all(), name
        assert getattr(x, name)().dtype == mg.bool
    ints = mg.tensor([1, 2])
    assert mg.isfinite(ints).numpy().all() and not mg.isnan(ints).numpy().any()
    for kwargs in ({}, {"nan": 2.0, "posinf": 9.0, "neginf": -9.0}):
        close(mg.nan_to_num(x, **kwargs).numpy(), torch.nan_to_num(t, **kwargs).numpy(), 0, 0)
    (y, g), (wy, wg) = both(values, np.float64, mg.nan_to_num, torch.nan_to_num)
    close(y, wy, 0, 0)
    close(g, wg, 0, 0)


def test_isclose_allclose():
    a = np.array([1.0, math.inf, math.nan, 1.0, 0.0, 5.0, -math.inf, 1.0])
    b = np.array([1.0 + 1e-6, math.inf, math.nan, 1.1, 1e-9, math.inf, math.inf, math.nan])
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.2, "atol": 0.0}):
        got = mg.isclose(mg.tensor(a), mg.tensor(b), **kwargs).numpy()
        assert (got == torch.isclose(torch.tensor(a), torch.tensor(b), **kwargs).numpy()).all(), kwargs
    result = mg.allclose(mg.tensor([1.0, 2.0]), mg.tensor([1.0, 2.0 + 1e-7]))
    assert result is True
    assert mg.tensor([1.0]).allclose(mg.tensor([1.5])) is False


@pytest.mark.parametrize("p", ["fro", 2, 1, math.inf, -math.inf])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_norm(p, dim, keepdim):
    x = R.uniform(-2, 2, (2, 3, 4))
    x[0, 0, 0] = x[0, 0, 1]                  # a tie for the inf-norm's maximum, if it is there
    (y, g), (wy, wg) = both(x, np.float64, lambda a: a.norm(p, dim, keepdim),
                            lambda a: torch.norm(a, p, dim, keepdim))
    close(y, wy, 1e-12, 0)
    close(g, wg, 1e-12, 1e-15)
    (_, g), (_, wg) = both(np.zeros(3), np.float64, mg.norm, torch.norm)     # 0, not NaN, at zero
    close(g, wg, 0, 0)


def test_normalize():
    x = R.uniform(-2, 2, (3, 4))
    x[1] = 0.0
    for kwargs in ({}, {"p": 1.0, "dim": 0}, {"dim": -1, "eps": 0.5}):
        (y, g), (wy, wg) = both(x, np.float64, lambda a: F.normalize(a, **kwargs),
                                lambda a: TF.normalize(a, **kwargs))
        close(y, wy, 1e-12, 1e-15)
        close(g, wg, 1e-10, 1e-12)


def test_tensor_api():
    x = mg.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=mg.float64)
    t = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    close(x.softmax(1).numpy(), t.softmax(1).numpy(), 1e-12, 0)
    close(x.log_softmax(0).numpy(), t.log_softmax(0).numpy(), 1e-12, 0)
    assert x.new_zeros(2, 3).dtype == mg.float64 and x.new_zeros((2, 3)).shape == (2, 3)
    assert x.new_ones(4, dtype=mg.int64).numpy().tolist() == [1, 1, 1, 1]
    assert x.new_full((2,), 7.0).numpy().tolist() == [7.0, 7.0] and x.new_empty(3).shape == (3,)
    assert x.new_tensor([1, 2]).dtype == mg.float64
    assert F.one_hot(mg.tensor([0, 2]), 3).numpy().tolist() == [[1, 0, 0], [0, 0, 1]]
    array = np.array([1.0, 2.0])
    copy = mg.from_numpy(array)
    array[0] = 5.0                           # a copy: the tensor keeps its value
    assert copy.numpy().tolist() == [1.0, 2.0] and copy.dtype == mg.float64
    assert mg.as_tensor(x) is x and mg.as_tensor([1, 2]).dtype == mg.int64
    assert mg.as_tensor(x, dtype=mg.float32).dtype == mg.float32


def test_devices():
    x = mg.tensor([1.0])
    assert x.device == mg.device("cpu") == "cpu" and str(x.device) == "cpu"
    assert repr(mg.device("cpu")) == "device(type='cpu')"
    assert x.to("cpu") is x and x.to(mg.device("cpu")) is x and x.cpu() is x
    assert x.to(mg.device("cpu"), mg.float64).dtype == mg.float64
    assert x.to(device="cpu") is x and mg.as_tensor([1.0], device="cpu").shape == (1,)
    for bad in ("cuda", "cuda:0", "mps", "opencl:1"):
        with pytest.raises(mg.ArgumentError, match="is not available"):
            x.to(bad)
        with pytest.raises(mg.ArgumentError, match="is not available"):
            mg.device(bad)


CREATED_ON_A_DEVICE = [
    lambda device: mg.tensor([1.0, 2.0], device=device), lambda device: mg.zeros(2, 3, device=device),
    lambda device: mg.ones((2,), device=device), lambda device: mg.empty(2, device=device),
    lambda device: mg.full((2,), 3.0, device=device), lambda device: mg.arange(4, device=device),
    lambda device: mg.linspace(0, 1, 5, device=device), lambda device: mg.eye(3, device=device),
    lambda device: mg.rand(2, device=device), lambda device: mg.randn(2, device=device),
    lambda device: mg.randint(0, 5, (3,), device=device), lambda device: mg.randperm(4, device=device),
    lambda device: mg.zeros_like(mg.ones(2), device=device),
    lambda device: mg.ones_like(mg.ones(2), device=device),
    lambda device: mg.full_like(mg.ones(2), 7, device=device),
    lambda device: mg.rand_like(mg.ones(2), device=device),
    lambda device: mg.randn_like(mg.ones(2), device=device),
]


@pytest.mark.parametrize("create", CREATED_ON_A_DEVICE)
def test_creation_takes_a_device(create):
    for device in (None, "cpu", "cpu:0", mg.device("cpu")):
        assert create(device).device == "cpu"
    with pytest.raises(mg.ArgumentError, match="device 'cuda' is not available"):
        create("cuda")


def test_inference_mode():
    x = mg.tensor([1.0], requires_grad=True)
    with mg.inference_mode():
        assert not (x * 2).requires_grad
    with mg.inference_mode(False):
        assert (x * 2).requires_grad

    @mg.inference_mode
    def bare():
        return (x * 2).requires_grad

    @mg.inference_mode()
    def called():
        return (x * 2).requires_grad
    assert not bare() and not called() and not bare()
    assert (x * 2).requires_grad
