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
# A register-blocked accumulator this small stays in vector registers for the whole reduction
# (28 of AVX-512's 32; the other 4 hold the shared operand): a longer row is cut into tiles so it
# fits. Matmul 1024^3 went from 78 to 174 GFLOP/s with 8 rows x 32 columns.
REGISTER_BYTES = 1792
LANES_MIN_BYTES = 64   # a register tile is at least one 512-bit vector wide


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
            tile, whole = None, ROW_MAX
            if loops and node.ndim and _contiguous(value, node.ndim - 1):
                tile, registers = self.row_tile(node, value, acc_dtype)
                if tile is not None:
                    value, store, row = self.split_row(node, value, store, tile)
                    outer.append(row)
                    whole = tile if registers else ROW_MAX   # a register tile is the whole block
            block, size = [], 1
            for d in reversed(outer):
                if size * extent[d] > whole or (d == 0 and len(outer) > 1):   # keep a parallel loop
                    break
                block.insert(0, d)
                size *= extent[d]
            inner = next((d for d in reversed(block) if extent[d] > 1), None)
            if loops and size >= ROW_MIN and inner is not None and _contiguous(value, inner):
                offset = Const(0)
                for d in block:
                    offset = offset * extent[d] + Var(d)
                outer = outer[:len(outer) - len(block)]
                blocking = _register_block(extent, value, outer, inner, size)
                rows = None           # (row variable, rows) of a register block
                if blocking is None:
                    self.accumulator.index = simplify(offset, self.extents)
                    accumulate = [ir.Accumulate("acc", op, value, self.accumulator.index)]
                    stores = [store]
                else:
                    accumulate, stores, rows = self.register_blocked(blocking, offset, size, op, value, store)
                    size *= rows[1]
                for d in reversed(block):
                    kind = ir.VECTOR if d == inner else ir.SERIAL
                    accumulate = [ir.Loop(d, extent[d], kind, accumulate)]
                    stores = [ir.Loop(d, extent[d], kind, stores)]
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

    def row_tile(self, node, value, acc_dtype):
        """(tile, registers): the length of the tiles an output row is cut into, or None.

        A row that a register block would accumulate over more than REGISTER_BYTES is cut into
        the longest tiles that fit (a divisor of its length, at least one vector: registers is
        True). Otherwise a row longer than ROW_MAX is cut into tiles of up to ROW_MAX elements
        (a divisor, at least 64). A row with no such divisor is not cut."""
        length = node.shape[-1]
        blocking = _register_block(self.extents, value, list(range(node.ndim - 1)), node.ndim - 1, 1)
        if blocking is not None:
            itemsize = acc_dtype.itemsize
            budget = REGISTER_BYTES // (itemsize * blocking[1])
            shortest = max(1, LANES_MIN_BYTES // itemsize)
            tile = next((t for t in range(budget, shortest - 1, -1) if length % t == 0), None)
            if length > budget and tile is not None:
                return tile, True
        if length > ROW_MAX:
            return next((t for t in range(ROW_MAX, 63, -1) if length % t == 0), None), False
        return None, False

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

    def register_blocked(self, blocking, offset, size, op, value, store):
        """Accumulate `rows` consecutive values of output dimension d at once: d's loop counts
        blocks, and each step of the vectorised loop reads its shared operand once for `rows`
        accumulations (unrolled), each with its own element of the other operand. Returns
        (accumulations, stores, (row variable, rows))."""
        d, rows = blocking
        r = max(self.extents) + 1
        self.extents[d], self.extents[r] = self.extents[d] // rows, rows
        block_var = Var(d) * rows + Var(r)
        accumulate = []
        for row in range(rows):
            mapping = Replace({d: Var(d) * rows + Const(row)})
            index = simplify(Const(row * size) + offset, self.extents)
            accumulate.append(ir.Accumulate("acc", op, self.substituted(value, mapping), index))
        mapping = Replace({d: block_var})
        self.accumulator.index = simplify(Var(r) * size + offset, self.extents)
        stores = [ir.Store(store.param, simplify(substitute(store.index, mapping), self.extents),
                           self.substituted(store.value, mapping))]
        return accumulate, stores, (r, rows)

    def substituted(self, value, mapping):
        """A value tree with its index expressions' variables replaced (`mapping`)."""
        def index(expr):
            return None if expr is None else simplify(substitute(expr, mapping), self.extents)
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
