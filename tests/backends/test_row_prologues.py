"""Row prologues (compiler/rows.py): reductions computed per row inside the element-wise kernel
that reads them give the oracle's numbers on every backend, at awkward shapes, and the kernel
counts show they fused."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from tests.backends.conftest import BACKENDS, against_oracle


def _normalised(x, axes):
    mean = x.mean(axes, keepdim=True)
    centred = x - mean
    return centred / ((centred * centred).mean(axes, keepdim=True) + 1e-5).sqrt()


def _softmax_plus_rows(x):
    """A row sum read by a kernel over rows of another length (the prologue gets its own loop)."""
    return F.softmax(x[:, :3], dim=1) + x.sum(1, keepdim=True)


CASES = {
    # name: (function, shape, kernels when every reduction fuses)
    "softmax": (lambda x: F.softmax(x, dim=1), (7, 13), 1),
    # a sum over one element has the kernel's shape: it fuses as the epilogue, the max stays
    "softmax one column": (lambda x: F.softmax(x, dim=1), (5, 1), 2),
    "softmax one row": (lambda x: F.softmax(x, dim=-1), (1, 17), 1),
    "softmax long row": (lambda x: F.softmax(x, dim=1), (2, 9001), 1),     # past the row cache
    "softmax 3d last axis": (lambda x: F.softmax(x, dim=2), (2, 3, 11), 1),
    "softmax middle axis": (lambda x: F.softmax(x, dim=1), (3, 5, 4), 3),  # not per row: unfused
    "log_softmax": (lambda x: F.log_softmax(x, dim=1), (6, 11), 1),
    "layer norm": (lambda x: _normalised(x, -1), (4, 5, 7), 1),
    "norm over two axes": (lambda x: _normalised(x, (2, 3)), (2, 3, 5, 7), 1),
    "other row length": (_softmax_plus_rows, (4, 6), 1),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_row_prologues_match_the_oracle(backend, name):
    fn, shape, _ = CASES[name]
    x = mg.tensor(np.random.default_rng(len(name)).standard_normal(shape).astype(np.float32) * 4)
    against_oracle(backend, [fn(x).node])


@pytest.mark.parametrize("name", sorted(CASES))
def test_row_reductions_fuse_into_their_reader(name):
    fn, shape, count = CASES[name]
    assert len(schedule(pending_graph([fn(mg.rand(*shape)).node]))) == count


def _statements(body):
    for s in body:
        yield s
        if isinstance(s, ir.Loop):
            yield from _statements(s.body)


def test_a_costly_value_is_kept_in_a_row_array_and_a_cheap_one_recomputed():
    (softmax,) = schedule(pending_graph([F.softmax(mg.rand(4, 9), dim=1).node]))
    kept = [s for s in _statements(softmax.kernel.body) if isinstance(s, ir.Assign)]
    assert len(kept) == 1 and kept[0].value.op == "exp2"      # exp(x - max), once per element
    (log_softmax,) = schedule(pending_graph([F.log_softmax(mg.rand(4, 9), dim=1).node]))
    assert not any(isinstance(s, ir.Assign) for s in _statements(log_softmax.kernel.body))


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_nan_inf_and_half_precision_rows(backend):
    rows = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    rows[1, 3] = np.nan
    rows[2, 0] = np.inf
    rows[3, :] = -np.inf
    x = mg.tensor(rows)
    against_oracle(backend, [F.softmax(x, dim=1).node, F.log_softmax(x, dim=1).node])
    against_oracle(backend, [F.softmax(mg.tensor(rows[[0, 4]].astype(np.float16)), dim=1).node])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_integer_row_max(backend):
    x = mg.tensor(np.random.default_rng(1).integers(-50, 50, (6, 7)).astype(np.int32))
    against_oracle(backend, [(x - x.amax(1, keepdim=True)).node])


def test_a_reduction_read_by_two_kernels_stays_a_kernel_of_its_own():
    x = mg.rand(4, 6)
    row_max = x.amax(1, keepdim=True)
    assert len(schedule(pending_graph([(x - row_max).node, (x * row_max).node]))) == 3
