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
from metagraph.compiler.generic import MANY, RuntimeExtent, generic_form
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


def _compiles_and_values(model, batches):
    """The kernels each inference of `model` compiles over `batches`, in turn; every inference's
    values are checked against the numpy oracle's."""
    compiles = []
    for x in batches:
        with mg.profile() as prof, mg.no_grad():
            got = model(x).numpy()
        compiles.append(prof.compiles)
        with mg.no_grad():
            want = NumpyBackend().realize([model(x).node])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return compiles


def test_every_batch_size_after_the_first_compiles_nothing(c_backend):
    """Kernels are scheduled for NOMINAL rows whatever the batch and take it at run time, with a body
    for fewer rows than their groups: the first size, a batch of one, compiles every kernel, and no
    later size compiles any; every size's values are the oracle's."""
    compiles = _compiles_and_values(_model(), [_batch(n) for n in (1, 3, 2, 5, 17, 16, 9, 40, 64, 65, 7)])
    assert compiles[0] > 0 and compiles[1:] == [0] * (len(compiles) - 1)
    (entry,) = [e for e in c_backend.schedules.values() if e.steps[0].positions and len(e.steps) > 3][-1:]
    assert all(step.outer is not None and step.name.split("_")[1].startswith("N") for step in entry.steps)


def test_per_channel_values_broadcast_alike_at_a_batch_of_one(c_backend):
    """A batch norm, a conv's bias and a clamp over a 1x1 map (MobileNetV2's tail): at a batch of one
    a per-channel (1, C, 1, 1) value has the input's shape, so nothing would broadcast it and fusion
    would inline its scale where other batches materialise it. Per-channel values are (C, 1, 1)
    (broadcast at every batch size) and a broadcast over the batch counts NOMINAL rows: the first
    size compiles everything, batch 2 and later sizes nothing."""
    mg.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 24, 3, stride=2), nn.BatchNorm2d(24), nn.ReLU6(),
                          nn.Conv2d(24, 1280, 3), nn.BatchNorm2d(1280), nn.ReLU6(),   # (fusion.SMALL
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 10)).eval()  # channels)
    rng = np.random.default_rng(5)
    for bn in (model[1], model[4]):      # statistics of a trained model, not the initial 0 and 1
        bn.running_mean.copy_(mg.tensor(rng.standard_normal(bn.num_features).astype(np.float32)))
        bn.running_var.copy_(mg.tensor(rng.random(bn.num_features).astype(np.float32) + 0.5))
    compiles = _compiles_and_values(model, [_batch(n) for n in (1, 2, 3, 1, 6)])
    assert compiles[0] > 0 and compiles[1:] == [0, 0, 0, 0]


def _small_cnn(channels, bias, norm, act):
    """A conv (stride 2), a per-channel step, an activation, global pooling and a classifier."""
    class Scale(nn.Module):         # a user's own per-channel scale, (1, C, 1, 1) as PyTorch code has it
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(mg.tensor(np.linspace(0.5, 1.5, channels, dtype=np.float32)))

        def forward(self, x):
            return x * (self.weight * self.weight + 0.1).reshape(1, channels, 1, 1)
    norms = {"batch": lambda: nn.BatchNorm2d(channels), "group": lambda: nn.GroupNorm(4, channels),
             "scale": Scale, None: nn.Identity}
    return nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, bias=bias), norms[norm](), act(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 5)).eval()


def _from_a_batch_of_one(model, size):
    return _compiles_and_values(model, [mg.tensor(np.random.default_rng(n).standard_normal((n, 3, size, size))
                                                  .astype(np.float32)) for n in (1, 2, 5)])


@settings(max_examples=8, deadline=None, derandomize=True)
@given(channels=st.sampled_from([8, 40, 1100]), size=st.integers(3, 9), bias=st.booleans(),
       norm=st.sampled_from(["batch", "group", "scale", None]), act=st.sampled_from([nn.ReLU, nn.ReLU6]))
def test_random_cnns_from_a_batch_of_one_compile_nothing_after_it(channels, size, bias, norm, act):
    """Convolutions with and without bias, a batch or group norm, an activation and a pooling, over
    maps whose last is 1x1 or larger, with channels below and above fusion.SMALL: from a batch of
    one, later batch sizes compile nothing and every value is the oracle's."""
    needs("c")
    mg.set_backend("c")
    mg.manual_seed(channels + size)
    assert _from_a_batch_of_one(_small_cnn(channels, bias, norm, act), size)[1:] == [0, 0]


def test_a_users_own_per_channel_view_from_a_batch_of_one(c_backend):
    """The composites shape per-channel values (C, 1, 1); a user's (1, C, 1, 1) view over a 1x1 map
    of more than fusion.SMALL channels is read unbroadcast at a batch of one, and broadcast at
    others: fusion copies out the value the view reshapes at both (fusion._reshaped)."""
    mg.manual_seed(1)
    assert _from_a_batch_of_one(_small_cnn(1100, False, "scale", nn.ReLU6), 4)[1:] == [0, 0]


