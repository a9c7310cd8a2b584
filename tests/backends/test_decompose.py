"""A backend that declares it does not render some table rows still gives the oracle's numbers:
lowering rewrites those rows exactly in terms of the rows it has."""
import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen.c import CBackend
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.ops.table import TABLE
from metagraph.pipeline.realize import Pipeline
from tests.backends.conftest import against_oracle
from tests.helpers import needs
from tests.ops.test_table import ROW_CASES

WITHOUT = {"neg", "max", "mod"}


class PartialC(CBackend):
    """The C backend with three rows left out, as a new chip's first port might."""
    name = "c-partial"
    renders = frozenset(TABLE) - WITHOUT


@pytest.fixture(scope="module")
def partial():
    needs("c")
    return Pipeline(PartialC())


def _ops(value):
    ops = {value.op} if hasattr(value, "op") else set()
    for child in getattr(value, "args", ()) or ():
        ops |= _ops(child)
    if hasattr(value, "value") and not isinstance(value.value, (int, float, bool)):
        ops |= _ops(value.value)
    return ops


def _statement_ops(statements):
    ops = set()
    for s in statements:
        if hasattr(s, "body"):
            ops |= _statement_ops(s.body)
        elif hasattr(s, "value"):
            ops |= _ops(s.value)
    return ops


@pytest.mark.parametrize("name", sorted(WITHOUT))
def test_left_out_rows_are_decomposed_exactly(partial, name):
    fn, _, arrays = ROW_CASES[name]
    out = fn(*[mg.tensor(a) for a in arrays]).node
    steps = schedule(pending_graph([out]), Target(renders=partial.generator.renders))
    kernels = [step.kernel for step in steps]
    assert not _statement_ops(kernels[0].body) & WITHOUT
    against_oracle(partial, [out])


def test_nan_and_ties_survive_the_max_rewrite(partial):
    a = mg.tensor(np.array([1.0, np.nan, 2.0, 0.0, -0.0, np.inf]))
    b = mg.tensor(np.array([np.nan, 1.0, 2.0, -0.0, 0.0, 1.0]))
    against_oracle(partial, [a.maximum(b).node, (a.maximum(b).sum()).node, F.max_pool2d(
        mg.rand(1, 2, 4, 4), 2).node])


def test_a_row_without_a_decomposition_is_a_clear_error():
    class NoSin(PartialC):
        renders = frozenset(TABLE) - {"sin"}
    needs("c")
    with pytest.raises(mg.MetagraphError, match=r"not render the table op 'sin'.*no exact decomposition"):
        Pipeline(NoSin()).realize([mg.rand(3).sin().node])
