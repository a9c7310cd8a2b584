"""The default schedule of a reduction: a list of primitive applications (schedule.py) decided from how
its operands move along its loops (access.py), good without tuning.

A reduction accumulates a block of output elements at once, the block's loop innermost and
vectorised, the reduction's loops around it. The blocks, each a short sequence of primitives:
- a channel tile, where the output row would be guarded lane by lane (a conv's input gradient
  over a small plane), read with a stride, or fill too few of its vectors' lanes: one vector along
  an outer dimension (split, reorder, pack its operand, block);
- a register tile, where an outer output dimension can be register-blocked (a conv's filters, a
  matmul's rows): the output row (block), cut into tiles that fit the registers (split) or
  flattened with the rows after it (flatten_plane), rounded up to whole vectors (round_up);
- a row block: the trailing output dimensions, up to ROW_MAX elements;
- a transposed panel, where the one operand that varies along the row reads it with a stride
  (x @ w.T): the row cut into tiles whose panels are packed;
- otherwise one dot product per output element: reduction loops merged, the output loops in the
  order that reuses the largest operand, that operand packed.
After a block, outer dimensions are jammed into it (register blocking) while the tile has fewer
than MIN_CHAINS independent vector accumulations. Tuning may choose a block first (`chosen`),
other register budgets, or a list of its own.
"""
import math

from metagraph.compiler import blocks, ir, packing, planes
from metagraph.compiler.access import (VECTOR_BYTES, contiguous, largest_load, loop_variables, operands,
                                       register_block, reuse_order, row_vectors, vector_loop)
from metagraph.compiler.simplify import value_range
from metagraph.expr import Var, linear_terms, variables

PACK_BYTES = 64 * 1024    # a packed operand slice (dot products) at most this large
# A channel tile's packed operand at most this many times a core's L2. The tile streams its pack once
# per pass over the outputs it jams (a weight gradient: the 3x3 taps, 9 multiply-adds per element
# read), so a pack larger than L2 streams from L3 at a few FLOPs a byte and the tile still wins: the
# weight gradient of a 3x3 conv over (8, 64, 56, 56), a 1.6 MB pack, 14.5 -> 8.3 ms on one core;
# over (8, 128, 28, 28) 62 -> 8.4 ms; ResNet-18's training step at 224^2, bs8, 891 -> 674 ms (one
# core), 471 -> 358 (two). At 3/8 (192 KiB of 512 KiB measured first, then 384 of 1 MiB: ResNet-50's
# stride-2 conv over 14x14 at batch 1, a 288 KiB pack, 36.7 -> 32.4 ms a network with its tile) those
# fell back to a flattened 3-wide row tile.
TILE_PACK_SHARE = 4
# A register tile along the output row whose vectors hold fewer output elements than this share of
# their lanes gives way to a channel tile (one core, conv 3x3 forward): over 8x8 planes, bs32 (4
# rows of 8 in 48 lanes) 2.07 -> 1.41 ms; over 4x4 3.3 -> 1.9 ms; over 7x7 (49 of 64 lanes) the
# flat plane stays faster (17 ms against 24 as a channel tile). Weight gradients, whose rows are a
# 3-wide kernel row, gain most: 3x3 512 channels over 7x7 at bs4 36 -> 10 ms, 256 over 14x14 56 -> 16.
TILE_FILL = 3 / 4
PANEL_BYTES = 512 * 1024       # a transposed operand's panel: half of L2
# ... copied only for at least this many output rows that reuse it: below, dot products that stream
# the operand once are faster (a 1024x1024 linear layer on one core, 8 rows: 0.47 ms through the
# panel, 0.26 as dot products; 12 rows 0.55 and 0.39; 16 rows 0.47 and 0.60)
PANEL_REUSE_MIN = 16
ROW_MIN, ROW_MAX = 8, 1024   # output rows this long are accumulated whole, their loop innermost
# A register tile of at most ACC_REGISTERS vectors stays in registers for the whole reduction
# (AVX-512 has 32; a backend may ask for fewer): matmul 1024^3 went from 78-88 to 117-160
# GFLOP/s with 8 rows x 64 columns under gcc.
ACC_REGISTERS = 32
# A register tile keeps at least MIN_CHAINS independent vector accumulations in flight (two FMA
# units of 4 cycles' latency), blocking further output dimensions while it has fewer (a channel
# tile over a 2x2 plane had 2), but not past MAX_CHAINS.
MIN_CHAINS, MAX_CHAINS = 8, 16
LANE_CHAINS = 16     # accumulation chains a block whose reduction goes to lanes may jam up to
BLOCKS = ("channel_tile", "register_tile", "row_block", "transposed_panel")   # what tuning may choose


