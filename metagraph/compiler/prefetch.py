"""Software prefetches: the lines a reduction loop will read a few iterations ahead, where the
hardware's prefetchers do not follow.

A CPU's stride prefetchers stop at page boundaries, so a load whose address moves by a page or
more per iteration (a conv's weights read along the output channels for its input gradient,
9 KiB apart over 256 channels; an activation read along the batch for a weight gradient) misses
every time its operand is out of cache, as it is in place inside a training step: ResNet-18's
input gradient over 2x2 planes ran 0.92 ms a call there and 0.27 ms when called again at once.
`ahead(loop, params)` names what to fetch: for each such load (grouped by parameter and the part
of its index outside the loop), the lines its iteration DISTANCE ahead will read, over every value
of the loops inside (the taps of a window, a weight gradient's plane), when they span at most
LINES_MAX lines or one per iteration of the loops inside, LINES_MOST at most, in a loop of more
than twice DISTANCE iterations. Only plain loads: a guarded one may have no address where its guard
fails.

Not a rewrite: a prefetch changes no value and no loop. A code generator that can emits them at
the start of a reduction loop's body (C: __builtin_prefetch, LLVM: llvm.prefetch); the others
need not (docs/porting.md).
"""
import math

from metagraph.compiler import ir
from metagraph.compiler.generic import RuntimeExtent
from metagraph.expr import Binary, Const, Var, linear_terms

STRIDE_MIN = 4096    # bytes a load moves per iteration from which it is fetched ahead (a page)
DISTANCE = 4         # iterations ahead
LINE = 64            # bytes in a cache line
LINES_MAX = 4        # lines a group of loads may span per iteration, or one per iteration of the loops
LINES_MOST = 16      # inside where they run more, but never more than this (more: not fetched, the
                     # fetches would cost more than they save: a 7x7 stem's weight gradient fetched
                     # 100 lines of its 229-wide rows, 3 of them per iteration of the loop)


def ahead(loop, params):
    """[(param, index expression)] to prefetch at the start of each iteration of the REDUCE loop
    `loop`, the first element of each line (each an element the loop reads at a later iteration,
    or the last iteration's); [] for none."""
    if loop.kind != ir.REDUCE or isinstance(loop.extent, RuntimeExtent) or loop.extent <= 2 * DISTANCE:
        return []
    inner = {s.var: s.extent for s in ir.statements(loop.body) if isinstance(s, ir.Loop)}
    # iterations of the loops inside, per iteration of this one (they nest, as a reduction's do)
    iterations = math.prod(inner.values())
    groups = {}         # (param, the index's terms outside the loops inside) -> lowest, highest offset
    for load in _plain_loads(loop.body):
        terms, const = linear_terms(load.index)
        if type(const) is not int or any(type(c) is not int or type(t) is not Var for t, c in terms.items()):
            continue
        coefficients = {t.axis: c for t, c in terms.items()}
        if abs(coefficients.get(loop.var, 0)) * params[load.param].dtype.itemsize < STRIDE_MIN:
            continue
        low = const + sum(c * (inner[v] - 1) for v, c in coefficients.items() if v in inner and c < 0)
        high = const + sum(c * (inner[v] - 1) for v, c in coefficients.items() if v in inner and c > 0)
        key = (load.param, tuple(sorted((v, c) for v, c in coefficients.items() if v not in inner)))
        known = groups.get(key, (low, high))
        groups[key] = (min(known[0], low), max(known[1], high))
    at = Binary("min", Var(loop.var) + DISTANCE, Const(loop.extent - 1))
    fetches = []
    for (param, outside), (low, high) in groups.items():
        per_line = max(1, LINE // params[param].dtype.itemsize)
        if (high - low) // per_line + 1 > min(LINES_MOST, max(LINES_MAX, iterations)):
            continue
        base = None
        for v, c in outside:
            term = (at if v == loop.var else Var(v)) * c
            base = term if base is None else base + term
        offsets = list(range(low, high + 1, per_line))
        fetches += [(param, base + offset) for offset in offsets + ([high] if offsets[-1] != high else [])]
    return fetches


def _plain_loads(body):
    """The loads with no validity test, not under a guard, of the statements of `body` and of the
    loops inside it."""
    for s in ir.statements(body):
        stack = [getattr(s, "value", None)] if not isinstance(s, ir.Loop) else []
        while stack:
            v = stack.pop()
            if isinstance(v, ir.Load) and v.valid is None:
                yield v
            elif isinstance(v, ir.Apply):
                stack.extend(v.args)
