"""The optional library_op path (METAGRAPH_LIBRARY=1): contractions that are einsums run through
numpy's BLAS, give the oracle's numbers at awkward shapes, and only they leave generated code."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen.interpreter import NumpyBackend
from tests.backends.conftest import compare

R = np.random.default_rng(3)


def _data(*shape):
    return mg.tensor(R.standard_normal(shape).astype(np.float32))


CASES = {
    "matmul primes": lambda: _data(7, 13) @ _data(13, 5),
    "matmul size 1": lambda: _data(1, 3) @ _data(3, 1),
    "vector @ matrix": lambda: _data(11) @ _data(11, 4),
    "batched, broadcast": lambda: _data(3, 1, 5, 7) @ _data(2, 7, 3),
    "linear with bias": lambda: F.linear(_data(4, 9), _data(6, 9), _data(6)),
    "1x1 conv": lambda: F.conv2d(_data(2, 5, 3, 3), _data(4, 5, 1, 1)),
    "user einsum (reindex + sum)": lambda: _data(3, 4).reindex([3, 5, 4], ["i0", "i2"]).mul(
        _data(5, 4).reindex([3, 5, 4], ["i1", "i2"])).sum(2),
}


@pytest.fixture
def library(monkeypatch):
    monkeypatch.setattr(mg.flags, "LIBRARY", 1)


def _run(out):
    want = NumpyBackend().realize([out.node])[0]
    with mg.profile() as prof:
        got = out.numpy()
    return got, want, [kernel.name for kernel in prof.kernels]


@pytest.mark.parametrize("name", sorted(CASES))
def test_contractions_go_to_the_library_and_match_the_oracle(library, name):
    got, want, names = _run(CASES[name]())
    assert any(n.startswith("lib_") for n in names), names
    compare(got, want, mg.float32)


def test_gradients_of_a_linear_layer_use_the_library_too(library):
    x, w = _data(5, 8), mg.nn.Parameter(R.standard_normal((3, 8)).astype(np.float32))
    (grad,) = mg.grad((F.linear(x, w) ** 2).sum(), [w])
    got, want, names = _run(grad)
    assert any(n.startswith("lib_") for n in names), names
    compare(got, want, mg.float32)


def test_windows_and_integers_stay_generated(library):
    for out in (F.conv2d(_data(1, 2, 5, 5), _data(3, 2, 3, 3), padding=1),
                mg.tensor(R.integers(0, 5, (3, 4))) @ mg.tensor(R.integers(0, 5, (4, 2)))):
        got, want, names = _run(out)
        assert not any(n.startswith("lib_") for n in names), names
        compare(got, want, out.dtype)


def test_off_by_default():
    assert mg.flags.LIBRARY == 0
    _, _, names = _run(_data(7, 13) @ _data(13, 5))
    assert not any(n.startswith("lib_") for n in names)


def test_an_operand_is_materialised_only_for_a_contraction_that_goes_to_the_library(library):
    a, b = _data(3, 4), _data(6, 4)
    plain = (a * 2).reindex([3, 5, 4], ["i0", "i2"])
    shifted = b.reindex([3, 5, 4], ["i1 + 1", "i2"])      # not a plain variable: stays generated
    out = (plain * shifted).sum(2)
    got, want, names = _run(out)
    assert names == [n for n in names if n.startswith("r_")] and len(names) == 1, names
    compare(got, want, mg.float32)
