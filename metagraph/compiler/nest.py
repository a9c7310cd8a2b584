"""The loop nest of a kernel over its output, and of a reduction inside it: row blocks
accumulated whole with their loops innermost, rows too long for one block cut into tiles, and
register blocking of an outer output dimension. Every rewrite substitutes loop variables in the
kernel IR's values; nothing here knows which operator the reduction came from.
"""
from metagraph.compiler import ir
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var, linear_terms, variables

ROW_MIN, ROW_MAX = 8, 1024   # output rows this long are accumulated whole, their loop innermost


def _loads(value):
    """Every Load in a value tree."""
    if isinstance(value, ir.Load):
        return [value]
    if isinstance(value, ir.Guard):
        return _loads(value.value)
    return [load for arg in getattr(value, "args", ()) for load in _loads(arg)]


STRIDE_MAX = 2     # the vectorised loop of a row block may read with this stride (strided convs)


def _contiguous(value, var):
    """Whether every load's address moves by a small constant stride (0 to STRIDE_MAX elements)
    per step of loop variable `var`."""
    for load in _loads(value):
        terms, _ = linear_terms(load.index)
        if any(var in variables(term) and (not isinstance(term, Var) or not 0 <= coef <= STRIDE_MAX)
               for term, coef in terms.items()):
            return False
    return True


class Replace(dict):
    """A substitution for `substitute`: the variables it names, every other one unchanged."""

    def __missing__(self, axis):
        return Var(axis)


ACC_MAX = 2048     # elements of a register-blocked accumulator (8 KiB of float32; 16 KiB measured slower)
# A register-blocked accumulator of at most this many vectors stays in registers for the whole
# reduction (AVX-512 has 32): a longer row is cut into tiles so that it fits, and the tile is the
# whole block. Matmul 1024^3 went from 78 to 161-176 GFLOP/s with 8 rows x 32 or 64 columns.
VECTOR_BYTES, ACC_REGISTERS = 64, 32


def _load_variables(load):
    return variables(load.index) | (variables(load.valid) if load.valid is not None else set())


