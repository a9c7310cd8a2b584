"""Memos keyed by shapes (composite templates, signature numbers, schedules and the kernels only they
hold) forget what recent realisations did not use (ops/stale.py): a loop over new batch sizes keeps
them bounded, whatever the number of sizes; a loop over the same shapes keeps all of its own, with
more realisations an iteration than the sweep looks back over."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import nn
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.ops import node, recorded, stale
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
        bound = 2 * max(floor, each * (stale.KEPT_REALISATIONS + 2))
        assert bound < each * len(sizes)        # (the test would notice memos that keep everything)
        assert max(count[k] for count in counts) <= bound, (k, [count[k] for count in counts])
    kept = {id(f) for entry in small_floors.schedules.values() for f in entry.functions}
    assert {id(f) for f in small_floors.functions.values()} <= kept     # kernels go with schedules


def test_a_loop_over_the_same_shapes_records_and_lowers_once(small_floors):
    model = _model()
    x = mg.tensor(np.random.default_rng(0).standard_normal((3, 1, 6, 6)).astype(np.float32))

    def iteration():        # more realisations than the sweep looks back over, each its own graph
        with mg.no_grad():
            y = model(x)
            for k in range(stale.KEPT_REALISATIONS + 4):
                (y[:, k % 5] * (k + 1)).sum().item()
    iteration()
    templates, schedules = dict(recorded._TEMPLATES), dict(small_floors.schedules)
    signatures = {key: entry[0] for key, entry in node._SIGNATURES.items()}
    for _ in range(3):
        iteration()
    assert recorded._TEMPLATES == templates             # the same Template objects: none recorded again
    assert small_floors.schedules == schedules          # the same Schedules: none lowered again
    assert {key: entry[0] for key, entry in node._SIGNATURES.items()} == signatures


def test_the_schedules_run_last_stay_whatever_their_size(small_floors, monkeypatch):
    """Beyond the node bound the least recently run schedules go, never the SCHEDULES_ALWAYS run
    last: a loop's graphs larger than the bound are not lowered again at every realisation."""
    from metagraph.pipeline import realize
    monkeypatch.setattr(realize, "SCHEDULE_NODES", 1)        # every schedule is over it
    small_floors.sweep = Sweep(10 ** 6)                      # (the bounds alone, here)
    model = _model()
    batches = [mg.tensor(np.random.default_rng(n).standard_normal((n, 1, 6, 6)).astype(np.float32))
               for n in range(1, 13)]
    for x in batches:
        with mg.no_grad():
            model(x).numpy()
    assert len(small_floors.schedules) == realize.SCHEDULES_ALWAYS
    kept = dict(small_floors.schedules)
    for x in batches[-realize.SCHEDULES_ALWAYS:] * 2:
        with mg.no_grad():
            model(x).numpy()
    assert small_floors.schedules == kept and all(a is b for a, b in zip(kept.values(),
                                                                           small_floors.schedules.values()))
