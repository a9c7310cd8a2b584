"""Row reductions over a contraction (attention's softmax(q @ k^T), a norm after a projection):
each row's max and sum are row prologues that read the contraction's per-element sums, which must
then be computed where those prologues can see them (or materialised). Values and gradients
against the numpy oracle on every backend, over random shapes and row operations."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from tests.backends.conftest import BACKENDS, against_oracle, backend  # noqa: F401

ROW_OPS = {
    "softmax": lambda s: F.softmax(s, dim=-1),
    "log_softmax": lambda s: F.log_softmax(s, dim=-1),
    "normalise": lambda s: (s - s.mean(-1, keepdim=True)) / (s.var(-1, keepdim=True) + 1e-5).sqrt(),
    "softmax_of_scaled": lambda s: F.softmax(s * 0.125 + 1.0, dim=-1),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 9), k=st.integers(1, 9),
       n=st.integers(1, 9), op=st.sampled_from(sorted(ROW_OPS)), seed=st.integers(0, 99))
def test_row_reductions_of_a_contraction(backend, batch, m, k, n, op, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((*batch, m, k), (*batch, k, n)))
    against_oracle(backend, [ROW_OPS[op](mg.tensor(a) @ mg.tensor(b)).node])     # inference
    a, b = mg.tensor(a, requires_grad=True), mg.tensor(b, requires_grad=True)
    y = ROW_OPS[op](a @ b)
    weights = mg.tensor(rng.standard_normal(y.shape).astype(np.float32))
    grads = mg.grad((y * weights).sum(), [a, b])
    against_oracle(backend, [g.node for g in grads])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_attention_forward_and_backward(backend):
    """Scaled dot-product attention over 4 heads, written by hand as a user would."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 4, 6, 8)).astype(np.float32) for _ in range(3)]
    for requires_grad in (False, True):
        q, k, v = (mg.tensor(x, requires_grad=requires_grad) for x in arrays)
        out = F.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v
        grads = mg.grad(out.sum(), [q, k, v]) if requires_grad else []
        against_oracle(backend, [out.node] + [g.node for g in grads])
