"""The loop nest of a kernel over its output, and of a reduction inside it.

A reduction accumulates a block of output elements at once in a local array, the block's loop
innermost and vectorised, the reduction's loops around it:
- a channel tile, where the output row would be guarded lane by lane (a conv's input gradient
  over a small plane): one vector along an outer dimension, its operand packed (`channel_tile`);
- a register tile, where an outer output dimension can be register-blocked (a conv's filters, a
  matmul's rows): the output row alone, cut into tiles or flattened with the rows after it so
  that rows x row vectors fit the vector registers (`register_tile`);
- otherwise a row block: the trailing output dimensions, up to ROW_MAX elements (`row_block`);
- otherwise one dot product per output element.
Every rewrite substitutes loop variables in the kernel IR's values; nothing here knows which
operator the reduction came from.
"""
import math
from dataclasses import dataclass

from metagraph.compiler import ir, planes
from metagraph.compiler.access import (VECTOR_BYTES, Replace, contiguous, largest_load, loop_variables,
                                       operands, reads_flat, register_block, reuse_order, row_vectors,
                                       vector_loop)
from metagraph.compiler.simplify import simplify, substitute, value_range
from metagraph.expr import Const, Var, linear_terms, variables

PACK_BYTES = 64 * 1024    # a packed operand slice (`Nest.packed`) at most this large
TILE_PACK_BYTES = 192 * 1024   # a channel tile's packed operand (`Nest.channel_tile`), in L2
# A register tile along the output row whose vectors hold fewer output elements than this share of
# their lanes gives way to a channel tile (one core, conv 3x3 forward): over 8x8 planes, bs32 (4
# rows of 8 in 48 lanes) 2.07 -> 1.41 ms; over 4x4 3.3 -> 1.9 ms; over 7x7 (49 of 64 lanes) the
# flat plane stays faster (17 ms against 24 as a channel tile). Weight gradients, whose rows are a
# 3-wide kernel row, gain most: 3x3 512 channels over 7x7 at bs4 36 -> 10 ms, 256 over 14x14 56 -> 16.
TILE_FILL = 3 / 4
PANEL_BYTES = 512 * 1024       # a transposed operand's panel (`Nest.transposed_panel`): half of L2
PANEL_REUSE_MIN = 4            # ... copied only for at least this many output rows that reuse it
ROW_MIN, ROW_MAX = 8, 1024   # output rows this long are accumulated whole, their loop innermost
# A register tile of at most ACC_REGISTERS vectors stays in registers for the whole reduction
# (AVX-512 has 32; a backend may ask for fewer): matmul 1024^3 went from 78-88 to 117-160
# GFLOP/s with 8 rows x 64 columns under gcc.
ACC_REGISTERS = 32
# A register tile keeps at least MIN_CHAINS independent vector accumulations in flight (two FMA
# units of 4 cycles' latency), blocking further output dimensions while it has fewer (a channel
# tile over a 2x2 plane had 2), but not past MAX_CHAINS.
MIN_CHAINS, MAX_CHAINS = 8, 16
# The blocks a reduction may accumulate at once: Nest's methods of these names, each called with
# (node, value, store, loops, itemsize, chosen) and returning a _Block or None where it does not
# apply. Tuning may choose any of them (`chosen`); the heuristic tries them in `Nest.heuristic`'s order.
BLOCKS = ("channel_tile", "register_tile", "row_block", "transposed_panel")


@dataclass
class _Block:
    """The output elements a reduction accumulates at once: `block` are their loop variables
    (see vector_loop for the vectorised one), `outer` the output loops around them; the value and store after
    any rewrite of their variables, and the loops and accumulator position the store uses."""
    value: object
    store: object
    outer: list
    block: list
    store_loops: list = None     # (variable, extent, kind); None: the block's own loops
    store_offset: object = None  # None: the accumulation's own position


