"""Software prefetches (compiler/prefetch.py): which lines a reduction loop fetches ahead, and that the
C and LLVM code generators emit them without changing a value."""
import numpy as np
import pytest

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
