"""Long float sums: every code generator blocks them (compiler/cascade.py), so a float32 sum of n
terms has an error that grows like log n, and loops past 2^31 iterations count in 64 bits."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import metagraph as mg
from metagraph.compiler import cascade, ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from tests.backends.conftest import BACKENDS, backend  # noqa: F401
from tests.helpers import needs

COMPILED = [b for b in BACKENDS if b != "numpy"]


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
def test_a_sum_of_ones_past_float32s_step_is_exact(backend):
    # 3e8 is a multiple of float32's unit at that size (32): blocks of 1024 ones add exactly
    assert mg.ones(300_000_000).sum().item() == 300_000_000.0


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
def test_a_sum_of_more_than_two_to_the_31_terms_counts_in_64_bits(backend):
    n = 3 * 10 ** 9
    got = mg.ones(3).reindex([n], ["i0 % 3"]).sum().item()
    assert abs(got - n) <= 2 * np.spacing(np.float32(n))


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
def test_a_sum_of_a_fraction_keeps_float32_precision(backend):
    n = (1 << 24) + 7           # 0.1 is inexact: a plain running sum drifts by percents here
    got = (mg.ones(3) * 0.1).reindex([n], ["i0 % 3"]).sum().item()
    assert abs(got - n * 0.1) / (n * 0.1) < 2e-6


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=2, max_size=4), data=st.data())
@pytest.mark.parametrize("name", COMPILED)
def test_reductions_over_many_terms_match_float64(name, shape, data):
    """Random shapes and axes, scaled so that the reduction runs past a block: the float32 result
    stays within a few units of float32 precision of the exact sum of its terms."""
    needs(name)
    mg.set_backend(name)
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
    reduced = int(np.prod([shape[a] for a in axes]))
    shape[axes[0]] *= -(-3 * cascade.BLOCK // reduced) if reduced < 3 * cascade.BLOCK else 1
    if np.prod(shape) > 4_000_000:
        shape[axes[0]] = max(1, shape[axes[0]] * 4_000_000 // int(np.prod(shape)))
    values = np.random.default_rng(len(shape)).random(shape, dtype=np.float32) + 0.05
    got = mg.tensor(values).sum(dim=tuple(axes)).numpy()
    want = values.astype(np.float64).sum(axis=tuple(axes))
    np.testing.assert_allclose(got, want, rtol=4e-6)


def _terms_per_accumulator(statements, counts=None, depth=1):
    """For each float sum accumulator: the most terms one of its elements collects directly."""
    counts = {} if counts is None else counts
    for s in statements:
        if isinstance(s, ir.Loop):
            _terms_per_accumulator(s.body, counts, depth * (s.extent if s.kind == ir.REDUCE else 1))
        elif isinstance(s, ir.Accumulate) and s.op == "add" and s.value.dtype.is_float:
            counts[s.name] = max(counts.get(s.name, 0), depth)
    return counts


@pytest.mark.parametrize("shape, dim", [((5_000_003,), 0), ((4000, 3000), 1), ((200_000, 24), 0),
                                        ((7, 2000, 9), (0, 1))])
def test_no_accumulator_collects_more_than_a_block(shape, dim):
    """The rewrite's rule, on the kernel IR: each accumulator adds at most BLOCK terms before
    they join the one outside (FAN_IN at the levels above)."""
    x = mg.tensor(np.zeros(shape, np.float32))
    (step,) = schedule(pending_graph([x.sum(dim=dim).node]))
    counts = _terms_per_accumulator(step.kernel.body)
    assert counts and max(counts.values()) <= cascade.BLOCK
