"""Golden generated sources: what the C backend emits for a few kernels, read by a person.

Regenerate after an intended change with METAGRAPH_UPDATE_GOLDEN=1 and review the diff."""

import os

import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen.c import render
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _sources(*tensors):
    """The generated kernel functions (without the file's shared header of helpers)."""
    source = render([step.kernel for step in schedule(pending_graph([t.node for t in tensors]))])
    return source[source.index("\nvoid ") + 1:]


def _fused_chain():
    x = mg.rand(64)
    return F.relu(x * 1.5 + 0.5) * F.sigmoid(x)


CASES = {
    "elementwise_chain": _fused_chain,
    "row_sum": lambda: mg.rand(8, 33).sum(1),
    "matmul": lambda: mg.rand(4, 6) @ mg.rand(6, 9),
    "conv_bias_relu": lambda: F.relu(
        F.conv2d(mg.rand(2, 3, 6, 6), mg.rand(4, 3, 3, 3), padding=1) + mg.rand(4)[:, None, None]
    ),
    "scatter": lambda: mg.rand(5, 3).reindex_reduce("add", [3, 3], ["i0 // 2", "i1"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_source_matches_golden(name):
    source = _sources(CASES[name]())
    path = os.path.join(GOLDEN, name + ".c")
    if os.environ.get("METAGRAPH_UPDATE_GOLDEN"):
        with open(path, "w") as stream:
            stream.write(source)
    with open(path) as stream:
        assert source == stream.read(), f"generated source for {name} changed; see {path}"


def test_golden_matmul_runs_i_k_j_without_division():
    source = _sources(CASES["matmul"]())
    body = source.split("void ", 1)[1]
    assert (
        "float acc[9] __attribute__((aligned(64)));" in body
        and "acc[i1] += " in body
        and "/" not in body
        and "%" not in body
    )
