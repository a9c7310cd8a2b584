"""The opencl backend's float sums in lanes: where 16 lanes divide the reduction, the loop is blocks
of 16 iterations, one a lane (PoCL vectorises that inner loop and the math in it); elsewhere the
iteration modulo 16 picks the lane. Either way each lane sums the same terms in the same order."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from tests.helpers import needs


@pytest.mark.parametrize("width, blocked", [(1024, True), (1000, False), (48, True)])
def test_a_row_sum_is_blocks_of_lanes_where_the_lanes_divide_the_row(width, blocked):
    needs("opencl")
    from metagraph.codegen import opencl
    from metagraph.runtime.opencl import Device
    data = np.random.default_rng(width).standard_normal((8, width)).astype(np.float32)
    total = mg.tensor(data).sum(1)
    source = opencl.render([step.kernel for step in schedule(pending_graph([total.node]))], Device())
    assert ("_lane < 16; " in source) == blocked
    assert ("& 15]" in source) == (not blocked)
    got = mg.backend._instance("opencl").realize([total.node])[0]
    np.testing.assert_allclose(np.asarray(got, np.float64), data.astype(np.float64).sum(1), rtol=1e-5,
                               atol=1e-5)