def _register_block(shape, value, outer, inner, size):
    """(d, rows) when output dimension d is worth blocking: some operand does not
    depend on d (it is read once for all rows) and every operand that does is constant along the
    vectorised loop (one scalar per row). The innermost such dimension; rows divides its extent."""
    loads = _loads(value)
    for d in reversed(outer):
        dependent = [load for load in loads if d in _load_variables(load)]
        if not dependent or len(dependent) == len(loads):
            continue
        if any(inner in _load_variables(load) for load in dependent):
            continue
        # the first dimension is the parallel loop: keep at least 8 blocks of it for the threads
        rows = next((r for r in (8, 4, 2) if shape[d] % r == 0 and r * size <= ACC_MAX
                     and (d != 0 or shape[d] // r >= 8)), None)
        if rows is not None:
            return d, rows
    return None


def _vectors(length, itemsize):
    """Vector registers a row of `length` elements occupies."""
    return -(-length * itemsize // VECTOR_BYTES)


def _guards(value):
    """Every Guard and IndexValue in a value tree (index conditions outside loads)."""
    if isinstance(value, (ir.Guard, ir.IndexValue)):
        return [value] + _guards(getattr(value, "value", None))
    return [g for arg in getattr(value, "args", ()) for g in _guards(arg)]


def _mentions(value, axes):
    exprs = [value.expr] if isinstance(value, ir.IndexValue) else [value.cond, value.valid]
    return any(expr is not None and variables(expr) & set(axes) for expr in exprs)


class _Plane:
    """Output rows a..a+R of a plane computed as one flat loop (see Nest.flattened): the value with
    every load's S*h + w replaced by the flat position p, the store over (t, r, w), and where the
    store reads the tile from (r*S + w)."""

    def __init__(self, nest, a, b, pitch, rows, value, store):
        extents = nest.extents
        height, width = extents[a], extents[b]
        self.var = p = max(extents) + 1
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
        self.value = nest.rewritten(value, fold)
        mapping = Replace({a: Var(a) * rows + Var(r)})
        self.store = ir.Store(store.param, simplify(substitute(store.index, mapping), extents),
                              nest.substituted(store.value, mapping))
        self.store_offset = Var(r) * pitch + Var(b)
        self.store_loops = [(r, rows, ir.SERIAL), (b, width, ir.VECTOR)]


class Nest:
    """Builds loop nests for one kernel: `extents` (loop variable -> extent, updated as variables
    are split) and the kernel's accumulator (its index is set here) are the lowering's."""

    def __init__(self, extents, accumulator):
        self.extents, self.accumulator = extents, accumulator

    def loops(self, node, store, reduce_parts):
        """Loops over the output around `store`, with the reduction (`reduce_parts`) inside.

        A reduction accumulates a whole block of its trailing output dimensions (as many as fit
        in ROW_MAX elements, at least ROW_MIN) in a local array, with the block's loops innermost:
        a matmul runs i-k-j, a convolution runs along its output rows, and both read memory
        contiguously in the vectorised loop."""
        outer, extent = list(range(node.ndim)), self.extents
        if reduce_parts is None:
            body = [store]
        else:
            acc_dtype, init, op, loops, value = reduce_parts
            whole, least, plane, registers = ROW_MAX, ROW_MIN, None, False   # block elements: most, least
            if loops and node.ndim and _contiguous(value, node.ndim - 1):
                rows = _register_block(extent, value, outer[:-1], node.ndim - 1, 1)
                tile, registers = self.row_tile(node.shape[-1], acc_dtype.itemsize, rows)
                if tile is not None:
                    value, store, row = self.split_row(node, value, store, tile)
                    outer.append(row)
                elif registers:
                    plane = self.flattened(node, value, store, acc_dtype.itemsize, rows)
                if plane is not None:      # the row's loop is the store's only
                    value, store = plane.value, plane.store
                    outer[-1] = plane.var
                if registers:          # the register tile is the row (or its tile) alone
                    whole, least = extent[outer[-1]], 2
            block, size = [], 1
            for d in reversed(outer):
                if size * extent[d] > whole or (d == 0 and len(outer) > 1):   # keep a parallel loop
                    break
                if block and registers:
                    break
                block.insert(0, d)
                size *= extent[d]
            inner = next((d for d in reversed(block) if extent[d] > 1), None)
            if loops and size >= least and inner is not None and _contiguous(value, inner):
                offset = Const(0)
                for d in block:
                    offset = offset * extent[d] + Var(d)
                store_offset, store_loops = offset, [(d, extent[d], ir.VECTOR if d == inner else ir.SERIAL)
                                                     for d in block]
                if plane is not None:   # the plane's rows are stored one by one from the flat tile
                    store_offset, store_loops = plane.store_offset, plane.store_loops
                outer = outer[:len(outer) - len(block)]
                blocking = _register_block(extent, value, outer, inner, size)
                rows = None           # (row variable, rows) of a register block
                if blocking is None:
                    accumulate = [ir.Accumulate("acc", op, value, simplify(offset, extent))]
                    self.accumulator.index = simplify(store_offset, extent)
                    stores = [store]
                else:
                    accumulate, stores, rows = self.register_blocked(blocking, (offset, store_offset), size,
                                                                     op, value, store)
                    size *= rows[1]
                for d in reversed(block):
                    accumulate = [ir.Loop(d, extent[d], ir.VECTOR if d == inner else ir.SERIAL, accumulate)]
                for loop in reversed(store_loops):
                    stores = [ir.Loop(*loop, stores)]
                if rows is not None:
                    stores = [ir.Loop(*rows, ir.SERIAL, stores)]
                for loop_var, loop_extent in reversed(loops):
                    accumulate = [ir.Loop(loop_var, loop_extent, ir.REDUCE, accumulate)]
                body = [ir.Define("acc", acc_dtype, init, op, size)] + accumulate + stores
            else:
                body = [ir.Accumulate("acc", op, value)]
                for loop_var, loop_extent in reversed(loops):
                    body = [ir.Loop(loop_var, loop_extent, ir.REDUCE, body)]
                body = [ir.Define("acc", acc_dtype, init, op)] + body + [store]
        for d in reversed(outer):
            body = [ir.Loop(d, extent[d], ir.PARALLEL if d == 0 else ir.SERIAL, body)]
        return body

    def row_tile(self, length, itemsize, blocking):
        """(tile, registers): the length of the tiles an output row is cut into (None: not cut),
        and whether the row's register block (`blocking`) fits in ACC_REGISTERS vectors.

        A row that a register block would accumulate in more vectors than that is cut into the
        longest tiles that fit (a divisor of its length, at least one vector). Otherwise a row
        longer than ROW_MAX is cut into tiles of up to ROW_MAX elements (a divisor, at least 64).
        A row with no such divisor is not cut."""
        if blocking is not None:
            if _vectors(length, itemsize) * blocking[1] <= ACC_REGISTERS:
                return None, True
            shortest = max(1, VECTOR_BYTES // itemsize)
            tile = next((t for t in range(length // 2, shortest - 1, -1)
                         if length % t == 0 and _vectors(t, itemsize) * blocking[1] <= ACC_REGISTERS), None)
            if tile is not None:
                return tile, True
        if length > ROW_MAX:
            return next((t for t in range(ROW_MAX, 63, -1) if length % t == 0), None), False
        return None, False

    def flattened(self, node, value, store, itemsize, blocking):
        """A short output row and the rows after it as one flat vectorised loop (a _Plane), or
        None when that does not help.

        Where every load reads the plane (h, w) at S*h + w (times a stride), for one row pitch
        S >= the row's length (a convolution over a padded copy), R rows starting at h are the
        addresses p in [0, (R-1)*S + W) from h's: one loop over p computes them, and the lanes
        whose w is past the row are computed but never stored. A 7x7 plane is then one loop of 61
        lanes instead of seven of 7. R divides the rows and is chosen for the most output lanes
        per instruction (multiply-adds plus loads of the register block)."""
        a, b = node.ndim - 2, node.ndim - 1
        if a < 1 or a == blocking[0] or any(_mentions(v, (a, b)) for v in _guards(value)):
            return None
        pitch = None
        for load in _loads(value):
            terms, _ = linear_terms(load.index)
            ca, cb = terms.get(Var(a), 0), terms.get(Var(b), 0)
            if load.valid is not None and variables(load.valid) & {a, b}:
                return None
            if any(variables(term) & {a, b} for term in terms if term not in (Var(a), Var(b))):
                return None      # a or b inside a product, division or index tensor read
            if not ca and not cb:
                continue
            if cb <= 0 or ca % cb or (pitch is not None and ca // cb != pitch):
                return None
            pitch = ca // cb
        height, width, rows = self.extents[a], self.extents[b], blocking[1]
        # Only rows shorter than half a vector: a 14-wide plane flattened to 30 lanes measured
        # slower (gcc then kept the accumulator in memory), a 7-wide one 3x faster.
        if pitch is None or pitch < width or 2 * width * itemsize > VECTOR_BYTES:
            return None

        def score(r):
            lanes = (r - 1) * pitch + width
            vectors = _vectors(lanes, itemsize)
            fits = vectors * rows <= ACC_REGISTERS
            return fits * r * width * rows / (rows + vectors + rows * vectors)
        best = max((r for r in range(1, height + 1) if height % r == 0), key=score)
        if best == 1 or score(best) <= 0:
            return None
        return _Plane(self, a, b, pitch, best, value, store)

    def split_row(self, node, value, store, tile):
        """The output row cut into tiles of `tile` elements: (value, store, tile variable) with
        the last dimension counting tiles."""
        last, length = node.ndim - 1, node.shape[-1]
        row = max(self.extents) + 1
        self.extents[last], self.extents[row] = length // tile, tile
        mapping = Replace({last: Var(last) * tile + Var(row)})
        store = ir.Store(store.param, simplify(substitute(store.index, mapping), self.extents),
                         self.substituted(store.value, mapping))
        return self.substituted(value, mapping), store, row

    def register_blocked(self, blocking, offsets, size, op, value, store):
        """Accumulate `rows` consecutive values of output dimension d at once: d's loop counts
        blocks, and each step of the vectorised loop reads its shared operand once for `rows`
        accumulations (unrolled), each with its own element of the other operand. `offsets` are
        the position in the block where it is accumulated and where it is stored from. Returns
        (accumulations, stores, (row variable, rows))."""
        (d, rows), (offset, store_offset) = blocking, offsets
        r = max(self.extents) + 1
        self.extents[d], self.extents[r] = self.extents[d] // rows, rows
        block_var = Var(d) * rows + Var(r)
        accumulate = []
        for row in range(rows):
            mapping = Replace({d: Var(d) * rows + Const(row)})
            index = simplify(Const(row * size) + offset, self.extents)
            accumulate.append(ir.Accumulate("acc", op, self.substituted(value, mapping), index))
        mapping = Replace({d: block_var})
        self.accumulator.index = simplify(Var(r) * size + store_offset, self.extents)
        stores = [ir.Store(store.param, simplify(substitute(store.index, mapping), self.extents),
                           self.substituted(store.value, mapping))]
        return accumulate, stores, (r, rows)

    def substituted(self, value, mapping):
        """A value tree with its index expressions' variables replaced (`mapping`)."""
        return self.rewritten(value, lambda expr: substitute(expr, mapping))

    def rewritten(self, value, rewrite):
        """A value tree with `rewrite` applied to its index expressions (then simplified)."""
        def index(expr):
            return None if expr is None else simplify(rewrite(expr), self.extents)
        memo = {}

        def walk(v):
            if id(v) in memo:
                return memo[id(v)]
            out = v         # values the mapping does not change stay the same objects (shared)
            if isinstance(v, ir.Load):
                parts = (index(v.index), index(v.valid))
                if parts != (v.index, v.valid):
                    out = ir.Load(v.param, parts[0], v.dtype, parts[1])
            elif isinstance(v, ir.IndexValue):
                expr = index(v.expr)
                if expr != v.expr:
                    out = ir.IndexValue(expr, v.dtype)
            elif isinstance(v, ir.Guard):
                parts = (index(v.cond), walk(v.value), index(v.valid))
                if parts != (v.cond, v.value, v.valid):
                    out = ir.Guard(parts[0], parts[1], v.fill, parts[2], v.check)
            elif isinstance(v, ir.Apply):
                args = tuple(walk(a) for a in v.args)
                if any(a is not b for a, b in zip(args, v.args)):
                    out = ir.Apply(v.op, args, v.dtype, v.site)
            elif isinstance(v, ir.Ref) and v is not self.accumulator and v.index is not None:
                out = ir.Ref(v.name, v.dtype, index(v.index))
            memo[id(v)] = out
            return out
        return walk(value)