class Heuristic:
    """Decides the schedule of one reduction (a schedule.Scheduling of its plain nest) into an
    output of `shape` with accumulators of `itemsize` bytes: `registers` vector registers a tile
    may fill, `tile_fill` the channel tile's threshold, `readable[param]` how many elements a load
    may touch (None: no load reads past what its loop needs), `chosen` a block to try first,
    `l2_bytes` a core's second-level cache (what a channel tile's pack may fill: TILE_PACK_SHARE),
    `whole_first`: the first output dimension is neither split, jammed nor blocked (a kernel that
    takes its first extent at run time, for extents below its groups' rows: generic.py)."""

    def __init__(self, scheduling, shape, itemsize, registers=ACC_REGISTERS, tile_fill=TILE_FILL,
                 readable=None, chosen=None, l2_bytes=1 << 20, whole_first=False):
        self.s, self.shape, self.ndim, self.itemsize = scheduling, tuple(shape), len(shape), itemsize
        self.grouped = 1 if whole_first else 0      # the first output dimension that may be grouped
        self.registers, self.tile_fill, self.readable, self.chosen = registers, tile_fill, readable, chosen
        self.tile_pack_bytes = int(l2_bytes * TILE_PACK_SHARE)

    @property
    def extents(self):
        return self.s.extents

    def value(self):
        return blocks.reads(self.s.body)[0]

    def schedule(self):
        """Apply the default schedule to the scheduling (its steps record it)."""
        loops = [(loop.var, loop.extent) for loop in blocks.Nest(self.s.body).reductions]
        order = []
        if loops and self.ndim:
            rest = ["register_tile", "row_block"] if contiguous(self.value(), self.ndim - 1) else \
                ["transposed_panel"]
            order = ["channel_tile"] + rest
            if self.chosen is not None:
                order = [self.chosen] + order
        for name in order:
            trial = self.s.copy()
            if getattr(self, name)(trial, loops, chosen=name == self.chosen):
                self.s.adopt(trial)
                self.register_blocks()
                return
        self.dot_products()

    # ---- blocks ----------------------------------------------------------------------------
    def channel_tile(self, s, loops, chosen=False):
        """A block of one vector along an outer output dimension v (a conv's channels) where the
        output row's vectorised loop would be guarded lane by lane (a conv's input gradient over a
        small plane: its window's border), read with a stride (a strided conv: 4.9 -> 1.0 ms in
        ResNet-18's training step) or
        fill less than `tile_fill` of its vectors' lanes (a conv over an 8x8 or smaller plane):
        the only operand that varies along v, which reads nothing but v and the reduction, is
        packed per tile of v, v innermost, at the start of the tile's loop, which becomes the
        parallel one; every other operand and every guard is one scalar for the whole vector.
        The row is the last dimension longer than 1 (a 1x1 stride-2 conv's weight gradient
        (512, 256, 1, 1) reads its 256-long row 4 floats apart: 4.4 -> 0.2 ms). `chosen` (by
        tuning): wherever it applies, whatever the row."""
        value, lanes = self.value(), VECTOR_BYTES // self.itemsize
        last = max((d for d in range(self.ndim) if self.shape[d] > 1), default=0)   # the row
        if last < 1:
            return False
        guards = [v for v in ir.values(value) if isinstance(v, ir.Guard)]
        filled = last < self.ndim - 1 or planes.fill(s.extents, self.ndim, value, self.itemsize,
                                                     self.registers) >= self.tile_fill
        if contiguous(value, last, stride_max=1) and not any(last in loop_variables(g) for g in guards) \
                and filled and not chosen:
            return False
        reduction = [var for var, _ in loops]
        size = lanes * math.prod(extent for _, extent in loops)
        read = operands(value)
        for v in range(self.grouped, last):
            varying = [x for x in ir.values(value) if v in loop_variables(x)]
            if len(varying) != 1 or not isinstance(varying[0], ir.Load) or s.extents[v] % lanes \
                    or s.extents[v] < 2 * lanes or size * self.itemsize > self.tile_pack_bytes \
                    or loop_variables(varying[0]) - {v} - set(reduction) or len(read) < 2:
                continue
            lane = blocks.fresh_variable(s.extents)
            s.apply("split", v, lanes)
            s.apply("reorder", (v, *[d for d in range(self.ndim) if d != v], lane))
            (operand,) = [x for x in ir.loads(blocks.reads(s.body)[0]) if lane in loop_variables(x)]
            s.apply("pack", *_operand_key(s.body, operand), v, (*loops, (lane, lanes)), ())
            s.apply("block", (lane,))
            return True
        return False

    def transposed_panel(self, s, loops, chosen=False):
        """A register tile for a contraction whose one operand that varies along the output row
        reads the row with a stride and the reduction contiguously (x @ w.T: a linear layer's
        weight, attention's keys): the row is cut into tiles of whole vectors, and for each tile
        that operand's panel (the tile's columns over the whole reduction) is packed, the row
        innermost, at the start of the tile's loop; the tile's loop runs inside the output loops
        the operand reads (keys: per batch and head) and outside the others, which then reuse the
        panel. A linear layer 1024 -> 256 over 1024 tokens ran as one dot product per output."""
        value = self.value()
        last, lanes = self.ndim - 1, VECTOR_BYTES // self.itemsize
        if last < self.grouped:
            return False
        reduction = [var for var, _ in loops]
        strided = [load for load in ir.loads(value) if not contiguous(load, last)]
        if len(strided) != 1 or any(last in loop_variables(v) for v in ir.values(value)
                                    if v is not strided[0] and not isinstance(v, ir.Apply)):
            return False
        reads = loop_variables(strided[0]) - set(reduction) - {last}
        depth = math.prod(extent for _, extent in loops)
        length = self.shape[last]
        widest = max(1, self.registers // 8) * lanes       # 8 register-blocked rows of the tile fit
        tile = next((t for t in range(min(length // 2, widest), lanes - 1, -lanes)
                     if length % t == 0 and t * depth * self.itemsize <= PANEL_BYTES), None)
        reuse = math.prod(s.extents[d] for d in range(last) if d not in reads)
        if tile is None or any(d >= last for d in reads) or reuse < PANEL_REUSE_MIN:
            return False
        row = blocks.fresh_variable(s.extents)
        s.apply("split", last, tile)
        outer = [d for d in range(last) if d in reads] + [last] + [d for d in range(last) if d not in reads]
        s.apply("reorder", (*outer, row))
        (operand,) = [load for load in ir.loads(blocks.reads(s.body)[0]) if row in loop_variables(load)]
        s.apply("pack", *_operand_key(s.body, operand), last, (*loops, (row, tile)), ())
        s.apply("block", (row,))
        return True

    def register_tile(self, s, loops, chosen=False):
        """The output row alone as the block, where an outer output dimension can be register-
        blocked and rows x row vectors fit `registers`: a row that does not fit is cut into the
        longest tiles that do (a divisor of its length, at least one vector); a row shorter than
        half a vector may be flattened with the rows after it (planes.layout); rounded up to
        whole vectors where that pays (`whole_vectors`). False when the row does not read
        contiguously, no register block applies or no tile fits."""
        value = self.value()
        last, length = self.ndim - 1, self.shape[-1]
        blocking = register_block(s.extents, value, list(range(self.grouped, last)), last, 1)
        if last < self.grouped or blocking is None or length < 2 or not contiguous(value, last):
            return False

        def fits(t):
            return row_vectors(t, self.itemsize) * blocking[1] <= self.registers
        if fits(length):
            plane = planes.layout(s.extents, self.ndim, value, self.itemsize, blocking, self.registers)
            s.apply("block", (last,))
            if plane is not None:
                s.apply("flatten_plane", self.ndim - 2, last, *plane)
        else:
            shortest = max(1, VECTOR_BYTES // self.itemsize)
            tile = next((t for t in range(length // 2, shortest - 1, -1) if length % t == 0 and fits(t)),
                        None)
            if tile is None:
                return False
            row = blocks.fresh_variable(s.extents)
            s.apply("split", last, tile)
            s.apply("block", (row,))
        if not self.lanes_expected(s):
            self.whole_vectors(s)
        return True

    def lanes_expected(self, s):
        """Whether the lane rule (lanes.py) will vectorise this block's reduction along its own
        innermost loop: a block of one row narrower than half a vector, and a reduction loop of at
        least two vectors that every load reads with unit stride or not at all (a 3x3 conv's weight
        gradient over its image rows). Each element of the row is then a chain of its own, so the
        row is neither rounded up (a lane chain computed for nothing) nor jammed past LANE_CHAINS
        chains (they would spill: over (8, 64, 56, 56), 8 rows rounded to 4 took 21 ms on one core,
        4 rows of 3 16)."""
        nest = blocks.Nest(s.body)
        lanes = VECTOR_BYTES // self.itemsize
        if len(nest.block) != 1 or not nest.reductions or 2 * s.extents[nest.block[0]] > lanes:
            return False
        inner = nest.reductions[-1]
        strides = [linear_terms(load.index)[0].get(Var(inner.var), 0)
                   for load in ir.loads(nest.accumulations[0].value)]
        return inner.extent >= 2 * lanes and set(strides) <= {0, 1} and 1 in strides and \
            not any(inner.var in variables(load.index) and load.valid is not None
                    for load in ir.loads(nest.accumulations[0].value))

    def whole_vectors(self, s):
        """Round a register tile's vectorised loop up to whole vectors where its tail would take
        several partial vectors and every read stays readable: a 14-wide row then computes 16
        lanes and stores 14, instead of 8 + 4 + 2 lanes, which spill the tile (ResNet-18 bs8,
        a 3x3 conv over 14x14: 44 ms before, 11 after). A tail of one half vector stays (conv
        3x3 over 56x56: 171 GFLOP/s at 48 + 8 lanes, 133 at 64). Only loads may vary along the
        loop, with unit stride (no guards, index values or checked divisions, which could fail
        on lanes that are never stored; stride-2 rows measured slower rounded up)."""
        inner = vector_loop(blocks.Nest(s.body).block, s.extents)
        width, lanes = s.extents[inner], VECTOR_BYTES // self.itemsize
        if self.readable is None or bin(width % lanes).count("1") < 2:
            return
        rounded = -(-width // lanes) * lanes if 2 * width > lanes else 1 << (width - 1).bit_length()
        reads = []
        for v in ir.values(blocks.reads(s.body)[0]):
            if isinstance(v, ir.Load):
                if v.valid is not None and inner in variables(v.valid):
                    return
                if inner in variables(v.index):
                    if linear_terms(v.index)[0].get(Var(inner)) != 1:
                        return
                    reads.append(v)
            elif inner in loop_variables(v) or getattr(v, "site", None) is not None:
                return
        extents = {**s.extents, inner: rounded}
        for load in reads:
            low, high = value_range(load.index, extents)
            if low < 0 or high >= self.readable[load.param]:
                return
        s.apply("round_up", inner, rounded)

    def row_block(self, s, loops, chosen=False):
        """The trailing output dimensions as the block, as many as fit in ROW_MAX elements and at
        least ROW_MIN, the first dimension kept outside as the parallel loop where the dimensions
        after it hold more than one element. A row longer than ROW_MAX is first cut into tiles of
        up to ROW_MAX elements (a divisor of its length, at least 64; a row with no such divisor
        is not cut). False when the block's vectorised loop would not read contiguously."""
        outer = list(range(self.ndim))
        if self.shape[-1] > ROW_MAX and self.ndim > self.grouped:
            tile = next((t for t in range(ROW_MAX, 63, -1) if self.shape[-1] % t == 0), None)
            if tile is not None:
                outer.append(blocks.fresh_variable(s.extents))
                s.apply("split", self.ndim - 1, tile)
        block, size = [], 1
        for d in reversed(outer[self.grouped:]):
            # keep a parallel loop, unless the block has nothing but dimensions of one element (a
            # per-channel sum over 1x1 planes, (512, 1, 1): dot products read 512 floats apart)
            if size * s.extents[d] > ROW_MAX or (d == 0 and len(outer) > 1 and size > 1):
                break
            block.insert(0, d)
            size *= s.extents[d]
        inner = vector_loop(block, s.extents)
        if size < ROW_MIN or inner is None or not contiguous(blocks.reads(s.body)[0], inner):
            return False
        s.apply("block", tuple(block))
        return True

    def register_blocks(self):
        """Jam outer output dimensions into the block (blocks.jam) while the tile has fewer than
        MIN_CHAINS independent vector accumulations: for each, the innermost dimension that some
        operand does not vary along and every operand that does is constant along the vector
        loop (access.register_block)."""
        nest = blocks.Nest(self.s.body)
        value, size = nest.accumulations[0].value, nest.define.size
        outer = [loop.var for loop in nest.chain if loop.var >= self.grouped]
        inner = vector_loop(nest.block, self.extents)
        vectors, used, chains = row_vectors(size, self.itemsize), set(), 1
        most = 8
        if self.lanes_expected(self.s):       # each element of the row a chain (lanes_expected)
            vectors, most = size, max(2, LANE_CHAINS // size)
        blocking = register_block(self.extents, value, outer, inner, size, most=most)
        while blocking is not None:
            self.s.apply("jam", *blocking)
            chains, size = chains * blocking[1], size * blocking[1]
            used.add(blocking[0])
            if chains * vectors >= MIN_CHAINS:
                break           # enough chains to hide the latency; fewer: block another dimension
            blocking = register_block(self.extents, value, [d for d in outer if d not in used], inner, size,
                                      most=min(most, MAX_CHAINS // (chains * vectors)))

    # ---- one dot product per output element ------------------------------------------------
    def dot_products(self):
        """Merge the reduction's loops that read flat, order the output loops to reuse the largest
        operand (access.reuse_order), pack the slice of it the innermost output loop reuses
        (`packed`), and merge again the loops the copy is read flat along."""
        self.merged()
        order = reuse_order(self.value(), self.ndim, self.extents)
        if order != [loop.var for loop in blocks.Nest(self.s.body).chain]:
            self.s.apply("reorder", tuple(order))
        if self.packed(order):
            self.merged()

    def merged(self):
        """Reduction loops of one iteration dropped (unless all are) and neighbouring ones that
        every index reads as one flat range merged, innermost first: a conv with a 1x1 output
        plane sums 512 x 3 x 3 contiguous products in one loop instead of 512 x 3 loops of 3."""
        loops = [(loop.var, loop.extent) for loop in blocks.Nest(self.s.body).reductions]
        single = [var for var, extent in loops if extent == 1]
        if single and len(single) < len(loops):
            self.s.apply("drop_units", tuple(single))
        loops = [loop.var for loop in blocks.Nest(self.s.body).reductions]
        k = len(loops) - 1
        while k > 0:
            trial = self.s.copy()
            try:
                trial.apply("merge", loops[k - 1], loops[k])
            except ValueError:
                pass
            else:
                self.s.adopt(trial)
                del loops[k - 1]
            k -= 1

    def packed(self, order):
        """Pack the largest operand's slice that the innermost output loop reuses, laid out in
        reduction order, where that operand does not vary along that loop and does not already
        read the reduction as one flat range: the copy is made once per iteration of the loops
        around (a 1x1-plane conv's input gradient reads each filter's weights 4608 floats apart:
        7.9 -> 0.84 ms per call; the stride-2 conv from 2x2 to 1x1 reads 2x2 of each 3x3 filter:
        7 ms in loops of 2 -> 0.8 as one loop). Whether it did."""
        value = self.value()
        loops = [(loop.var, loop.extent) for loop in blocks.Nest(self.s.body).reductions]
        varying = [d for d in order if self.extents[d] > 1]
        largest = largest_load(value, self.extents)
        if not loops or not varying or largest is None:
            return False
        reduction = [var for var, _ in loops]
        size = math.prod(extent for _, extent in loops)
        terms, _ = linear_terms(largest.index)
        flat = [math.prod(extent for _, extent in loops[k + 1:]) for k in range(len(loops))]
        if loop_variables(largest) - set(reduction) - set(varying[:-1]) - set(order[len(varying):]) or \
                [terms.get(Var(var), 0) for var in reduction] == flat or \
                size * largest.dtype.itemsize > PACK_BYTES or len(varying) < 2:
            return False       # (one varying loop: a copy before it would be shared by its threads)
        self.s.apply("pack", *_operand_key(self.s.body, largest), varying[-2], tuple(loops),
                     tuple((d, 0) for d in order[len(varying):]))
        return True


def _operand_key(body, load):
    """(parameter, ordinal) that packing.operand finds `load` by."""
    for ordinal in range(len(ir.loads(blocks.reads(body)[0]))):
        try:
            if packing.operand(body, load.param, ordinal) is load:
                return load.param, ordinal
        except ValueError:
            break
    raise ValueError("the operand is not read by the reduction")
