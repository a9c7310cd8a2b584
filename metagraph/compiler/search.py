"""The search's neighbourhood of a schedule: step lists (schedule.py) that differ from the heuristic's
in one choice and are legal on the kernel's plain nest. Tuning (pipeline/tuning.py) ranks them with
the cost model beside its other variants and times the cheapest.

The choices varied, each where the heuristic made one:
- a register tile's rows: every jam's row count among JAM_ROWS (register pressure against reuse);
- a jam dropped, or one more jam of an outer loop not jammed yet (more chains in flight);
- the width of a tile that a split cut the output row into (a block of one split loop), among
  the divisors of the row that are whole vectors (wider tiles reuse each row's operand more);
- a rounding up to whole vectors or a packed copy dropped.
"""
from metagraph.compiler import blocks
from metagraph.compiler.schedule import Rewrite, applied

JAM_ROWS = (2, 3, 4, 6, 8, 12, 16)
TILE_WIDTHS = (16, 32, 48, 64, 96, 128, 192, 256)   # elements of a split row's tile (float32 vectors)
MOST = 32          # neighbours at most, the first found (one-choice edits, in the order above)


def neighbours(body, extents, steps):
    """Legal step lists near `steps` (the heuristic's list for the plain nest `body` whose loop
    extents are `extents`), without duplicates and without `steps` itself."""
    steps, found, seen = list(steps), [], {tuple(steps)}
    for candidate in _edits(body, extents, steps):
        key = tuple(candidate)
        if key in seen:
            continue
        seen.add(key)
        try:
            applied(body, dict(extents), candidate)
        except ValueError:
            continue
        found.append(key)
        if len(found) >= MOST:
            break
    return found


def _edits(body, extents, steps):
    jams = [i for i, step in enumerate(steps) if step.primitive == "jam"]
    for i in jams:
        var, rows = steps[i].args
        for other in JAM_ROWS:
            if other != rows:
                yield steps[:i] + [Rewrite("jam", (var, other))] + steps[i + 1:]
        yield steps[:i] + steps[i + 1:]
    yield from _more_jams(body, extents, steps)
    yield from _tile_widths(body, extents, steps)
    for i, step in enumerate(steps):
        if step.primitive in ("round_up", "pack"):
            yield steps[:i] + steps[i + 1:]


def _more_jams(body, extents, steps):
    """The list with one more jam of an outer loop that is not jammed yet."""
    sizes = dict(extents)
    try:
        nest = blocks.Nest(applied(body, sizes, steps))
    except ValueError:
        return
    if not nest.block:
        return
    jammed = {step.args[0] for step in steps if step.primitive == "jam"}
    for loop in nest.chain:
        if loop.var not in jammed:
            yield from (steps + [Rewrite("jam", (loop.var, rows))] for rows in (2, 4, 8)
                        if loop.extent % rows == 0)


def _tile_widths(body, extents, steps):
    """The list with another width for a split whose inner loop is then the block."""
    for i, step in enumerate(steps):
        if step.primitive != "split":
            continue
        sizes = dict(extents)
        try:
            applied(body, sizes, steps[:i])
        except ValueError:
            return
        var, width = step.args
        inner = blocks.fresh_variable(sizes)
        if Rewrite("block", ((inner,),)) not in steps[i + 1:]:
            continue
        length = sizes[var]
        for other in TILE_WIDTHS:
            if other != width and length % other == 0 and other < length:
                later = [Rewrite(later.primitive, _resized(later.args, (inner, width), (inner, other)))
                         for later in steps[i + 1:]]
                yield steps[:i] + [Rewrite("split", (var, other))] + later


def _resized(args, old, new):
    """Arguments with the (variable, extent) pair `old` replaced by `new` (a pack's loop over the tile)."""
    if args == old:
        return new
    if isinstance(args, tuple):
        return tuple(_resized(arg, old, new) for arg in args)
    return args
