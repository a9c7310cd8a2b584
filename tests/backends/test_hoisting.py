"""Loop-invariant statements (compiler/hoist.py): a sum whose terms do not read an output loop is
computed once, before that loop, on every code generator (against the numpy oracle); a sum that
reads every loop around it, or shares memory with what follows it, stays where it is; random
legal hoists among random rewrites keep the values."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import metagraph as mg
from metagraph.compiler import hoist, ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.expr import Var
from tests.backends.conftest import BACKENDS, against_oracle
from tests.backends.test_rewrites import COMPILED, SETTINGS, _random_rewrites, against_oracle_rewritten

F = mg.nn.functional


def _kernels(nodes, threads=1):
    return [step.kernel for step in schedule(pending_graph(nodes), Target(threads=threads)) if step.kernel]


def _hoisted_sums(kernel):
    """Names of the accumulators a kernel defines outside every loop."""
    return {s.name for s in kernel.body if isinstance(s, ir.Define)}


def _layer(rng, *shape, grad=False):
    return mg.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_the_gradient_of_a_sum_through_linear_layers_sums_each_column_once(backend, threads):
    # d sum(gelu(x @ w1.T) @ w2.T) / d w2: every row of the gradient sums the same column of the
    # hidden layer (the loss's gradient is ones); d / d hidden sums w2's columns for every token
    rng = np.random.default_rng(0)
    x, w1, w2 = _layer(rng, 4, 6, 16), _layer(rng, 24, 16, grad=True), _layer(rng, 20, 24, grad=True)
    y = F.linear(F.gelu(F.linear(x, w1)), w2)
    grads = [g.node for g in mg.grad(y.sum(), [w1, w2])]
    kernels = _kernels(grads, threads)
    by_shape = {}
    for kernel in kernels:
        by_shape.setdefault(kernel.params[0].shape, []).append(kernel)
    assert any(_hoisted_sums(k) for k in by_shape[(20, 24)])          # w2's gradient
    assert any(_hoisted_sums(k) for k in by_shape[(4, 6, 24)])        # the hidden layer's gradient
    against_oracle(backend, grads)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_sum_hoisted_before_a_loop_worth_threads_is_seen_by_every_thread(backend, monkeypatch):
    """Large enough that the parallel loop after the hoisted sum runs on threads (tasks): llvm's
    team functions and bang's tasks (NRAM of their own) each compute the sum for themselves
    (codegen/compiled.local_only); llvm failed to compile it, bang's second task read garbage."""
    monkeypatch.setattr(mg.flags, "NUM_THREADS", 2)
    rng = np.random.default_rng(2)
    x, w = _layer(rng, 256, 512), _layer(rng, 512, 256, grad=True)
    (grad,) = mg.grad((x @ w).sum(), [w])
    assert any(_hoisted_sums(k) for k in _kernels([grad.node], threads=2))
    against_oracle(backend, [grad.node])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_sum_that_reads_every_loop_around_it_stays_inside(backend):
    rng = np.random.default_rng(1)
    x, w = _layer(rng, 4, 6, 16), _layer(rng, 24, 16, grad=True)
    upstream = _layer(rng, 4, 6, 24)
    (grad,) = mg.grad((F.linear(x, w) * upstream).sum(), [w])
    # a batch of equal products: the sums read the rows and columns of the loops they sit in
    a, b = _layer(rng, 1, 8, 16), _layer(rng, 16, 12)
    batched = mg.matmul(a.expand(3, 8, 16), b)
    for kernel in _kernels([grad.node, batched.node]):
        assert not _hoisted_sums(kernel), kernel.name
    against_oracle(backend, [grad.node, batched.node])


def _tile(size=4):
    return [ir.Define("acc", mg.float32, 0.0, "add", size),
            ir.Loop(2, 6, ir.REDUCE, [ir.Loop(1, size, ir.VECTOR, [
                ir.Accumulate("acc", "add", ir.Load(1, Var(2) * size + Var(1), mg.float32), Var(1))])])]


def _params(output_read=False):
    return [ir.Param("p0", mg.float32, (3, 4), True), ir.Param("p1", mg.float32, (24,), output_read)]


def _store(reads_row=True):
    value = ir.Ref("acc", mg.float32, Var(1))
    return ir.Loop(1, 4, ir.VECTOR, [ir.Store(0, Var(0) * 4 + Var(1) if reads_row else Var(1), value)])


def test_an_invariant_sum_moves_before_the_loop():
    store = _store()
    loop = ir.Loop(0, 3, ir.PARALLEL, _tile() + [store])
    assert hoist.invariant_prefix(loop, _params()) == 2
    moved, rest = hoist.hoist(loop, 2, _params())
    assert [type(s) for s in moved] == [ir.Define, ir.Loop] and rest.body == [store]
    assert hoist.hoisted([loop], _params())[:2] == moved


# (case, the prefix that may move instead)
CASES = [("reads the loop", 0), ("reads an output", 0), ("written after", 0),
         ("stores", 1),          # the Define alone may move: nothing after writes it
         ("part of a sum", 2),   # the Define without its loop: each iteration would add to one sum
         ("the whole body", 0)]


@pytest.mark.parametrize("case, instead", CASES)
def test_what_is_not_invariant_stays(case, instead):
    body, params, count = _tile() + [_store()], _params(), 2
    if case == "reads the loop":
        body[1].body[0].body[0].value = ir.Load(1, Var(0) + Var(1), mg.float32)
    elif case == "reads an output":
        params = _params(output_read=True)
    elif case == "written after":       # the loop's own iterations add to the sum
        body.append(ir.Accumulate("acc", "add", ir.Scalar(1.0, mg.float32), Var(0)))
    elif case == "stores":
        body = [body[0], ir.Loop(2, 6, ir.SERIAL, [_store(reads_row=False)]), body[2]]
    elif case == "part of a sum":
        count = 1
    elif case == "the whole body":
        body = body[:2]
    loop = ir.Loop(0, 3, ir.PARALLEL, body)
    assert not hoist.movable(loop, count, params)
    with pytest.raises(ValueError, match="do not compute the same values"):
        hoist.hoist(loop, count, params)
    assert hoist.invariant_prefix(loop, params) == instead


def _invariant_graph(data):
    """The gradient of a sum through a random small matmul (its loss's gradient is ones), a
    matmul with an operand broadcast along a row or column, or one of the two with an epilogue."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    m, k, n = (data.draw(st.sampled_from([1, 3, 4, 8, 12]), label=name) for name in "mkn")
    batch = data.draw(st.sampled_from([(), (2,), (3,)]), label="batch")
    a, b = _layer(rng, *batch, m, k, grad=True), _layer(rng, k, n, grad=True)
    kind = data.draw(st.sampled_from(["grad_b", "grad_a", "broadcast"]), label="kind")
    if kind == "broadcast":
        row = _layer(rng, *batch, 1, k)
        out = mg.matmul(row.expand(*batch, m, k), b)
    else:
        out = mg.matmul(a, b)
        if data.draw(st.booleans(), label="relu"):
            out = F.relu(out)
        (out,) = mg.grad(out.sum(), [b if kind == "grad_b" else a])
    return out.node


@pytest.mark.parametrize("backend", COMPILED, indirect=True)
@SETTINGS
@given(data=st.data())
def test_random_hoists_among_rewrites_keep_the_values(backend, data, monkeypatch):
    choices = data.draw(st.lists(st.integers(0, 2 ** 20), min_size=1, max_size=4), label="rewrites")
    against_oracle_rewritten(backend, [_invariant_graph(data)], _random_rewrites(choices), monkeypatch)
