"""Golden generated sources: what the C and bang backends emit for a few kernels, read by a person.

Regenerate after an intended change with METAGRAPH_UPDATE_GOLDEN=1 and review the diff."""

import os
import re

import numpy as np
import pytest

import metagraph as mg
import metagraph.nn.functional as F
from metagraph.codegen import bang, c
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _sources(*tensors, backend="c"):
    """The generated kernel functions (without the file's shared header of helpers)."""
    kernels = [step.kernel for step in schedule(pending_graph([t.node for t in tensors]))]
    if backend == "bang":
        source = bang.render(kernels)
        return source[source.index(f"\n/* {kernels[0].name}: ") + 1:]
    source = c.render(kernels)
    return source[source.index("\nvoid ") + 1:]


def _fused_chain():
    x = mg.rand(64)
    return F.relu(x * 1.5 + 0.5) * F.sigmoid(x)


def _float16_chain():
    """The chain in float16: on c, values held as bits and converted by integer helpers."""
    def half():
        return mg.tensor(np.linspace(-4, 4, 64), dtype=mg.float16)
    return F.relu(half() * 1.5 + 0.5) * F.sigmoid(half())


CASES = {
    "elementwise_chain": _fused_chain,
    "elementwise_chain_float16": _float16_chain,
    "row_sum": lambda: mg.rand(8, 33).sum(1),
    "matmul": lambda: mg.rand(4, 6) @ mg.rand(6, 9),
    "conv_bias_relu": lambda: F.relu(
        F.conv2d(mg.rand(2, 3, 6, 6), mg.rand(4, 3, 3, 3), padding=1) + mg.rand(4)[:, None, None]
    ),
    "scatter": lambda: mg.rand(5, 3).reindex_reduce("add", [3, 3], ["i0 // 2", "i1"]),
}


@pytest.mark.parametrize("backend", ["c", "bang"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_source_matches_golden(name, backend):
    source = _sources(CASES[name](), backend=backend)
    path = os.path.join(GOLDEN, name + (".c" if backend == "c" else ".bang.c"))
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
        and "acc[i1] = fmaf(t0, t1, acc[i1]);" in body
        and "/" not in body
        and "%" not in body
    )


@pytest.mark.parametrize("name", ["elementwise_chain", "row_sum", "matmul", "conv_bias_relu"])
def test_bang_moves_tiles_through_nram_with_copies_and_vector_intrinsics(name):
    source = _sources(CASES[name](), backend="bang")
    assert "__nram__" in source and "GDRAM2NRAM" in source and "NRAM2GDRAM" in source
    assert re.search(r"__bang_(add|mul|active_relu|maxequal|reduce_sum)\w*\(", source)
    # global memory only through copies: no element of a kernel parameter indexed directly,
    # no per-element gather, and no lane loops at all in these kernels
    assert not re.search(r"\bp\d+\[", source)
    assert "__gather" not in source and "__scatter" not in source and "lane++" not in source


def test_bang_reduces_with_the_reduction_intrinsic_and_pads_by_interval():
    assert "__bang_reduce_sum(" in _sources(CASES["row_sum"](), backend="bang")
    conv = _sources(CASES["conv_bias_relu"](), backend="bang")
    assert "__bang_write_zero(" in conv and "const int64_t lo = " in conv and "__bang_active_relu(" in conv


def test_bang_refuses_a_scratchpad_too_small_for_one_lane():
    kernels = [step.kernel for step in schedule(pending_graph([_fused_chain().node]))]
    with pytest.raises(mg.MetagraphError, match=r"bang: kernel e_64_\w+ needs \d+ bytes of NRAM .* is 16"):
        bang.render(kernels, capacity=16)
    assert "#define TILE 1\n" in bang.render(kernels, capacity=128)     # tiny, but it fits
