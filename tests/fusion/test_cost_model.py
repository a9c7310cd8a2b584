"""The search's cost model (compiler/cost.py) on hand-written loop nests: each of its bounds
moves the way the machine does, so that it ranks a kernel's variants; and it prefers, among the
variants of real contractions, the ones the tuner's timing has found faster."""
import numpy as np
import pytest

import metagraph as mg
from metagraph import dtypes
from metagraph.compiler import cost, ir
from metagraph.compiler.graph import pending_graph
from metagraph.compiler.lower import Target, schedule
from metagraph.expr import Const, Var
from metagraph.ops.linalg import matmul

F32 = dtypes.float32


def _load(param, index):
    return ir.Load(param, index, F32)


def _dot(n, chains=1, vector=False):
    """`chains` sums of n products (a column of a (n, chains) matrix times a vector), each into
    its own element of an accumulator (the vectorised loop over them when `vector`)."""
    product = ir.Apply("mul", (_load(1, Var(0) * chains + Var(1)), _load(2, Var(0))), F32)
    accumulate = ir.Accumulate("acc", "add", product, Var(1))
    inner = ir.Loop(1, chains, ir.VECTOR if vector else ir.SERIAL, [accumulate])
    return [ir.Define("acc", F32, 0, size=chains), ir.Loop(0, n, ir.REDUCE, [inner]),
            ir.Store(0, Const(0), ir.Ref("acc", F32, Const(0)))]


def test_one_accumulator_waits_for_itself():
    one = cost.estimate(_dot(1024)).issue
    assert one >= 1024 * cost.ACCUMULATE_LATENCY
    # two independent accumulations per step take no longer than one: the latency hides them
    assert cost.estimate(_dot(1024, chains=2)).issue == one


def test_vectors_issue_fewer_instructions_than_lanes_one_by_one():
    scalar = cost.estimate(_dot(1024, chains=64)).issue
    vector = cost.estimate(_dot(1024, chains=64, vector=True)).issue
    assert vector * 8 <= scalar


def test_a_strided_vector_read_is_a_gather():
    def body(stride):
        load = _load(1, Var(0) * stride)
        return [ir.Loop(0, 4096, ir.VECTOR, [ir.Store(0, Var(0), ir.Apply("neg", (load,), F32))])]
    assert cost.estimate(body(2)).issue > 8 * cost.estimate(body(1)).issue


def test_parallel_loops_share_the_work_among_threads():
    body = [ir.Loop(2, 64, ir.PARALLEL, _dot(256))]
    assert cost.estimate(body, threads=2).cycles == cost.estimate(body).cycles / 2
    short = [ir.Loop(2, 1, ir.PARALLEL, _dot(256))]      # one iteration keeps one thread busy
    assert cost.estimate(short, threads=2).cycles == cost.estimate(short).cycles


def _sweep(rows, columns, depth):
    """out[i, j] = sum_k a[i, k] * b[k, j], i outermost: b is read again for every row i."""
    product = ir.Apply("mul", (_load(1, Var(0) * depth + Var(2)), _load(2, Var(2) * columns + Var(1))), F32)
    return [ir.Loop(0, rows, ir.SERIAL, [ir.Loop(1, columns, ir.SERIAL, [
        ir.Define("acc", F32, 0), ir.Loop(2, depth, ir.REDUCE, [ir.Accumulate("acc", "add", product)]),
        ir.Store(0, Var(0) * columns + Var(1), ir.Ref("acc", F32))])])]


def test_an_operand_that_leaves_the_cache_is_read_again_for_every_row():
    fits = cost.estimate(_sweep(64, 128, 512)).memory          # b: 256 KiB, read once
    spills = cost.estimate(_sweep(64, 1024, 512)).memory       # b: 2 MiB, read 64 times
    assert spills > 8 * 8 * fits / 2


def test_the_model_prefers_what_timing_prefers_for_skinny_products():
    """x @ w.T with 32 rows: the channel tile (the heuristic's) against the transposed panel, which
    copies a panel of w for every tile and reuses it for only 32 rows (measured on one core:
    225 against 400 us)."""
    rng = np.random.default_rng(0)
    x = mg.tensor(rng.standard_normal((32, 256)).astype(np.float32))
    w = mg.tensor(rng.standard_normal((1024, 256)).astype(np.float32))

    def cycles(block):
        graph = pending_graph([matmul(x.node, w.T.node)])
        (step,) = schedule(graph, Target(block=block))
        return cost.estimate(step.kernel.body).cycles
    assert cycles(None) < cycles("transposed_panel")


def test_a_register_tile_past_the_registers_spills():
    def per_vector(vectors):
        return cost.estimate(_dot(64, chains=16 * vectors, vector=True)).issue / vectors
    assert per_vector(31) == pytest.approx(per_vector(16), rel=0.01)      # fits beside its operand
    assert per_vector(40) > 1.1 * per_vector(31)
