"""A strided conv's input gradient as a gather (compiler/gather.py, `_solved_variable`): each input
position sums the taps whose window lands on it, over every output position the stride allows,
where the scatter would add each product to its target. Only where the plane is short enough
that the gather wastes few steps; checked on every backend against the oracle."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.ops.autograd import gradients
from tests.backends.conftest import BACKENDS, against_oracle

R = np.random.default_rng(5)


def _input_gradient(x_shape, w_shape, weights=None, **conv):
    """The input gradient of a conv whose weights take a gradient too (as in training)."""
    x = mg.tensor(R.standard_normal(x_shape).astype(np.float32), requires_grad=True)
    w = mg.tensor(R.standard_normal(w_shape).astype(np.float32) if weights is None else weights,
                  requires_grad=True)
    out = F.conv2d(x, w, **conv)
    seed = mg.tensor(R.standard_normal(out.shape).astype(np.float32)).node
    return gradients([out.node], [seed])[x.node.id]


CASES = {    # name: (x shape, w shape, conv arguments, the kernel kind)
    "ResNet-18's 8x8 to 4x4, 64 channels": ((2, 64, 8, 8), (16, 64, 3, 3), dict(stride=2, padding=1), "g"),
    "7x5 plane, 24 channels (no channel tile)": ((2, 24, 7, 5), (5, 24, 3, 3), dict(stride=2, padding=1),
                                                  "g"),
    # the taps (5) outnumber the output rows (3): the tap is the unit-stride variable a window
    # gradient solves for (ops/window_gradient.py), a sum over the zero-bordered weights
    "stride 3, 5x5 taps, 9x9": ((1, 32, 9, 9), (4, 32, 5, 5), dict(stride=3, padding=2), "r"),
    # the channel index (k // 4) * 16 + c is not a sum of variables: a scatter, as at stride 1
    "stride 2, groups 2 stays a scatter": ((2, 32, 7, 7), (8, 16, 3, 3), dict(stride=2, padding=1,
                                                                             groups=2), "s"),
    # y = 2*oy + 2*ky - 2: no tap with coefficient 1 to solve for
    "stride 2, dilation 2 stays a scatter": ((2, 32, 7, 7), (8, 32, 3, 3), dict(stride=2, padding=2,
                                                                              dilation=2), "s"),
    "2x2 taps on a 6x4 plane": ((3, 32, 6, 4), (3, 32, 2, 2), dict(stride=2), "g"),
    # a 32x32 plane: the gather would run 16 output rows for the 1.5 that add; the scatter stays
    "32x32 plane stays a scatter": ((1, 8, 32, 32), (4, 8, 3, 3), dict(stride=2, padding=1), "s"),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_input_gradients_match_the_oracle(backend, name):
    x_shape, w_shape, conv, _ = CASES[name]
    against_oracle(backend, [_input_gradient(x_shape, w_shape, **conv)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_short_planes_gather_and_long_ones_scatter(name):
    """(or sum a window gradient, where one applies)"""
    x_shape, w_shape, conv, kind = CASES[name]
    steps = schedule(pending_graph([_input_gradient(x_shape, w_shape, **conv)]))
    assert steps[-1].kernel.name[0] == kind


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_taps_the_stride_skips_add_nothing_even_when_inf(backend):
    weights = R.standard_normal((4, 32, 3, 3)).astype(np.float32)
    weights[:, :, 0, 0] = np.inf     # read only at odd input rows and columns (padding 1, stride 2)
    node = _input_gradient((2, 32, 6, 6), (4, 32, 3, 3), weights=weights, stride=2, padding=1)
    against_oracle(backend, [node])
    value = mg.Tensor(node).numpy()
    assert np.isfinite(value[:, :, 0::2, :]).all() and np.isfinite(value[:, :, 1::2, 0::2]).all()
    assert not np.isfinite(value[:, :, 1, 1]).any()
