"""Channel tiles: a reduction whose output row would be guarded lane by lane (a conv's input
gradient over a small plane), read with a stride (a strided conv) or fill too few of its vectors'
lanes (a conv over a small plane) is vectorised along an outer output dimension instead, the one operand that varies along it packed per tile
(compiler/heuristic.py: `Heuristic.channel_tile`); the C code generator turns each lane-uniform mask into a
branch around its vector loop. Checked on every backend against the oracle, at awkward shapes."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen import c
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.ops import table
from metagraph.ops.autograd import gradients
from tests.backends.conftest import BACKENDS, against_oracle

R = np.random.default_rng(11)


def _data(*shape, dtype=np.float32, grad=False):
    return mg.tensor(R.standard_normal(shape).astype(dtype), requires_grad=grad)


def _gradient(x, w, of="x", **conv):
    """The graph of conv2d(x, w)'s gradient with respect to x or w, for a random seed."""
    out = F.conv2d(x, w, **conv)
    seed = mg.tensor(R.standard_normal(out.shape).astype(x.dtype.np)).node
    return gradients([out.node], [seed])[(x if of == "x" else w).node.id]


CASES = {    # name: (graph, the tiled output dimension or None)
    "4x4 plane, 32 channels": (
        lambda: _gradient(_data(2, 32, 4, 4, grad=True), _data(5, 32, 3, 3), padding=1), 1),
    "3x5 plane, 48 channels, batch 1": (
        lambda: _gradient(_data(1, 48, 3, 5, grad=True), _data(7, 48, 3, 3), padding=1), 1),
    # a 1x3 window guards only the row's first and last positions: the others accumulate unmasked
    "3x8 plane, 1x3 taps (interior positions unguarded)": (
        lambda: _gradient(_data(2, 32, 3, 8, grad=True), _data(4, 32, 1, 3), padding=(0, 1)), 1),
    "5x4 plane, 2x3 taps, batch 3": (
        lambda: _gradient(_data(3, 32, 5, 4, grad=True), _data(3, 32, 2, 3), padding=1), 1),
    # no guard where every tap reads the whole plane: a 2x2 plane's gradient sums over the plane
    # (more taps than positions); taps that read only padding are dropped
    "2x2 plane, 3x3 taps": (
        lambda: _gradient(_data(3, 32, 2, 2, grad=True), _data(3, 32, 3, 3), padding=1), None),
    "2x2 plane, padding 2, 5x5 taps": (
        lambda: _gradient(_data(3, 32, 2, 2, grad=True), _data(3, 32, 5, 5), padding=2), None),
    "7x3 plane, dilation 2": (
        lambda: _gradient(_data(2, 32, 7, 3, grad=True), _data(4, 32, 3, 3), padding=2, dilation=2),
        1),
    "float64, 16 channels (8 lanes)": (
        lambda: _gradient(_data(2, 16, 3, 3, dtype=np.float64, grad=True),
                                _data(3, 16, 3, 3, dtype=np.float64), padding=1), 1),
    # a strided conv reads its input at stride 2 along the row: tiled along its filters
    "stride-2 forward conv, weights with a gradient": (
        lambda: F.conv2d(_data(2, 8, 9, 7), _data(32, 8, 3, 3, grad=True), stride=2, padding=1).node, 1),
    # a 1x1 stride-2 conv's weight gradient (32, 8, 1, 1): its row is the 8 input channels (the
    # size-1 dimensions after it do not count), which it reads 16 floats apart
    "1x1 stride-2 conv weight gradient": (
        lambda: _gradient(_data(3, 8, 4, 4), _data(32, 8, 1, 1, grad=True), of="w", stride=2), 0),
    # too few channels for two tiles: the row tile as before
    "4x4 plane, 24 channels": (
        lambda: _gradient(_data(2, 24, 4, 4, grad=True), _data(5, 24, 3, 3), padding=1), None),
    # no guard (the forward conv reads a zero-bordered copy), but 4 rows of 4 flattened fill 16 of
    # the 32 lanes they take
    "forward conv over a 4x4 plane": (
        lambda: F.conv2d(_data(2, 8, 4, 4), _data(32, 8, 3, 3), padding=1).node, 1),
    # 7 rows of 7 flattened fill 49 of 64 lanes: the flat plane stays
    "forward conv over a 7x7 plane": (
        lambda: F.conv2d(_data(2, 8, 7, 7), _data(32, 8, 3, 3), padding=1).node, None),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CASES))