def test_max_pooling_and_its_gradient_route_take_the_batch_at_run_time(c_backend):
    """The tap search tests the window's padding by its indices (the plane's, never the batch's):
    still a kernel that takes the batch at run time. What stays per batch size is the gradient's
    scatter into the input (a scatter has no generic form: compiler/generic.py)."""
    mg.manual_seed(0)
    scale, pool = mg.nn.Parameter(mg.rand(8, 1, 1) + 0.5), nn.MaxPool2d(3, 2, 1)
    compiles = []
    for n in (2, 3, 1, 6):
        data = np.random.default_rng(n).standard_normal((n, 8, 9, 9)).astype(np.float32)
        data[:, :, :3, :3] = -np.inf            # windows whose only maxima are -inf and padding
        values = []
        for realise in (lambda t: t.numpy(), lambda t: NumpyBackend().realize([t.node])[0]):
            activation = mg.tensor(data) * scale
            activation.retain_grad()
            with mg.profile() as prof:
                pool(activation).sum().backward()
                values.append(realise(activation.grad))
            compiles.append(prof.compiles)
        np.testing.assert_array_equal(values[0], values[1])
        assert values[0][:, :, 0, 0].min() == 1     # the first -inf inside, not the padding before it
    assert compiles[2::2] == [1, 1, 1]


def test_a_linear_layer_over_any_count_of_rows_shares_one_kernel(c_backend):
    """Rows in groups (a channel tile of 16, or rows jammed by 8), the last group clamped where they
    do not divide the count (blocks.jam), and a body scheduled for FEW rows below a group's: every
    count from one row to MANY, divisible or prime, runs one kernel; from MANY on, rows are
    scheduled for their count (a kernel at most per count); every size's values are right."""
    mg.manual_seed(2)
    layer, compiles = nn.Linear(48, 40), {}
    for n in [1, 2, 3, 5, 8, 13, 15, 16, 17, 31, 64, 65, 83, 131, 255, 256, 300, 257]:
        x = mg.tensor(np.random.default_rng(n).standard_normal((n, 48)).astype(np.float32))
        with mg.profile() as prof, mg.no_grad():
            got = layer(x).relu().numpy()
        compiles[n] = prof.compiles
        want = np.maximum(x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(), 0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert compiles[1] > 0 and all(compiles[n] == 0 for n in compiles if 1 < n < MANY)
    assert all(compiles[n] <= 1 for n in compiles if n >= MANY)


def test_a_weight_with_as_many_rows_as_the_batch_is_not_taken_for_it(c_backend):
    """A linear layer 40 -> 24 over 24 rows: its weight's first extent is the batch's, but it is read
    along the output's columns; the kernel is scheduled again with the weight as it is, still
    generic, and serves other counts without compiling."""
    mg.manual_seed(3)
    layer, compiles = nn.Linear(40, 24), []
    for n in (24, 10, 24, 33):
        x = mg.tensor(np.random.default_rng(n).standard_normal((n, 40)).astype(np.float32))
        with mg.profile() as prof, mg.no_grad():
            got = layer(x).numpy()
        compiles.append(prof.compiles)
        np.testing.assert_allclose(got, x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert compiles[1:] == [0, 0, 0]


def test_a_transformer_over_a_new_batch_size_compiles_only_its_token_lookup(c_backend):
    """A GPT over batches of token ids: the lookup reads an index tensor and stays per batch size;
    fusion makes it a kernel of its own, so every kernel after it (layer norms, attention,
    projections) serves every batch size."""
    from metagraph import models
    mg.manual_seed(4)
    gpt = models.gpt(vocab=32, context=16, d_model=32, heads=2, layers=1).eval()
    compiles = _compiles_and_values(gpt, [mg.tensor(np.random.default_rng(n).integers(0, 32, (n, 16)))
                                          for n in (2, 5, 3, 9)])
    assert compiles[0] > 3 and compiles[1:] == [1, 1, 1]


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


@settings(max_examples=25, deadline=None, derandomize=True)
@given(ops=st.lists(st.sampled_from(["relu", "rowsum", "matmul", "transpose", "scale", "softmax", "pad", "linear",
                                     "flip", "shift", "square", "edge"]), min_size=1, max_size=4),
       sizes=st.lists(st.integers(1, 40), min_size=3, max_size=5))
def test_random_graphs_over_changing_leading_extents_keep_the_values(ops, sizes):
    """The same structure over several leading extents, below and above a group's rows (a linear
    layer's 16): whatever goes generic computes every one; what reads the leading dimension other
    than at its own row (a flip, a shift, a weight as wide as the batch) stays right."""
    needs("c")
    mg.set_backend("c")
    rng = np.random.default_rng(7)
    weight = mg.tensor(rng.standard_normal((6, 5)).astype(np.float32))
    wide = mg.tensor(rng.standard_normal((24, 24)).astype(np.float32))
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
            elif op == "edge":           # a constant's padded view: a test of the other indices
                h = h * F.pad(mg.ones(*h.shape[1:]), (1, 0))[..., :h.shape[-1]]
            elif op == "linear":         # (n, 24) @ (24, 24): rows in groups from 16 on
                flat = h.reshape(n, -1)
                flat = flat[:, :24] if flat.shape[1] >= 24 else F.pad(flat, (0, 24 - flat.shape[1]))
                h = F.linear(flat, wide).relu()
            elif op == "flip":
                h = h.flip(0) * 2.0
            elif op == "shift" and n > 1:   # row i + 1 at row i, zero last
                h = F.pad(h[1:], (0,) * (2 * h.ndim - 1) + (1,))
            elif op == "square":         # (n, n): a second dimension as long as the batch
                flat = h.reshape(n, -1)
                h = (flat @ flat.T) * 0.1
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
