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
    with inputs numbered in walk order. Equal constants count as one node, and so do buffers of
    equal contents: whether two uses share one is not part of what is computed (a composite that
    is called every time makes its own tables each time)."""
    order, seen = [], {}

    def visit(n):
        key = id(n)
        if n.op == "const":
            key = ("const", repr(n.attrs))
        elif n.buffer is not None:
            key = ("buffer", n.shape, n.dtype, n.buffer.tobytes())
        if key in seen:
            return seen[key]
        inputs = tuple(visit(i) for i in n.inputs)
        seen[key] = len(order)
        order.append((n.op, repr(n.attrs), n.shape, n.dtype, n.requires_grad, n.leaf, inputs,
                       key if n.op == "buffer" else None))
        return seen[key]
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


def _slots(node, names):
    """Every slot of a node but its id, its site and the replay that made it, its inputs by their
    numbers in `names`."""
    found = {name: getattr(node, name) for name in Node.__slots__
             if name not in ("id", "site", "replayed_from", "__weakref__")}
    found["inputs"] = tuple(names.setdefault(id(source), len(names)) for source in node.inputs)
    return found


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_replayed_node_has_every_slot_a_built_one_has(requires_grad):
    from metagraph.ops import math as m
    x = mg.tensor(_data(5, 7).astype(np.float32), requires_grad=requires_grad).node
    composite = recorded(lambda a: m.sub(m.exp(m.mul(a, 2.0)), 1.0))
    built, replayed = composite(x), composite(x)
    names = [{id(x): 0}, {id(x): 0}]
    pairs, stack = 0, [(built, replayed)]
    while stack:
        a, b = stack.pop()
        if a is b:
            continue
        assert _slots(a, names[0]) == _slots(b, names[1])
        assert b.id > a.id and len(b.site) == 2
        pairs += 1
        stack.extend(zip(a.inputs, b.inputs))
    assert pairs >= 3
    # the replay that made it, on a result autograd does not walk
    assert built.replayed_from is None and (replayed.replayed_from is None) == requires_grad


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


def test_arguments_that_differ_in_kind_or_sign_get_their_own_graphs(monkeypatch):
    monkeypatch.setattr(rec, "_TEMPLATES", {})         # a table the suite has not filled to its bound
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


def _n(*shape, dtype=np.float32, seed=0, requires_grad=False):
    return mg.tensor(_data(*shape, seed=seed).astype(dtype), requires_grad=requires_grad).node


def _i(values):
    return mg.tensor(np.array(values, dtype=np.int64)).node


def _cases():
    from metagraph.ops import conv, linalg, loss, math as m, movement as mv, reduce as rd
    x, w = _n(2, 3, 5, 5, requires_grad=True), _n(4, 3, 3, 3, seed=1, requires_grad=True)
    v, u = _n(3, 4), _n(4, seed=2)
    return {
        "relu": (m.relu, (v,), {}), "gelu_tanh": (m.gelu, (v,), {"approximate": "tanh"}),
        "sigmoid": (m.sigmoid, (v,), {}), "clamp_nodes": (m.clamp, (v, u, 0.5), {}),
        "where_broadcast": (m.where, (m.lt(v, 0.0), u, 1.0), {}), "pow_int": (m.pow, (v, 3), {}),
        "pow_float": (m.pow, (v, 2.5), {}), "pow_node": (m.pow, (v, u), {}),
        "round": (m.round, (v,), {"decimals": 2}), "div_int": (m.div, (_i([1, 2]), 2), {}),
        "mean": (rd.mean, (v, 1), {"keepdim": True}), "var": (rd.var, (v,), {"correction": 0}),
        "max_dim": (rd.max, (v, 1), {}), "argmax": (rd.argmax, (v,), {"dim": 0}),
        "logsumexp": (rd.logsumexp, (v, (0, 1)), {}),
        "reshape": (mv.reshape, (v, (-1, 2)), {}), "permute": (mv.permute, (x, (0, 2, 3, 1)), {}),
        "pad_reflect": (mv.pad, (x, (1, 2, 0, 1)), {"mode": "reflect"}),
        "cat": (mv.cat, ([v, v, _n(1, 4)],), {"dim": 0}), "split": (mv.split, (v, [1, 2]), {}),
        "unbind": (mv.unbind, (v, 1), {}), "tril": (mv.tril, (v, -1), {}),
        "matmul_batched": (linalg.matmul, (_n(2, 3, 4), _n(4, 5)), {}),
        "conv2d": (conv.conv2d, (x, w, None, 2, 1, 1, 1), {}),
        "conv2d_groups": (conv.conv2d, (_n(1, 4, 6, 6), _n(4, 2, 3, 3)), {"groups": 2, "padding": 1}),
        "max_pool2d": (conv.max_pool2d, (x, 3), {"stride": 2, "padding": 1}),
        # makes its index tables as buffers: not recorded in ops, and called every time if it were
        "interpolate": (recorded(conv.interpolate), (x,), {"scale_factor": 2, "mode": "bilinear",
                                                            "align_corners": False}),
        "cross_entropy": (loss.cross_entropy, (v, _i([0, 3, 1])), {"label_smoothing": 0.1}),
        "batch_norm_training": (loss.batch_norm, (x, _n(3), _n(3, seed=3), _n(3, seed=4), None, True),
                                {}),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_every_kind_of_composite_replays_its_own_graph(name):
    fn, args, kwargs = _cases()[name]
    fn(*args, **kwargs)
    replayed, direct = fn(*args, **kwargs), fn.__wrapped__(*args, **kwargs)

    def flat(result):
        if isinstance(result, Node):
            return [_structure(result)]
        return [piece for r in result if r is not None for piece in flat(r)]
    assert flat(replayed) == flat(direct)
    for got, want in zip(_leaves(replayed), _leaves(direct)):
        np.testing.assert_array_equal(Tensor(got).numpy(), Tensor(want).numpy())


def _leaves(result):
    if isinstance(result, Node):
        return [result]
    return [n for r in result if r is not None for n in _leaves(r)]
