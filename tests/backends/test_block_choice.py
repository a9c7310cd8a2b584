"""Every block a reduction can accumulate (compiler/heuristic.py's BLOCKS), chosen in place of the
heuristic's as tuning does (`Target.block`), computes the same values: random contractions and
convolution gradients on every code generator against the numpy oracle; and a block chosen where
it does not apply leaves the heuristic's kernel as it was."""
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.compiler.heuristic import BLOCKS
from metagraph.ops.autograd import gradients
from metagraph.ops.linalg import matmul
from metagraph.pipeline import stored
from metagraph.pipeline.realize import Pipeline
from tests.backends.conftest import BACKENDS, against_oracle

COMPILED = [name for name in BACKENDS if name != "numpy"]
SETTINGS = settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)) // 3,
                    deadline=None, derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
SIZES = st.sampled_from([1, 3, 16, 17, 32, 48, 64])


def _array(rng, *shape):
    return mg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)


def _reduction(data):
    """A matmul (either operand transposed, batched or not) or a small convolution's output, input
    gradient or weight gradient."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    if data.draw(st.booleans(), label="matmul"):
        batch = data.draw(st.lists(st.sampled_from([1, 2]), max_size=1), label="batch")
        m, k, n = (data.draw(SIZES, label=name) for name in "mkn")
        a = _array(rng, *batch, m, k).node
        transposed = data.draw(st.booleans(), label="b transposed")
        b = _array(rng, n, k).node if transposed else _array(rng, k, n).node
        return matmul(a, mg.Tensor(b).T.node if transposed else b)
    channels, filters = data.draw(st.sampled_from([(4, 32), (32, 16), (3, 48)]), label="channels")
    size = data.draw(st.sampled_from([2, 5, 8]), label="plane")
    stride = data.draw(st.sampled_from([1, 2]), label="stride")
    x, w = _array(rng, 2, channels, size, size), _array(rng, filters, channels, 3, 3)
    out = F.conv2d(x, w, stride=stride, padding=1)
    of = data.draw(st.sampled_from(["output", "input", "weight"]), label="of")
    if of == "output":
        return out.node
    seed = mg.tensor(rng.standard_normal(out.shape).astype(np.float32)).node
    return gradients([out.node], [seed])[(x if of == "input" else w).node.id]


def _with_block(backend, block, monkeypatch):
    """`backend` lowering with `block` tried first, nothing it lowered before reused."""
    target = replace(backend.target, block=block)
    monkeypatch.setattr(Pipeline, "target", property(lambda self: target))
    backend.schedules.clear()
    monkeypatch.setattr(stored, "MIN_NODES", math.inf)


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
@SETTINGS
@given(data=st.data())
def test_every_block_keeps_the_values(backend, data, monkeypatch):
    out = _reduction(data)
    _with_block(backend, data.draw(st.sampled_from(BLOCKS), label="block"), monkeypatch)
    against_oracle(backend, [out])


def _names(node, block):
    return [step.name for step in schedule(pending_graph([node]), Target(block=block))]


def test_blocks_make_other_kernels_where_they_apply():
    rng = np.random.default_rng(3)
    x, w = _array(rng, 32, 64), _array(rng, 128, 64)
    product = matmul(x.node, w.T.node)          # x @ w.T: the heuristic's channel tile
    heuristic = _names(product, None)
    assert _names(product, "channel_tile") == heuristic
    assert _names(product, "transposed_panel") != heuristic
    square = matmul(x.node, _array(rng, 64, 48).node)     # x @ w: a register tile
    assert _names(square, "register_tile") == _names(square, None)
    assert _names(square, "channel_tile") != _names(square, None)
    # a block that does not apply (a panel of an operand that reads the row contiguously) changes
    # nothing, and leaves no trace in the kernel the heuristic makes
    assert _names(square, "transposed_panel") == _names(square, None)


def _conv(of, stride=1):
    """A 3x3 conv of 16 channels into 48 over a 6x6 plane: its output, or a gradient."""
    rng = np.random.default_rng(4)
    x, w = _array(rng, 2, 16, 6, 6), _array(rng, 48, 16, 3, 3)
    out = F.conv2d(x, w, stride=stride, padding=1)
    if of == "output":
        return out.node
    seed = mg.tensor(rng.standard_normal(out.shape).astype(np.float32)).node
    return gradients([out.node], [seed])[(x if of == "input" else w).node.id]


CHOSEN = {      # a reduction and a block that applies to it but that the heuristic does not choose
    "x @ w, channel tile": (lambda: matmul(_array(np.random.default_rng(1), 64, 40).node,
                                           _array(np.random.default_rng(2), 40, 64).node), "channel_tile"),
    "x @ w.T, transposed panel": (lambda: matmul(_array(np.random.default_rng(1), 32, 24).node,
                                                 _array(np.random.default_rng(2), 64, 24).T.node),
                                  "transposed_panel"),
    "x @ w, row block": (lambda: matmul(_array(np.random.default_rng(1), 64, 24).node,
                                        _array(np.random.default_rng(2), 24, 2048).node), "row_block"),
    "conv, channel tile": (lambda: _conv("output"), "channel_tile"),
    "strided conv, register tile": (lambda: _conv("output", 2), "register_tile"),
    "conv weight gradient, register tile": (lambda: _conv("weight"), "register_tile"),
    "conv input gradient, row block": (lambda: _conv("input"), "row_block"),
}


@pytest.mark.parametrize("case", sorted(CHOSEN))
@pytest.mark.parametrize("backend", COMPILED, indirect=True)
def test_a_chosen_block_keeps_the_values(backend, case, monkeypatch):
    graph, block = CHOSEN[case]
    assert _names(graph(), block) != _names(graph(), None)      # the block makes another kernel
    _with_block(backend, block, monkeypatch)
    against_oracle(backend, [graph()])
