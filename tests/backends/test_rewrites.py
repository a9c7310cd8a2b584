"""Schedule rewrites (compiler/rewrites.py, lanes.py, hoist.py, flat_rows.py) keep every kernel's
values: random legal sequences of split, interchange, merge, vectorise, unroll-and-jam, stage, hoist
and lane splits on the kernels of random graphs, on every code generator, against the numpy oracle;
and the panel and lane rules apply where they should and nowhere else."""
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metagraph as mg
from metagraph.compiler import flat_rows, hoist, ir, lanes, rewrites
from metagraph.compiler.access import loop_variables
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.expr import Var
from metagraph.ops.linalg import matmul
from metagraph.ops.loss import softmax
from metagraph.pipeline import stored
from tests.backends.conftest import BACKENDS, against_oracle
from tests.backends.test_random_graphs import _graph

COMPILED = [name for name in BACKENDS if name != "numpy"]     # the oracle lowers nothing
SETTINGS = settings(max_examples=int(os.environ.get("METAGRAPH_HYPOTHESIS_EXAMPLES", 25)), deadline=None,
                    derandomize=not os.environ.get("METAGRAPH_HYPOTHESIS_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
STAGE_MAX = 4096          # elements a random stage may copy


def _loops(body, path=()):
    for k, s in enumerate(body):
        if isinstance(s, ir.Loop):
            yield path + (k,), s
            yield from _loops(s.body, path + (k,))


def _reads(loop):
    for _, inner in _loops([loop]):
        for s in inner.body:
            if not isinstance(s, ir.Loop) and getattr(s, "value", None) is not None:
                yield from (v for v in ir.values(s.value) if isinstance(v, ir.Load))


def _writes_only_its_own(loop):
    statements = list(rewrites.statements_in(loop.body))
    own = {s.name for s in statements if isinstance(s, ir.Define)}
    return all(s.name in own for s in statements if isinstance(s, (ir.Accumulate, ir.Assign)))


def _moves(body, extents, params):
    """(path to a loop, primitive name, argument) for every legal application in `body`."""
    for path, loop in _loops(body):
        if loop.kind != ir.VECTOR:
            for factor in range(2, loop.extent):
                if loop.extent % factor == 0:
                    yield path, "split", factor
        if loop.kind != ir.REDUCE and loop.extent <= 4 and not rewrites._scatters(loop.body) and \
                _writes_only_its_own(loop):
            yield path, "unroll_and_jam", None
        if len(loop.body) == 1 and isinstance(loop.body[0], ir.Loop) and \
                ir.REDUCE not in (loop.kind, loop.body[0].kind) and not rewrites._scatters(loop.body):
            yield path, "interchange", None
        inside = {inner.var: inner.extent for _, inner in _loops(loop.body)}
        for read in _reads(loop):
            size = np.prod([inside[v] for v in loop_variables(read) if v in inside])
            if not params[read.param].output and size <= STAGE_MAX:
                yield path, "stage", read
        for count in range(1, len(loop.body)):
            if hoist.movable(loop, count, params):
                yield path, "hoist", count
        if _legal(lambda: flat_rows.merge(loop, dict(extents))):
            yield path, "merge", None
        if _legal(lambda: flat_rows.vectorise(loop, params)):
            yield path, "vectorise", None
        outside = {d.name: d for d in body if isinstance(d, ir.Define)}
        if len(path) == 1 and loop.kind in (ir.SERIAL, ir.REDUCE) and rewrites.sums_only(loop, outside):
            yield path, "share_sum", None


def _legal(apply):
    """Whether a primitive applies (it raises ValueError where it does not)."""
    try:
        apply()
    except ValueError:
        return False
    return True


def _lane_moves(body, path=()):
    """(path to an accumulator array's Define, "lane_split", (lanes, width)) for every legal lane
    split of the reduction chain after it: any lanes up to the innermost reduction's extent, any
    width from the stored one to the vector loop's."""
    for k, s in enumerate(body):
        if isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            yield from _lane_moves(s.body, path + (k,))
        chain = body[k + 1] if k + 1 < len(body) else None
        if not (isinstance(s, ir.Define) and s.size and s.init is not None and isinstance(chain, ir.Loop)
                and chain.kind == ir.REDUCE):
            continue
        reduction = rewrites.reduction_chain(chain)[-1]
        row = reduction.body[0] if len(reduction.body) == 1 else None
        if not isinstance(row, ir.Loop) or row.kind != ir.VECTOR or not all(
                isinstance(a, ir.Accumulate) and a.name == s.name and a.index is not None for a in row.body):
            continue
        stored = min([row.extent] + [loop.extent for _, loop in _loops(body[k + 2:]) if loop.var == row.var])
        for count in range(1, reduction.extent + 1):         # a tail where they do not divide
            for width in range(stored, row.extent + 1):
                yield path + (k,), "lane_split", (count, width)


def _applied(body, path, make):
    body = list(body)
    if len(path) == 1:
        body[path[0]] = make(body[path[0]])
    else:
        loop = body[path[0]]
        body[path[0]] = ir.Loop(loop.var, loop.extent, loop.kind, _applied(loop.body, path[1:], make))
    return body


def _at(body, path):
    for k in path[:-1]:
        body = body[k].body
    return body[path[-1]]


def _replaced(body, path, statements):
    """`body` with the statement at `path` replaced by `statements`."""
    body = list(body)
    if len(path) == 1:
        return body[:path[0]] + statements + body[path[0] + 1:]
    loop = body[path[0]]
    body[path[0]] = ir.Loop(loop.var, loop.extent, loop.kind, _replaced(loop.body, path[1:], statements))
    return body


def _random_rewrites(choices):
    """A stand-in for rewrites.scheduled applying legal primitives picked by `choices` (drawn
    beforehand: whether a kernel is lowered at all depends on caches, which hypothesis must not see)."""
    def rewrite(body, extents, params, threads):
        for n, choice in enumerate(choices):
            moves = list(_moves(body, extents, params)) + list(_lane_moves(body))
            if not moves:
                break
            path, name, argument = moves[choice % len(moves)]
            if name == "lane_split":
                define, chain = _at(body, path), _at(body, path[:-1] + (path[-1] + 1,))
                statements = lanes.lane_split(define, chain, *argument, extents)
                body = _replaced(_replaced(body, path[:-1] + (path[-1] + 1,), []), path, statements)
                continue
            if name == "unroll_and_jam":
                body = _replaced(body, path, rewrites.unroll_and_jam(_at(body, path), extents))
                continue
            if name == "hoist":
                moved, rest = hoist.hoist(_at(body, path), argument, params)
                body = _replaced(body, path, moved + [rest])
                continue
            make = {"split": lambda loop: rewrites.split(loop, argument, extents),
                    "merge": lambda loop: flat_rows.merge(loop, extents),
                    "vectorise": lambda loop: flat_rows.vectorise(loop, params),
                    "interchange": rewrites.interchange, "share_sum": rewrites.share_sum,
                    "stage": lambda loop: rewrites.stage(loop, argument, extents, f"stage{n}")}[name]
            body = _applied(body, path, make)
        return body
    return rewrite


SIZES = st.sampled_from([1, 3, 4, 8, 12, 16])


def _contraction(data):
    """A matmul (batched or not) with an element-wise or row epilogue: register tiles, row blocks
    and dot products."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    batch = data.draw(st.lists(st.sampled_from([1, 2, 3]), max_size=1), label="batch")
    m, k, n = (data.draw(SIZES, label=name) for name in "mkn")
    a = mg.tensor(rng.standard_normal((*batch, m, k)).astype(np.float32)).node
    b = mg.tensor(rng.standard_normal((k, n)).astype(np.float32)).node
    out = matmul(a, b)
    epilogue = data.draw(st.sampled_from(["none", "relu", "softmax"]), label="epilogue")
    return out if epilogue == "none" else mg.nn.functional.relu(mg.Tensor(out)).node \
        if epilogue == "relu" else softmax(out, -1)


def against_oracle_rewritten(backend, nodes, scheduled, monkeypatch):
    """`nodes` computed by `backend` from kernels whose loop nests `scheduled` (in place of
    rewrites.scheduled) rewrites, against the oracle."""
    monkeypatch.setattr(rewrites, "scheduled", scheduled)
    backend.schedules.clear()           # lower this graph again, whatever was cached for it
    monkeypatch.setattr(stored, "MIN_NODES", math.inf)      # in memory or on disk
    against_oracle(backend, nodes)


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
@SETTINGS
@given(data=st.data())
def test_random_rewrites_keep_the_values(backend, data, monkeypatch):
    choices = data.draw(st.lists(st.integers(0, 2 ** 20), min_size=1, max_size=4), label="rewrites")
    out = _contraction(data) if data.draw(st.booleans(), label="contraction") else _graph(data)[0]
    against_oracle_rewritten(backend, [out], _random_rewrites(choices), monkeypatch)


def _lane_splits(choices):
    """A stand-in for rewrites.scheduled applying a lane split, its lanes, width and form picked by
    `choices`, at every accumulator array where one is legal."""
    def rewrite(body, extents, params, threads):
        for choice in choices:
            moves = list(_lane_moves(body))
            if not moves:
                break
            path, _, (count, width) = moves[choice % len(moves)]
            define, chain = _at(body, path), _at(body, path[:-1] + (path[-1] + 1,))
            statements = lanes.lane_split(define, chain, count, width, extents, unroll=choice % 2 == 0)
            body = _replaced(_replaced(body, path[:-1] + (path[-1] + 1,), []), path, statements)
        return body
    return rewrite


def _weight_gradient(data):
    """The weight gradient of a random small convolution (a narrow vector loop over the kernel row),
    or a matmul with a narrow output."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    if data.draw(st.booleans(), label="matmul"):
        m, k, n = (data.draw(st.integers(1, 12), label=name) for name in "mkn")
        return matmul(mg.tensor(rng.standard_normal((m, k)).astype(np.float32)).node,
                      mg.tensor(rng.standard_normal((k, n)).astype(np.float32)).node)
    batch, channels, out = (data.draw(st.integers(1, 3), label=name) for name in ("batch", "in", "out"))
    size = data.draw(st.integers(3, 12), label="size")
    kernel = data.draw(st.sampled_from([1, 2, 3]), label="k")
    x = mg.tensor(rng.standard_normal((batch, channels, size, size)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((out * 4, channels, kernel, kernel)).astype(np.float32),
                  requires_grad=True)
    y = mg.nn.functional.conv2d(x, w, padding=kernel // 2)
    (grad_w,) = mg.grad((y * mg.tensor(rng.standard_normal(y.shape).astype(np.float32))).sum(), [w])
    return grad_w.node


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
@SETTINGS
@given(data=st.data())
def test_random_lane_splits_keep_the_values(backend, data, monkeypatch):
    choices = data.draw(st.lists(st.integers(0, 2 ** 20), min_size=1, max_size=3), label="splits")
    against_oracle_rewritten(backend, [_weight_gradient(data)], _lane_splits(choices), monkeypatch)


def _staged(nodes, threads=1):
    graph = pending_graph(nodes)
    names = set()
    for step in schedule(graph, Target(threads=threads)):
        for _, loop in _loops(step.kernel.body if step.kernel else []):
            names |= {s.name for s in loop.body if isinstance(s, ir.Define) and s.name.startswith("panel")}
    return names


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_panel_read_again_per_row_block_is_staged(backend, threads):
    rng = np.random.default_rng(3)
    # panels of 512 x 32 floats (64 KiB) over 20 column tiles: 1.3 MiB, re-read per row block
    a = mg.tensor(rng.standard_normal((64, 512)).astype(np.float32))
    b = mg.tensor(rng.standard_normal((512, 640)).astype(np.float32))
    out = (a @ b).node
    assert _staged([out], threads)
    against_oracle(backend, [out])


def test_no_panel_where_the_cache_holds_the_operand():
    rng = np.random.default_rng(4)
    small = mg.tensor(rng.standard_normal((64, 64)).astype(np.float32))
    assert not _staged([(small @ small).node])
    # one row block: nothing shares a panel
    row = mg.tensor(rng.standard_normal((1, 512)).astype(np.float32))
    wide = mg.tensor(rng.standard_normal((512, 640)).astype(np.float32))
    assert not _staged([(row @ wide).node])


def _lane_split_kernels(nodes):
    return [step.kernel.name for step in schedule(pending_graph(nodes), Target())
            if step.kernel and any(isinstance(s, ir.Define) and s.name.endswith("_lanes")
                                   for s in rewrites.statements_in(step.kernel.body))]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("shape, kernel, stride, lanes_expected", [
    ((2, 3, 8, 8), 3, 1, True),       # a 3-wide kernel row over rows of 8: 8 lanes along the row
    ((1, 4, 16, 16), 3, 1, True),     # rows of 16: 16 lanes
    ((2, 3, 12, 12), 3, 1, False),    # 4 lanes divide the row: 3 instructions per 4 steps, not 1.5x fewer
    ((2, 3, 8, 8), 1, 1, False),      # no kernel row to widen
    ((2, 3, 16, 16), 3, 2, False),    # a stride-2 input row is not read contiguously
])
def test_a_narrow_weight_gradient_is_vectorised_along_its_reduction(backend, shape, kernel, stride,
                                                                     lanes_expected):
    rng = np.random.default_rng(6)
    x = mg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)
    w = mg.tensor(rng.standard_normal((8, shape[1], kernel, kernel)).astype(np.float32), requires_grad=True)
    y = mg.nn.functional.conv2d(x, w, padding=kernel // 2, stride=stride)
    g = mg.tensor(rng.standard_normal(y.shape).astype(np.float32))
    (grad_w,) = mg.grad((y * g).sum(), [w])
    assert bool(_lane_split_kernels([grad_w.node])) == lanes_expected
    against_oracle(backend, [grad_w.node])


def test_primitives_refuse_what_is_not_legal():
    loop = ir.Loop(0, 6, ir.SERIAL, [ir.Loop(1, 4, ir.REDUCE, [])])
    with pytest.raises(ValueError, match="does not divide"):
        rewrites.split(loop, 4, {0: 6, 1: 4})
    with pytest.raises(ValueError, match="reduction"):
        rewrites.interchange(loop)
    with pytest.raises(ValueError, match="not a single loop"):
        rewrites.interchange(ir.Loop(0, 6, ir.SERIAL, []))
    with pytest.raises(ValueError, match="reduction"):
        rewrites.unroll_and_jam(ir.Loop(1, 4, ir.REDUCE, []), {1: 4})
    outer_sum = ir.Loop(0, 3, ir.SERIAL, [ir.Accumulate("acc", "add", ir.Scalar(1.0, mg.float32))])
    with pytest.raises(ValueError, match="defined outside"):
        rewrites.unroll_and_jam(outer_sum, {0: 3})
    tile = [ir.Define("acc", mg.float32, 0.0, "add", 4),
            ir.Loop(0, 6, ir.REDUCE, [ir.Loop(1, 4, ir.VECTOR, [
                ir.Accumulate("acc", "add", ir.Scalar(1.0, mg.float32), Var(1))])])]
    with pytest.raises(ValueError, match="do not fit"):
        lanes.lane_split(*tile, 8, 4, {0: 6, 1: 4})      # more lanes than the reduction has
    with pytest.raises(ValueError, match="do not fit"):
        lanes.lane_split(*tile, 2, 5, {0: 6, 1: 4})      # wider than the vector loop


def _shared_sums(node, threads):
    target = Target(threads=threads, shared_sums=True)
    return [loop for step in schedule(pending_graph([node]), target) if step.kernel
            for loop in step.kernel.body if isinstance(loop, ir.Loop) and loop.kind == ir.SHARED_SUM]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("build, shared", [
    (lambda x: x.sum(), True),                      # a full sum: one output
    (lambda x: x.sum(0), True),                     # columns summed down the rows: no parallel loop
    (lambda x: x[:, :8].sum(0), True),              # a few columns: an accumulator array
    (lambda x: x.sum(1), False),                    # a sum per row: the rows are the parallel loop
    (lambda x: x.amax(), False),                    # a maximum: not a sum
])
def test_a_sum_without_a_parallel_loop_shares_its_outer_loop_among_the_threads(backend, build, shared):
    x = mg.tensor(np.random.default_rng(7).standard_normal((512, 256)).astype(np.float32))
    out = build(x).node
    assert bool(_shared_sums(out, 2)) == shared and not _shared_sums(out, 1)
    against_oracle(backend, [out])


def test_c_gives_each_thread_its_own_copy_of_the_accumulators():
    from metagraph.codegen import c
    x = mg.tensor(np.random.default_rng(8).standard_normal((4096, 64)).astype(np.float32))  # worth threads
    for node, clause in ((x.sum().node, "reduction(+:acc)"), (x[:, :8].sum(0).node, "reduction(+:acc[:8])")):
        target = Target(threads=mg.flags.NUM_THREADS, shared_sums=True)
        kernels = [step.kernel for step in schedule(pending_graph([node]), target)]
        assert (clause in c.render(kernels)) == (mg.flags.NUM_THREADS > 1)


def test_only_a_loop_that_only_sums_into_zeroed_accumulators_is_shared():
    f32, one = mg.float32, ir.Scalar(1.0, mg.float32)
    outside = {"acc": ir.Define("acc", f32, 0.0), "top": ir.Define("top", f32, -1e30, "max"),
               "ones": ir.Define("ones", f32, 1.0)}
    sums = ir.Loop(0, 8, ir.SERIAL, [ir.Define("part", f32, 0.0), ir.Loop(1, 4, ir.REDUCE, [
        ir.Accumulate("part", "add", one)]), ir.Accumulate("acc", "add", ir.Ref("part", f32))])
    assert rewrites.sums_only(sums, outside)
    for body in ([ir.Accumulate("top", "max", one)],                      # not a sum
                 [ir.Accumulate("ones", "add", one)],                     # not from 0
                 [ir.Accumulate("acc", "add", ir.Ref("acc", f32))],       # reads the total so far
                 [ir.Store(0, Var(0), one)],                              # writes memory
                 [ir.Accumulate("elsewhere", "add", one)]):               # defined nowhere before it
        assert not rewrites.sums_only(ir.Loop(0, 8, ir.SERIAL, body), outside)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_at_batch_one_the_threads_share_the_output_channels(backend):
    rng = np.random.default_rng(5)
    x = mg.tensor(rng.standard_normal((1, 8, 9, 9)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
    out = mg.nn.functional.relu(mg.nn.functional.conv2d(x, w, padding=1)).node
    for step in schedule(pending_graph([out]), Target(threads=2)):
        (outer,) = [s for s in step.kernel.body if isinstance(s, ir.Loop)]
        assert outer.kind == ir.PARALLEL and outer.extent >= 2, step.kernel.name
    against_oracle(backend, [out])
