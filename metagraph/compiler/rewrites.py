"""Schedule rewrites on a finished loop nest: small, legal transformations of the kernel IR, and the
rules that compose them (`scheduled`).

Primitives (each returns new statements; the kernel's `extents` gains any variable it creates):
- `split(loop, factor)`: `for v < n` becomes `for vo < n/factor: for vi < factor` with v replaced
  by vo * factor + vi;
- `interchange(loop)`: a loop whose body is one loop trades places with it;
- `unroll_and_jam(loop)`: the loop's body once, each statement in it repeated per value of the
  loop's variable (accumulators renamed apart), so that copies share their loads;
- `stage(loop, load)`: the values `load` reads inside `loop` are copied, once per iteration of
  `loop`, into a local array laid out in the order its loops read it, and read from there.

Rules: `spread_threads` gives the threads an output loop when the parallel one is too short (the
batch, at batch 1). `reuse_panels`: in a chain of output loops P > Q around a reduction, an
operand that does not vary along P but does along Q (a matmul's right-hand panel of one column
tile over the whole reduction) is read again from memory for every iteration of P when its panels
together exceed the cache. Split P into chunks, move the chunk loop inside Q and stage the operand
at Q: the panel is then copied once per chunk, contiguous, and read from L2 by every row block of
the chunk. Matmul 2048^3 on one core re-read its right-hand side 256 times (66 GFLOP/s; 108 now).
`unroll_and_jam` is in no rule yet (see docs/performance.md). The lane rule, which vectorises a
reduction along its own loop, is in lanes.py and runs after these. `shared_sums` runs last: a
kernel with no parallel loop as long as the thread count (a full sum, a sum over the rows of a few
columns) shares the outermost loop of its sum among the threads (ir.SHARED_SUM), each adding into
its own copy of the accumulators: a full sum of 4096x1024 ran on one core.
"""
import math

from metagraph.compiler import ir
from metagraph.compiler.access import Replace, loop_variables
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var

L1_BYTES = 32 * 1024         # a panel smaller than this stays in L1 without help
PANEL_BYTES = 512 * 1024     # a staged panel: at most half of L2
CACHE_BYTES = 1024 * 1024    # an operand whose panels together fit here is reused from L2 already
CHUNKS_PER_THREAD = 2        # chunks of the parallel loop each thread gets (balance against reuse)
MIN_CHUNK = 4                # iterations of P that share one staged panel, at least


# ---- primitives ------------------------------------------------------------------------------

def fresh_variable(extents):
    """A loop variable no loop of the kernel uses yet."""
    return max(extents) + 1


def rewritten_body(body, mapping, extents):
    """Statements with their index expressions' variables replaced (`mapping`), simplified (each
    distinct expression once: the loads of an element-wise kernel share their indices)."""
    done = {}

    def rewrite(expr):
        if expr not in done:
            done[expr] = simplify(substitute(expr, mapping), extents)
        return done[expr]
    return [ir.rewritten_statement(s, rewrite) for s in body]


def split(loop, factor, extents):
    """The loop as an outer loop of extent/factor around an inner one of `factor` (which must divide
    the extent); the outer keeps the loop's kind and variable, the inner is serial."""
    if factor <= 0 or loop.extent % factor:
        raise ValueError(f"split: {factor} does not divide the extent {loop.extent}")
    inner = fresh_variable(extents)
    extents[loop.var], extents[inner] = loop.extent // factor, factor
    mapping = Replace({loop.var: Var(loop.var) * factor + Var(inner)})
    body = rewritten_body(loop.body, mapping, extents)
    return ir.Loop(loop.var, loop.extent // factor, loop.kind,
                   [ir.Loop(inner, factor, ir.SERIAL, body)])


