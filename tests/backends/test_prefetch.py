"""Software prefetches (compiler/prefetch.py): which lines a reduction loop fetches ahead, and that the
C and LLVM code generators emit them without changing a value."""
import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metagraph as mg
import metagraph.nn.functional as F
from metagraph import dtypes
from metagraph.codegen import c, llvm
from metagraph.compiler import ir, prefetch
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.expr import Binary, Var
from metagraph.ops.autograd import gradients
from tests.backends.conftest import BACKENDS, against_oracle

F32 = dtypes.float32
PARAMS = [ir.Param("out", F32, (64,), True), ir.Param("w", F32, (64 * 2304,), False),
          ir.Param("x", F32, (4096,), False)]


def _reduction(*values):
    """A reduction loop (variable 1, 64 iterations) around a 2-iteration loop (variable 2) that adds
    the product of `values`."""
    product = ir.Apply("mul", tuple(values), F32) if len(values) > 1 else values[0]
    inner = ir.Loop(2, 2, ir.REDUCE, [ir.Accumulate("acc", "add", product)])
    return ir.Loop(1, 64, ir.REDUCE, [inner])


def _evaluate(expr, env):
    """An index expression's value at the variables `env`."""
    if isinstance(expr, Var):
        return env[expr.axis]
    if hasattr(expr, "op"):
        a, b = _evaluate(expr.a, env), _evaluate(expr.b, env)
        return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b)}[expr.op]
    return expr.value


_LOAD = st.tuples(st.sampled_from([0, 1, 3]),                              # var 0's coefficient
                  st.sampled_from([-2304, -1100, 1, 64, 999, 1024, 2304, 2999]),   # the loop's
                  st.lists(st.integers(-6, 6), min_size=2, max_size=2),      # the inner loops'
                  st.integers(0, 40), st.booleans())                        # constant, guarded


@settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)), deadline=None)
@given(extent=st.integers(6, 30), inner=st.lists(st.integers(1, 9), min_size=2, max_size=2),
       loads=st.lists(_LOAD, min_size=1, max_size=4))
def test_every_fetched_address_is_between_two_the_loop_reads_ahead(extent, inner, loads):
    """Random reduction nests (variable 0 outside, 1 the loop, 2 and 3 inside it; loads with random
    coefficients, some a page or more apart, some guarded): each fetched address, at every
    iteration, lies between the lowest and highest element of its parameter that the iteration
    DISTANCE ahead (or the last) reads. So it is inside the buffer, which LLVM's inbounds needs."""
    values, reads = [], {}
    for k, (c0, c1, (c2, c3), const, guarded) in enumerate(loads):
        terms = {0: c0, 1: c1, 2: c2, 3: c3}
        extents = {0: 3, 1: extent, 2: inner[0], 3: inner[1]}
        low = const + sum(c * (extents[v] - 1) for v, c in terms.items() if c < 0)
        index = Var(0) * c0 + Var(1) * c1 + Var(2) * c2 + Var(3) * c3 + (const - low)     # from 0
        values.append(ir.Load(k, index, F32, valid=Binary("<", Var(2), 5) if guarded else None))
        reads[k] = (index, extents)
    params = [ir.Param(f"p{k}", F32, (10 ** 6,), False) for k in range(len(loads))]
    product = values[0] if len(values) == 1 else ir.Apply("mul", tuple(values), F32)
    loop = ir.Loop(1, extent, ir.REDUCE, [ir.Loop(2, inner[0], ir.REDUCE, [ir.Loop(3, inner[1], ir.REDUCE, [
        ir.Accumulate("acc", "add", product)])])])
    for param, index in prefetch.ahead(loop, params):
        read, extents = reads[param]
        for v0, i in itertools.product(range(3), range(extent)):
            later = min(i + prefetch.DISTANCE, extent - 1)
            touched = [_evaluate(read, {0: v0, 1: later, 2: a, 3: b})
                       for a, b in itertools.product(range(extents[2]), range(extents[3]))]
            assert min(touched) <= _evaluate(index, {0: v0, 1: i}) <= max(touched)


