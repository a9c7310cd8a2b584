"""Register blocking of contractions: a reduction that accumulates a row block also blocks an
outer output dimension (conv filters, matmul rows), reading the shared operand once per step for
every row of the block. Checked on every backend against the oracle at shapes that trigger it."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.compiler.ir import loads as _loads
from tests.backends.conftest import BACKENDS, against_oracle

R = np.random.default_rng(5)


def _data(*shape):
    return mg.tensor(R.standard_normal(shape).astype(np.float32))


CASES = {   # name: (graph, rows expected in the vectorised loop)
    "conv 3x3 padded, 37-wide rows": (lambda: F.conv2d(_data(2, 3, 37, 37), _data(8, 3, 3, 3), padding=1), 8),
    "conv with bias and relu epilogue": (
        lambda: F.relu(F.conv2d(_data(1, 5, 33, 33), _data(12, 5, 3, 3), _data(12), padding=1)), 4),
    # the parallel first dimension keeps 8 blocks: 3 rows (24 // 4 would leave 6)
    "matmul, 24 rows (blocks of 2, a batch keeping 8 groups)": (lambda: _data(24, 7) @ _data(7, 33), 2),
    "conv 3x3 stride 2 (strided row reads)": (
        lambda: F.conv2d(_data(2, 3, 41, 41), _data(8, 3, 3, 3), stride=2, padding=1), 8),
    "batched matmul": (lambda: _data(3, 64, 5) @ _data(3, 5, 17), 8),
}


def _vector_loop(statements):
    for s in statements:
        if isinstance(s, ir.Loop):
            if s.kind == ir.VECTOR and any(isinstance(b, ir.Accumulate) for b in s.body):
                return s
            found = _vector_loop(s.body)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_blocked_rows_share_one_read(name):
    make, rows = CASES[name]
    out = make()
    steps = schedule(pending_graph([out.node]))
    kernel = next(step.kernel for step in steps if step.kernel.name.startswith("r_"))
    loop = _vector_loop(kernel.body)
    accumulations = [s for s in loop.body if isinstance(s, ir.Accumulate)]
    assert len(accumulations) == rows
    shared = [id(load) for s in accumulations for load in _loads(s.value)]
    assert len(set(shared)) == rows + 1     # one shared operand, one element of the other per row


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_blocked_kernels_match_the_oracle(backend, name):
    against_oracle(backend, [CASES[name][0]().node])


@pytest.mark.parametrize("backend", ["c"], indirect=True)
def test_blocked_conv_gradients_match_the_oracle(backend):
    x, w = _data(2, 3, 35, 35), _data(8, 3, 3, 3)
    x.requires_grad_(True), w.requires_grad_(True)
    gx, gw = mg.grad((F.conv2d(x, w, padding=1) ** 2).sum(), [x, w])
    against_oracle(backend, [gx.node, gw.node])


WIDE = {   # output rows longer than ROW_MAX: tiles of a divisor of the row (or, for a prime, none)
    "2048 columns": lambda: _data(16, 9) @ _data(9, 2048),
    "1100 columns (tiles of 550)": lambda: _data(3, 4) @ _data(4, 1100),
    "1031 columns (prime)": lambda: _data(2, 3) @ _data(3, 1031),
}


@pytest.mark.parametrize("name", sorted(WIDE))
def test_wide_rows_are_tiled_where_a_divisor_allows(name):
    out = WIDE[name]()
    kernel = schedule(pending_graph([out.node]))[0].kernel
    loop = _vector_loop(kernel.body)
    if "prime" in name:
        assert loop is None          # a dot product per element, as before
    else:
        assert loop.extent <= 1024 and out.shape[-1] % loop.extent == 0


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(WIDE))
def test_wide_rows_match_the_oracle(backend, name):
    against_oracle(backend, [WIDE[name]().node])


def _input_gradient(stride, weight=None):
    x = _data(2, 3, 11, 11).requires_grad_(True)
    w = weight if weight is not None else _data(8, 3, 3, 3)
    (gx,) = mg.grad((F.conv2d(x, w, stride=stride, padding=1) ** 2).sum(), [x])
    return gx


def test_an_input_gradient_is_a_window_sum_at_stride_1_and_2():
    """Stride 1: a reduction of a product of views (ops/window_gradient.py), neither a gather nor a
    scatter, summed over the input's own shape, not its padded copy's; stride 2: the same, one sum
    per phase of the stride, (2, 3, 6, 6) each, read back at the input's positions."""
    names = [s.kernel.name for s in schedule(pending_graph([_input_gradient(1).node]))]
    assert not any(n[0] in "gs" for n in names)
    assert any(n.startswith("r_2x3x11x11_") for n in names)
    names = [s.kernel.name for s in schedule(pending_graph([_input_gradient(2).node]))]
    assert not any(n[0] in "gs" for n in names)
    assert sum(n.startswith("r_2x3x6x6_") for n in names) == 4


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_gathered_input_gradients_match_the_oracle(backend):
    weight = R.standard_normal((8, 3, 3, 3)).astype(np.float32)
    weight[2, 1, 0, 0] = np.inf       # a padded position contributes nothing, not 0 * inf
    against_oracle(backend, [_input_gradient(1).node, _input_gradient(1, mg.tensor(weight)).node])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_gathered_read_inside_the_tensor_but_outside_a_dimension_contributes_nothing(backend):
    # out[t] = sum of x[a, b] with a + b = t: solved as b = t - a, whose flat address 3a + t never
    # leaves x although b does (t=0, a=1 would read x[0, 3]); the guard must still exclude it
    x = mg.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) + 1)
    out = x.reindex_reduce("add", [4], ["i0 + i1"])
    assert [s.kernel.name[0] for s in schedule(pending_graph([out.node]))] == ["g"]
    against_oracle(backend, [out.node])
