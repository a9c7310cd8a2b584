"""Flattened planes: when a register tile over short output rows should compute several rows as one
vectorised loop (the primitive that does it is blocks.flatten_plane).

Where every load reads the plane (h, w) at pitch * h + w, R rows starting at h are one flat range
of addresses, and one loop over it computes them all (the lanes past a row are computed, never
stored).
"""
from metagraph.compiler import ir
from metagraph.compiler.access import VECTOR_BYTES, loop_variables, register_block, row_vectors
from metagraph.expr import Var, linear_terms, variables


def layout(extents, ndim, value, itemsize, blocking, registers):
    """(pitch, rows) of the flattened plane, or None when it does not apply or help.

    Where every load reads the plane (h, w) at S*h + w (times a stride), for one row pitch
    S >= the row's length (a convolution over a padded copy), R rows starting at h are the
    addresses p in [0, (R-1)*S + W) from h's: one loop over p computes them, and the lanes
    whose w is past the row are computed but never stored. Every address they read lies
    between two that valid lanes read. A 7x7 plane is then one loop of 61 lanes instead of
    seven of 7. R divides the rows and is chosen for the most output lanes per instruction
    (multiply-adds plus loads of the register block)."""
    a, b = ndim - 2, ndim - 1
    if a < 1 or a == blocking[0]:
        return None
    pitch = plane_pitch(value, a, b)
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


def plane_pitch(value, a, b):
    """The pitch S at which every load of a value tree reads the plane (a, b) as S * a + b (times a
    stride), or None where one does not (a guard, a validity or an index value along the plane,
    a or b inside a product, division or index tensor read, rows read at another pitch)."""
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
            return None
        if not ca and not cb:
            continue
        if cb <= 0 or ca % cb or (pitch is not None and ca // cb != pitch):
            return None
        pitch = ca // cb
    return pitch


def fill(extents, ndim, value, itemsize, registers):
    """The share of the lanes of a register tile's vectors that hold output elements (the row
    rounded up to whole vectors, or the flattened plane): 1.0 for a row of whole vectors."""
    last = ndim - 1
    width, lanes = extents[last], VECTOR_BYTES // itemsize
    blocking = register_block(extents, value, list(range(last)), last, 1)
    found = layout(extents, ndim, value, itemsize, blocking, registers) if blocking else None
    if found is not None:
        pitch, rows = found
        width, computed = rows * width, (rows - 1) * pitch + width
    else:
        computed = width
    return width / (row_vectors(computed, itemsize) * lanes)
