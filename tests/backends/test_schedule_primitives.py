"""A reduction's schedule is a list of primitive applications (compiler/blocks.py, schedule.py):
random legal lists applied to the plain nests of random reductions keep every value on every code
generator (against the numpy oracle); the heuristic's list replays to the same kernel and survives
its text; and each primitive refuses what is not legal."""
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph.compiler import blocks, ir, packing, planes, schedule
from metagraph.compiler.access import VECTOR_BYTES, loop_variables, reads_flat
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.heuristic import Heuristic
from metagraph.compiler.lower import Target, schedule as lowered
from metagraph.compiler.simplify import value_range
from metagraph.expr import Var
from metagraph.ops.linalg import matmul
from metagraph.pipeline import stored
from tests.backends.conftest import BACKENDS, against_oracle
from tests.backends.test_block_choice import _reduction
from tests.backends.test_rewrites import _contraction

COMPILED = [name for name in BACKENDS if name != "numpy"]
SETTINGS = settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)), deadline=None,
                    derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
LOCAL_MAX = 4096        # elements a random block or pack may hold


def _divisors(n):
    return [f for f in range(2, n) if n % f == 0]


def _moves(heuristic):
    """(primitive, arguments) of legal applications to the heuristic's nest as it is now."""
    s = heuristic.s
    nest, extents = blocks.Nest(s.body), s.extents
    chain = [loop.var for loop in nest.chain]
    for var in chain:
        yield from (("split", (var, f)) for f in _divisors(extents[var])[:3])
    if len(chain) > 1 and not any(nest.keeps[1:]):
        yield "reorder", (tuple(chain[1:] + chain[:1]),)
        yield "reorder", (tuple(reversed(chain)),)
    if not nest.block:
        for k in range(1, len(chain) + 1):
            fits = math.prod(extents[v] for v in chain[-k:]) <= LOCAL_MAX
            if fits and not any(nest.keeps[len(chain) - k + 1:]):
                yield "block", (tuple(chain[-k:]),)
    else:
        for var in chain:
            yield from (("jam", (var, rows)) for rows in (2, 3, 4, 5)     # (clamped where they do not divide)
                        if rows < extents[var] and nest.define.size * rows <= LOCAL_MAX)
        yield from _round_ups(heuristic, nest)
        yield from _flattened_planes(nest, chain, extents)
    if not any(isinstance(d, ir.Define) and d.name == packing.PACK for d in ir.statements(s.body)):
        yield from _packs(nest, chain, extents)
    loops = [loop.var for loop in nest.reductions]
    value = nest.accumulations[0].value
    for outer, inner in zip(loops, loops[1:]):
        if all(reads_flat(e, outer, inner, extents[inner])
               for v in ir.values(value) for e in ir.index_expressions(v)):
            yield "merge", (outer, inner)
    units = tuple(v for v in loops if extents[v] == 1)
    if units and len(units) < len(loops):
        yield "drop_units", (units,)


def _packs(nest, chain, extents):
    value = nest.accumulations[0].value
    for load in {id(v): v for v in ir.loads(value)}.values():
        used = loop_variables(load)
        same = [v for v in {id(x): x for x in ir.loads(value)}.values() if v.param == load.param]
        ordinal = same.index(load)
        for depth, at in enumerate([None] + chain):
            inside = chain[depth:] + [loop.var for loop in nest.reductions + nest.accumulating]
            if used - set(inside) - set(chain[:depth]):
                continue
            loops = tuple((v, extents[v]) for v in inside if v in used)
            if loops and math.prod(e for _, e in loops) <= LOCAL_MAX:
                yield "pack", (load.param, ordinal, at, loops, ())


