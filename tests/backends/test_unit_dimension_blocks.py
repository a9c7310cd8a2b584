"""A reduction whose output's trailing dimensions are all of one element (a per-channel sum over
1x1 planes, (C, 1, 1)) accumulates the channels as one row block, read contiguously per term, on
every code generator (against the numpy oracle); where the dimensions after the first hold more
than one element, the first stays the parallel loop."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.compiler import ir, rewrites
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from tests.backends.conftest import BACKENDS, against_oracle


def _blocks(node):
    """The sizes of the accumulator arrays of `node`'s one kernel."""
    (step,) = schedule(pending_graph([node]), Target(threads=2))
    return [s.size for s in rewrites.statements_in(step.kernel.body) if isinstance(s, ir.Define)]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_per_channel_sum_over_unit_planes_is_one_row_block(backend):
    rng = np.random.default_rng(0)
    x, y = (mg.tensor(rng.standard_normal((6, 40, 1, 1)).astype(np.float32)) for _ in range(2))
    sums = [(x * y).sum((0, 2, 3), keepdim=True).node, (x * y).sum(0).node]
    for node in sums:
        assert _blocks(node) == [40]
    against_oracle(backend, sums)


def test_a_row_block_after_the_first_dimension_keeps_it_outside():
    rng = np.random.default_rng(1)
    x = mg.tensor(rng.standard_normal((5, 4, 24)).astype(np.float32))
    assert _blocks(x.sum(1, keepdim=True).node) == [24]       # (5, 1, 24): rows of 24, 5 outside
