"""Row prologues: reductions an element-wise kernel computes once per row, before its loop along
the row.

Softmax is max, then a sum of exp(x - max), then exp(x - max) / sum: three kernels, three passes
over memory. When a reduction's only readers are one element-wise kernel (and other reductions
computed there), that kernel computes it inside its loops over the variables the read uses (a
row) and before the loops after them; the row it reads stays in the first-level cache for the
passes after the first. A value a prologue and the kernel's own loop both compute at the same
position (softmax's exp) is kept in a local row array when it is costly (`cache_shared`).

The lowering (lower.py) builds each prologue; this module picks them, caches shared values and
places the statements.
"""
import math
from dataclasses import dataclass

from metagraph.compiler import ir
from metagraph.compiler.fusion import TRANSCENDENTAL
from metagraph.compiler.simplify import simplify
from metagraph.expr import Const, Var

NOT_ELEMENTWISE = ("reduce", "reindex_reduce", "contiguous")
# A reduction with one value per element of its reader (a projection read through a head-split
# permute) is a prologue only when it sums at most this many terms: a longer one is a contraction
# that, computed by a kernel of its own, keeps its register tile (4.5 ms as per-element dot
# products, 1.6 ms tiled plus 0.1 to copy, for a 256 -> 256 projection of 1024 tokens).
PER_ELEMENT_TERMS = 16
ROW_CACHE_BYTES = 32 * 1024    # a row array larger than this recomputes instead (stack, L1)


@dataclass
class Prologue:
    """One reduction as statements placed at the start of the kernel's loop at `depth` (1: the
    outermost loop's body). `aligned`: its loops are the kernel's own loops after `depth`, with the
    same variables, so that values it computes are the kernel's at the same position."""
    depth: int
    statements: list     # the accumulator's Define, then the reduction's loops
    accumulate: ir.Accumulate
    aligned: bool

    @property
    def innermost(self):
        loop = self.statements[-1]
        while isinstance(loop.body[-1], ir.Loop):
            loop = loop.body[-1]
        return loop


def choose(graph, candidates, readers, excluded):
    """{reduction position: position of the element-wise kernel that computes it as a prologue}:
    each candidate whose readers are one element-wise kernel (not one of `excluded`: those with an
    epilogue reduction or computed by a library) and reductions computed in that same kernel.
    Readers come after what they read, so walking backwards sees them first. Whether the reads
    are once per row is the lowering's to check: it refuses the fusion otherwise."""
    chosen = {}
    for k in sorted(candidates, reverse=True):
        roots = {chosen.get(reader, reader) for reader in readers.get(k, ())}
        if len(roots) == 1:
            (root,) = roots
            if root not in excluded and graph.nodes[root].op not in NOT_ELEMENTWISE:
                chosen[k] = root
    return chosen


def cache_shared(prologues, store, shape, extents):
    """Keep in a row array each costly value (one with a transcendental op) that an aligned
    prologue and `store` both compute, at the largest such values: the prologue writes it, the
    kernel's loop (and later prologues at that depth) read it. Softmax 4096x1024: 2.5 ms with
    its exp computed twice per element, 2.25 with it kept."""
    for p, prologue in enumerate(prologues):
        if not prologue.aligned:
            continue
        row = math.prod(shape[prologue.depth:])
        in_store = {id(v) for v in ir.values(store.value)}
        shared = [v for v in ir.values(prologue.accumulate.value) if id(v) in in_store]
        arguments = {id(a) for v in shared for a in _arguments(v)}
        costly = [v for v in shared if id(v) not in arguments and v.dtype.is_float and
                  row * v.dtype.itemsize <= ROW_CACHE_BYTES and
                  any(isinstance(u, ir.Apply) and u.op in TRANSCENDENTAL for u in ir.values(v))]
        index = _row_index(shape, prologue.depth, extents)
        for j, value in enumerate(costly):
            name = f"{prologue.accumulate.name}_cache{j}"
            ref = {id(value): ir.Ref(name, value.dtype, index)}
            prologue.statements.insert(0, ir.Define(name, value.dtype, None, size=row))
            prologue.innermost.body.insert(0, ir.Assign(name, index, value))
            prologue.accumulate.value = ir.replaced(prologue.accumulate.value, ref)
            for later in prologues[p + 1:]:
                if later.aligned and later.depth == prologue.depth:
                    later.accumulate.value = ir.replaced(later.accumulate.value, ref)
            store.value = ir.replaced(store.value, ref)


def _arguments(value):
    return (value.value,) if isinstance(value, ir.Guard) else getattr(value, "args", ())


def _row_index(shape, depth, extents):
    """The flat position in a row of the loop variables after `depth`."""
    offset, stride = Const(0), 1
    for d in reversed(range(depth, len(shape))):
        if shape[d] != 1:
            offset = offset + Var(d) * stride
        stride *= shape[d]
    return simplify(offset, extents)


def place(body, prologues):
    """An element-wise kernel's loop nest (one loop per output dimension, in order) with each
    prologue's statements at the start of its loop's body, in the order they were made."""
    if not prologues:
        return body
    loops = [body[0]]
    while isinstance(loops[-1].body[0], ir.Loop):
        loops.append(loops[-1].body[0])
    before = {}
    for prologue in prologues:
        before.setdefault(prologue.depth, []).extend(prologue.statements)
    for depth, statements in before.items():
        loops[depth - 1].body[:0] = statements
    return body
