"""How a reduction's operands move along loop variables: the facts the loop nest (nest.py) chooses
its block, register block and loop order from."""
import math

from metagraph.compiler import ir
from metagraph.expr import Var, linear_terms, variables

STRIDE_MAX = 2     # the vectorised loop of a row block may read with this stride (strided convs)
ACC_MAX = 2048     # elements of a register-blocked accumulator (8 KiB of float32; 16 KiB measured slower)
VECTOR_BYTES = 64  # one AVX-512 register: the loop nest's unit of vectorisation
# Rows a register block takes, the first that divides the dimension: powers of two first, then
# the others, so that a 7-wide plane is blocked too (a channel tile over ResNet-50's 7x7 layers had
# 2 accumulation chains, latency-bound at 67 GFLOP/s on two cores)
JAM_ROWS = (8, 4, 7, 6, 5, 3, 2)
JAM_WASTE = 8      # rows a register block may compute twice where none of JAM_ROWS divides: 1 in 8
# Rows a register block takes along a dimension whose extent varies (jam_rows), in order. 6 rows of
# a 4-vector tile (24 accumulators) ran matmuls and linear layers 10-34% faster than 8 (every
# register) on one core, but matmul 2048^3 13% slower on two: each group of rows streams the other
# operand whole from L3, and 6 rows stream it a third more often. Which wins is a cost model's
# call (L3 traffic against register pressure); 8 keeps what powers of two ran before.
VARYING_ROWS = (8, 6, 4, 2)


def contiguous(value, var, stride_max=STRIDE_MAX):
    """Whether every load's address moves by a small constant stride (0 to `stride_max` elements)
    per step of loop variable `var`."""
    for load in ir.loads(value):
        terms, _ = linear_terms(load.index)
        if any(var in variables(term) and (not isinstance(term, Var) or not 0 <= coef <= stride_max)
               for term, coef in terms.items()):
            return False
    return True


class Replace(dict):
    """A substitution for `substitute`: the variables it names, every other one unchanged."""

    def __missing__(self, axis):
        return Var(axis)


def loop_variables(v):
    """The loop variables one value node's index expressions use."""
    return set().union(*(variables(expr) for expr in ir.index_expressions(v)))


def register_block(shape, value, outer, inner, size, most=8):
    """(d, rows) when output dimension d is worth blocking: some operand does not
    depend on d (it is read once for all rows) and every operand that does is constant along the
    vectorised loop (one scalar per row). The innermost such dimension; rows (at most `most`,
    `jam_rows`)."""
    loads = operands(value)
    for d in reversed(outer):
        dependent = [load for load in loads if d in loop_variables(load)]
        if not dependent or len(dependent) == len(loads):
            continue
        if any(inner in loop_variables(load) for load in dependent):
            continue
        rows = jam_rows(shape[d], lambda r: r <= most and r * size <= ACC_MAX and
                        (d != 0 or -(-shape[d] // r) >= 8), varies=d == 0)
        if rows is not None:
            return d, rows
    return None


def jam_rows(extent, allowed, varies=False):
    """The rows a register block takes along a dimension of `extent`: the first of JAM_ROWS that
    `allowed` and divides it, else the largest allowed that leaves at most 1/JAM_WASTE of the rows
    computed twice (blocks.jam clamps a last group to the extent: a linear layer over 97 tokens
    blocks 8 rows, 13 groups, where it ran one row at a time at a quarter of the speed). Along a
    dimension whose extent `varies` from call to call (the output's first: a batch), the first of
    VARYING_ROWS allowed within that waste, divisor or not: the rows then change only where the extent
    crosses one of a few thresholds, and kernels over batches of other sizes share one generic form
    (generic.py: a batch below MANY is scheduled for NOMINAL rows and meets none of them; batches of
    MANY rows or more, scheduled for their count, share the 8-row form past 57)."""
    if varies:
        return next((r for r in VARYING_ROWS if allowed(r) and r < extent and (-extent % r) * JAM_WASTE <= extent),
                    None)
    rows = next((r for r in JAM_ROWS if allowed(r) and extent % r == 0), None)
    if rows is None:
        rows = next((r for r in sorted(JAM_ROWS, reverse=True) if allowed(r) and r < extent and
                     (-extent % r) * JAM_WASTE <= extent), None)
    return rows


def operands(value):
    """The values a value tree reads per element: loads, and local arrays (a packed operand)."""
    return [v for v in ir.values(value)
            if isinstance(v, ir.Load) or isinstance(v, ir.Ref) and v.index is not None]


def reads_flat(expr, outer, inner, inner_extent):
    """Whether `expr` reads loop variables outer and inner only as outer * (c * inner_extent) +
    inner * c (or not at all), so that one variable over both ranges can replace them."""
    terms, _ = linear_terms(expr)
    if any(term not in (Var(outer), Var(inner)) and variables(term) & {outer, inner} for term in terms):
        return False
    return terms.get(Var(outer), 0) == terms.get(Var(inner), 0) * inner_extent


def largest_load(value, extents):
    """The load of a value tree that reads the most elements (None without loads)."""
    return max(ir.loads(value), key=lambda load: math.prod(extents[v] for v in loop_variables(load)),
               default=None)


def reuse_order(value, ndim, extents):
    """The output loops of one dot product per element, outermost first: an output dimension the
    largest operand does not vary along goes innermost (its size-1 dimensions after it), so that
    consecutive dot products read the same slice of that operand from the first-level cache. A
    conv over a 1x1 plane otherwise streams all its weights once per image: the input gradient
    of ResNet-18's 512-channel conv, 32 images: 8.5 -> 7.9 ms per call (packed: 0.84)."""
    order = [d for d in range(ndim) if extents[d] > 1]
    largest = largest_load(value, extents)
    if largest is None or not order:
        return list(range(ndim))
    reused = [d for d in order if d not in loop_variables(largest)]
    if reused and order[-1] not in reused:
        order = [d for d in order if d != reused[-1]] + [reused[-1]]
    return order + [d for d in range(ndim) if extents[d] == 1]


def row_vectors(length, itemsize):
    """Vector registers a row of `length` elements occupies."""
    return -(-length * itemsize // VECTOR_BYTES)


def vector_loop(block, extents):
    """The vectorised loop of a block: its innermost that runs more than once."""
    return next((d for d in reversed(block) if extents[d] > 1), None)
