"""Contractions keep their register tile: a transposed operand (x @ w.T, q @ k.T) is read from a
packed panel, and a projection read through a head-split permute is not fused into the permute as
one dot product per element (the cost rule in compiler/rows.py, stated in compiler/fusion.py)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.compiler import ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from tests.backends.conftest import BACKENDS, against_oracle, backend  # noqa: F401


def _steps(*tensors):
    return schedule(pending_graph([t.node for t in tensors]))


def _statements(statements):
    for s in statements:
        yield s
        if isinstance(s, ir.Loop):
            yield from _statements(s.body)


def _register_tiled(step):
    """Whether a kernel accumulates a block of outputs in a local array, reading a packed panel."""
    defines = {s.name: s for s in _statements(step.kernel.body) if isinstance(s, ir.Define)}
    return "acc" in defines and defines["acc"].size is not None and "pack" in defines


@pytest.mark.parametrize("batch", [(), (3,), (2, 5)])
def test_a_linear_layer_reads_its_weight_from_a_transposed_panel(batch):
    x, w = mg.rand(*batch, 48, 96), mg.rand(64, 96)
    (step,) = _steps(F.linear(x, w))
    assert _register_tiled(step)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_panel_nothing_reuses_is_not_copied(rows):
    """At batch 1 a linear layer reads each weight once: copying the weight into a panel cost
    more than the product (AlexNet's 9216 -> 4096 layer: 32 ms, 7.8 as dot products)."""
    (step,) = _steps(F.linear(mg.rand(rows, 96), mg.rand(64, 96)))
    assert not _register_tiled(step)


def test_attention_scores_read_the_keys_from_a_panel_per_head():
    q, k = mg.rand(2, 4, 32, 16), mg.rand(2, 4, 32, 16)
    (step,) = _steps(q @ k.transpose(-1, -2))
    assert _register_tiled(step)


def test_a_projection_before_a_head_split_stays_a_tiled_kernel():
    """h @ W.T + b, reshaped to heads and permuted: the contraction is its own register-tiled
    kernel and the permute a copy, not one dot product per element of the permuted output."""
    h, w, b = mg.rand(2, 16, 64), mg.rand(64, 64), mg.rand(64)
    heads = F.linear(h, w, b).reshape(2, 16, 4, 16).permute(0, 2, 1, 3)
    steps = _steps(heads)
    assert len(steps) == 2
    assert any(_register_tiled(step) for step in steps)


def test_a_short_reduction_per_element_still_fuses_into_its_reader():
    x = mg.rand(6, 5, 3)
    assert len(_steps(x.sum(-1).permute(1, 0) * 2.0)) == 1


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 40), k=st.integers(1, 70),
       n=st.sampled_from([1, 3, 16, 32, 48, 64, 80, 96]), bias=st.booleans(), seed=st.integers(0, 9))
def test_transposed_contractions_match_the_oracle(backend, batch, m, k, n, bias, seed):
    rng = np.random.default_rng(seed)
    x = mg.tensor(rng.standard_normal((*batch, m, k)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((n, k)).astype(np.float32))
    b = mg.tensor(rng.standard_normal(n).astype(np.float32)) if bias else None
    y = F.linear(x, w, b)
    heads = y.reshape(*batch, m, 1, n).permute(*range(len(batch)), len(batch) + 1, len(batch),
                                               len(batch) + 2)
    against_oracle(backend, [y.node, heads.node])
