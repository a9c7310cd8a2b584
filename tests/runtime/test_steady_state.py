"""A graph seen before costs hashing plus kernel calls: it is not lowered, rendered or loaded again,
however its nodes were built (fresh nodes every iteration, as an eager loop builds them)."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.pipeline import realize
from tests.helpers import needs


@pytest.fixture(params=["c", "llvm"])
def counted(request, monkeypatch):
    """The backend `request.param`, with its calls of lower.schedule and of load counted."""
    needs(request.param)
    mg.set_backend(request.param)
    calls = {"schedule": 0, "load": 0}

    def counting(name, function):
        def count(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return count
    monkeypatch.setattr(realize, "schedule", counting("schedule", realize.schedule))
    active = mg.backend._active
    monkeypatch.setattr(active, "load", counting("load", active.load))
    return calls


def _chain(start, steps):
    a = mg.tensor(start)
    for k in range(steps):
        a = a * 0.5 + k
    return a


def test_an_eager_loop_lowers_its_graph_once(counted):
    start = np.arange(16, dtype=np.float32)
    first = _chain(start, 300).numpy().copy()
    seen = dict(counted)
    for _ in range(3):
        again = _chain(start, 300).numpy()          # new nodes, the same structure
        np.testing.assert_array_equal(again, first)
    assert counted == seen


def test_a_matmul_called_again_lowers_nothing(counted):
    rng = np.random.default_rng(0)
    a = mg.tensor(rng.standard_normal((8, 5), np.float32))
    b = mg.tensor(rng.standard_normal((5, 3), np.float32))
    (a @ b).numpy()
    seen = dict(counted)
    with mg.profile() as report:
        for _ in range(3):
            np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5)
    assert counted == seen and report.compiles == 0 and report.launches == 3


def test_a_new_structure_is_lowered(counted):
    start = np.arange(16, dtype=np.float32)
    _chain(start, 5).numpy()
    seen = counted["schedule"]
    (mg.tensor(start) - 1).exp().numpy()
    assert counted["schedule"] == seen + 1
