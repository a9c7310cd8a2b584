"""Memos keyed by shapes (composite templates, signature numbers, schedules and the kernels only they
hold) forget what has not been used since their last sweep (ops/stale.py): a loop over new batch
sizes keeps them bounded, whatever the number of sizes; a loop keeps its own entries, however many
realisations an iteration makes, while new shapes keep coming and sweeps happen."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.ops import node, recorded
from metagraph.ops.stale import Sweep
from tests.runtime.test_runtime_extents import c_backend  # noqa: F401  (a fixture)


@pytest.fixture
def small_floors(c_backend, monkeypatch):   # noqa: F811
    """Empty memos that are swept from a few entries on (the defaults wait for hundreds)."""
    monkeypatch.setattr(recorded, "_TEMPLATES", {})
    monkeypatch.setattr(recorded, "_SWEEP", Sweep(8))
    monkeypatch.setattr(node, "_SIGNATURES", {})
    monkeypatch.setattr(node, "_SWEEP", Sweep(16))
    c_backend.sweep = Sweep(2)
    return c_backend


def _memos(pipeline):
    return len(recorded._TEMPLATES), len(node._SIGNATURES), len(pipeline.schedules)


def _model():
    mg.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 3 * 3, 5), nn.Softmax(dim=1)).eval()


def test_a_loop_over_new_batch_sizes_keeps_bounded_memos(small_floors):
    model, sizes = _model(), range(1, 41)
    counts = []
    for n in sizes:
        x = np.random.default_rng(n).standard_normal((n, 1, 6, 6)).astype(np.float32)
        with mg.no_grad():
            got = model(mg.tensor(x)).numpy()
        counts.append(_memos(small_floors))
    with mg.no_grad():
        mg.set_backend("numpy")
        want = model(mg.tensor(x)).numpy()
        mg.set_backend("c")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)     # (templates recorded again)
    per_size = counts[0]               # what one size adds to each memo
    floors = (recorded._SWEEP.floor, node._SWEEP.floor, small_floors.sweep.floor)
    for k, (each, floor) in enumerate(zip(per_size, floors)):
        bound = 3 * (floor + each)      # (ops/stale.py: H + 2 max(floor, H), and one size's)
        assert bound < each * len(sizes)        # (the test would notice memos that keep everything)
        assert max(count[k] for count in counts) <= bound, (k, [count[k] for count in counts])
    kept = {id(f) for entry in small_floors.schedules.values() for f in entry.functions}
    assert {id(f) for f in small_floors.functions.values()} <= kept     # kernels go with schedules


def test_a_loop_keeps_its_own_entries_while_new_shapes_sweep_the_memos(small_floors):
    """Each iteration: a dozen realisations of one batch's graphs, then a batch of a new size (new
    templates, numbers and schedules, so the memos keep being swept, each after fewer new entries
    than an iteration makes). The loop's own templates and schedules are never made again."""
    recorded._SWEEP, node._SWEEP, small_floors.sweep = Sweep(16), Sweep(48), Sweep(2)
    model = _model()
    x = mg.tensor(np.random.default_rng(0).standard_normal((3, 1, 6, 6)).astype(np.float32))

    def iteration(size):
        with mg.no_grad():
            y = model(x)
            for k in range(12):
                (y.sum(), y.amax(), (y * y).sum())[k % 3].item()
            model(mg.tensor(np.random.default_rng(size).standard_normal((size, 1, 6, 6))
                            .astype(np.float32))).numpy()
    iteration(4)
    iteration(5)
    templates = {key: t for key, t in recorded._TEMPLATES.items() if (3, 1, 6, 6) in _shapes(key)}
    schedules = {key: entry for key, entry in small_floors.schedules.items() if entry.runs >= 2}
    generations = recorded._SWEEP.generation, small_floors.sweep.generation
    for size in range(6, 30):
        iteration(size)
    assert recorded._SWEEP.generation > generations[0] + 2          # (swept again and again)
    assert small_floors.sweep.generation > generations[1] + 2
    assert templates and all(recorded._TEMPLATES.get(key) is t for key, t in templates.items())
    assert len(schedules) >= 3
    assert all(small_floors.schedules.get(key) is entry for key, entry in schedules.items())


def _shapes(key):
    """The shapes a template's key describes (its arguments' (shape, dtype, ...) tuples)."""
    found = set()
    for part in key:
        if not isinstance(part, tuple):
            continue
        if part and isinstance(part[0], tuple) and all(type(n) is int for n in part[0]):
            found.add(part[0])
        else:
            found |= _shapes(part)
    return found
