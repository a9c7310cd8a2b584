"""Reductions vectorised along their own loop: lanes of partial sums.

A reduction into an accumulator array whose vector loop is narrow (a conv's weight gradient
accumulates 3-wide kernel rows: 3 of 16 lanes) can be vectorised along its innermost reduction loop
instead, where that loop reads its operands contiguously: each lane accumulates its own partial
sums, which are combined after the reduction. `lane_split` is the primitive; `lanes_along_reductions`
the rule that applies it where the vector instructions it saves are worth it (ResNet-18's 3x3
weight gradient over 56x56: 54 -> 27 ms on one core; a 16-channel one over 32x32: 14 -> 3.5 ms).
"""
import math

from metagraph.compiler import ir
from metagraph.compiler.access import VECTOR_BYTES, Replace
from metagraph.compiler.rewrites import (fresh_variable, loops_in, reduction_chain, rewritten_body,
                                         statements_in)
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var, linear_terms, variables

LANE_GAIN = 1.5              # a lane split must cut the vector instructions by this factor,
LANE_REGISTERS = 32          # ... its copies unrolled while their accumulators fit the registers,
LANE_BYTES = 16 * 1024       # ... or as loops over a lane array that stays in L1


def lane_split(define, chain, lanes, width, extents, unroll=True):
    """(statements replacing `define` and the reduction `chain` after it) with the chain's innermost
    loop r split into `lanes` lanes, `r -> r * lanes + l`: each accumulation under r goes into its
    own element of a local array of one element per lane, l the vector loop innermost, and after
    the chain the lanes are combined into `define`'s elements. The loops under r (a register tile's
    vector loop, a row block's loops) keep only their first `width` iterations of the vector loop
    (the ones stored) and become serial; with `unroll` they are unrolled into copies inside one
    vector loop instead (a register tile whose copies then stay in registers)."""
    path = reduction_chain(chain)
    reduction, row = path[-1], _vector_loop(path[-1])
    main, tail = divmod(reduction.extent, lanes)
    if lanes < 1 or not main or not row or width > row.extent:
        raise ValueError(f"lane_split: {lanes} lanes over a reduction of {reduction.extent} and {width} of "
                         f"a vector loop of {row.extent if row else 0} do not fit")
    lane, element, part, rest = (fresh_variable(extents) + k for k in range(4))
    extents.update({reduction.var: main, lane: lanes, element: define.size, part: lanes, rest: tail})
    name = f"{define.name}_lanes"

    def split(statements, fixed):
        out, leaves = [], []
        for s in statements:
            if isinstance(s, ir.Accumulate):
                mapping = Replace({**fixed, reduction.var: Var(reduction.var) * lanes + Var(lane)})
                index = simplify(substitute(s.index, mapping) * lanes + Var(lane), extents)
                value = ir.rewritten(s.value, lambda e: simplify(substitute(e, mapping), extents))
                leaves.append(ir.Accumulate(name, s.op, value, index))
                continue
            extent = width if s.kind == ir.VECTOR else s.extent
            if unroll:
                leaves += [c for k in range(extent) for c in split(s.body, {**fixed, s.var: Const(k)})]
                continue
            if leaves:
                out, leaves = out + [ir.Loop(lane, lanes, ir.VECTOR, leaves)], []
            extents[s.var] = extent
            out.append(ir.Loop(s.var, extent, ir.SERIAL, split(s.body, fixed)))
        if unroll and not fixed:
            return [ir.Loop(lane, lanes, ir.VECTOR, leaves)]
        return out + ([ir.Loop(lane, lanes, ir.VECTOR, leaves)] if leaves and not unroll else leaves)

    body = [ir.Loop(reduction.var, main, ir.REDUCE, split(reduction.body, {}))]
    if tail:        # the last iterations as they were, from the vector loop's first `width`
        narrowed = _narrowed(reduction.body, row, width)
        mapping = Replace({reduction.var: Var(rest) + Const(main * lanes)})
        body.append(ir.Loop(rest, tail, ir.REDUCE, rewritten_body(narrowed, mapping, extents)))
    for loop in reversed(path[:-1]):
        body = [ir.Loop(loop.var, loop.extent, loop.kind, body)]
    combine = ir.Accumulate(define.name, define.op,
                            ir.Ref(name, define.dtype, simplify(Var(element) * lanes + Var(part), extents)),
                            Var(element))
    combined = ir.Loop(element, define.size, ir.SERIAL, [ir.Loop(part, lanes, ir.SERIAL, [combine])])
    return [define, ir.Define(name, define.dtype, define.init, define.op, define.size * lanes)] + body + \
        [combined]