def interchange(loop):
    """A loop whose body is exactly one loop, with the two swapped (kinds stay with positions: a
    parallel outer loop stays the parallel one). Legal for output loops, whose iterations are
    independent; refused where an iteration accumulates into shared memory."""
    if len(loop.body) != 1 or not isinstance(loop.body[0], ir.Loop):
        raise ValueError("interchange: the loop's body is not a single loop")
    inner = loop.body[0]
    if ir.REDUCE in (loop.kind, inner.kind) or _scatters(inner.body):
        raise ValueError("interchange: a reduction or a scatter depends on the loops' order")
    return ir.Loop(inner.var, inner.extent, loop.kind,
                   [ir.Loop(loop.var, loop.extent, inner.kind, inner.body)])


def stage(loop, load, extents, name):
    """`loop` with every read of `load` inside it (the same parameter, index and validity) taken
    from a local array `name`, filled at the start of each iteration from the loops inside `loop`
    that the load uses, in their nesting order (the innermost varies fastest)."""
    path = _enclosing_loops(loop.body, load)
    if path is None:
        raise ValueError("stage: the load is not read inside the loop")
    used = loop_variables(load)
    loops = [(inner.var, inner.extent) for inner in path if inner.var in used]
    fresh, next_var = {}, fresh_variable(extents)
    for k, (var, extent) in enumerate(loops):
        fresh[var] = Var(next_var + k)
        extents[next_var + k] = extent
    copy_value = ir.rewritten(load, lambda expr: simplify(substitute(expr, Replace(fresh)), extents))
    copy = [ir.Assign(name, row_major(loops, fresh, extents), copy_value)]
    for var, extent in reversed(loops):
        copy = [ir.Loop(fresh[var].axis, extent, ir.SERIAL, copy)]
    size = math.prod(extent for _, extent in loops)
    ref = ir.Ref(name, load.dtype, row_major(loops, {var: Var(var) for var, _ in loops}, extents))
    body = [_replace_reads(s, load, ref) for s in loop.body]
    return ir.Loop(loop.var, loop.extent, loop.kind,
                   [ir.Define(name, load.dtype, None, size=size)] + copy + body)


def unroll_and_jam(loop, extents):
    """The loop's body once, every statement in it (inside its inner loops too) repeated for each
    value of the loop's variable, the copies' accumulators and local arrays renamed apart (`acc`
    becomes `acc_0`, `acc_1`, ...): a reduction then computes `extent` outputs per pass over its
    operands, each load shared by the copies that read it. Legal for an output loop, whose
    iterations write apart; refused where an iteration accumulates into shared memory."""
    if loop.kind == ir.REDUCE or _scatters(loop.body):
        raise ValueError("unroll_and_jam: a reduction or a scatter depends on the loop's order")
    statements = list(statements_in(loop.body))
    names = {s.name for s in statements if isinstance(s, ir.Define)}
    if any(isinstance(s, (ir.Accumulate, ir.Assign)) and s.name not in names for s in statements):
        raise ValueError("unroll_and_jam: the loop writes a local array or accumulator defined outside it")

    def copies(statement):
        if isinstance(statement, ir.Loop):
            return [ir.Loop(statement.var, statement.extent, statement.kind,
                            [c for inner in statement.body for c in copies(inner)])]
        out = []
        for k in range(loop.extent):
            mapping = Replace({loop.var: Const(k)})
            out.append(ir.rewritten_statement(statement, lambda e: simplify(substitute(e, mapping), extents),
                                              {name: f"{name}_{k}" for name in names}))
        return out
    return [c for s in loop.body for c in copies(s)]


def reduction_chain(loop):
    """The reduction loops from `loop` down, each the only statement of the one before."""
    path = [loop]
    while len(path[-1].body) == 1 and isinstance(path[-1].body[0], ir.Loop) and \
            path[-1].body[0].kind == ir.REDUCE:
        path.append(path[-1].body[0])
    return path


