"""The conformance suite runs on every backend; each result is compared with the numpy oracle
interpreting the same graph. A backend that cannot work on this machine (no C compiler, no
llvmlite, no OpenCL platform) is skipped, with the reason (failed instead where
METAGRAPH_REQUIRE_BACKENDS names it, as in CI: tests/helpers.needs)."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import dtypes
from metagraph.codegen.interpreter import NumpyBackend
from tests.helpers import needs

BACKENDS = ["numpy", "c", "llvm", "bang", "opencl"]


@pytest.fixture
def backend(request):
    """The backend named by the test's parameter, active for the test."""
    needs(request.param)
    mg.set_backend(request.param)
    return mg.backend._instance(request.param)


def compare(got, want, dtype, rtol=None):
    if dtype.is_float:
        tolerance = rtol or {dtypes.float16: 2e-2, dtypes.bfloat16: 6e-2, dtypes.float32: 1e-4}.get(dtype,
                                                                                                  1e-9)
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tolerance,
                                   atol=tolerance, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def against_oracle(backend, nodes):
    """Realise graph nodes on `backend` and compare each with the oracle (computed first, so that
    buffers the backend keeps for autograd cannot feed the oracle)."""
    want = NumpyBackend().realize(nodes)
    got = backend.realize(nodes)
    for node, g, w in zip(nodes, got, want):
        compare(g, w, node.dtype)
