"""Recorded composites: a replay builds exactly the graph a call would, and only when it may."""
import math

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.ops import recorded as rec
from metagraph.ops.node import Node
from metagraph.ops.recorded import recorded
from metagraph.tensor import Tensor


def _structure(node):
    """Every node reachable from `node`, as (op, attrs, shape, dtype, requires_grad, leaf, inputs)
    with inputs numbered in walk order, buffers by identity."""
    order, seen = [], {}

    def visit(n):
        if id(n) in seen:
            return seen[id(n)]
        inputs = tuple(visit(i) for i in n.inputs)
        seen[id(n)] = len(order)
        order.append((n.op, repr(n.attrs), n.shape, n.dtype, n.requires_grad, n.leaf, inputs,
                       id(n) if n.op == "buffer" else None))
        return seen[id(n)]
    visit(node)
    return order


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_replay_builds_the_graph_a_call_builds(requires_grad):
    x = mg.tensor(_data(5, 7).astype(np.float32), requires_grad=requires_grad)
    first = F.softmax(x, dim=1)                 # recorded (or replayed, if an earlier test ran it)
    again = F.softmax(x, dim=1)
    direct = Tensor(F.softmax.__wrapped__.__wrapped__(x.node, dim=1))    # the composite itself
    assert _structure(again.node) == _structure(direct.node) == _structure(first.node)
    assert again.node is not first.node
    want = np.exp(x.numpy() - x.numpy().max(1, keepdims=True))
    np.testing.assert_allclose(again.numpy(), want / want.sum(1, keepdims=True), rtol=1e-6)


def test_gradients_through_a_replay():
    data = _data(3, 4)
    grads = []
    for _ in range(3):                           # record, then replay twice
        x = mg.tensor(data, requires_grad=True)
        (F.log_softmax(x, dim=1) * mg.tensor(_data(3, 4, seed=1))).sum().backward()
        grads.append(x.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], grads[2])
    with mg.no_grad():
        y = F.log_softmax(mg.tensor(data, requires_grad=True), dim=1)
    assert not y.requires_grad


def test_arguments_that_differ_in_kind_or_sign_get_their_own_graphs():
    scaled = recorded(lambda x, s: x * s)
    n = mg.tensor(np.arange(4, dtype=np.int32)).node
    assert scaled(n, 2).dtype == mg.int32
    assert scaled(n, 2.0).dtype == mg.float32          # 2 == 2.0 in Python, not here
    assert scaled(n, True).dtype == mg.int32
    f = mg.tensor(np.ones(3, dtype=np.float32)).node
    assert np.all(np.signbit(Tensor(scaled(f, 0.0)).numpy()) == [False] * 3)
    assert np.all(np.signbit(Tensor(scaled(f, -0.0)).numpy()) == [True] * 3)
    count = len(rec._TEMPLATES)
    for _ in range(3):
        assert np.isnan(Tensor(scaled(f, math.nan)).numpy()).all()
    assert len(rec._TEMPLATES) == count + 1            # nan is one signature, not one per call


def test_the_same_node_twice_is_not_two_nodes():
    combine = recorded(lambda a, b: a * 2.0 + b)
    x = mg.tensor(np.array([1.0, 2.0], dtype=np.float32)).node
    y = mg.tensor(np.array([10.0, 20.0], dtype=np.float32)).node
    np.testing.assert_array_equal(Tensor(combine(x, x)).numpy(), [3, 6])
    np.testing.assert_array_equal(Tensor(combine(x, y)).numpy(), [12, 24])
    np.testing.assert_array_equal(Tensor(combine(y, y)).numpy(), [30, 60])
    np.testing.assert_array_equal(Tensor(combine(y, x)).numpy(), [21, 42])


def test_a_composite_that_reads_a_node_it_was_not_given_is_called_every_time():
    outside = {"node": mg.tensor(np.array([1.0], dtype=np.float32)).node}
    add_outside = recorded(lambda x: x + outside["node"])
    x = mg.tensor(np.array([5.0], dtype=np.float32)).node
    assert Tensor(add_outside(x)).numpy()[0] == 6
    outside["node"] = mg.tensor(np.array([100.0], dtype=np.float32)).node
    assert Tensor(add_outside(x)).numpy()[0] == 105


def test_a_composite_that_makes_a_value_is_called_every_time():
    counter = {"calls": 0}

    def noisy(x):
        counter["calls"] += 1
        return x + mg.tensor(np.full(x.shape, counter["calls"], dtype=np.float32)).node
    noisy = recorded(noisy)
    x = mg.tensor(np.zeros(2, dtype=np.float32)).node
    assert Tensor(noisy(x)).numpy()[0] == 1
    assert Tensor(noisy(x)).numpy()[0] == 2


def test_arguments_it_cannot_describe_are_passed_to_a_plain_call():
    calls = []
    take = recorded(lambda x, table: calls.append(1) or x * float(table[0]))
    x = mg.tensor(np.ones(2, dtype=np.float32)).node
    for value in (2.0, 3.0):
        assert Tensor(take(x, np.array([value]))).numpy()[0] == value
    assert len(calls) == 2


def test_results_keep_their_structure_and_may_be_arguments():
    split = recorded(lambda x, y: (x, None, [x * 2.0, y]))
    x = mg.tensor(np.ones(2, dtype=np.float32)).node
    y = mg.tensor(np.zeros(2, dtype=np.float32)).node
    for _ in range(2):
        first, nothing, (doubled, same) = split(x, y)
        assert first is x and nothing is None and same is y
        assert Tensor(doubled).numpy().tolist() == [2, 2]


def test_replayed_nodes_point_at_the_users_line():
    x = mg.tensor(_data(2, 3).astype(np.float32))
    F.softmax(x, dim=0)
    y = F.softmax(x, dim=0); line = _line()   # noqa: E702  (the same line)
    assert y.node.location == (__file__, line)
    assert all(n.location == (__file__, line) for n in _nodes(y.node) if n.inputs)


def _line():
    import sys
    return sys._getframe(1).f_lineno


def _nodes(node):
    found, stack = {}, [node]
    while stack:
        n = stack.pop()
        if id(n) not in found:
            found[id(n)] = n
            stack.extend(n.inputs)
    return list(found.values())


def test_a_bad_call_still_raises_after_a_good_one():
    x = mg.tensor(_data(2, 3).astype(np.float32))
    F.layer_norm(x, 3)
    with pytest.raises(mg.ShapeError, match="layer_norm"):
        F.layer_norm(x, 4)
    assert isinstance(F.layer_norm(x, 3).node, Node)