def row_major(loops, names, extents):
    """The row-major position in `loops` ((variable, extent), outermost first), each variable
    named by `names`."""
    index, stride = Const(0), 1
    for var, extent in reversed(loops):
        index, stride = index + names[var] * stride, stride * extent
    return simplify(index, extents)


def _same_read(a, b):
    return isinstance(b, ir.Load) and a.param == b.param and a.index == b.index and a.valid == b.valid


def _reads(statement):
    value = getattr(statement, "value", None)
    return [] if value is None else [v for v in ir.values(value) if isinstance(v, ir.Load)]


def _enclosing_loops(body, load, path=()):
    """The loops from `body` down to the first statement reading `load`, or None."""
    for s in body:
        if isinstance(s, ir.Loop):
            found = _enclosing_loops(s.body, load, path + (s,))
            if found is not None:
                return list(found)
        elif any(_same_read(load, read) for read in _reads(s)):
            return list(path)
    return None


def _replace_reads(s, load, ref):
    if isinstance(s, ir.Loop):
        return ir.Loop(s.var, s.extent, s.kind, [_replace_reads(b, load, ref) for b in s.body])
    reads = [read for read in _reads(s) if _same_read(load, read)]
    if not reads:
        return s
    value = ir.replaced(s.value, {id(read): ref for read in reads})
    if isinstance(s, ir.Accumulate):
        return ir.Accumulate(s.name, s.op, value, s.index)
    if isinstance(s, ir.Assign):
        return ir.Assign(s.name, s.index, value)
    if isinstance(s, ir.Store):
        return ir.Store(s.param, s.index, value)
    return ir.ScatterAccumulate(s.param, s.index, s.op, value, s.valid, s.check)


def _scatters(body):
    return any(isinstance(s, ir.ScatterAccumulate) or isinstance(s, ir.Loop) and _scatters(s.body)
               for s in body)


def statements_in(body):
    """Every statement that is not a loop, inside the loops of `body` too, in order."""
    for s in body:
        if isinstance(s, ir.Loop):
            yield from statements_in(s.body)
        else:
            yield s


def share_sum(loop):
    """The loop as an ir.SHARED_SUM (legal where `sums_only` holds)."""
    return ir.Loop(loop.var, loop.extent, ir.SHARED_SUM, loop.body)


def sums_only(loop, outside):
    """Whether `loop` writes nothing but sums into accumulators of `outside` (name -> ir.Define, those
    defined before it, each initialised to 0 and summing), and reads none of them: its iterations
    may then add into copies of them, in any grouping."""
    inner = {s.name for s in ir.statements(loop.body) if isinstance(s, ir.Define)}
    summed = False
    for s in ir.statements(loop.body):
        if isinstance(s, (ir.Store, ir.ScatterAccumulate)) or \
                isinstance(s, ir.Assign) and s.name not in inner:
            return False
        if isinstance(s, ir.Accumulate) and s.name not in inner:
            define = outside.get(s.name)
            if define is None or s.op != "add" or define.op != "add" or define.init != 0:
                return False
            summed = True
        value = getattr(s, "value", None)
        if value is not None and any(isinstance(v, ir.Ref) and v.name not in inner for v in ir.values(value)):
            return False
    return summed


# ---- the rules ---------------------------------------------------------------------------------

def shared_sums(body, threads):
    """The kernel body with the outermost loops of its sums shared among the threads (module
    docstring), where it has no parallel loop of `threads` iterations or more."""
    if threads < 2 or any(isinstance(s, ir.Loop) and s.kind == ir.PARALLEL and s.extent >= threads
                          for s in body):
        return body
    outside = {s.name: s for s in body if isinstance(s, ir.Define)}
    return [share_sum(s) if isinstance(s, ir.Loop) and s.kind in (ir.SERIAL, ir.REDUCE) and
            s.extent >= threads and sums_only(s, outside) else s for s in body]


