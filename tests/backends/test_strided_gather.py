"""A strided conv's input gradient: split into the stride's phases, each a unit-stride sum of a
product of views (ops/window_gradient.py), where the window's taps allow it; over short rows, the
output channels summed first and the taps scattered after; else a scatter. Lowering may turn a
scatter into a gather (compiler/gather.py). Checked on every backend against the oracle."""
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


CASES = {    # name: (x shape, w shape, conv arguments, the kernel kinds: "sum" (no gather, no scatter),
    #           or the kinds every schedule has: g, s, and r (the channels summed first))
    # rows too short for phases (ops/window_gradient.py, GATHER_WASTE_MAX): the channels summed first
    "ResNet-18's 8x8 to 4x4, 64 channels": ((2, 64, 8, 8), (16, 64, 3, 3), dict(stride=2, padding=1), "rg"),
    "7x5 plane, 24 channels": ((2, 24, 7, 5), (5, 24, 3, 3), dict(stride=2, padding=1), "rg"),
    "stride 3, 5x5 taps, 9x9": ((1, 32, 9, 9), (4, 32, 5, 5), dict(stride=3, padding=2), "sum"),
    # the channel index (k // 4) * 16 + c is not a sum of variables: a scatter, as at stride 1
    "stride 2, groups 2 stays a scatter": ((2, 32, 7, 7), (8, 16, 3, 3), dict(stride=2, padding=1,
                                                                             groups=2), "s"),
    # y = 2*oy + 2*ky - 2: the tap's coefficient is not 1, no phase split; the channels summed first
    "stride 2, dilation 2 stays a scatter": ((2, 32, 7, 7), (8, 32, 3, 3), dict(stride=2, padding=2,
                                                                              dilation=2), "rs"),
    "2x2 taps on a 6x4 plane": ((3, 32, 6, 4), (3, 32, 2, 2), dict(stride=2), "rg"),
    "32x32 plane": ((1, 8, 32, 32), (4, 8, 3, 3), dict(stride=2, padding=1), "sum"),
    "1x1 stride 2 (one phase, the others zero)": ((2, 16, 9, 8), (8, 16, 1, 1), dict(stride=2), "sum"),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_input_gradients_match_the_oracle(backend, name):
    x_shape, w_shape, conv, _ = CASES[name]
    against_oracle(backend, [_input_gradient(x_shape, w_shape, **conv)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_long_strided_input_gradients_are_sums_over_phases_and_short_ones_gathers(name):
    x_shape, w_shape, conv, kind = CASES[name]
    steps = schedule(pending_graph([_input_gradient(x_shape, w_shape, **conv)]))
    kinds = {step.kernel.name[0] for step in steps}
    assert set(kind) <= kinds if kind != "sum" else not kinds & {"g", "s"}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_taps_the_stride_skips_add_nothing_even_when_inf(backend):
    weights = R.standard_normal((4, 32, 3, 3)).astype(np.float32)
    weights[:, :, 0, 0] = np.inf     # read only at odd input rows and columns (padding 1, stride 2)
    node = _input_gradient((2, 32, 6, 6), (4, 32, 3, 3), weights=weights, stride=2, padding=1)
    against_oracle(backend, [node])
    value = mg.Tensor(node).numpy()
    assert np.isfinite(value[:, :, 0::2, :]).all() and np.isfinite(value[:, :, 1::2, 0::2]).all()
    assert not np.isfinite(value[:, :, 1, 1]).any()
