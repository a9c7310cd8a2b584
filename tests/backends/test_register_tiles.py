"""Register tiles: a register-blocked accumulator small enough to stay in vector registers for the
whole reduction. A long row is cut into tiles that fit; a short row of a plane read at a fixed
pitch (a convolution over its zero-bordered copy) is flattened with the rows after it into one
vectorised loop whose lanes past the row are computed and never stored. Each case is checked on
every backend against the oracle at awkward shapes (primes, size 1, tails), gradients included."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.compiler.nest import ACC_REGISTERS, VECTOR_BYTES
from tests.backends.conftest import BACKENDS, against_oracle

R = np.random.default_rng(11)


def _data(*shape, dtype=np.float32):
    return mg.tensor(R.standard_normal(shape).astype(dtype))


def _kernels(out):
    return [step.kernel for step in schedule(pending_graph([out.node])) if step.kernel is not None]


def _vector_loops(statements):
    for s in statements:
        if isinstance(s, ir.Loop):
            if s.kind == ir.VECTOR and any(isinstance(b, ir.Accumulate) for b in s.body):
                yield s
            yield from _vector_loops(s.body)


def _register_tile(kernel):
    """(accumulations per vector step, lanes of the vectorised loop) of a reduction kernel."""
    loop = next(_vector_loops(kernel.body))
    return sum(isinstance(s, ir.Accumulate) for s in loop.body), loop.extent


TILED = {    # name: graph; every one has a register-blocked reduction
    "matmul 64x1024 (32-lane tiles)": lambda: _data(64, 24) @ _data(24, 1024),
    "matmul 64x480 float64": lambda: _data(64, 5, dtype=np.float64) @ _data(5, 480, dtype=np.float64),
    "matmul 16x97 (prime row, not cut)": lambda: _data(16, 3) @ _data(3, 97),
    "conv 7x7 plane, 16 filters": lambda: F.conv2d(_data(2, 24, 7, 7), _data(16, 24, 3, 3), padding=1),
    "conv 5x3 plane, stride 2": lambda: F.conv2d(_data(2, 40, 9, 5), _data(8, 40, 3, 3), stride=2, padding=1),
    "conv 4x4 plane, 1x1 kernel": lambda: F.conv2d(_data(3, 70, 4, 4), _data(8, 70, 1, 1)),
    "conv 1x1 plane": lambda: F.conv2d(_data(2, 30, 3, 3), _data(16, 30, 3, 3)),
    "conv 2x2 plane with bias and relu": lambda: F.relu(
        F.conv2d(_data(2, 64, 2, 2), _data(8, 64, 3, 3), _data(8), padding=1)),
}


@pytest.mark.parametrize("name", sorted(TILED))
def test_register_tiles_fit_the_registers(name):
    out = TILED[name]()
    kernel = next(k for k in _kernels(out) if k.name.startswith("r_"))
    loops = list(_vector_loops(kernel.body))
    if "1x1 plane" in name:
        assert not loops             # a dot product per output element
        return
    rows, lanes = _register_tile(kernel)
    itemsize = out.dtype.itemsize
    if "prime" not in name:
        assert rows * -(-lanes * itemsize // VECTOR_BYTES) <= ACC_REGISTERS
    if name.startswith("matmul 64x1024"):
        assert (rows, lanes) == (8, 64)
    if "7x7" in name:
        assert lanes == 6 * 9 + 7     # the padded copy's pitch is 9: one loop over the plane
    if "stride 2" in name:
        assert lanes == (5 - 1) * 7 + 3 and rows == 8


def test_a_plane_is_flattened_only_over_an_unguarded_read():
    # below SMALL elements the padding stays a guarded read, and a guarded plane is not flattened
    out = F.conv2d(_data(1, 2, 7, 7), _data(8, 2, 3, 3), padding=1)
    rows, lanes = _register_tile(next(k for k in _kernels(out) if k.name.startswith("r_")))
    assert lanes == 7


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(TILED))
def test_register_tiles_match_the_oracle(backend, name):
    against_oracle(backend, [TILED[name]().node])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_flattened_conv_gradients_match_the_oracle(backend):
    x = _data(2, 24, 7, 7, dtype=np.float64).requires_grad_(True)
    w = _data(16, 24, 3, 3, dtype=np.float64).requires_grad_(True)
    gx, gw = mg.grad((F.conv2d(x, w, padding=1) ** 2).sum(), [x, w])
    against_oracle(backend, [gx.node, gw.node])


def test_a_backend_may_ask_for_smaller_register_tiles():
    out = _data(64, 24) @ _data(24, 1024)
    kernel = schedule(pending_graph([out.node]), registers=16)[0].kernel
    assert _register_tile(kernel) == (8, 32)
