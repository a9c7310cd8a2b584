"""Flat rows (compiler/flat_rows.py: `merge`, `vectorise` and the rule `flattened`): an element-wise
kernel's serial loops that every index reads as one flat range become one loop, and its innermost
serial loop, written with unit stride and read with a stride of at most 2 (a condition along it is
a lane mask), the vector loop, on every code generator (against the numpy oracle); loops read
apart (a per-channel operand, a transposed view) and the parallel loop stay as they are."""
import numpy as np
import pytest

import metagraph as mg
from metagraph.compiler import flat_rows, ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.expr import Var
from tests.backends.conftest import BACKENDS, against_oracle

F = mg.nn.functional


def _loops(node, threads=1):
    """The loop nest of `node`'s one kernel, outermost first (the first loop of each body)."""
    (step,) = schedule(pending_graph([node]), Target(threads=threads))
    loops, body = [], step.kernel.body
    while body and isinstance(body[0], ir.Loop):
        loops.append(body[0])
        body = body[0].body
    return loops


def _loop_extents(node, threads=1):
    return [loop.extent for loop in _loops(node, threads)]


def _array(rng, *shape):
    return mg.tensor(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("shape, extents", [
    ((6, 5, 3, 3), [6, 45]),          # a 3x3 weight's update: one loop per filter
    ((4, 8, 4, 4), [4, 8, 16]),       # a per-channel scale: the planes merge, the channels stay
])
def test_short_rows_read_as_one_range_become_one_loop(backend, shape, extents):
    rng = np.random.default_rng(0)
    a, b = _array(rng, *shape), _array(rng, *shape)
    scale = _array(rng, 1, shape[1], 1, 1)
    out = (F.relu(a * scale + b) if len(extents) == 3 else a * 0.9 + b).node
    assert _loop_extents(out) == extents
    assert _loops(out)[-1].kind == ir.VECTOR
    against_oracle(backend, [out])


def _innermost(body):
    """The innermost loops of a kernel body, in order."""
    for s in body:
        if isinstance(s, ir.Loop):
            inner = list(_innermost(s.body))
            yield from inner if inner else [s]


def _conditions(loop):
    return [v for s in loop.body for v in ir.values(s.value)
            if isinstance(v, ir.Guard) or isinstance(v, ir.Load) and v.valid is not None]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_rows_read_apart_stay_loops_and_short_strides_vectorise(backend):
    rng = np.random.default_rng(1)
    x = _array(rng, 3, 4, 5)
    strided = (x[:, :, ::2] * 2.0).node                  # every other element
    transposed = (x.transpose(1, 2) + 1.0).node          # the row read 5 elements apart
    for node, extents, kind in [(strided, [3, 4, 3], ir.VECTOR), (transposed, [3, 5, 4], ir.SERIAL)]:
        assert _loop_extents(node) == extents
        assert _loops(node)[-1].kind == kind
    against_oracle(backend, [strided, transposed])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_padded_row_is_peeled_into_its_borders_and_an_unguarded_vector_interior(backend):
    rng = np.random.default_rng(1)
    x = _array(rng, 3, 4, 5)
    padded = F.pad(x, (1, 1)).node                       # rows of 7 read from rows of 5
    phases = F.pad(x, (1, 2))[:, :, 1::2].node           # a padded row's odd phase, read at stride 2
    framed = F.pad(x, (2, 1, 1, 2), value=-1.0).node     # both dimensions padded
    for node, interior in [(padded, 5), (phases, 3), (framed, 5)]:
        (step,) = schedule(pending_graph([node]), Target())
        rows = list(_innermost(step.kernel.body))
        inside = [loop for loop in rows if loop.extent == interior and loop.kind == ir.VECTOR]
        assert inside and not any(_conditions(loop) for loop in rows)     # no lane masks left
    against_oracle(backend, [padded, phases, framed])


def test_the_parallel_loop_keeps_its_extent():
    rng = np.random.default_rng(2)
    x = _array(rng, 8, 4, 4)
    assert _loop_extents((x * 2.0).node, threads=2) == [8, 16]


def test_merge_refuses_what_does_not_read_flat():
    def nest(index, inner_kind=ir.SERIAL, statement=ir.Store):
        value = ir.Load(1, index, mg.float32)
        leaf = statement(0, index, value) if statement is ir.Store else \
            ir.Accumulate("acc", "add", value, index)
        return ir.Loop(0, 3, ir.SERIAL, [ir.Loop(1, 4, inner_kind, [leaf])])
    flat = Var(0) * 4 + Var(1)
    merged = flat_rows.merge(nest(flat), {0: 3, 1: 4})
    assert (merged.var, merged.extent) == (1, 12)
    for loop in [nest(Var(0) * 5 + Var(1)), nest(flat, ir.VECTOR), nest(flat, statement=ir.Accumulate),
                 ir.Loop(0, 3, ir.SERIAL, [])]:
        with pytest.raises(ValueError, match="one range"):
            flat_rows.merge(loop, {0: 3, 1: 4})


def test_vectorise_refuses_what_does_not_write_apart():
    def row(index, param=1, kind=ir.SERIAL):
        return ir.Loop(1, 4, kind, [ir.Store(0, index, ir.Load(param, Var(1), mg.float32))])
    params = [ir.Param("p0", mg.float32, (4,), True), ir.Param("p1", mg.float32, (4,), False)]
    assert flat_rows.vectorise(row(Var(1)), params).kind == ir.VECTOR
    for loop in [row(Var(1) * 2), row(Var(0)), row(Var(1), param=0), row(Var(1), kind=ir.PARALLEL)]:
        with pytest.raises(ValueError, match="write apart"):
            flat_rows.vectorise(loop, params)
