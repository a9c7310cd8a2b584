"""Dot-product kernels (no vectorisable output row): the output loops reuse the largest operand,
and an operand read with a stride along the reduction is copied once per reuse into a local
array read contiguously (compiler/access.py: `reuse_order`; heuristic.py: `Heuristic.packed`). Checked
on every backend against the oracle, at shapes that trigger it."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.ops.autograd import gradients
from tests.backends.conftest import BACKENDS, against_oracle

R = np.random.default_rng(7)


def _data(*shape, grad=False):
    return mg.tensor(R.standard_normal(shape).astype(np.float32), requires_grad=grad)


def _input_gradient(x, w, **conv):
    out = F.conv2d(x, w, **conv)
    seed = mg.tensor(R.standard_normal(out.shape).astype(np.float32)).node
    return gradients([out.node], [seed])[x.node.id]


CASES = {   # name: (graph, whether an operand is packed)
    "1x1-plane conv input gradient": (
        lambda: _input_gradient(_data(3, 13, 1, 1, grad=True), _data(11, 13, 3, 3), padding=1), True),
    # one image: each weight is read once, so there is nothing to reuse and nothing to pack
    "1x1-plane conv input gradient, batch 1": (
        lambda: _input_gradient(_data(1, 7, 1, 1, grad=True), _data(5, 7, 3, 3), padding=1), False),
    "1x1-plane conv forward (contiguous weights: reordered, not packed)": (
        lambda: F.conv2d(_data(3, 13, 1, 1), _data(11, 13, 1, 1)).node, False),
    # padded, it sums only the centre tap (ops/conv.py): its weights are then 9 floats apart
    "1x1-plane 3x3 conv forward (the centre tap's weights: packed)": (
        lambda: F.conv2d(_data(3, 13, 1, 1), _data(11, 13, 3, 3), padding=1).node, True),
    # it reads 2x2 of each 3x3 filter (ops/conv.py drops the taps that read only padding): packed
    # flat, the reduction is one loop
    "stride-2 conv to a 1x1 plane": (
        lambda: F.conv2d(_data(2, 5, 2, 2), _data(7, 5, 3, 3), stride=2, padding=1).node, True),
    "strided columns summed per output": (
        lambda: (_data(5, 1, 17) * _data(17, 9).T.reshape(1, 9, 17)).sum(2).node, False),
}


def _defines(statements):
    for s in statements:
        if isinstance(s, ir.Define):
            yield s
        if isinstance(s, ir.Loop):
            yield from _defines(s.body)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_dot_products_match_the_oracle(backend, name):
    against_oracle(backend, [CASES[name][0]()])


@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_operands_are_packed(name):
    build, packed = CASES[name]
    steps = schedule(pending_graph([build()]))
    names = {d.name for step in steps for d in _defines(step.kernel.body)}
    assert ("pack" in names) == packed, names


def test_a_packed_slice_merges_the_reduction_loops():
    (step,) = schedule(pending_graph([CASES["stride-2 conv to a 1x1 plane"][0]()]))
    loops, inner = [], step.kernel.body
    while inner:
        loops += [s for s in inner if isinstance(s, ir.Loop) and s.kind == ir.REDUCE]
        inner = [b for s in inner if isinstance(s, ir.Loop) for b in s.body]
    assert [loop.extent for loop in loops] == [5 * 2 * 2]


def test_the_output_loop_the_weights_do_not_vary_along_is_innermost():
    """The 1x1-plane input gradient: threads over channels, images innermost, the filter slice
    copied once per channel."""
    (step,) = schedule(pending_graph([CASES["1x1-plane conv input gradient"][0]()]))
    outer = step.kernel.body[0]
    assert outer.kind == ir.PARALLEL and outer.var == 1
    assert isinstance(outer.body[0], ir.Define) and outer.body[0].name == "pack"
    assert outer.body[2].var == 0
