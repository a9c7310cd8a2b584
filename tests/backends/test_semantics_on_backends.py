"""The edge semantics of tests/ops/test_semantics.py where a backend computes them: bounds checks
in gradients, sin and cos at large arguments, pow's special values, exact rounded division."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from tests.backends.conftest import BACKENDS
from tests.ops.test_semantics import _division_operands, _pow_pairs, assert_same

CHECKED_READS = {
    "embedding": lambda w, i: F.embedding(i, w),
    "gather": lambda w, i: w.gather(0, mg.stack([i, i], dim=1)),
    "getitem": lambda w, i: w[i],
    "index_select": lambda w, i: w.index_select(0, i),
    "index_add": lambda w, i: mg.zeros((4, 3), dtype=w.dtype).index_add(0, i, w[:2]),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("name", sorted(CHECKED_READS))
def test_an_index_out_of_range_raises_in_the_gradient_too(backend, name):
    """Only the gradient is computed, never the forward value that would have raised."""
    w = mg.tensor(np.ones((4, 3)), requires_grad=True)
    CHECKED_READS[name](w, mg.tensor([1, 100])).sum().backward()
    with pytest.raises(mg.IndexOutOfRange, match="out of bounds"):
        w.grad.numpy()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype, atol", [(np.float64, 2e-15), (np.float32, 2e-7)])
def test_sin_and_cos_reduce_large_arguments_exactly_and_cos_is_even(backend, dtype, atol):
    x = np.concatenate([np.linspace(-1e6, 1e6, 257), [1e7, 123456.789, 1e10, 1e20, 3e30, np.pi / 2]])
    x = x.astype(dtype)
    exact = x.astype(np.float64)
    t = mg.tensor(x, requires_grad=True)
    sin, cos, cos_negated = mg.sin(t), mg.cos(t), mg.cos(-t)
    d_sin, = mg.grad(sin.sum(), [t], retain_graph=True)
    d_cos, = mg.grad(cos.sum(), [t])
    mg.sync(sin, cos, cos_negated, d_sin, d_cos)
    for got, want in ((sin, np.sin(exact)), (cos, np.cos(exact)), (d_sin, np.cos(exact)),
                      (d_cos, -np.sin(exact))):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=atol)
    np.testing.assert_array_equal(cos.numpy(), cos_negated.numpy())


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_pow_special_values_and_gradients(backend, dtype, rtol):
    torch = pytest.importorskip("torch")
    x, e = _pow_pairs(dtype)
    ours = [mg.tensor(x, requires_grad=True), mg.tensor(e, requires_grad=True)]
    theirs = [torch.tensor(x, requires_grad=True), torch.tensor(e, requires_grad=True)]
    y = ours[0] ** ours[1]
    grads = mg.grad(y.sum(), ours)
    mg.sync(y, *grads)
    (theirs[0] ** theirs[1]).sum().backward()
    assert_same(y.numpy(), (torch.tensor(x) ** torch.tensor(e)).numpy(), rtol)
    for grad, t in zip(grads, theirs):
        assert_same(grad.numpy(), t.grad.numpy(), rtol)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rounded_division_is_exact(backend, dtype):
    """Dekker's exact product needs each operation rounded once (no contraction into FMA)."""
    torch = pytest.importorskip("torch")
    a, b = _division_operands(dtype)
    ours, ta, tb = [mg.tensor(a), mg.tensor(b)], torch.tensor(a), torch.tensor(b)
    results = [mg.div(*ours, rounding_mode="floor"), mg.div(*ours, rounding_mode="trunc"),
               mg.remainder(*ours)]
    mg.sync(*results)
    wants = [torch.div(ta, tb, rounding_mode="floor"), torch.div(ta, tb, rounding_mode="trunc"),
             torch.remainder(ta, tb)]
    for got, want in zip(results, wants):
        assert_same(got.numpy(), want.numpy(), 0)
