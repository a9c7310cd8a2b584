"""F.hardtanh and F.relu6 (PyTorch's relu6 is hardtanh(x, 0, 6)) and the Hardtanh and ReLU6 modules
against PyTorch, at the values where hardtanh and clamp part: the bounds, NaN, the infinities and
signed zeros; forward (bit for bit, sign of zero included) and gradient."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.nn.layers import Hardtanh

torch = pytest.importorskip("torch")
TF = torch.nn.functional

SPECIAL = [-7.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 6.0, 6.5, np.nan, np.inf, -np.inf]


def _both(ours, theirs, values, dtype):
    """ours and theirs on the same values: outputs equal bit for bit, gradients of sum() equal."""
    x = mg.tensor(np.array(values, dtype), requires_grad=True)
    t = torch.tensor(np.array(values, dtype), requires_grad=True)
    out, want = ours(x), theirs(t)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(np.signbit(out.numpy()), np.signbit(want.detach().numpy()))
    out.sum().backward()
    want.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu6_is_torchs_at_the_bounds_nan_and_infinities(dtype):
    """The gradient is 0 at 0 and at 6 and 1 at NaN, as PyTorch's (clamp's is 1, 1 and 0)."""
    _both(F.relu6, TF.relu6, SPECIAL, dtype)
    _both(nn.ReLU6(), torch.nn.ReLU6(), SPECIAL, dtype)


@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (0.0, 6.0), (-0.0, 0.5), (-2.0, -2.0), (0.5, 6.5)])
def test_hardtanh_is_torchs(bounds):
    _both(lambda x: F.hardtanh(x, *bounds), lambda x: TF.hardtanh(x, *bounds), SPECIAL, np.float32)
    _both(lambda x: F.hardtanh(x, min_val=bounds[0], max_val=bounds[1]),
          lambda x: TF.hardtanh(x, min_val=bounds[0], max_val=bounds[1]), SPECIAL, np.float64)
    if bounds[0] < bounds[1]:
        _both(Hardtanh(*bounds), torch.nn.Hardtanh(*bounds), SPECIAL, np.float32)


def test_hardtanh_keeps_integer_dtypes():
    """Integer inputs stay integer; the bounds are converted to their dtype, as PyTorch does."""
    values = np.array([-3, 0, 1, 7])
    for bounds in [(0.5, 6.5), (-1.5, 6.5)]:
        out = F.hardtanh(mg.tensor(values), *bounds)
        assert out.dtype == mg.int64
        np.testing.assert_array_equal(out.numpy(), TF.hardtanh(torch.tensor(values), *bounds).numpy())
    assert F.relu6(mg.tensor(values, dtype=mg.int32)).tolist() == [0, 0, 1, 6]


def test_modules_repr_and_errors():
    assert repr(Hardtanh()) == repr(torch.nn.Hardtanh()) == "Hardtanh(min_val=-1.0, max_val=1.0)"
    assert repr(Hardtanh(0.5, 2)) == repr(torch.nn.Hardtanh(0.5, 2))
    assert repr(nn.ReLU6()) == repr(torch.nn.ReLU6()) == "ReLU6()"
    relu6 = nn.ReLU6(inplace=True)
    assert isinstance(relu6, Hardtanh) and (relu6.min_val, relu6.max_val) == (0.0, 6.0)
    with pytest.raises(mg.ArgumentError, match="max_val"):
        Hardtanh(2.0, 1.0)
    with pytest.raises(mg.ArgumentError, match="min_val 2.0 cannot be greater than max_val 1.0"):
        F.hardtanh(mg.ones(2), 2.0, 1.0)
    with pytest.raises(mg.DTypeError, match="bool"):
        F.hardtanh(mg.tensor([True, False]), 0.0, 1.0)
