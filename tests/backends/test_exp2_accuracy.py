"""float32 exp2 (softmax, sigmoid, tanh and exp all call it) is within 1.5 ulp of exp2 in float64 on
every code generator, over the whole float32 range: C and LLVM inline their own polynomial, whose
clamps, NaN handling and subnormal results are what this checks. (Not the numpy oracle: NumPy's
own float32 exp2 is 2.6 ulp off near 2^127.5.)"""
import numpy as np
import pytest

import metagraph as mg
from tests.backends.conftest import BACKENDS

EDGES = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 0.5, -0.5, 1.5, 2.5,
         127.0, 127.5, 127.99999, 128.0, 128.00002, 129.0, 130.0, 1e30, 3.4028235e38,
         -125.0, -126.0, -126.49, -126.5, -127.0, -140.3, -148.99, -149.0, -149.5, -150.0, -150.49, -150.5,
         -150.51, -151.0, -151.5, -152.0, -1e30, -3.4028235e38]


def _inputs():
    rng = np.random.default_rng(0)
    spread = rng.uniform(-160.0, 140.0, 100_000).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([np.array(EDGES, np.float32), spread, bits])


@pytest.mark.parametrize("backend", [name for name in BACKENDS if name != "numpy"], indirect=True)
def test_float32_exp2_over_the_whole_range(backend):
    x = _inputs()
    got = mg.exp2(mg.tensor(x)).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.exp2(x.astype(np.float64))
        rounded = exact.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    ends = ~np.isnan(x) & ((rounded == 0) | np.isinf(rounded))
    assert np.array_equal(got[ends], rounded[ends]), x[ends][got[ends] != rounded[ends]]
    inside = ~np.isnan(x) & ~ends
    with np.errstate(invalid="ignore"):
        ulps = np.abs(got[inside].astype(np.float64) - exact[inside]) / np.spacing(rounded[inside])
    worst = int(np.argmax(ulps))
    assert ulps[worst] <= 1.5, f"{ulps[worst]:.2f} ulp at x={x[inside][worst]!r}"
