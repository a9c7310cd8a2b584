"""A window's gradient as a sum (ops/window_gradient.py): wherever it applies, the same values as
the scatter-add it replaces, on random convolutions (the oracle backend, float64), and a sum, not
a scatter, where it must apply."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.ops import table


def _gradients(x_data, w_data, conv):
    """The input and weight gradients of sum(conv2d(x, w) * seed), and the ops of the nodes the
    input gradient is built of."""
    x = mg.tensor(x_data, requires_grad=True)
    w = mg.tensor(w_data, requires_grad=True)
    out = F.conv2d(x, w, **conv)
    seed = mg.tensor(np.random.default_rng(1).standard_normal(out.shape))
    gx, gw = mg.grad((out * seed).sum(), [x, w])
    ops, stack, seen = set(), [gx.node], set()
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen.add(node.id)
            ops.add(node.op)
            stack.extend(node.inputs)
    return gx.numpy(), gw.numpy(), ops


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batch=st.integers(1, 2), groups=st.sampled_from([1, 2]), per_group=st.integers(1, 3),
       filters=st.integers(1, 2), size=st.tuples(st.integers(1, 13), st.integers(1, 13)),
       kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)))
def test_a_window_gradient_gives_the_scatters_values(batch, groups, per_group, filters, size, kernel, stride,
                                                     padding, dilation):
    spans = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    if any(s + 2 * p < span for s, p, span in zip(size, padding, spans)):
        return          # no output position
    rng = np.random.default_rng(0)
    x_data = rng.standard_normal((batch, groups * per_group) + size)
    w_data = rng.standard_normal((groups * filters, per_group) + kernel)
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    mg.set_backend("numpy")
    summed = _gradients(x_data, w_data, conv)
    plain = table.window_gradient
    try:
        table.window_gradient = lambda *arguments: None
        scattered = _gradients(x_data, w_data, conv)
    finally:
        table.window_gradient = plain
    assert "reindex_reduce" in scattered[2]
    np.testing.assert_allclose(summed[0], scattered[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(summed[1], scattered[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("conv", [dict(padding=1), dict(padding=0), dict(padding=2, dilation=2),
                                  dict(padding=(1, 0))])
def test_a_unit_stride_input_gradient_is_a_sum_with_no_scatter(conv):
    rng = np.random.default_rng(2)
    _, _, ops = _gradients(rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 3)), conv)
    assert "reindex_reduce" not in ops and "reduce" in ops


@pytest.mark.parametrize("conv, kernel", [(dict(stride=2, padding=1), 3), (dict(stride=3, padding=2), 5),
                                          (dict(stride=2), 1), (dict(stride=(2, 1), padding=1), 3)])
def test_a_strided_input_gradient_is_a_sum_over_phases_with_no_scatter(conv, kernel):
    """Split into the stride's phases, each a unit-stride sum (a 1x1 window's one phase, the
    others zero); the values are the scatter's (the hypothesis test above)."""
    rng = np.random.default_rng(3)
    _, _, ops = _gradients(rng.standard_normal((1, 2, 12, 11)), rng.standard_normal((2, 2, kernel, kernel)), conv)
    assert "reindex_reduce" not in ops and "reduce" in ops


def test_a_strided_dilated_input_gradient_keeps_the_scatter():
    rng = np.random.default_rng(3)
    _, _, ops = _gradients(rng.standard_normal((1, 2, 12, 12)), rng.standard_normal((2, 2, 3, 3)),
                           dict(stride=2, padding=2, dilation=2))
    assert "reindex_reduce" in ops


@pytest.mark.parametrize("x_shape, conv", [((2, 6, 8, 8), dict(stride=2, padding=1)),
                                           ((1, 5, 7, 5), dict(stride=2, padding=1)),
                                           ((1, 2, 12, 12), dict(stride=2, padding=2, dilation=2))])
def test_short_strided_rows_sum_the_channels_before_scattering_the_taps(x_shape, conv):
    """Rows too short for phases (or a dilated strided window): the scatter reads a sum over the
    output channels, laid out (batch, input channels, taps, output rows), never the product itself."""
    rng = np.random.default_rng(4)
    x = mg.tensor(rng.standard_normal(x_shape), requires_grad=True)
    w = mg.tensor(rng.standard_normal((7, x_shape[1], 3, 3)), requires_grad=True)
    out = F.conv2d(x, w, **conv)
    (gx,) = mg.grad((out * mg.tensor(rng.standard_normal(out.shape))).sum(), [x])
    stack, scatters = [gx.node], []
    while stack:
        node = stack.pop()
        scatters += [node] if node.op == "reindex_reduce" else []
        stack.extend(node.inputs)
    assert scatters and all(s.inputs[0].op == "reduce" for s in scatters)
    summed = scatters[0].inputs[0]
    laid_out = x_shape[:2] + (3, 3) + out.shape[-2:]
    assert summed.shape == tuple(size for size in laid_out if size > 1)       # (a 1-wide one is 0)
    assert summed.inputs[0].shape[-1] == 7      # the output channels, summed
