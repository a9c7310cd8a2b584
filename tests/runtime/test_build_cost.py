"""What a node costs to build: element-wise operators built without operands() and apply() when
nothing broadcasts or promotes, and gradient rules recorded per signature and replayed
(ops/recorded.py recorded_rule). Both must build exactly what the general path builds."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import metagraph as mg
from metagraph.ops import autograd, math as m, table
from metagraph.compiler.graph import pending_graph

DTYPES = ["float32", "float16", "int32", "int64", "bool"]
SCALARS = [2, 2.5, True]


@pytest.mark.parametrize("op, dtype, scalar, reflected",
                         itertools.product(["add", "mul", "lt", "ne"], DTYPES, SCALARS, [False, True]))
def test_scalar_operands_promote_as_pytorch_does(op, dtype, scalar, reflected):
    torch = pytest.importorskip("torch")
    values = np.array([0, 1, 3], dtype=dtype)
    ours, theirs = mg.tensor(values), torch.from_numpy(values)
    build = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "lt": lambda a, b: a < b,
             "ne": lambda a, b: a != b}[op]
    got = build(scalar, ours) if reflected else build(ours, scalar)
    want = build(scalar, theirs) if reflected else build(theirs, scalar)
    assert got.dtype.name == str(want.dtype).replace("torch.", "")
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_the_fast_path_builds_what_operands_and_apply_build():
    x = mg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).node
    y = mg.tensor(np.ones((2, 3), np.float32)).node
    for fast, row, op in [(m.add, "add", "add"), (m.mul, "mul", "mul"), (m.lt, "cmplt", "lt"),
                          (m.ne, "cmpne", "ne")]:
        for a, b in [(x, y), (x, 2), (3.5, y)]:
            built, general = fast(a, b), table.apply(row, *m.operands(op, a, b))
            assert (built.op, built.shape, built.dtype, built.attrs) == \
                   (general.op, general.shape, general.dtype, general.attrs)
            assert built.inputs == general.inputs          # the same nodes (constants are shared)


def test_shapes_that_do_not_broadcast_name_the_op_and_the_shapes():
    a, b = mg.zeros(2, 3), mg.zeros(4, 3)
    with pytest.raises(mg.errors.ShapeError, match=r"add.*\(2, 3\).*\(4, 3\)"):
        a + b
    with pytest.raises(mg.errors.ShapeError, match=r"lt.*\(2, 3\).*\(4, 3\)"):
        a < b


def _permuted_gradient(shape):
    values = np.arange(np.prod(shape), dtype=np.float32)
    x = mg.tensor(values.reshape(shape), requires_grad=True)
    (x.permute(1, 0) * mg.tensor(values.reshape(shape[::-1]))).sum().backward()
    return x.grad


def test_a_gradient_rule_runs_once_per_signature_and_is_replayed(monkeypatch):
    calls = []
    inverse_view = table.inverse_view
    monkeypatch.setattr(table, "inverse_view", lambda *args: calls.append(1) or inverse_view(*args))
    first = _permuted_gradient((3, 5))
    made = len(calls)
    again = _permuted_gradient((3, 5))
    assert len(calls) == made                       # the permutation's rule was replayed
    _permuted_gradient((4, 5))
    assert len(calls) > made                        # another signature runs the rule
    want = np.arange(15, dtype=np.float32).reshape(5, 3).T
    np.testing.assert_array_equal(first.numpy(), want)
    np.testing.assert_array_equal(again.numpy(), want)
    assert pending_graph([first.node]).key == pending_graph([again.node]).key


def test_replayed_rules_build_the_graph_that_calling_them_builds(monkeypatch):
    """The same network's gradients, with rules replayed and with every rule called: equal values."""
    model = mg.nn.Sequential(mg.nn.Conv2d(2, 3, 3, padding=1), mg.nn.BatchNorm2d(3), mg.nn.ReLU(),
                             mg.nn.MaxPool2d(2), mg.nn.Flatten(), mg.nn.Linear(12, 4))
    x = mg.tensor(np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32))

    def gradients():
        for p in model.parameters():
            p.grad = None
        (model(x).softmax(1) ** 2).sum().backward()
        return [p.grad.numpy().copy() for p in model.parameters()]
    gradients()
    replayed = gradients()
    monkeypatch.setattr(autograd, "_RULES", {name: row.grad for name, row in table.TABLE.items()})
    called = gradients()
    for a, b in zip(replayed, called):
        np.testing.assert_array_equal(a, b)


def test_second_derivatives_through_replayed_rules():
    for _ in range(3):
        x = mg.tensor(np.array([0.5, -1.5, 2.0], np.float32), requires_grad=True)
        (first,) = mg.grad((x.exp() * x.permute(0)).sum(), [x], create_graph=True)
        (second,) = mg.grad(first.sum(), [x])
        value = np.array([0.5, -1.5, 2.0], np.float32)
        np.testing.assert_allclose(second.numpy(), np.exp(value) * (value + 2), rtol=1e-5)


def _reference_order(outputs):
    """Nodes that need a gradient in the order autograd walks them, written recursively."""
    order, seen = [], set()

    def visit(node):
        seen.add(node.id)
        if not node.leaf:
            for source in reversed(node.inputs):
                if source.requires_grad and source.id not in seen:
                    visit(source)
        order.append(node)
    for root in reversed(outputs):
        if root.requires_grad and root.id not in seen:
            visit(root)
    return order[::-1]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 ** 16), st.integers(0, 2 ** 16), st.sampled_from("+*c")),
                min_size=1, max_size=25), st.integers(1, 3))
def test_the_backward_order_of_random_graphs_is_the_recursive_walks(steps, roots):
    """Random DAGs (values used many times, nodes of many inputs through cat) in the iterative and
    the recursive walk's order."""
    pool = [mg.tensor(np.ones(2, np.float32), requires_grad=k % 2 == 0) for k in range(3)]
    for a, b, op in steps:
        x, y = pool[a % len(pool)], pool[b % len(pool)]
        pool.append(x + y if op == "+" else x * y if op == "*" else mg.cat(pool[-4:], 0)[:2])
    outputs = [t.node for t in pool[-roots:]]
    assert [n.id for n in autograd._backward_order(outputs)] == [n.id for n in _reference_order(outputs)]


def test_the_backward_order_is_a_depth_first_post_order():
    model = mg.nn.Sequential(mg.nn.Conv2d(2, 3, 3, padding=1), mg.nn.BatchNorm2d(3), mg.nn.ReLU(),
                             mg.nn.Flatten(), mg.nn.Linear(48, 4))
    x = mg.tensor(np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32))
    out = model(x)
    outputs = [out.softmax(1).sum().node, out.node, (out * out).mean().node]
    order = autograd._backward_order(outputs)
    assert [n.id for n in order] == [n.id for n in _reference_order(outputs)]
    position = {n.id: k for k, n in enumerate(order)}
    for node in order:                  # every node after each of its consumers
        for source in node.inputs if not node.leaf else ():
            if source.requires_grad:
                assert position[source.id] > position[node.id]
