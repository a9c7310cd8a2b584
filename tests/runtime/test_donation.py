"""Donation (runtime/donation.py): an element-wise kernel writes its output over an input that dies
with it — an optimizer's update over the old parameter — and never over a value anyone can still
read: a numpy view the user holds, a detached copy, a lazy value built from it."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import nn
from metagraph.runtime import donation


@pytest.fixture
def no_donation(monkeypatch):
    def without():
        monkeypatch.setattr(donation.Donations, "donor", lambda *args: None)
    return without


def _train(optimizer_class, steps=4, item_first=False, **options):
    mg.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5 * 5, 3))
    optimizer = optimizer_class(model.parameters(), **options)
    x = mg.tensor(np.random.default_rng(0).standard_normal((6, 3, 5, 5)).astype(np.float32))
    y = mg.tensor([0, 1, 2, 0, 1, 2])
    allocated = []
    for _ in range(steps):
        with mg.profile() as prof:
            loss = F.cross_entropy(model(x), y)
            if item_first:
                loss.item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        allocated.append(prof.bytes_allocated)
    return [p.numpy().copy() for p in model.parameters()], allocated


@pytest.mark.parametrize("optimizer_class, options", [
    (mg.optim.SGD, dict(lr=0.1, momentum=0.9)), (mg.optim.Adam, dict(lr=0.01)),
    (mg.optim.RMSprop, dict(lr=0.01, momentum=0.5))])
@pytest.mark.parametrize("item_first", [False, True])
def test_training_gives_the_same_values_with_less_memory(optimizer_class, options, item_first, no_donation):
    donated, allocated_donating = _train(optimizer_class, item_first=item_first, **options)
    no_donation()
    plain, allocated_plain = _train(optimizer_class, item_first=item_first, **options)
    for a, b in zip(donated, plain):
        np.testing.assert_array_equal(a, b)
    assert allocated_donating[-1] < allocated_plain[-1]


def _stepped_parameter():
    """A parameter after one SGD step (its buffer is the executor's) and its optimizer."""
    p = nn.Parameter(mg.tensor(np.arange(12, dtype=np.float32).reshape(3, 4)))
    optimizer = mg.optim.SGD([p], lr=0.5, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        (p * p).sum().backward()
        optimizer.step()
    mg.sync(p)
    return p, optimizer


def _step(p, optimizer):
    optimizer.zero_grad()
    (p * p).sum().backward()
    optimizer.step()
    mg.sync(p)


@pytest.mark.parametrize("hold", ["numpy view", "detached", "lazy product", "lazy view", "momentum view"])
def test_what_the_user_holds_keeps_its_value(hold):
    p, optimizer = _stepped_parameter()
    before = p.detach().numpy().copy()
    momentum = optimizer.state[id(p)]["momentum_buffer"]
    momentum_before = momentum.numpy().copy() if hold == "momentum view" else None
    held = {"numpy view": lambda: p.numpy(), "detached": lambda: p.detach(),
            "lazy product": lambda: p * 2, "lazy view": lambda: p.t(),
            "momentum view": lambda: momentum.numpy()}[hold]()
    _step(p, optimizer)
    assert not np.array_equal(p.numpy(), before)
    value = held if isinstance(held, np.ndarray) else held.numpy()
    want = {"lazy product": before * 2, "lazy view": before.T,
            "momentum view": momentum_before}.get(hold, before)
    np.testing.assert_array_equal(value, want)


def test_a_parameter_nothing_holds_is_updated_in_place():
    p, optimizer = _stepped_parameter()
    address = p.node.buffer.__array_interface__["data"][0]
    _step(p, optimizer)
    assert p.node.buffer.__array_interface__["data"][0] == address


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_updates_with_random_holds(data):
    """Random element-wise updates of a few state tensors (in place, as optimizers write them),
    realised at random points, with views, detached copies and lazy values taken at random and
    read at the end: every value is numpy's."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    shape = (data.draw(st.integers(1, 5), label="rows"), data.draw(st.integers(1, 40), label="cols"))
    states = [mg.tensor(rng.standard_normal(shape).astype(np.float32)) * 1.0 for _ in range(3)]
    mg.sync(*states)                     # the executor's buffers, which may be donated
    truth = [s.numpy().copy() for s in states]
    held = []
    for _ in range(data.draw(st.integers(1, 8), label="updates")):
        i, j = data.draw(st.integers(0, 2), label="target"), data.draw(st.integers(0, 2), label="other")
        scale = float(data.draw(st.sampled_from([0.5, -1.5, 2.0]), label="scale"))
        kind = data.draw(st.sampled_from(["add", "mul", "lerp"]), label="update")
        if kind == "add":
            states[i] += states[j] * scale
            truth[i] = truth[i] + truth[j] * np.float32(scale)
        elif kind == "mul":
            states[i] *= scale
            truth[i] = truth[i] * np.float32(scale)
        else:
            states[i] = states[i] * 0.25 + states[j].abs().sqrt() * scale
            truth[i] = truth[i] * np.float32(0.25) + np.sqrt(np.abs(truth[j])) * np.float32(scale)
        hold = data.draw(st.sampled_from(["none", "none", "view", "detach", "lazy"]), label="hold")
        k = data.draw(st.integers(0, 2), label="held")
        if hold == "view":
            held.append((states[k].numpy(), truth[k].copy()))
        elif hold == "detach":
            held.append((states[k].detach(), truth[k].copy()))
        elif hold == "lazy":
            held.append((states[k] - 1.0, truth[k] - np.float32(1.0)))
        if data.draw(st.booleans(), label="realise"):
            mg.sync(*states)
    for state, want in zip(states, truth):
        np.testing.assert_allclose(state.numpy(), want, rtol=1e-5, atol=1e-5)
    for value, want in held:
        got = value if isinstance(value, np.ndarray) else value.numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source, target", [("bool", "float64"), ("float32", "float64"),
                                            ("float64", "float32"), ("int64", "float32"),
                                            ("float32", "float32")])
def test_only_an_input_of_the_outputs_dtype_and_shape_may_be_written_over(source, target):
    from metagraph.compiler.graph import pending_graph
    from metagraph.compiler.lower import schedule
    x = mg.tensor(np.arange(12).reshape(3, 4) % 3).to(getattr(mg, source)) * 1
    mg.sync(x)
    out = x.to(getattr(mg, target)) + 1
    (step,) = schedule(pending_graph([out.node]))
    assert step.in_place == ((0,) if source == target else ())
    column = (x.to(getattr(mg, target))[:, :1] + 1).expand(3, 4)      # not at the output's index
    (step,) = schedule(pending_graph([column.node]))
    assert step.in_place == ()


def test_a_numpy_view_taken_through_another_node_keeps_its_value():
    """A view of a detached tensor, or one taken before the tensor became a Parameter: numpy points
    the view at the pool's byte array, whose reference count donation reads."""
    w0 = mg.tensor(np.arange(6, dtype=np.float32)) * 0.5
    snapshot = w0.numpy()
    w = nn.Parameter(w0)
    del w0
    optimizer = mg.optim.SGD([w], lr=0.1)
    views = []
    for _ in range(3):
        optimizer.zero_grad()
        (w * w).sum().backward()
        optimizer.step()
        mg.sync(w)
        views.append((w.detach().numpy(), w.numpy().copy()))
    np.testing.assert_array_equal(snapshot, np.arange(6, dtype=np.float32) * 0.5)
    for view, value in views:
        np.testing.assert_array_equal(view, value)


def test_a_value_autograd_still_needs_is_not_given_away():
    a = np.linspace(-1, 1, 6, dtype=np.float32)
    weight = nn.Parameter(mg.tensor(np.full(6, 3.0, np.float32)))
    data = mg.tensor(a) * 2.0
    mg.sync(data)
    hidden = data * weight                  # its gradient for weight reads data
    del data
    mg.sync(hidden)
    hidden.sum().backward()
    np.testing.assert_allclose(weight.grad.numpy(), 2 * a, rtol=1e-6)


def test_reads_of_realised_nodes_are_counted_in_every_run():
    """Two graphs of one key whose realised nodes read different things: the second's user-held
    input is not taken on the strength of the first's counts."""
    a = np.arange(16, dtype=np.float32)
    weight = nn.Parameter(mg.tensor(np.ones(16, np.float32)))
    x = mg.tensor(a) * 2.0
    mg.sync(x)
    kept = x * weight
    mg.sync(kept)
    (x * 3.0 + kept).numpy()
    del x, kept
    x2 = mg.tensor(a) * 2.0
    mg.sync(x2)
    other = mg.tensor(a) * 5.0
    mg.sync(other)
    other = other.requires_grad_()
    np.testing.assert_array_equal((x2 * 3.0 + other).numpy(), a * 11)
    np.testing.assert_array_equal(x2.numpy(), a * 2)


def test_a_check_failing_after_a_donation_leaves_the_finished_values():
    a = np.arange(8, dtype=np.float32)
    state = mg.tensor(a) * 2.0
    mg.sync(state)
    state = state * 3.0                     # donated
    later = (state + 1.0)[mg.tensor([1, 99])]
    with pytest.raises(mg.IndexOutOfRange):
        mg.sync(state, later)
    np.testing.assert_array_equal(state.numpy(), a * 6)
    with pytest.raises(mg.IndexOutOfRange):
        later.numpy()


def test_a_step_with_a_check_never_writes_over_its_input():
    state = mg.tensor(np.arange(1, 9, dtype=np.int64)) * 3
    mg.sync(state)
    divisor = mg.tensor(np.array([1, 2, 0, 1, 1, 1, 1, 1], np.int64)) * 1
    mg.sync(divisor)
    state = state // divisor
    for _ in range(2):
        with pytest.raises(mg.MetagraphError, match="division by zero"):
            state.numpy()