def test_channel_tiles_match_the_oracle(backend, name):
    against_oracle(backend, [CASES[name][0]()])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_channel_loop_is_tiled_and_its_operand_packed(name):
    build, tiled = CASES[name]
    steps = schedule(pending_graph([build()]))
    reduction = [s for s in steps if s.kernel.name[0] in "gr"][-1].kernel
    outer = reduction.body[0]
    if tiled is None:
        assert not (isinstance(outer.body[0], ir.Define) and outer.body[0].name == "pack")
        return
    lanes = 64 // reduction.params[0].dtype.itemsize
    assert outer.kind == ir.PARALLEL and outer.var == tiled
    assert outer.extent * lanes == reduction.params[0].shape[tiled]
    assert isinstance(outer.body[0], ir.Define) and outer.body[0].name == "pack"


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_window_past_the_border_with_inf_weights_matches_the_oracle(backend):
    """The input gradient reads the output gradient through a zero border (ops/window_gradient.py):
    an infinite weight that a window meets only past the border gives NaN there (0 x inf), as
    PyTorch's convolution backward does too (where exactly depends on the algorithm: PyTorch's
    4x4 case has NaN in half the rows). Every backend gives the oracle's values, NaN included."""
    weights = R.standard_normal((3, 32, 3, 3)).astype(np.float32)
    weights[0, :, 0, :] = np.inf     # the last row's gradient reads them only past the border
    x, w = _data(2, 32, 4, 4, grad=True), mg.tensor(weights)
    out = F.conv2d(x, w, padding=1)
    seed = np.zeros(out.shape, np.float32)
    seed[:, 0, 3, :] = 1.0                 # the last row: tap row 0 reads below the plane
    (node,) = [gradients([out.node], [mg.tensor(seed).node])[x.node.id]]
    against_oracle(backend, [node])


def test_lane_uniform_masks_become_branches_in_c(monkeypatch):
    """A guarded gather (a strided or grouped conv's input gradient, a user's scatter; here a
    stride-1 one, made a gather by turning the window gradient off) branches around each vector
    loop whose mask is the same for all lanes."""
    monkeypatch.setattr(table, "window_gradient", lambda *arguments: None)
    (step,) = [s for s in schedule(pending_graph([CASES["4x4 plane, 32 channels"][0]()]))
               if s.kernel.name.startswith("g_")]
    source = c.render([step.kernel])
    assert "if ((" in source and "? fmaf(" not in source


@pytest.mark.parametrize("name", sorted(name for name, (_, tiled) in CASES.items() if tiled is not None))
def test_no_channel_tile_keeps_a_masked_multiply_add_in_c(name):
    """Accumulations whose guard folded away (a position every tap reads) run unbranched beside
    the branched ones: the vector loop is never left with a select GCC would not vectorise."""
    for step in schedule(pending_graph([CASES[name][0]()])):
        source = c.render([step.kernel])
        assert "? fmaf(" not in source and "? fma(" not in source


# derandomised like the random graphs (the kernel cache then serves CI); more with
# METAGRAPH_HYPOTHESIS_EXAMPLES and METAGRAPH_HYPOTHESIS_RANDOM=1
@settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 12)), deadline=None,
          derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 3), st.sampled_from([32, 48]), st.integers(1, 6), st.integers(1, 6),
       st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2))
@pytest.mark.parametrize("backend", ["c", "llvm"], indirect=True)
def test_random_convs_and_their_gradients_match_the_oracle(backend, batch, channels, height, width,
                                                           kh, kw, padding, stride):
    """Forward, input and weight gradients of random convs with enough channels for channel tiles
    (guarded, strided or neither) on the code generators against the oracle."""
    if height + 2 * padding < kh or width + 2 * padding < kw:
        return
    conv = dict(padding=padding, stride=stride)
    x, w = _data(batch, channels, height, width, grad=True), _data(channels, channels, kh, kw, grad=True)
    out = F.conv2d(x, w, **conv)
    seed = mg.tensor(R.standard_normal(out.shape).astype(np.float32)).node
    grads = gradients([out.node], [seed])
    against_oracle(backend, [out.node, grads[x.node.id], grads[w.node.id]])
