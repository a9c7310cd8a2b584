"""A Python scalar that changes at one call site from iteration to iteration becomes a run-time
value (ops/scalars.py): new values lower and compile nothing. Scalars that stay the same are still
folded into the kernels, and so are values that differ within one graph."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.pipeline import realize
from metagraph.ops import math as math_ops, scalars
from tests.helpers import needs


@pytest.fixture(params=["c", "llvm"])
def lowerings(request, monkeypatch):
    """The backend `request.param`, with its calls of lower.schedule counted; a clean site table."""
    needs(request.param)
    mg.set_backend(request.param)
    scalars.forget()
    # constants other tests made shared are not seen to vary (the rule's stated limit): start clean
    monkeypatch.setattr(math_ops, "_CONSTANTS", {})
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return schedule(*args, **kwargs)
    schedule = realize.schedule
    monkeypatch.setattr(realize, "schedule", counting)
    return calls


def test_a_scalar_that_changes_every_iteration_compiles_a_bounded_number_of_kernels(lowerings):
    # (a shape no other test uses: a value another site has made a shared constant of this shape is
    # folded until some site varies, see ops/scalars.py)
    start = np.arange(21, dtype=np.float32).reshape(7, 3) - 4
    x = mg.tensor(start)
    with mg.profile() as prof:
        for i in range(50):
            got = (x * i + 0.5).numpy()
            np.testing.assert_allclose(got, start * i + 0.5)
    # the first value folded, the second on: one run-time graph (the first, folded, may be one an
    # earlier test's loop made a shared constant: then the second is folded too)
    assert len(lowerings) <= 3
    assert prof.compiles + prof.cache_hits <= 3


def test_a_hand_written_warm_up_of_the_learning_rate_compiles_nothing_after_two_steps(lowerings):
    rng = np.random.default_rng(0)
    data, target = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    w = mg.zeros(4, requires_grad=True)
    x, t = mg.tensor(data), mg.tensor(target)
    expected, lr, warmup = np.zeros(4, np.float32), 0.1, 30
    for step in range(30):
        loss = ((x @ w - t) ** 2).mean()
        loss.backward()
        with mg.no_grad():
            w -= lr * (step + 1) / warmup * w.grad
        w.grad = None
        w.numpy()
        if step == 2:
            seen = len(lowerings)
        gradient = 2 * data.T @ (data @ expected - target) / len(target)
        expected = expected - np.float32(lr * (step + 1) / warmup) * gradient
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert len(lowerings) == seen


def test_gradients_through_a_run_time_scalar(lowerings):
    start = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    for scale in (0.5, 1.5, -2.0, 3.25, 7.0):
        x = mg.tensor(start, requires_grad=True)
        y = ((x * scale + scale) ** 2).sum()
        y.backward()
        np.testing.assert_allclose(y.item(), ((start * scale + scale) ** 2).sum(), rtol=1e-5)
        np.testing.assert_allclose(x.grad.numpy(), 2 * (start * scale + scale) * scale, rtol=1e-5)


def test_a_run_time_scalar_is_a_buffer_the_kernel_reads_and_a_constant_one_stays_folded(lowerings):
    x = mg.tensor(np.ones(5, np.float32))
    kinds = []
    for i in range(4):
        y = x * 1.5 + i
        scaled, offset = y.node.inputs
        read = offset.inputs[0] if offset.inputs else offset
        kinds.append((scaled.inputs[1].op, offset.op, read.op, read.shape))
        np.testing.assert_array_equal(y.numpy(), np.full(5, 1.5 + i, np.float32))
    assert kinds[0][:2] == ("const", "const")                 # nothing has varied yet
    assert {kind[0] for kind in kinds} == {"const"}           # x * 1.5: the same value, folded
    assert kinds[2:] == [("const", "reindex", "buffer", ())] * 2    # a 0-d buffer, broadcast


def test_values_that_differ_within_one_graph_stay_folded(lowerings):
    start = np.arange(16, dtype=np.float32)
    for _ in range(3):
        a = mg.tensor(start)
        for k in range(20):
            a = a * 0.5 + k
        offsets = {a.node.inputs[1].op}
        a.numpy()
    assert offsets == {"const"} and len(lowerings) == 1
    integers = mg.tensor(np.array([2, -3, 5], np.int64))
    for _ in range(2):       # integer powers loop over the exponent's bits with one constant each
        np.testing.assert_array_equal((integers ** mg.tensor(np.array([3, 2, 1]))).numpy(), [8, 9, 5])


def test_small_exponents_keep_their_shortcuts():
    x = mg.tensor(np.array([1.0, -2.0, 3.0], np.float32))
    for exponent in (2, 2, 2):
        assert (x ** exponent).node.op == "mul"
        (x ** exponent).numpy()
    for exponent in (0.5, 1.5, 2.5, 3.5):       # a varying exponent: a run-time value from the second
        np.testing.assert_allclose((mg.tensor(np.array([4.0], np.float32)) ** exponent).numpy(),
                                   [4.0 ** exponent], rtol=1e-6)


def test_the_site_table_is_bounded(monkeypatch):
    scalars.forget()
    monkeypatch.setattr(scalars, "SITE_TABLE_SIZE", 8)
    x = mg.tensor(np.zeros(3, np.float32))
    for size in range(1, 30):
        (mg.tensor(np.zeros(size, np.float32)) + 0.25).numpy()     # a new site (shape) per size
    (x + 0.75).numpy()
    assert len(scalars._sites) <= 8


def test_a_varying_site_costs_nothing_to_constants_of_other_kinds(lowerings, monkeypatch):
    """Only constant operands of a (shape, dtype) some site varies in look their site up."""
    grid, row = mg.tensor(np.ones((3, 3), np.float32)), mg.tensor(np.ones(16, np.float32))
    for i in range(4):
        (grid * float(i)).numpy()                   # a (3, 3) float32 site varies
    assert ((3, 3), mg.float32) in scalars.Sites.varying
    row * 0.5, grid * 0.5                           # made shared constants (their first values)
    looked_up = []
    real = scalars.varies
    monkeypatch.setattr(scalars, "varies", lambda *args: looked_up.append(args[1]) or real(*args))
    row * 0.5                                       # shared constant of another shape: no lookup
    grid * 0.5                                      # of the varying kind: looked up
    assert looked_up == [(3, 3)]