def _vector_loop(reduction):
    """The one vector loop under a reduction loop, or None."""
    found = [loop for loop in loops_in(reduction.body) if loop.kind == ir.VECTOR]
    return found[0] if len(found) == 1 else None


def _narrowed(body, row, width):
    """`body` with loop `row` cut to its first `width` iterations."""
    return [ir.Loop(s.var, width if s is row else s.extent, s.kind, _narrowed(s.body, row, width))
            if isinstance(s, ir.Loop) else s for s in body]


def lanes_along_reductions(body, extents, gain=LANE_GAIN):
    """The body with the lane rule of the module docstring applied wherever it holds: an
    accumulator array followed by a chain of reduction loops whose innermost holds only loops (one
    of them the vector loop, `width` of whose iterations are stored) of accumulations into it.
    The lanes (a power of two up to a whole vector, dividing the reduction) are those that need
    the fewest vector instructions; the rule holds when that cuts them by `gain` and every index
    reads the reduction's variable with unit stride (or not at all). The loops under the reduction
    are unrolled where their copies' accumulators fit LANE_REGISTERS vectors, kept as loops where
    the lane array fits LANE_BYTES, and the rule does not hold otherwise."""
    out = [ir.Loop(s.var, s.extent, s.kind, lanes_along_reductions(s.body, extents, gain))
           if isinstance(s, ir.Loop) and s.kind != ir.REDUCE else s for s in body]
    k = 0
    while k + 1 < len(out):
        define, chain = out[k], out[k + 1]
        found = _lane_plan(define, chain, out[k + 2:], gain) \
            if isinstance(define, ir.Define) and define.size and define.init is not None and \
            isinstance(chain, ir.Loop) and chain.kind == ir.REDUCE else None
        if found is not None:
            lanes, width, unroll = found
            replacement = lane_split(define, chain, lanes, width, extents, unroll)
            out[k:k + 2] = replacement
            k += len(replacement)
        k += 1
    return out


def _lane_plan(define, chain, after, gain):
    """(lanes, width, unroll) for `lane_split` where the rule holds, else None."""
    reduction = reduction_chain(chain)[-1]
    nest = list(loops_in(reduction.body))
    vector = [loop for loop in nest if loop.kind == ir.VECTOR]
    leaves = list(statements_in(reduction.body))
    if len(vector) != 1 or any(loop.kind == ir.REDUCE for loop in nest) or not all(
            isinstance(s, ir.Accumulate) and s.name == define.name and s.index is not None for s in leaves):
        return None
    row, extent = vector[0], reduction.extent
    if extent < 2:          # nothing to spread over lanes (an empty reduction sums nothing)
        return None
    width = min([row.extent] + [loop.extent for loop in loops_in(after) if loop.var == row.var])
    vector_lanes = VECTOR_BYTES // define.dtype.itemsize
    # vector instructions per accumulation over the reduction loop, now and split into n lanes that
    # divide it (width per n steps). A peeled tail keeps the old accumulators live beside the
    # lanes' and spilled them: a 3x3 weight gradient over 56x56 took 61 ms in 16 lanes and a
    # tail of 8, 27 in 8 lanes, 54 before.
    now = extent * -(-row.extent // vector_lanes)
    cost, lanes = min((extent // n * width, -n) for n in _powers_of_two(min(vector_lanes, extent))
                      if extent % n == 0)
    lanes = -lanes
    if now < gain * cost:
        return None
    for s in leaves:
        for v in ir.values(s.value):
            index = v.index if isinstance(v, (ir.Load, ir.Ref)) else None
            if index is not None and reduction.var in variables(index) and \
                    linear_terms(index)[0].get(Var(reduction.var)) != 1:
                return None
    copies = len(leaves) * width * math.prod(loop.extent for loop in nest if loop is not row)
    if copies <= LANE_REGISTERS:
        return lanes, width, True
    if define.size * lanes * define.dtype.itemsize <= LANE_BYTES:
        return lanes, width, False
    return None


def _powers_of_two(limit):
    n = 1
    while n <= limit:
        yield n
        n *= 2
