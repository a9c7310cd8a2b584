"""The pending graph's structural key: equal for graphs that may share a schedule, and only then."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph.compiler.graph import pending_graph, replayed, walked
from metagraph.ops import math as m
from metagraph.ops import movement as mv
from metagraph.ops import reduce as rd
from metagraph.ops.recorded import recorded
from metagraph.tensor import Tensor


def _key(tensor):
    return pending_graph([tensor.node]).key


def _ones():
    return mg.tensor(np.ones(3, dtype=np.float32))


def test_structurally_equal_graphs_share_a_key():
    assert _key(mg.exp(_ones()) * 2.0) == _key(mg.exp(_ones()) * 2.0)
    assert _key(mg.exp(_ones()) * 2.0) != _key(mg.exp(_ones()) * 3.0)


def test_a_constant_of_the_other_sign_of_zero_is_another_graph():
    assert _key(_ones() * 0.0) != _key(_ones() * -0.0)
    assert np.signbit((_ones() * 0.0).numpy()).tolist() == [False] * 3
    assert np.signbit((_ones() * -0.0).numpy()).tolist() == [True] * 3    # not the 0.0 kernel


def test_a_nan_constant_finds_its_graph_again():
    assert _key(_ones() * math.nan) == _key(_ones() * math.nan)


# ---- a recorded call's result: its graph from the replay's slots (compiler/graph.py `replayed`) ----

_STEPS = [      # (arity, fn) over (3, 4) float32 nodes
    (2, lambda a, b: m.add(a, b)), (2, lambda a, b: m.maximum(a, b)), (2, lambda a, b: m.sub(b, a)),
    (1, lambda a: m.mul(a, 2.5)), (1, m.exp), (1, m.tanh),
    (1, lambda a: m.add(rd.sum(a, 1, keepdim=True), a)),
    (1, lambda a: mv.transpose(mv.transpose(a, 0, 1), 0, 1)),
]


def _composite(program, arity):
    """A composite applying `program` (step number, operand picks) to its `arity` arguments and the
    values it made, returning the last."""
    def composite(*args):
        values = list(args)
        for number, first, second in program:
            count, fn = _STEPS[number]
            picks = [values[first % len(values)], values[second % len(values)]][:count]
            values.append(fn(*picks))
        return values[-1]
    return recorded(composite)


def _same_graph(found, walked_graph):
    assert found.key == walked_graph.key and found.outputs == walked_graph.outputs
    assert len(found.nodes) == len(walked_graph.nodes)
    assert all(a is b for a, b in zip(found.nodes, walked_graph.nodes))
    assert found.position == walked_graph.position


@settings(max_examples=40, deadline=None)
@given(program=st.lists(st.tuples(st.integers(0, len(_STEPS) - 1), st.integers(0, 9), st.integers(0, 9)),
                        min_size=1, max_size=6),
       arity=st.integers(1, 3), repeated=st.booleans())
def test_a_replayed_result_has_the_graph_a_walk_finds(program, arity, repeated):
    rng = np.random.default_rng(len(program))
    args = [mg.tensor(rng.standard_normal((3, 4)).astype(np.float32)).node for _ in range(arity)]
    if repeated:
        args[-1] = args[0]                       # one node given twice
    composite = _composite(program, arity)
    composite(*args)                              # recorded
    for _ in range(3):                            # replayed: walked once, then from the slots
        result = composite(*args)
        assert result.replayed_from is not None
        assert replayed(result, *result.replayed_from) is not None
        _same_graph(pending_graph([result]), walked([result]))
    assert result.replayed_from[0].walk is not None
    want = Tensor(result).numpy()
    np.testing.assert_allclose(Tensor(composite(*args)).numpy(), want, rtol=1e-6)


def test_a_replay_whose_graph_changed_since_is_walked():
    composite = _composite([(4, 0, 0), (3, 1, 1), (0, 1, 2)], 1)
    realised = mg.tensor(np.ones((3, 4), np.float32)).node
    composite(realised)
    composite(realised)
    pending(composite(realised))                  # the template's walk is recorded
    lazy = m.add(realised, 1.0)                   # an argument not computed yet: its nodes join the graph
    result = composite(lazy)
    assert replayed(result, *result.replayed_from) is None
    _same_graph(pending_graph([result]), walked([result]))
    result = composite(realised)
    inner = result.inputs[0]
    mg.sync(Tensor(inner))                        # a node the replay built, computed since
    assert replayed(result, *result.replayed_from) is None
    _same_graph(pending_graph([result]), walked([result]))
    np.testing.assert_allclose(Tensor(result).numpy(), np.exp(np.ones((3, 4))) * 3.5, rtol=1e-6)
    assert result.replayed_from is None           # (dropped with the history once computed)


def pending(node):
    return pending_graph([node])
