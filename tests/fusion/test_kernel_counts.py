"""How many kernels a computation takes: fusion's behaviour, pinned down."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
from tests.helpers import needs
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule


def kernels(*tensors):
    """The kernel launches that realising these tensors takes (on any backend: the schedule)."""
    return schedule(pending_graph([t.node for t in tensors]))


def test_twenty_element_wise_ops_are_one_kernel():
    x = mg.rand(1000)
    y = x
    for k in range(10):
        y = (y * 1.01 + 0.5).exp() if k % 3 == 0 else y * 0.5 - 0.25
    assert len(kernels(y)) == 1


@pytest.mark.parametrize("length", [20, 60, 100])
def test_a_relu_affine_chain_is_one_kernel_whatever_its_length(length):
    """relu reads its input twice (where(y > 0, y, 0)): each value read twice is computed once in
    the kernel, a named temporary, never materialised nor recomputed along the chain; the chain is
    cut only past fusion.MAX_DEPTH levels (100 steps are fewer)."""
    x = mg.rand(2 ** 16)
    y = x
    for k in range(length):
        y = F.relu(y * 1.01 - 0.3) if k % 2 else y * 0.9 + 0.1
    (step,) = kernels(y)
    assert len(ir.describe(step.kernel.body)) < 400 * length     # linear in the chain, not 2^length


def test_a_chain_past_the_depth_bound_is_cut_and_compiles():
    x = mg.rand(1000)
    y = x
    for k in range(400):
        y = F.relu(y * 1.01 - 0.3) if k % 2 else y * 0.9 + 0.1
    assert 2 <= len(kernels(y)) <= 4
    assert np.isfinite(y.numpy()).all()


def test_matmul_is_one_kernel():
    assert len(kernels(mg.rand(16, 32) @ mg.rand(32, 8))) == 1


def test_conv_bias_relu_is_one_kernel():
    x, w, b = mg.rand(2, 3, 8, 8), mg.rand(4, 3, 3, 3), mg.rand(4)
    steps = kernels(F.relu(F.conv2d(x, w, padding=1) + b[:, None, None]))
    assert len(steps) == 1 and steps[0].kernel.name.startswith("r_")


def test_linear_with_bias_is_one_kernel():
    assert len(kernels(F.linear(mg.rand(4, 5), mg.rand(3, 5), mg.rand(3)))) == 1


def test_row_softmax_is_one_kernel():
    """Its row max and row sum are computed per row inside the kernel that writes it (rows.py)."""
    steps = kernels(F.softmax(mg.rand(64, 100), dim=1))
    assert len(steps) == 1


@pytest.mark.parametrize("rows", [64, 1023, 1024, 8192])
def test_layer_norm_is_one_kernel_over_any_number_of_rows(rows):
    """Its mean and variance are row prologues, and rsqrt(var + eps), a per-row value broadcast
    along the row, is computed once per row where it is read, however many rows there are (it was
    copied out from SMALL rows on: three kernels)."""
    w = mg.rand(256)
    assert len(kernels(F.layer_norm(mg.rand(rows, 256), (256,), w, w))) == 1


def test_a_costly_value_broadcast_over_leading_dimensions_is_still_copied_out():
    """Only repeats along a cheap value's own row are free: across rows it would be computed
    again, and so would a costly per-row value read by a reader that runs across the rows."""
    per_column = (mg.rand(1, 2048).exp() + 1).log().sqrt()
    assert len(kernels(per_column * mg.rand(64, 2048))) == 2
    x = mg.rand(2048, 64)
    per_row = (x.sum(1, keepdim=True).exp() + 1).log().sqrt()
    steps = kernels((x * per_row).T + 0.5)
    assert [s.kernel.name[0] for s in steps] == ["r", "e"]      # the row's value with its sum,
    transposed = [v for s in ir.statements(steps[1].kernel.body) if getattr(s, "value", None) is not None
                  for v in ir.values(s.value)]
    assert not any(isinstance(v, ir.Apply) and v.op in ("exp2", "log2", "sqrt") for v in transposed)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_a_reshape_is_told_from_the_other_views(shape, data):
    """fusion._reshaped: a reshape of a computed value that adds or drops dimensions of one is one;
    a permutation that reorders the dimensions longer than one, a slice and a flip are not."""
    from metagraph.compiler.fusion import _reshaped
    x = mg.rand(*shape) * 2.0
    at = data.draw(st.integers(0, len(shape)), label="a dimension of one at")
    assert _reshaped(x.reshape(*shape[:at], 1, *shape[at:]).node)
    ones = [size for size in shape if size > 1] or [1]
    view = x.reshape(*ones).node
    assert view.op != "reindex" or _reshaped(view)
    order = data.draw(st.permutations(range(len(shape))), label="order")
    view = x.permute(*order).node
    reordered = [d for d in order if shape[d] > 1] != [d for d in range(len(shape)) if shape[d] > 1]
    assert not (reordered and _reshaped(view))
    if shape[0] > 1:
        assert not _reshaped(x[1:].node) and not _reshaped(x.flip(0).node)


def test_views_never_materialise():
    x = mg.rand(4, 6, 8)
    y = x.permute(2, 0, 1)[1:, ::2].reshape(7, -1).flip(0) * 2
    assert len(kernels(y)) == 1


def test_expensive_fan_out_is_materialised_and_cheap_fan_out_recomputed():
    x = mg.rand(100)
    cheap = x * 2
    assert len(kernels(cheap + 1, cheap * 3)) == 2          # one kernel per output, cheap recomputed
    costly = (x.exp() + 1).log().sqrt()
    assert len(kernels(costly * 2.0, costly + 1.0)) == 3   # two kernels read it: computed once, stored
    # read several times, at one position, by one kernel: computed once there, no buffer
    assert len(kernels(costly * costly + costly)) == 1


def test_erf_tanh_softplus_and_gelu_are_one_kernel_and_gelu_fuses_into_a_linear_layer():
    x, w = mg.rand(8, 32), mg.rand(16, 32)
    for f in (mg.erf, mg.tanh, F.softplus, F.gelu, lambda t: F.gelu(t, approximate="tanh")):
        assert len(kernels(f(x))) == 1
    assert len(kernels(F.gelu(F.linear(x, w)))) == 1


def test_a_strided_pooling_window_over_a_small_plane_reads_a_padded_copy():
    """A 3x3/2 max-pool reads its 16x16 plane's padded copy 1.9 times per element: the copy is
    made, and the pooling kernel reads it with no bounds test."""
    x, scale = mg.rand(2, 64, 16, 16), mg.rand(64)
    steps = kernels(F.max_pool2d(F.relu(x * scale[:, None, None]), 3, 2, 1))
    assert [s.kernel.name[0] for s in steps] == ["e", "r"]

    def values(body):
        for statement in body:
            if isinstance(statement, ir.Loop):
                yield from values(statement.body)
            elif getattr(statement, "value", None) is not None:
                yield from ir.values(statement.value)
    assert not any(isinstance(v, ir.Guard) or getattr(v, "valid", None) is not None
                   for v in values(steps[1].kernel.body))


def test_a_padding_mask_is_a_test_of_the_indices_not_a_copy():
    """Max pooling's gradient route finds each window's first maximum among the taps inside the
    input: a padded view of a constant True. That view is computed where it is read (a test of the
    indices), never copied into a buffer of its own, as a padded computed value is."""
    x = mg.rand(2, 64, 16, 16, requires_grad=True)
    steps = kernels(F.max_pool2d(x, 3, 2, 1))
    assert not any(p.dtype == mg.bool for s in steps for p in s.kernel.params)
    assert [s.kernel.name[0] for s in steps] == ["e", "r", "r", "r"]     # x padded, max, tap, value


def test_expanding_view_of_an_expensive_value_is_materialised():
    x = mg.rand(2, 3, 16, 16)
    act = (x.exp() + 1).log().sqrt()
    steps = kernels(F.conv2d(act, mg.rand(4, 3, 3, 3), padding=1))
    assert len(steps) == 2       # the activation once, then the conv reads it
    small = (mg.rand(2, 3, 4, 4).exp() + 1).log().sqrt()
    assert len(kernels(F.conv2d(small, mg.rand(4, 3, 3, 3), padding=1))) == 1   # cheaper to recompute


def test_mlp_training_step_kernel_count():
    """A 2-layer MLP step (forward, cross-entropy, backward, SGD update of 4 parameters): 14 kernels.

    Forward 2: the hidden layer (matmul + bias, relu inlined into its readers) and the logits.
    Loss 5: row max, sum of exponentials, the target index as a column (an index tensor is
    materialised), the count of counted targets, the loss.
    Backward 3: the scatter back through the target gather, d loss / d logits (computing the row
    sum of the softmax gradient per row first), d loss / d hidden (a matmul).
    Updates 4: each parameter's gradient reduction with `p - lr * grad` fused in as its epilogue."""
    mg.manual_seed(0)
    x, y = mg.rand(8, 5), mg.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    w1, b1 = mg.rand(6, 5, requires_grad=True), mg.rand(6, requires_grad=True)
    w2, b2 = mg.rand(3, 6, requires_grad=True), mg.rand(3, requires_grad=True)
    params = [w1, b1, w2, b2]
    loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), y)
    grads = mg.grad(loss, params)
    with mg.no_grad():
        updated = [p - g * 0.1 for p, g in zip(params, grads)]
    steps = kernels(loss, *updated)
    assert len(steps) == MLP_STEP_KERNELS, [s.kernel.name for s in steps]


