"""Flattened planes: a register tile over short output rows, several rows as one vectorised loop.

Where every load reads the plane (h, w) at pitch * h + w, R rows starting at h are one flat range
of addresses, and one loop over it computes them all (the lanes past a row are computed, never
stored). Functions of a `nest.Nest` (`nest`), whose extents and rewrites they use.
"""
from metagraph.compiler import ir
from metagraph.compiler.access import VECTOR_BYTES, Replace, loop_variables, register_block, row_vectors
from metagraph.expr import Const, Var, linear_terms, variables


def flattened(nest, node, value, store, itemsize, blocking):
    """A short output row and the rows after it as one flat vectorised loop (the fields of a
    `nest._Block`), or None when that does not help (see `layout`)."""
    found = layout(nest.extents, node, value, itemsize, blocking, nest.registers)
    if found is None:
        return None
    a, b = node.ndim - 2, node.ndim - 1
    return plane(nest, a, b, *found, value, store)


def layout(extents, node, value, itemsize, blocking, registers):
    """(pitch, rows) of the flattened plane, or None when it does not apply or help.

    Where every load reads the plane (h, w) at S*h + w (times a stride), for one row pitch
    S >= the row's length (a convolution over a padded copy), R rows starting at h are the
    addresses p in [0, (R-1)*S + W) from h's: one loop over p computes them, and the lanes
    whose w is past the row are computed but never stored. Every address they read lies
    between two that valid lanes read. A 7x7 plane is then one loop of 61 lanes instead of
    seven of 7. R divides the rows and is chosen for the most output lanes per instruction
    (multiply-adds plus loads of the register block)."""
    a, b = node.ndim - 2, node.ndim - 1
    if a < 1 or a == blocking[0]:
        return None
    pitch = None
    for v in ir.values(value):
        if not isinstance(v, ir.Load):
            if loop_variables(v) & {a, b}:
                return None          # a guard or an index value along the plane
            continue
        terms, _ = linear_terms(v.index)
        ca, cb = terms.get(Var(a), 0), terms.get(Var(b), 0)
        if v.valid is not None and variables(v.valid) & {a, b}:
            return None
        if any(variables(term) & {a, b} for term in terms if term not in (Var(a), Var(b))):
            return None      # a or b inside a product, division or index tensor read
        if not ca and not cb:
            continue
        if cb <= 0 or ca % cb or (pitch is not None and ca // cb != pitch):
            return None
        pitch = ca // cb
    height, width, rows = extents[a], extents[b], blocking[1]
    # Only rows shorter than half a vector: a 14-wide plane flattened to 30 lanes measured
    # slower (gcc then kept the accumulator in memory), a 7-wide one 3x faster.
    if pitch is None or pitch < width or 2 * width * itemsize > VECTOR_BYTES:
        return None

    def score(r):
        lanes = (r - 1) * pitch + width
        vectors = row_vectors(lanes, itemsize)
        fits = vectors * rows <= registers
        return fits * r * width * rows / (rows + vectors + rows * vectors)
    best = max((r for r in range(1, height + 1) if height % r == 0), key=score)
    if best == 1 or score(best) <= 0:
        return None
    return pitch, best


def fill(extents, node, value, itemsize, registers):
    """The share of the lanes of a register tile's vectors that hold output elements (the row
    rounded up to whole vectors, or the flattened plane): 1.0 for a row of whole vectors."""
    last = node.ndim - 1
    width, lanes = extents[last], VECTOR_BYTES // itemsize
    blocking = register_block(extents, value, list(range(last)), last, 1)
    found = layout(extents, node, value, itemsize, blocking, registers) if blocking else None
    if found is not None:
        pitch, rows = found
        width, computed = rows * width, (rows - 1) * pitch + width
    else:
        computed = width
    return width / (row_vectors(computed, itemsize) * lanes)


def plane(nest, a, b, pitch, rows, value, store):
    """Output rows of dimension a computed `rows` at a time as one flat loop p (see
    `flattened`): every load's pitch*a + b becomes t*rows*pitch + p, with a's loop t counting
    row groups; the store runs over (r, b) and reads the tile at r*pitch + b."""
    extents = nest.extents
    height, width = extents[a], extents[b]
    p = max(extents) + 1
    r = p + 1
    extents[a], extents[p], extents[r] = height // rows, (rows - 1) * pitch + width, rows

    def fold(expr):
        terms, const = linear_terms(expr)
        step = terms.pop(Var(b), 0)
        if not step:
            return expr
        terms.pop(Var(a))
        out = Const(const) + (Var(a) * (rows * pitch) + Var(p)) * step
        for term, coef in terms.items():
            out = out + term * coef
        return out
    store = nest.stored(store, Replace({a: Var(a) * rows + Var(r)}))
    return (nest.rewritten(value, fold), store, list(range(b)), [p],
            [(r, rows, ir.SERIAL), (b, width, ir.VECTOR)], Var(r) * pitch + Var(b))