def _round_ups(heuristic, nest):
    """A one-loop block rounded up to whole vectors where every read stays readable."""
    if heuristic.readable is None or len(nest.block) != 1 or len(nest.accumulations) != 1:
        return
    (var,) = nest.block
    lanes = VECTOR_BYTES // heuristic.itemsize
    rounded = -(-heuristic.extents[var] // lanes) * lanes
    if rounded == heuristic.extents[var]:
        return
    extents = {**heuristic.extents, var: rounded}
    for v in ir.values(nest.accumulations[0].value):
        if isinstance(v, ir.Load):
            low, high = value_range(v.index, extents)
            guarded = v.valid is not None and var in loop_variables(v)
            if guarded or low < 0 or high >= heuristic.readable[v.param]:
                return
        elif var in loop_variables(v) or getattr(v, "site", None) is not None:
            return
    yield "round_up", (var, rounded)


def _flattened_planes(nest, chain, extents):
    if len(nest.block) != 1 or not chain or len(nest.accumulations) != 1:
        return
    a, (b,) = chain[-1], nest.block
    pitch = planes.plane_pitch(nest.accumulations[0].value, a, b)
    if pitch is not None and pitch >= extents[b]:
        yield from (("flatten_plane", (a, b, pitch, rows)) for rows in _divisors(extents[a]) + [extents[a]]
                    if ((rows - 1) * pitch + extents[b]) <= LOCAL_MAX)


def _random_schedules(choices):
    """A stand-in for Heuristic.schedule applying primitives picked by `choices` (drawn beforehand:
    which kernels are lowered depends on caches, which hypothesis must not see) among the
    candidates above; one its primitive refuses (a packed copy in the way) is skipped: every
    application a primitive accepts must keep the values."""
    def schedule(self):
        for choice in choices:
            moves = list(_moves(self))
            if not moves:
                break
            trial = self.s.copy()
            try:
                trial.apply(*_pick(moves, choice))
            except ValueError:
                continue
            self.s.adopt(trial)
    return schedule


def _pick(moves, choice):
    """A primitive picked evenly among those with candidates, then one of its candidates."""
    kinds = sorted({primitive for primitive, _ in moves})
    kind = kinds[choice % len(kinds)]
    candidates = [arguments for primitive, arguments in moves if primitive == kind]
    return (kind, *candidates[choice // len(kinds) % len(candidates)])


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
@SETTINGS
@given(data=st.data())
def test_random_schedules_keep_the_values(backend, data, monkeypatch):
    choices = data.draw(st.lists(st.integers(0, 2 ** 20), min_size=1, max_size=6), label="primitives")
    out = _reduction(data) if data.draw(st.booleans(), label="conv or matmul") else _contraction(data)
    monkeypatch.setattr(Heuristic, "schedule", _random_schedules(choices))
    backend.schedules.clear()           # lower this graph again, whatever was cached for it
    monkeypatch.setattr(stored, "MIN_NODES", math.inf)      # in memory or on disk
    against_oracle(backend, [out])


@settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)), deadline=None,
          derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_heuristic_schedule_replays_to_the_same_kernels(data):
    made = _reduction(data) if data.draw(st.booleans(), label="kind") else _contraction(data)
    graph = pending_graph([made])
    for step in lowered(graph, Target(slack=64)):
        if step.reduction_schedule:
            steps = schedule.parsed(schedule.text(step.reduction_schedule))
            assert steps == list(step.reduction_schedule)
            (again,) = [other for other in lowered(graph, Target(slack=64, steps=tuple(steps)))
                        if other.positions == step.positions]
            assert again.name == step.name


def _plain(m=8, k=6, n=32):
    """A matmul's plain nest (its steps applied by hand below) and its lowering's extents."""
    rng = np.random.default_rng(0)
    product = matmul(mg.tensor(rng.standard_normal((m, k)).astype(np.float32)).node,
                     mg.tensor(rng.standard_normal((k, n)).astype(np.float32)).node)
    captured = {}

    def capture(self):
        captured.update(body=self.s.body, extents=dict(self.s.extents))
    original = Heuristic.schedule
    Heuristic.schedule = capture
    try:
        lowered(pending_graph([product]), Target())
    finally:
        Heuristic.schedule = original
    return captured["body"], captured["extents"]


def test_the_primitives_build_a_register_tile_and_a_pack():
    body, extents = _plain()
    steps = [schedule.Rewrite("block", ((1,),)), schedule.Rewrite("jam", (0, 4)),
             schedule.Rewrite("pack", (2, 0, 0, ((2, 6), (1, 32)), ()))]
    body = schedule.applied(body, extents, steps)
    nest = blocks.Nest(body)
    assert nest.block == [1] and nest.define.size == 4 * 32 and len(nest.accumulations) == 4
    assert [loop.var for loop in nest.chain] == [0] and extents[0] == 2
    assert [s.name for s in nest.chain[0].body if isinstance(s, ir.Define)] == [packing.PACK, blocks.ACC]


def test_rows_that_do_not_divide_are_jammed_with_the_last_group_clamped():
    """7 rows in groups of 3: 3 groups, the last starting at row 4 (computing rows 4 and 5 again, over
    the same values); where 3 divides the rows the clamp folds away."""
    body, extents = _plain(m=7)
    body = schedule.applied(body, extents, [schedule.Rewrite("block", ((1,),)), schedule.Rewrite("jam", (0, 3))])
    nest = blocks.Nest(body)
    assert extents[0] == 3 and len(nest.accumulations) == 3
    first = "Binary(op='min', a=Binary(op='*', a=Var(axis=0), b=Const(value=3)), b=Const(value=4))"
    assert all(first in str(a.value) for a in nest.accumulations)
    body, extents = _plain(m=6)
    body = schedule.applied(body, extents, [schedule.Rewrite("block", ((1,),)), schedule.Rewrite("jam", (0, 3))])
    assert "min" not in str(blocks.Nest(body).accumulations)


def test_the_heuristic_blocks_rows_of_a_prime_count():
    """A linear layer over 97 rows blocks them 8 at a time (13 groups), not one at a time."""
    rng = np.random.default_rng(1)
    x, w = (mg.tensor(rng.standard_normal(shape).astype(np.float32)) for shape in ((97, 256), (256, 256)))
    (step,) = [s for s in lowered(pending_graph([(x @ w.T).node]), Target()) if s.kernel is not None]
    assert schedule.Rewrite("jam", (0, 8)) in step.reduction_schedule
    np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("steps, says", [
    ([("split", (1, 5))], "does not divide"),
    ([("block", ((0,),))], "not the innermost output loops"),
    ([("jam", (0, 2))], "no block"),
    ([("block", ((0, 1),)), ("round_up", (1, 48))], "not the one loop"),
    ([("block", ((1,),)), ("jam", (0, 9))], "rows exceed"),
    ([("merge", (2, 1))], "not the reduction loop"),
    ([("drop_units", ((2,),))], "not reduction loops of one iteration"),
    ([("pack", (2, 0, 0, ((2, 6),), ()))], "reads loops other than"),     # B[k, j] over k alone
    ([("pack", (1, 0, None, ((2, 6),), ()))], "shared by its threads"),  # before the parallel loop
    ([("block", ((1,),)), ("flatten_plane", (0, 1, 8, 2))], "do not read the plane"),
    ([("pack", (2, 0, 0, ((2, 6), (1, 32)), ())), ("reorder", ((1, 0),))], "statements of its own"),
])
def test_primitives_refuse_what_is_not_legal(steps, says):
    body, extents = _plain()
    with pytest.raises(ValueError, match=says):
        schedule.applied(body, extents, [schedule.Rewrite(name, arguments) for name, arguments in steps])


@pytest.mark.parametrize("text", ["", "{}", "[1]", '[["split", [1, 2.5]]]', '[["eval", []]]',
                                  '[["split", [true]]]', '[["split", ["0"]]]', '[["split", [1, 2], 3]]'])
def test_a_schedule_text_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="not a schedule"):
        schedule.parsed(text)


def test_a_pack_at_the_output_loop_it_reads_is_legal():
    body, extents = _plain()
    # A[i, k] packed at loop i over k: the copy reads i, the loop it is made in, and k, which it copies over
    body = schedule.applied(body, extents, [schedule.Rewrite("pack", (1, 0, 0, ((2, 6),), ()))])
    assert blocks.Nest(body).chain[0].body[0].name == packing.PACK
    (packed,) = [v for v in ir.values(blocks.reads(body)[0]) if isinstance(v, ir.Ref)]
    assert packed.name == packing.PACK and packed.index == Var(2)
