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
from metagraph.compiler.lower import Target, schedule
from metagraph.compiler.access import VECTOR_BYTES
from metagraph.compiler.heuristic import ACC_REGISTERS
from metagraph.expr import Var, linear_terms
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


def _reduction_loops(statements):
    for s in statements:
        if isinstance(s, ir.Loop):
            if s.kind == ir.REDUCE:
                yield s
            yield from _reduction_loops(s.body)


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
    "conv 14x14 plane (16 lanes where buffers have slack)": lambda: F.conv2d(
        _data(2, 8, 14, 14), _data(8, 8, 3, 3), padding=1),
    "conv 11x13 plane at stride 2, then a max-pool": lambda: F.max_pool2d(
        F.conv2d(_data(2, 8, 21, 25), _data(8, 8, 3, 3), stride=2, padding=1), 3, 2, 1),
}


@pytest.mark.parametrize("name", sorted(TILED))
def test_register_tiles_fit_the_registers(name):
    out = TILED[name]()
    kernel = next(k for k in _kernels(out) if k.name.startswith("r_"))
    loops = list(_vector_loops(kernel.body))
    if "1x1 plane" in name:          # a dot product per output element, over 30 x 3 x 3 products
        assert not loops             # in one loop: they are contiguous in both operands
        assert [s.extent for s in _reduction_loops(kernel.body)] == [270]
        return
    rows, lanes = _register_tile(kernel)
    itemsize = out.dtype.itemsize
    if "prime" not in name:
        assert rows * -(-lanes * itemsize // VECTOR_BYTES) <= ACC_REGISTERS
    if name.startswith("matmul 64x1024"):
        assert (rows, lanes) == (8, 64)
    if "7x7" in name:
        assert lanes == 6 * 9 + 7     # the padded copy's pitch is 9: one loop over the plane
    if "5x3" in name:     # the padded copy is read at stride 2 along its rows, 3-wide rows flattened
        assert lanes > 3 and rows == 8
        loads = [v for a in next(_vector_loops(kernel.body)).body for v in ir.loads(a.value)]
        lane = next(_vector_loops(kernel.body)).var
        assert {linear_terms(load.index)[0].get(Var(lane), 0) for load in loads} == {0, 2}


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
    kernel = schedule(pending_graph([out.node]), Target(registers=16))[0].kernel
    assert _register_tile(kernel) == (8, 32)


def _lanes(out, slack):
    """(lanes accumulated, lanes stored) of the first reduction kernel's register tile."""
    kernel = next(step.kernel for step in schedule(pending_graph([out.node]), Target(slack=slack))
                  if step.kernel.name.startswith("r_"))
    return _register_tile(kernel)[1], _last_vector_loop(kernel.body).extent


def _last_vector_loop(statements):
    """The last vectorised loop of a kernel (its store's, after a reduction)."""
    found = None
    for s in statements:
        if isinstance(s, ir.Loop):
            found = _last_vector_loop(s.body) or (s if s.kind == ir.VECTOR else found)
    return found


def test_a_row_whose_tail_takes_several_partial_vectors_is_rounded_up_to_whole_vectors():
    conv14 = F.conv2d(_data(2, 8, 14, 14), _data(8, 8, 3, 3), padding=1)
    assert _lanes(conv14, slack=128) == (16, 14)     # 8 + 4 + 2 lanes become one vector
    assert _lanes(conv14, slack=0) == (14, 14)       # without slack the last lanes would overrun
    conv56 = F.conv2d(_data(1, 4, 4, 56), _data(8, 4, 3, 3), padding=1)
    assert _lanes(conv56, slack=128) == (56, 56)     # 48 + 8: one half vector stays
    user_rows = _data(16, 8) @ _data(8, 14)          # a user's array has no slack: not rounded
    assert _lanes(user_rows, slack=128) == (14, 14)
    strided = F.conv2d(_data(2, 8, 28, 28), _data(8, 8, 3, 3), stride=2, padding=1)
    assert _lanes(strided, slack=128) == (14, 14)    # read at stride 2: measured slower rounded up


def _copy_kernel(out):
    return schedule(pending_graph([out.node]))[0].kernel.name


def test_a_strided_window_reads_its_padded_copy_as_it_is():
    """The graph does not reshape a strided window's copy for the vectoriser (its columns split
    into stride phases, as it once did): pooling and convolutions, trained or not, read one
    zero-bordered copy of the plane, and the schedule decides how to read it."""
    x, w = _data(1, 8, 40, 40), _data(8, 8, 3, 3)
    assert _copy_kernel(F.max_pool2d(x, 3, 2, 1)).startswith("e_1x8x41x41_")
    assert _copy_kernel(F.conv2d(x, w, stride=2, padding=1)).startswith("e_1x8x41x41_")
    trained = F.conv2d(x, w.requires_grad_(True), stride=2, padding=1)
    assert _copy_kernel(trained).startswith("e_1x8x41x41_")


def test_reduction_loops_merge_only_where_both_operands_read_them_as_one_range():
    a = _data(6, 5, 7)
    rows = _kernels(a.sum((1, 2)))[0]                       # contiguous: one loop of 35
    assert [s.extent for s in _reduction_loops(rows.body)] == [35]
    swapped = _kernels(a.permute(0, 2, 1).sum((1, 2)))[0]    # reads 5 x 7 transposed: kept apart
    assert sorted(s.extent for s in _reduction_loops(swapped.body)) == [5, 7]
