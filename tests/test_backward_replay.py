"""A backward pass recorded per graph structure (ops/recorded_backward.py): a replay builds the nodes
the rules build, and only where its key says the rules would build them."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.ops import autograd, recorded_backward
from metagraph.ops.recorded import _CALL
from tests.helpers import needs
from tests.ops.test_recorded import _structure


@pytest.fixture(autouse=True)
def rules(monkeypatch):
    """A clean table of walks, and a count of the gradient rules run since (a replay runs none)."""
    monkeypatch.setattr(recorded_backward, "_TEMPLATES", {})
    monkeypatch.setattr(recorded_backward, "_SEEN", {})
    ran, rule = [0], autograd._rule

    def counted(node, grad, walk):
        ran[0] += 1
        return rule(node, grad, walk)
    monkeypatch.setattr(autograd, "_rule", counted)
    return ran


def _walked_every_time(monkeypatch):
    monkeypatch.setattr(recorded_backward, "lookup", lambda key: (None, False))


def _net():
    return mg.nn.Sequential(mg.nn.Conv2d(3, 4, 3, padding=1), mg.nn.BatchNorm2d(4), mg.nn.ReLU(),
                            mg.nn.Flatten(), mg.nn.Linear(4 * 5 * 5, 3))


def _data():
    rng = np.random.default_rng(0)
    return mg.tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32)), mg.tensor([0, 2])


def _built(grads):
    return [_structure(g.node) for g in grads]


def _three_times(rules, backward):
    """backward() called three times on graphs of one structure: (its results, the rules each ran)."""
    results, ran = [], []
    for _ in range(3):
        before = rules[0]
        results.append(backward())
        ran.append(rules[0] - before)
    return results, ran


def test_the_third_walk_of_a_structure_is_replayed_and_builds_what_the_rules_build(rules):
    net, (x, y) = _net(), _data()
    loss = F.cross_entropy(net(x), y)
    params = list(net.parameters())
    (walked, recorded, replayed), ran = _three_times(
        rules, lambda: mg.grad(loss, params, retain_graph=True))
    assert ran[0] == ran[1] > 0 and ran[2] == 0
    assert _built(replayed) == _built(walked) == _built(recorded)
    assert all(a.node is not b.node for a, b in zip(replayed, recorded))
    for a, b in zip(replayed, walked):     # (each realised apart: the forward values kept may differ)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_replayed_nodes_are_the_walks_to_every_slot(rules):
    x = mg.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3), requires_grad=True)
    h = (x * 2).relu()
    loss = (h * h).mean() + x.sigmoid().sum()
    (walked, _, replayed), _ = _three_times(rules, lambda: mg.grad(loss, [x, h], retain_graph=True))
    pairs, seen = list(zip([g.node for g in walked], [g.node for g in replayed])), set()
    while pairs:
        a, b = pairs.pop()
        if a is b or id(a) in seen:
            continue
        seen.add(id(a))
        for name in ("op", "attrs", "shape", "dtype", "requires_grad", "leaf", "composite", "device",
                     "location", "buffer", "released", "grad_hooks", "grad_group", "owner"):
            assert getattr(a, name) == getattr(b, name), name
        pairs += zip(a.inputs, b.inputs)
    assert len(seen) > 10


@pytest.mark.parametrize("event", [None, "autocast", "freeze"])
def test_a_training_loop_replays_its_backward_pass_with_the_walks_values(rules, monkeypatch, event):
    """SGD steps with replays and with walks only give equal parameters, bit for bit; a parameter
    frozen at the fourth step is walked anew (its key changed), then replayed again."""
    x, y = _data()
    nets, ran = [], []
    for replay in (True, False):
        mg.manual_seed(0)
        net = _net()
        optimizer = mg.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        with monkeypatch.context() as patch:
            if not replay:
                _walked_every_time(patch)
            for step in range(8):
                if event == "freeze" and step == 4:
                    net[0].weight.requires_grad_(False)
                before = rules[0]
                optimizer.zero_grad()
                with mg.autocast(enabled=event == "autocast"):
                    loss = F.cross_entropy(net(x), y)
                loss.backward()
                ran.append(rules[0] - before)
                optimizer.step()
        nets.append(net)
    replayed, walked = ran[:8], ran[8:]
    assert replayed[:2] == walked[:2] and replayed[6:] == [0, 0] and min(walked) > 0
    if event == "freeze":
        assert replayed[3] == 0 and replayed[4] == replayed[5] == walked[4] < walked[3]
    for a, b in zip(*[net.parameters() for net in nets]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_graph_seen_once_is_keyed_not_recorded(rules):
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert not recorded_backward._TEMPLATES and len(recorded_backward._SEEN) == 1
    (x * x).sum().backward()
    assert len(recorded_backward._TEMPLATES) == 1 and not recorded_backward._SEEN
    np.testing.assert_array_equal(x.grad.numpy(), [4, 8])


def test_gradients_accumulate_into_grad_across_replayed_calls(rules):
    w = mg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    _, ran = _three_times(rules, lambda: (w * w * 3).sum().backward())
    assert ran[2] == 0
    np.testing.assert_array_equal(w.grad.numpy(), [18, -36, 54])


@pytest.mark.parametrize("change", ["freeze", "create_graph", "detach", "output_gradient", "autocast"])
def test_a_changed_structure_or_flag_is_walked_anew(rules, change):
    net, (x, y) = _net(), _data()
    params = list(net.parameters())

    def grads(changed):
        loss = F.cross_entropy(net(x), y)
        if changed and change == "freeze":
            params[0].requires_grad_(False)
            loss = F.cross_entropy(net(x), y)
        if changed and change == "detach":
            loss = F.cross_entropy(net[4](net[:4](x).detach()), y)      # only the last layer learns
        gradient = mg.tensor(2.0) if changed and change == "output_gradient" else None
        trained = [p for p in params if p.requires_grad]
        if changed and change == "autocast":
            with mg.autocast("cpu", dtype=mg.bfloat16):
                return mg.grad(loss, trained, grad_output=gradient)
        return mg.grad(loss, trained, grad_output=gradient, create_graph=changed and change == "create_graph")

    _three_times(rules, lambda: grads(False))
    before = rules[0]
    changed = grads(True)
    assert rules[0] > before
    with_walks = len(recorded_backward._TEMPLATES) + len(recorded_backward._SEEN)
    assert with_walks == 2
    if change == "freeze":
        assert len(changed) == len(params) - 1
    if change == "detach":
        assert len([g for g in changed if np.any(g.numpy())]) == 2       # the linear layer's
    if change == "create_graph":
        assert changed[0].requires_grad
    if change == "output_gradient":
        np.testing.assert_allclose(changed[-1].numpy(), 2 * grads(False)[-1].numpy(), rtol=1e-6)


def test_a_replay_releases_the_graph_and_a_second_backward_still_raises(rules):
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    _three_times(rules, lambda: (w * w).sum().backward())
    loss = (w * w).sum()
    loss.backward()                                        # replayed
    with pytest.raises(mg.MetagraphError, match="second time"):
        loss.backward()
    retained = (w * w).sum()
    retained.backward(retain_graph=True)
    retained.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [12, 24])


def test_hooks_and_grad_groups_are_walked_every_time(rules):
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    seen = []

    def backward():
        h = w * 3
        h.register_hook(lambda g: seen.append(1) or g * 2)
        (h * h).sum().backward()
    _, ran = _three_times(rules, backward)
    assert min(ran) > 0 and len(seen) == 3
    assert not recorded_backward._TEMPLATES
    np.testing.assert_array_equal(w.grad.numpy(), [3 * 36, 3 * 72])


def test_create_graph_replays_a_graph_that_can_be_differentiated_again(rules):
    x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)

    def second():
        g, = mg.grad((x * x * x).sum(), [x], create_graph=True)
        return mg.grad(g.sum(), [x])[0]
    (walked, _, replayed), ran = _three_times(rules, second)
    assert ran[2] == 0
    assert _structure(replayed.node) == _structure(walked.node)
    np.testing.assert_array_equal(replayed.numpy(), [6, 12, 18])


def test_a_walk_that_reads_a_node_outside_the_graph_is_not_replayed(rules, monkeypatch):
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    outside = mg.tensor([5.0, 7.0]).node
    rule = autograd._RULES["mul"]

    def reading_outside(g, y, a, b):
        return tuple(r + outside for r in rule(g, y, a, b))
    monkeypatch.setitem(autograd._RULES, "mul", reading_outside)
    _, ran = _three_times(rules, lambda: (x * 2).sum().backward())
    assert min(ran) > 0
    assert [made for _, made in recorded_backward._TEMPLATES.values()] == [_CALL]
    np.testing.assert_array_equal(x.grad.numpy(), [21, 27])


def test_a_walk_that_moves_a_gradient_to_a_device_is_walked_every_time(rules):
    needs("opencl")
    x = mg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = mg.tensor([0.5, 4.0, -1.0]).to("opencl")
    _, ran = _three_times(rules, lambda: (x.to("opencl") * w).sum().backward())
    assert min(ran) > 0
    assert [made for _, made in recorded_backward._TEMPLATES.values()] == [_CALL]
    np.testing.assert_array_equal(x.grad.numpy(), [1.5, 12.0, -3.0])


def test_a_replay_gives_the_walks_gradients_in_its_order_and_its_leaves(rules):
    a = mg.tensor([1.0, 2.0], requires_grad=True)
    b = mg.tensor([3.0, 4.0], requires_grad=True)

    def walk():
        h = a * b
        leaves = []
        grads = autograd.gradients([(h + a).sum().node], [mg.tensor(1.0).node], retain_graph=True,
                                   leaves=leaves)
        return [g.shape for g in grads.values()], len(grads), [leaf is a.node for leaf in leaves]
    (walked, _, replayed), ran = _three_times(rules, walk)
    assert ran[2] == 0 and replayed == walked