class Nest:
    """Builds loop nests for one kernel: `extents` (loop variable -> extent, updated as variables
    are split) and the kernel's accumulator (its index is set here) are the lowering's;
    `registers` is how many vectors a register tile may fill; `readable[param]` is how many
    elements of a parameter a load may touch (its size, or more where the buffer has slack past
    its end), None when no load may read past what its loop needs."""

    def __init__(self, extents, accumulator, registers=ACC_REGISTERS, tile_fill=TILE_FILL, readable=None,
                 block=None):
        self.extents, self.accumulator, self.registers = extents, accumulator, registers
        self.tile_fill = tile_fill
        self.readable = readable
        self.block = block   # the block (one of BLOCKS) to try before the heuristic's, or None
        self.pack = None     # (output loop variable or None: the kernel's body, statements)

    def loops(self, node, store, reduce_parts):
        """Loops over the output around `store`, with the reduction (`reduce_parts`) inside."""
        if reduce_parts is None:
            body, outer = [store], list(range(node.ndim))
        else:
            body, outer = self.reduction(node, store, *reduce_parts)
        for d in reversed(outer):
            body = [ir.Loop(d, self.extents[d], ir.PARALLEL if d == outer[0] else ir.SERIAL, body)]
        if self.pack is not None:
            var, statements = self.pack
            inside = body
            while var is not None and inside[0].var != var:
                inside = inside[0].body
            (inside if var is None else inside[0].body)[:0] = statements
        return body

    def heuristic(self, node, value, loops):
        """The blocks to try, in order, for a reduction of `value` over `loops` into `node`: the
        channel tile where it applies (see channel_tile: the heuristic asks more of it than
        applying), then a register tile or a row block where the output row reads contiguously,
        else the transposed panel (`reduction` tries `self.block` before them all). Where none
        applies, one dot product per output element."""
        if not loops or not node.ndim:
            return []
        rest = ["register_tile", "row_block"] if contiguous(value, node.ndim - 1) else ["transposed_panel"]
        return ["channel_tile"] + rest

    def reduction(self, node, store, acc_dtype, init, op, loops, value):
        """(body, output loops around it) of a reduction of `value` over `loops`."""
        found, order = None, self.heuristic(node, value, loops)
        if self.block is not None and order:
            order = [self.block] + order
        for name in order:
            extents, pack = dict(self.extents), self.pack
            found = getattr(self, name)(node, value, store, loops, acc_dtype.itemsize,
                                        chosen=name == self.block)
            if found is not None:
                break
            self.extents.clear()        # a block that does not apply leaves nothing behind
            self.extents.update(extents)
            self.pack = pack
        if found is None:         # one dot product per output element
            value, loops = self.collapsed(value, loops)
            order = reuse_order(value, node.ndim, self.extents)
            value = self.packed(value, loops, order)
            if self.pack is not None:        # the copy is read contiguously: merge its loops
                value, loops = self.collapsed(value, loops)
            body = [ir.Accumulate("acc", op, value)]
            for loop_var, loop_extent in reversed(loops):
                body = [ir.Loop(loop_var, loop_extent, ir.REDUCE, body)]
            return [ir.Define("acc", acc_dtype, init, op)] + body + [store], order
        extent, block = self.extents, found.block
        inner = vector_loop(block, extent)
        size, offset = 1, Const(0)
        for d in block:
            size, offset = size * extent[d], offset * extent[d] + Var(d)
        store_loops = found.store_loops or [(d, extent[d], ir.VECTOR if d == inner else ir.SERIAL)
                                            for d in block]
        store_offset = offset if found.store_offset is None else found.store_offset
        accumulate = [ir.Accumulate("acc", op, found.value, simplify(offset, extent))]
        self.accumulator.index = simplify(store_offset, extent)
        stores, vectors, used = [found.store], row_vectors(size, acc_dtype.itemsize), set()
        blocking = register_block(extent, found.value, found.outer, inner, size)
        while blocking is not None:
            accumulate, stores, rows = self.register_blocked(blocking, accumulate, stores, size)
            store_loops, size = [rows] + store_loops, size * rows[1]
            used.add(blocking[0])
            if len(accumulate) * vectors >= MIN_CHAINS:
                break           # enough chains to hide the latency; fewer: block another dimension
            blocking = register_block(extent, found.value, [d for d in found.outer if d not in used], inner,
                                      size, most=MAX_CHAINS // (len(accumulate) * vectors))
        for d in reversed(block):
            accumulate = [ir.Loop(d, extent[d], ir.VECTOR if d == inner else ir.SERIAL, accumulate)]
        for loop_var, loop_extent in reversed(loops):
            accumulate = [ir.Loop(loop_var, loop_extent, ir.REDUCE, accumulate)]
        for loop in reversed(store_loops):
            stores = [ir.Loop(*loop, stores)]
        return [ir.Define("acc", acc_dtype, init, op, size)] + accumulate + stores, found.outer

    def channel_tile(self, node, value, store, loops, itemsize, chosen=False):
        """A block of one vector along an outer output dimension v (a conv's channels) where the
        output row's vectorised loop would be guarded lane by lane (a conv's input gradient over a
        small plane: its window's border), read with a stride (a strided conv whose weights take
        a gradient, so its input is not split into phases: 4.9 -> 1.0 ms in ResNet-18's step) or
        fill less than `tile_fill` of its vectors' lanes (a conv over an 8x8 or smaller plane):
        the only operand that varies along v, which reads nothing but v and the reduction, is
        copied per tile of v into a local array with v innermost (`self.pack`, at the start of the
        tile's loop, which becomes the parallel one), and every other operand and every guard is
        one scalar for the whole vector. The register block then runs along the row
        (`register_block`). The row is the last dimension longer than 1 (a 1x1 stride-2 conv's
        weight gradient (512, 256, 1, 1) reads its 256-long row 4 floats apart: 4.4 -> 0.2 ms).
        `chosen` (by tuning): wherever it applies, whatever the row. A _Block, or None."""
        lanes = VECTOR_BYTES // itemsize
        last = max((d for d in range(node.ndim) if node.shape[d] > 1), default=0)   # the row
        if last < 1:
            return None
        guards = [v for v in ir.values(value) if isinstance(v, ir.Guard)]
        filled = last < node.ndim - 1 or planes.fill(self.extents, node, value, itemsize,
                                                     self.registers) >= self.tile_fill
        if contiguous(value, last, stride_max=1) and not any(last in loop_variables(g) for g in guards) \
                and filled and not chosen:
            return None
        reduction = [var for var, _ in loops]
        size = lanes * math.prod(extent for _, extent in loops)
        read = operands(value)
        for v in range(last):
            varying = [x for x in ir.values(value) if v in loop_variables(x)]
            if len(varying) != 1 or not isinstance(varying[0], ir.Load) or self.extents[v] % lanes \
                    or self.extents[v] < 2 * lanes or size * itemsize > TILE_PACK_BYTES \
                    or loop_variables(varying[0]) - {v} - set(reduction) or len(read) < 2:
                continue
            return self.channel_split(node, value, store, v, loops, lanes)
        return None

    def transposed_panel(self, node, value, store, loops, itemsize, chosen=False):
        """A register tile for a contraction whose one operand that varies along the output row
        reads the row with a stride and the reduction contiguously (x @ w.T: a linear layer's
        weight, attention's keys): the row is cut into tiles of whole vectors, and for each tile
        that operand's panel (the tile's columns over the whole reduction) is copied into a local
        array, the row innermost (`self.pack`), at the start of the tile's loop; the tile's loop
        runs inside the output loops the operand reads (keys: per batch and head) and outside
        the others, which then reuse the panel. A linear layer 1024 -> 256 over 1024 tokens ran
        as one dot product per output. A _Block, or None."""
        last, lanes = node.ndim - 1, VECTOR_BYTES // itemsize
        reduction = [var for var, _ in loops]
        strided = [load for load in ir.loads(value) if not contiguous(load, last)]
        if len(strided) != 1 or any(last in loop_variables(v) for v in ir.values(value)
                                    if v is not strided[0] and not isinstance(v, ir.Apply)):
            return None
        (operand,) = strided
        reads = loop_variables(operand) - set(reduction) - {last}
        depth = math.prod(extent for _, extent in loops)
        length = node.shape[last]
        widest = max(1, self.registers // 8) * lanes       # 8 register-blocked rows of the tile fit
        tile = next((t for t in range(min(length // 2, widest), lanes - 1, -lanes)
                     if length % t == 0 and t * depth * itemsize <= PANEL_BYTES), None)
        reuse = math.prod(self.extents[d] for d in range(last) if d not in reads)
        if tile is None or any(d >= last for d in reads) or reuse < PANEL_REUSE_MIN:
            return None
        value, store, row = self.split_row(node, value, store, tile)
        (operand,) = [load for load in ir.loads(value) if row in loop_variables(load)]
        value = self.copied(value, operand, list(loops) + [(row, tile)], last)
        outer = [d for d in range(last) if d in reads] + [last] + [d for d in range(last) if d not in reads]
        return _Block(value, store, outer, [row])

    def channel_split(self, node, value, store, v, loops, lanes):
        """The channel tile (see channel_tile) of output dimension v: v counts tiles of `lanes`."""
        lane = max(self.extents) + 1
        self.extents[v], self.extents[lane] = self.extents[v] // lanes, lanes
        mapping = Replace({v: Var(v) * lanes + Var(lane)})
        value, store = self.substituted(value, mapping), self.stored(store, mapping)
        (operand,) = [x for x in ir.loads(value) if lane in loop_variables(x)]
        value = self.copied(value, operand, list(loops) + [(lane, lanes)], v)
        outer = [v] + [d for d in range(node.ndim) if d != v]
        return _Block(value, store, outer, [lane])

    def packed(self, value, loops, order):
        """The dot products' value with their largest operand read from a local copy (`self.pack`)
        of the slice the innermost output loop reuses, laid out in reduction order, where that
        operand does not vary along that loop and does not already read the reduction as one flat
        range: the copy is made once per iteration of the loops around, and the reduction's loops
        can then merge where the other operands read them flat (a 1x1-plane conv's input gradient
        reads each filter's weights 4608 floats apart: 7.9 -> 0.84 ms per call; the stride-2 conv
        from 2x2 to 1x1 reads 2x2 of each 3x3 filter: 7 ms in loops of 2 -> 0.8 as one loop)."""
        varying = [d for d in order if self.extents[d] > 1]
        largest = largest_load(value, self.extents)
        if not loops or not varying or largest is None:
            return value
        reduction = [var for var, _ in loops]
        size = math.prod(extent for _, extent in loops)
        terms, _ = linear_terms(largest.index)
        flat = [math.prod(extent for _, extent in loops[k + 1:]) for k in range(len(loops))]
        if loop_variables(largest) - set(reduction) - set(varying[:-1]) - set(order[len(varying):]) or \
                [terms.get(Var(var), 0) for var in reduction] == flat or \
                size * largest.dtype.itemsize > PACK_BYTES:
            return value
        return self.copied(value, largest, loops, varying[-2] if len(varying) > 1 else None,
                           {d: Const(0) for d in order[len(varying):]})   # size-1 dimensions at 0

    def copied(self, value, operand, loops, at, fixed=None):
        """`value` reading `operand` from a local array `pack` (`self.pack`), which loops over
        `loops` (variable, extent), renamed, copy into in their row-major order at the start of
        the loop over output variable `at` (None: the kernel's body); `fixed` sets variables the
        copy reads at one value."""
        fresh = {var: Var(max(self.extents) + 1 + k) for k, (var, _) in enumerate(loops)}
        self.extents.update({fresh[var].axis: extent for var, extent in loops})
        renamed = Replace({**(fixed or {}), **fresh})
        copy = [ir.Assign("pack", self.flat_index(loops, fresh), self.substituted(operand, renamed))]
        for var, extent in reversed(loops):
            copy = [ir.Loop(fresh[var].axis, extent, ir.SERIAL, copy)]
        size = math.prod(extent for _, extent in loops)
        self.pack = (at, [ir.Define("pack", operand.dtype, None, size=size)] + copy)
        packed = ir.Ref("pack", operand.dtype, self.flat_index(loops, {var: Var(var) for var, _ in loops}))
        return ir.replaced(value, {id(operand): packed})

    def flat_index(self, loops, variables):
        """The row-major position in `loops` (variable, extent), each variable renamed."""
        index, stride = Const(0), 1
        for var, extent in reversed(loops):
            index, stride = index + variables[var] * stride, stride * extent
        return simplify(index, self.extents)

    def collapsed(self, value, loops):
        """(value, loops) with neighbouring reduction loops that every index expression reads as
        one flat range (the outer's coefficient is the inner's times its extent) merged into the
        inner one, which then vectorises over the whole range: a conv with a 1x1 output plane
        sums 512 x 3 x 3 contiguous products in one loop instead of 512 x 3 loops of 3."""
        single = [var for var, extent in loops if extent == 1]
        if single and len(single) < len(loops):       # a loop of one iteration reads at 0
            value = self.substituted(value, Replace({var: Const(0) for var in single}))
            loops = [(var, extent) for var, extent in loops if extent != 1]
        loops = list(loops)
        k = len(loops) - 1
        while k > 0:
            (outer, outer_extent), (inner, inner_extent) = loops[k - 1], loops[k]
            if all(reads_flat(expr, outer, inner, inner_extent) for v in ir.values(value)
                   for expr in ir.index_expressions(v)):
                self.extents[inner] = outer_extent * inner_extent
                value = self.substituted(value, Replace({outer: Const(0)}))
                loops[k - 1:k + 1] = [(inner, outer_extent * inner_extent)]
            k -= 1
        return value, loops

    def register_tile(self, node, value, store, loops, itemsize, chosen=False):
        """The output row alone as the block (a _Block), where an outer output dimension can be
        register-blocked and rows x row vectors fit `registers`: a row that does not fit is cut
        into the longest tiles that do (a divisor of its length, at least one vector); a row
        shorter than half a vector may be flattened with the rows after it (`planes.flattened`);
        rounded up to whole vectors where that pays (`whole_vectors`). None when the row does not
        read contiguously, no register block applies or no tile fits."""
        last, length = node.ndim - 1, node.shape[-1]
        blocking = register_block(self.extents, value, list(range(last)), last, 1)
        if blocking is None or length < 2 or not contiguous(value, last):
            return None
        found = self.register_row(node, value, store, itemsize, blocking)
        if found is not None:
            self.whole_vectors(found, itemsize)
        return found

    def register_row(self, node, value, store, itemsize, blocking):
        """register_tile's block, before rounding up to whole vectors."""
        last, length = node.ndim - 1, node.shape[-1]

        def fits(t):
            return row_vectors(t, itemsize) * blocking[1] <= self.registers
        outer = list(range(last))
        if fits(length):
            plane = planes.flattened(self, node, value, store, itemsize, blocking)
            if plane is not None:
                return _Block(*plane)
            return _Block(value, store, outer, [last])
        shortest = max(1, VECTOR_BYTES // itemsize)
        tile = next((t for t in range(length // 2, shortest - 1, -1) if length % t == 0 and fits(t)), None)
        if tile is None:
            return None
        value, store, row = self.split_row(node, value, store, tile)
        return _Block(value, store, outer + [last], [row])

    def whole_vectors(self, found, itemsize):
        """Round a register tile's vectorised loop up to whole vectors where its tail would take
        several partial vectors and every read stays readable: a 14-wide row then computes 16
        lanes and stores 14, instead of 8 + 4 + 2 lanes, which spill the tile (ResNet-18 bs8,
        a 3x3 conv over 14x14: 44 ms before, 11 after). A tail of one half vector stays (conv
        3x3 over 56x56: 171 GFLOP/s at 48 + 8 lanes, 133 at 64). Only loads may vary along the
        loop, with unit stride (no guards, index values or checked divisions, which could fail
        on lanes that are never stored; stride-2 rows measured slower rounded up)."""
        inner = vector_loop(found.block, self.extents)
        width, lanes = self.extents[inner], VECTOR_BYTES // itemsize
        if self.readable is None or bin(width % lanes).count("1") < 2:
            return
        rounded = -(-width // lanes) * lanes if 2 * width > lanes else 1 << (width - 1).bit_length()
        reads = []
        for v in ir.values(found.value):
            if isinstance(v, ir.Load):
                if v.valid is not None and inner in variables(v.valid):
                    return
                if inner in variables(v.index):
                    if linear_terms(v.index)[0].get(Var(inner)) != 1:
                        return
                    reads.append(v)
            elif inner in loop_variables(v) or getattr(v, "site", None) is not None:
                return
        self.extents[inner] = rounded
        for load in reads:
            low, high = value_range(load.index, self.extents)
            if low < 0 or high >= self.readable[load.param]:
                self.extents[inner] = width
                return
        found.store_loops = found.store_loops or [
            (d, width if d == inner else self.extents[d], ir.VECTOR if d == inner else ir.SERIAL)
            for d in found.block]

    def row_block(self, node, value, store, loops, itemsize, chosen=False):
        """The trailing output dimensions as the block, as many as fit in ROW_MAX elements and at
        least ROW_MIN (a _Block), the first dimension kept outside as the parallel loop where the
        dimensions after it hold more than one element. A row
        longer than ROW_MAX is first cut into tiles of up to ROW_MAX elements (a divisor of its
        length, at least 64; a row with no such divisor is not cut). None when the block's
        vectorised loop would not read contiguously."""
        outer = list(range(node.ndim))
        if node.shape[-1] > ROW_MAX:
            tile = next((t for t in range(ROW_MAX, 63, -1) if node.shape[-1] % t == 0), None)
            if tile is not None:
                value, store, row = self.split_row(node, value, store, tile)
                outer.append(row)
        block, size = [], 1
        for d in reversed(outer):
            # keep a parallel loop, unless the block has nothing but dimensions of one element (a
            # per-channel sum over 1x1 planes, (512, 1, 1): dot products read 512 floats apart)
            if size * self.extents[d] > ROW_MAX or (d == 0 and len(outer) > 1 and size > 1):
                break
            block.insert(0, d)
            size *= self.extents[d]
        inner = vector_loop(block, self.extents)
        if size < ROW_MIN or inner is None or not contiguous(value, inner):
            return None
        return _Block(value, store, outer[:len(outer) - len(block)], block)

    def split_row(self, node, value, store, tile):
        """The output row cut into tiles of `tile` elements: (value, store, tile variable) with
        the last dimension counting tiles."""
        last, length = node.ndim - 1, node.shape[-1]
        row = max(self.extents) + 1
        self.extents[last], self.extents[row] = length // tile, tile
        mapping = Replace({last: Var(last) * tile + Var(row)})
        return self.substituted(value, mapping), self.stored(store, mapping), row

    def stored(self, store, mapping):
        """A Store with its variables replaced (`mapping`)."""
        return ir.Store(store.param, simplify(substitute(store.index, mapping), self.extents),
                        self.substituted(store.value, mapping))

    def register_blocked(self, blocking, accumulate, stores, size):
        """Accumulations blocked along output dimension d (`blocking`: (d, rows)): d's loop counts
        blocks, and each accumulation is repeated (unrolled) for `rows` consecutive values of d,
        `size` elements apart in the accumulator, so that an operand that does not vary along d is
        read once for all of them. Applied again for each further dimension a tile blocks. Returns
        (accumulations, stores, the store's loop over the new rows)."""
        d, rows = blocking
        r = max(self.extents) + 1
        self.extents[d], self.extents[r] = self.extents[d] // rows, rows
        out = []
        for row in range(rows):
            mapping = Replace({d: Var(d) * rows + Const(row)})
            out += [ir.Accumulate("acc", a.op, self.substituted(a.value, mapping),
                                  simplify(Const(row * size) + a.index, self.extents)) for a in accumulate]
        self.accumulator.index = simplify(Var(r) * size + self.accumulator.index, self.extents)
        mapping = Replace({d: Var(d) * rows + Var(r)})
        return out, [self.stored(store, mapping) for store in stores], (r, rows, ir.SERIAL)

    def substituted(self, value, mapping):
        """A value tree with its index expressions' variables replaced (`mapping`)."""
        return self.rewritten(value, lambda expr: substitute(expr, mapping))

    def rewritten(self, value, rewrite):
        """A value tree with `rewrite` applied to its index expressions (then simplified); the
        kernel's accumulator, whose index is set later, is kept as the same object."""
        return ir.rewritten(value, lambda expr: simplify(rewrite(expr), self.extents), self.accumulator)