MLP_STEP_KERNELS = 14


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_profile_reports_launches_compiles_and_memory(backend):
    needs(backend)
    mg.set_backend(backend)
    x = mg.rand(256, 256)
    with mg.profile() as prof:
        (x @ x).sum().item()
    assert prof.launches == 2 and len(prof.kernels) == 2
    assert prof.compiles + prof.cache_hits == 2
    assert prof.peak_bytes >= 256 * 256 * 4
    kernel = prof.kernels[0]
    assert kernel.calls == 1 and kernel.seconds > 0 and kernel.name + "(" in kernel.source
    assert kernel.name in prof.table()


def test_a_realised_constant_stays_a_constant_in_later_kernels():
    """Constants are shared nodes: reading one must not turn it into a kernel input elsewhere."""
    from metagraph.ops import math as m
    mg.Tensor(m.const(0.0, (64,), mg.float32)).numpy()     # the shared node relu compares with
    x = mg.rand(64)
    (step,) = kernels(F.relu(x))
    assert len(step.kernel.params) == 2            # the output and x: the 0 is a literal


def test_a_sum_of_many_reductions_is_scheduled_without_a_restart_per_reduction(monkeypatch):
    """A kernel reads at most one fused reduction; the others are refused all at once (refusing
    them one by one relowered every kernel each time: a gradient norm over 200 tensors took 2.2 s
    to schedule)."""
    from metagraph.compiler import lower
    calls = []
    steps = lower._steps
    monkeypatch.setattr(lower, "_steps", lambda *args: calls.append(1) or steps(*args))
    total = sum((p * p).sum() for p in [mg.rand(5 + k) for k in range(50)]).sqrt()
    assert len(kernels(total)) == 50
    assert len(calls) <= 3
