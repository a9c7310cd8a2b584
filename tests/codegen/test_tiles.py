"""The tile planning pass (compiler/tiles.py) that scratchpad targets render: its valid-lane
intervals and strides against brute force, its plans of random graphs (checked for what a target
relies on, and run on the `bang` backend against the numpy oracle), and its tile sizing."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph.codegen import bang_ops
from metagraph.codegen.interpreter import evaluate
from metagraph.compiler import ir, tiles
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import schedule
from metagraph.expr import Binary, Const, Var
from tests.backends.conftest import against_oracle
from tests.backends.test_random_graphs import _graph
from tests.helpers import needs

SETTINGS = settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
                    derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TILE_VAR, OTHER = 1, 0                       # the tiled loop's variable, and one that is not
EXTENTS = {TILE_VAR: 40, OTHER: 6, tiles.LANES.axis: 41}



def _affine(rng):
    """a * tile variable + b * other variable + c."""
    a, b, c = rng.integers(-3, 4), rng.integers(-2, 3), rng.integers(-12, 13)
    return Var(TILE_VAR) * int(a) + Var(OTHER) * int(b) + int(c)


def _value(expr, tile_var, other, lanes=0):
    loop = {TILE_VAR: np.asarray(tile_var, np.int64), OTHER: np.int64(other),
            tiles.LANES.axis: np.int64(lanes)}
    return evaluate(expr, loop, [], None)


def test_an_interval_holds_exactly_on_the_lanes_where_its_condition_does():
    rng = np.random.default_rng(0)
    for _ in range(2000):       # conjunctions of one to three affine comparisons, at random tiles
        cond = None
        for _ in range(rng.integers(1, 4)):
            part = Binary(str(rng.choice(["<", "<="])), _affine(rng), _affine(rng))
            cond = part if cond is None else Binary("&&", cond, part)
        start, lanes, other = (int(rng.integers(0, 31)), int(rng.integers(1, 11)), int(rng.integers(0, 6)))
        bounds = tiles.interval(cond, TILE_VAR, EXTENTS)
        first, end = (int(_value(bound, start, other, lanes)) for bound in bounds)
        holds = _value(cond, start + np.arange(lanes), other) != 0
        lane = np.arange(lanes)
        assert np.array_equal(holds, (lane >= first) & (lane < end)), (str(cond), start, lanes, first, end)


def test_a_condition_that_is_not_affine_in_the_tile_has_no_interval():
    cond = Binary("<", Var(TILE_VAR) % 3, Const(1))
    assert tiles.interval(cond, TILE_VAR, EXTENTS) is None
    assert tiles.interval(Binary("==", Var(TILE_VAR), Const(1)), TILE_VAR, EXTENTS) is None


def test_a_stride_is_the_step_between_lanes():
    rng = np.random.default_rng(1)
    for _ in range(500):
        expr = _affine(rng) * int(rng.integers(1, 5)) - _affine(rng)
        at = int(rng.integers(0, 31))
        assert tiles.stride(expr, TILE_VAR) == int(_value(expr, at + 1, 2) - _value(expr, at, 2)), str(expr)
    assert tiles.stride(Var(TILE_VAR) // 2 + Var(OTHER), TILE_VAR) is None
    assert tiles.stride(Var(OTHER) * 3 + 1, TILE_VAR) == 0


def _kernels(out):
    return [step.kernel for step in schedule(pending_graph([out])) if step.kernel is not None]


def _check_plan(kernel, capacity):
    """What a target relies on: tiled loops are innermost; every buffer a step names is the plan's,
    and a per-lane one is written before it is read; accumulator slices are of accumulators; the
    tile fits the scratchpad (or the plan says that a single lane does not)."""
    plan = tiles.Plan(kernel, frozenset(bang_ops.WITH_SCALAR), bang_ops.fused)
    declared = set(plan.buffers)
    for loop in tiles.loops(kernel.body):
        if plan.program(loop) is None:
            continue
        assert tiles.tileable(loop)
        for steps in plan.program(loop):
            written = set()         # a per-lane buffer is read only after a step of its statement wrote it
            for step in steps:
                for key, operand in step.operands.items():
                    for part in operand if key == "args" else [operand]:
                        if isinstance(part, tiles.Buffer):
                            assert part in declared, (step.kind, part)
                            assert key == "out" or part.size is not None or part in written, (step.kind, part)
                        if isinstance(part, tiles.Slice):
                            assert part.name in plan.accumulators
                written.add(step.operands.get("out"))
    single = sum(b.dtype.itemsize * (b.size or 1) for b in plan.buffers)
    if single > capacity:
        with pytest.raises(mg.MetagraphError, match="for a single lane"):
            plan.lanes(capacity)
        return
    tile = plan.lanes(capacity)
    used = sum(b.dtype.itemsize * (b.size or tile) for b in plan.buffers)
    assert used <= capacity and (tile % tiles.ALIGN == 0 or tile < tiles.ALIGN)


@settings(SETTINGS, max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)))
@given(data=st.data())
def test_random_graphs_plan_what_a_target_relies_on_and_run_on_bang_as_on_the_oracle(data):
    needs("bang")
    out, _ = _graph(data)
    for kernel in _kernels(out):
        _check_plan(kernel, data.draw(st.sampled_from([2048, mg.flags.BANG_NRAM]), label="capacity"))
    mg.set_backend("bang")
    against_oracle(mg.backend._instance("bang"), [out])


def test_a_padded_read_copies_its_valid_lanes_and_a_gather_is_only_for_other_addresses():
    x = mg.rand(1, 2, 9, 9)
    conv = mg.nn.functional.conv2d(x, mg.rand(3, 2, 3, 3), padding=1)
    steps = [step for kernel in _kernels(conv.node) for program in tiles.Plan(kernel).programs.values()
             for statement in program for step in statement]
    kinds = {step.kind for step in steps}
    assert "copy_in" in kinds and "gather" not in kinds and "offsets" not in kinds
    assert any(step.kind == "copy_in" and step.operands["lanes"] is not None for step in steps)
    picked = mg.rand(10)[mg.tensor(np.array([3, 1, 4, 1, 5]))]       # addresses read from a tensor
    kinds = {step.kind for kernel in _kernels(picked.node) for program in tiles.Plan(kernel).programs.values()
             for statement in program for step in statement}
    assert "gather" in kinds and "offsets" in kinds


def test_a_tile_is_sized_to_the_scratchpad():
    kernel = _kernels((mg.rand(4, 1000) * 2 + 1).node)[-1]
    plan = tiles.Plan(kernel)
    per_lane = sum(b.dtype.itemsize for b in plan.buffers if b.size is None)
    fixed = sum(b.dtype.itemsize * b.size for b in plan.buffers if b.size is not None)
    assert plan.lanes(10 ** 9) == -(-plan.extent // tiles.ALIGN) * tiles.ALIGN     # the loop, rounded up
    lanes = plan.lanes(fixed + per_lane * 300)
    assert lanes == 256 and lanes * per_lane + fixed <= fixed + per_lane * 300
    assert plan.lanes(fixed + per_lane * 5) == 5                        # below ALIGN: whatever fits
    with pytest.raises(mg.MetagraphError, match=r"bang: kernel \w+ needs \d+ bytes of NRAM for a single"):
        plan.lanes(fixed + per_lane - 1)


def test_each_scalar_load_moves_through_a_slot_of_its_own():
    a, b = mg.rand(8, 16), mg.rand(16, 12)
    kernel = _kernels((a @ b).node)[-1]
    plan = tiles.Plan(kernel, frozenset(bang_ops.WITH_SCALAR), bang_ops.fused)
    scalars = [step.operands["value"] for program in plan.programs.values() for steps in program
               for step in steps if step.kind == "scalar"]
    loads = [v for value in scalars for v in ir.values(value) if isinstance(v, ir.Load)]
    assert loads and len({plan.slot(load).name for load in loads}) == len(loads)
    assert all(plan.slot(load).size == 1 and plan.slot(load) in plan.buffers for load in loads)


def test_a_scalar_form_takes_a_left_scalar_only_where_the_op_commutes():
    """A target with a scalar form of pow: 2 ** x must not become x ** 2 (the scalar is spread over
    a buffer instead); 2 * x may take the scalar form, mul commuting."""
    x = mg.rand(64)
    for expr, op, scalar_form in ((2.0 ** x, "pow", False), (2.0 * x, "mul", True)):
        plan = tiles.Plan(_kernels(expr.node)[-1], frozenset({"pow", "mul"}))
        (step,) = [step for program in plan.programs.values() for steps in program for step in steps
                   if step.kind == "compute" and step.operands["op"] == op]
        assert step.operands["scalar"] == scalar_form