def scheduled(body, extents, params, threads):
    """The kernel body with the rules applied where they hold: threads first, then panels (lanes.py's
    rule comes after both: its unrolled copies would each look like a panel of its own)."""
    body = [spread_threads(s, threads) if isinstance(s, ir.Loop) else s for s in body]
    return reuse_panels(body, extents, params, threads)


def spread_threads(loop, threads):
    """A parallel loop shorter than the thread count (the batch, at batch 1) traded for the output
    loop inside it while it can be: the threads then share output channels or rows, not one
    image. ResNet-18 at batch 1 ran every convolution on one core."""
    while loop.kind == ir.PARALLEL and loop.extent < threads and len(loop.body) == 1 and \
            isinstance(loop.body[0], ir.Loop) and loop.body[0].kind == ir.SERIAL and \
            loop.body[0].extent > loop.extent and not _scatters(loop.body):
        loop = interchange(loop)
    return loop


def reuse_panels(body, extents, params, threads):
    """The kernel body with the panel rule of the module docstring applied where it holds."""
    out = []
    for s in body:
        out.append(_panel_reused(s, extents, params, threads) if isinstance(s, ir.Loop) else s)
    return out


def _panel_reused(outer, extents, params, threads):
    if outer.kind not in (ir.PARALLEL, ir.SERIAL) or len(outer.body) != 1 \
            or not isinstance(outer.body[0], ir.Loop):
        return outer
    inner = outer.body[0]
    if inner.kind != ir.SERIAL or _scatters(inner.body) or \
            not any(isinstance(s, ir.Loop) and s.kind == ir.REDUCE for s in loops_in(inner.body)):
        return outer
    panel = _panel(inner, outer.var, extents, params)
    if panel is None:
        return outer
    chunks = _chunks(outer, threads)
    if chunks is None:
        return outer
    if chunks > 1:
        outer = split(outer, outer.extent // chunks, extents)
        chunked, inner_loop = outer, outer.body[0]
    else:
        chunked, inner_loop = None, outer
    swapped = interchange(inner_loop)            # Q outside the chunk's loop
    load = next(read for s in statements_in(swapped.body[0].body) for read in _reads(s)
                if _same_read(panel, read))
    staged = stage(swapped, load, extents, f"panel{swapped.var}")
    if chunked is None:
        return staged
    return ir.Loop(chunked.var, chunked.extent, chunked.kind, [staged])


def loops_in(body):
    """Every loop of `body`, the outer before the inner."""
    for s in body:
        if isinstance(s, ir.Loop):
            yield s
            yield from loops_in(s.body)


def _panel(inner, outer_var, extents, params):
    """The largest input read inside `inner` that does not vary along `outer_var` but does along
    `inner`, whose panel (what one iteration of `inner` reads) is worth staging; or None."""
    inside = {loop.var: loop.extent for loop in loops_in(inner.body)}
    best, best_bytes = None, 0
    for s in statements_in(inner.body):
        for read in _reads(s):
            used = loop_variables(read)
            if outer_var in used or inner.var not in used or params[read.param].output:
                continue
            panel_bytes = math.prod(inside[v] for v in used if v in inside) * read.dtype.itemsize
            if L1_BYTES < panel_bytes <= PANEL_BYTES and panel_bytes * inner.extent > CACHE_BYTES \
                    and panel_bytes > best_bytes:
                best, best_bytes = read, panel_bytes
    return best


def _chunks(outer, threads):
    """How many chunks to cut the outer loop into: CHUNKS_PER_THREAD per thread if it is the parallel
    loop, or fewer, but one per thread at least, each of MIN_CHUNK iterations or more; None when
    the loop is too short to share a panel."""
    if outer.kind != ir.PARALLEL or threads <= 1:
        return 1 if outer.extent >= MIN_CHUNK else None
    for chunks in range(threads * CHUNKS_PER_THREAD, threads - 1, -1):
        if outer.extent % chunks == 0 and outer.extent // chunks >= MIN_CHUNK:
            return chunks
    return None