def test_a_load_a_page_apart_per_iteration_is_fetched_ahead_over_the_loops_inside():
    # w[i1 * 2304 - 3 * i2 + 8 ... 40]: 9 KiB apart per iteration, 3 + 33 floats across the taps
    near, far = (ir.Load(1, Var(1) * 2304 - Var(2) * 3 + k, F32) for k in (8, 40))
    fetches = prefetch.ahead(_reduction(near, far), PARAMS)
    assert {param for param, _ in fetches} == {1}
    for i1, ahead in [(0, 4), (59, 63), (63, 63)]:     # DISTANCE ahead, the last iteration at the end
        addresses = sorted(_evaluate(index, {1: i1}) for _, index in fetches)
        assert addresses[0] == ahead * 2304 + 5 and addresses[-1] == ahead * 2304 + 40
        assert all(b - a <= 16 for a, b in zip(addresses, addresses[1:]))     # every line between


def test_a_group_may_span_a_line_per_iteration_of_the_loops_inside():
    # a weight gradient's plane: 8x8 inner iterations read 78 floats (5 lines) 25 KiB apart
    plane = ir.Load(1, Var(1) * 6400 + Var(2) * 10 + Var(3), F32)
    loop = ir.Loop(1, 32, ir.REDUCE, [ir.Loop(2, 8, ir.REDUCE, [ir.Loop(3, 8, ir.REDUCE, [
        ir.Accumulate("acc", "add", plane)])])])
    params = [PARAMS[0], ir.Param("x", F32, (32 * 6400,), False)]
    assert len(prefetch.ahead(loop, params)) == 6     # offsets 0, 16, ..., 64 and the last, 77


def test_no_more_than_lines_most_and_no_short_loop():
    # 64 inner iterations reading 20 lines 25 KiB apart: more than LINES_MOST, not fetched
    wide = ir.Load(1, Var(1) * 6400 + Var(2) * 40 + Var(3), F32)
    params = [PARAMS[0], ir.Param("x", F32, (32 * 6400,), False)]

    def loop(extent):
        return ir.Loop(1, extent, ir.REDUCE, [ir.Loop(2, 8, ir.REDUCE, [ir.Loop(3, 8, ir.REDUCE, [
            ir.Accumulate("acc", "add", wide)])])])
    assert prefetch.ahead(loop(32), params) == []
    narrow = ir.Load(1, Var(1) * 6400, F32)
    assert prefetch.ahead(ir.Loop(1, 2 * prefetch.DISTANCE, ir.REDUCE, [ir.Accumulate("acc", "add", narrow)]),
                          params) == []       # a loop this short has nothing to fetch ahead for


@pytest.mark.parametrize("load", [ir.Load(2, Var(1) * 64, F32),                      # 256 bytes apart
                                  ir.Load(1, Var(1) * 2304, F32, valid=Binary("<", Var(1), 60)),  # guarded
                                  ir.Load(1, Var(1) * 2304 + Var(2) * 1000, F32)])    # 63 lines wide
def test_near_guarded_or_wide_loads_are_not_fetched(load):
    assert prefetch.ahead(_reduction(load), PARAMS) == []


def _input_gradient(channels):
    """The input gradient of a 3x3 conv over 2x2 planes, bs16, `channels` in and out (the batch along
    the vector: channel tiles), whose weights are read channels * 9 floats apart along the output
    channels it sums (at 16 channels, 576 bytes: not fetched)."""
    rng = np.random.default_rng(0)
    x = mg.tensor(rng.standard_normal((16, channels, 2, 2)).astype(np.float32), requires_grad=True)
    w = mg.tensor(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), requires_grad=True)
    out = F.conv2d(x, w, padding=1)
    seed = mg.tensor(rng.standard_normal(out.shape).astype(np.float32)).node
    return gradients([out.node], [seed])[x.node.id]


def test_c_and_llvm_emit_the_prefetches_of_a_conv_input_gradient():
    kernels = [step.kernel for step in schedule(pending_graph([_input_gradient(128)]))]
    assert "__builtin_prefetch" in c.render(kernels)
    assert "call void @llvm.prefetch.p0" in llvm.render(kernels)
    narrow = [step.kernel for step in schedule(pending_graph([_input_gradient(16)]))]
    assert "__builtin_prefetch" not in c.render(narrow)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_gradient_with_prefetches_matches_the_oracle(backend):
    against_oracle(backend, [_input_gradient(128)])
