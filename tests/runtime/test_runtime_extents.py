"""Kernels that take their outermost extent at run time (compiler/generic.py): a kernel compiled for
one extent serves every extent its form is lowered at; values at
every extent are the numpy oracle's, through kernel-by-kernel launches and replays alike; kernels
whose schedule depends on the extent stay per extent."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.codegen.interpreter import NumpyBackend
from metagraph.compiler.generic import RuntimeExtent, generic_form
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.pipeline import stored
from tests.helpers import needs, trained


@pytest.fixture
def c_backend(tmp_path, monkeypatch):
    """A fresh c pipeline over an empty kernel cache (no kernel compiled before), active."""
    needs("c")
    from metagraph.codegen.c import CBackend
    from metagraph.pipeline.realize import Pipeline
    monkeypatch.setattr(mg.flags, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mg.flags, "TUNE", 0)
    monkeypatch.setattr(stored, "MIN_NODES", math.inf)
    pipeline = Pipeline(CBackend())
    monkeypatch.setattr(mg.backend, "_instance", lambda name, real=mg.backend._instance:
                        pipeline if name == "c" else real(name))
    mg.set_backend("c")
    return pipeline


def _model():
    mg.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    return model.eval()


def _batch(n, seed=None):
    return mg.tensor(np.random.default_rng(n if seed is None else seed).standard_normal((n, 3, 8, 8))
                     .astype(np.float32))


def test_a_new_batch_size_compiles_nothing_but_where_a_schedule_changes(c_backend):
    """The first size compiles its kernels, generic from the start; a later size compiles only
    kernels the heuristic schedules otherwise at its extent (the classifier's loops swap places once
    the batch outgrows its 10 classes), and then nothing."""
    model, compiles = _model(), []
    for n in (3, 5, 7, 9, 11, 13, 15, 17):
        x = _batch(n)
        with mg.profile() as prof, mg.no_grad():
            got = model(x).numpy()
        compiles.append(prof.compiles)
        with mg.no_grad():
            want = NumpyBackend().realize([model(x).node])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert compiles[0] > 0 and sum(compiles[1:]) <= compiles[0] / 2 and compiles[-3:] == [0, 0, 0]
    (entry,) = [e for e in c_backend.schedules.values() if e.steps[0].positions and len(e.steps) > 3][-1:]
    assert sum(step.outer is not None for step in entry.steps) >= len(entry.steps) - 1
    assert all(step.name.split("_")[1].startswith("N") for step in entry.steps if step.outer is not None)


def test_a_linear_layer_over_any_count_of_rows_shares_one_kernel(c_backend):
    """Rows jammed in groups of 8, the last group clamped where 8 does not divide them (blocks.jam):
    past 64 the schedule no longer depends on the count, so every count, divisible or prime, runs
    one generic kernel, and every size's values are right."""
    mg.manual_seed(2)
    layer, compiles = nn.Linear(48, 40), {}
    for n in list(range(64, 81)) + [83, 107, 131, 139, 256]:
        x = mg.tensor(np.random.default_rng(n).standard_normal((n, 48)).astype(np.float32))
        with mg.profile() as prof, mg.no_grad():
            got = layer(x).relu().numpy()
        compiles[n] = prof.compiles
        want = np.maximum(x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(), 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert sum(compiles.values()) <= 2 and all(compiles[n] == 0 for n in compiles if n > 65)


def test_replayed_runs_of_generic_kernels_keep_the_values(c_backend):
    """From a schedule's third run its kernels are replayed in one native call (runtime/replay.py),
    each generic one given its extent from a slot of the plan."""
    model = _model()
    for n in (4, 6, 6, 6, 6, 10, 10, 10, 4):
        x = _batch(n)
        with mg.no_grad():
            got = model(x).numpy()
            want = NumpyBackend().realize([model(x).node])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_training_with_a_last_smaller_batch_matches_the_oracle(c_backend):
    """Batch norm's statistics and the weights' gradients sum over the batch: those kernels stay per
    extent; the others go generic. Losses and parameters after each step are the oracle's."""
    def train(backend):
        mg.set_backend(backend)
        mg.manual_seed(1)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                              nn.Linear(8 * 8 * 8, 4))
        optimizer = mg.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        batches = ((_batch(n, seed=step), mg.tensor(np.random.default_rng(step).integers(0, 4, n)))
                   for step, n in enumerate((8, 8, 5, 8, 5, 7, 8)))
        return trained(model, optimizer, batches)
    got, want = train("c"), train("numpy")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert any(step.outer is not None for entry in c_backend.schedules.values() for step in entry.steps)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(ops=st.lists(st.sampled_from(["relu", "rowsum", "matmul", "transpose", "scale", "softmax", "pad"]),
                    min_size=1, max_size=4),
       sizes=st.lists(st.integers(1, 12), min_size=3, max_size=5))
def test_random_graphs_over_changing_leading_extents_keep_the_values(ops, sizes):
    """The same structure over several leading extents: whatever goes generic computes every one."""
    needs("c")
    mg.set_backend("c")
    rng = np.random.default_rng(7)
    weight = mg.tensor(rng.standard_normal((6, 5)).astype(np.float32))
    for n in sizes:
        h = mg.tensor(rng.standard_normal((n, 4, 6)).astype(np.float32))
        for op in ops:
            if op == "relu":
                h = h.relu()
            elif op == "rowsum":
                h = h - h.sum(-1, keepdim=True)
            elif op == "matmul" and h.shape[-1] == 6:
                h = h @ weight
            elif op == "transpose" and h.ndim == 3:
                h = h.transpose(1, 2).contiguous()
            elif op == "scale":
                h = h * 1.5 + 0.25
            elif op == "softmax":
                h = F.softmax(h, -1)
            elif op == "pad":
                h = F.pad(h, (1, 1))
        got = h.numpy()
        want = NumpyBackend().realize([h.node])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _kernel(node):
    return schedule(pending_graph([node]), Target(), runtime_extents=True)[-1]


def test_a_kernel_is_generic_from_its_first_extent_and_names_it_n():
    rng = np.random.default_rng(3)
    w = mg.tensor(rng.standard_normal((16, 8)).astype(np.float32))
    first = _kernel((mg.tensor(rng.standard_normal((5, 16)).astype(np.float32)) @ w).relu().node)
    second = _kernel((mg.tensor(rng.standard_normal((7, 16)).astype(np.float32)) @ w).relu().node)
    assert (first.outer, second.outer) == (5, 7) and first.name == second.name
    assert second.name.startswith("r_Nx8_") and isinstance(second.kernel.extents[0], RuntimeExtent)


@pytest.mark.parametrize("build", [
    lambda x: x.sum(0),                                   # sums over the leading dimension
    lambda x: F.pad(x, (0, 0, 1, 1)),                     # reads it under a condition
    lambda x: x[1:],                                      # reads it shifted
    lambda x: x.transpose(0, 1).contiguous(),             # writes it as a second dimension
])
def test_kernels_that_depend_on_the_leading_extent_have_no_generic_form(build):
    rng = np.random.default_rng(4)
    node = build(mg.tensor(rng.standard_normal((6, 5)).astype(np.float32)) * 2.0).node
    (step,) = [s for s in schedule(pending_graph([node]), Target()) if s.kernel is not None][-1:]
    assert generic_form(step.kernel, step.name[0], pending_graph([node]).nodes[step.positions[0]].shape) is None
