"""Blocked float sums: a rewrite of the kernel IR that bounds how many terms a float accumulator
collects before they join the running total.

A float32 accumulator that adds n terms one by one stops growing once its step falls below half
a unit in its last place (a sum of 3e8 ones stopped at 2^28 across sixteen lanes): its error
grows like n. Here every floating-point sum whose reduction loops run more than BLOCK iterations
per output is cut into blocks of at most BLOCK iterations, each summed into a fresh partial
accumulator, the partials summed FAN_IN at a time into partials of their own, and so on out to
the kernel's accumulator: a cascade, whose error grows like BLOCK + FAN_IN * log(n) / log(FAN_IN)
units in the last place, at the cost of one partial add per BLOCK terms (PyTorch's sums cascade
too). A loop longer than a block is split (`i -> o*f + i'`), its remainder a loop of its own.
Integer sums are exact and are left alone, and so are max and mul.
"""
import math

from metagraph.compiler import ir
from metagraph.compiler.access import Replace
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var

BLOCK = 1024     # terms the innermost partial sums collect (64 per lane of a 16-lane vector)
FAN_IN = 16      # partial sums each partial sum of the levels above collects
# A register tile of multiply-adds (a contraction's block of outputs) is cut only every
# TILE_BLOCK terms: a partial tile beside the running one does not fit the registers (a 512-channel
# 3x3 conv over 4x4 planes, 4608 terms per output: 27 -> 91 ms cut every 1024), and dot products
# accumulate linearly in BLAS libraries too.
TILE_BLOCK = 1 << 16


def blocked_sums(body, extents):
    """The kernel body with every long float sum blocked (see the module docstring); `extents`
    (loop variable -> extent) gains the variables the rewrite makes."""
    return _Cascade(extents).statements(body)


class _Cascade:
    def __init__(self, extents):
        self.extents = extents
        self.partials = 0

    def fresh(self, extent):
        var = max(self.extents, default=-1) + 1
        self.extents[var] = extent
        return var

    def statements(self, statements):
        out = []
        for s in statements:
            if isinstance(s, ir.Loop):
                define = self.summed_into(out, s)
                if define is not None:
                    chain, inner = _chain(s)
                    tile = define.size is not None and _multiply_adds(inner)
                    out.extend(self.cascade(chain, inner, define, TILE_BLOCK if tile else BLOCK))
                    continue
                s = ir.Loop(s.var, s.extent, s.kind, self.statements(s.body))
            out.append(s)
        return out

    @staticmethod
    def summed_into(before, loop):
        """The float sum's Define (in `before`) whose reduction `loop` is, when it runs longer
        than a block; else None."""
        name = _target(loop)
        define = next((s for s in reversed(before) if isinstance(s, ir.Define) and s.name == name), None)
        if define is None or define.op != "add" or not define.dtype.is_float or define.init is None:
            return None
        chain, inner = _chain(loop)
        if math.prod(extent for _, extent in chain) <= BLOCK or not _only_accumulates(inner, name):
            return None
        return define

    def cascade(self, loops, body, define, block=BLOCK, apart=False):
        """Statements that add the same terms as `body` over `loops` (variable, extent) into
        `define`'s accumulator, in blocks of at most `block` iterations, the partial sums of the
        blocks in blocks of FAN_IN, and so on. `apart`: a block that fits is still summed apart
        first (a split loop's blocks all are: a remainder's terms must not meet the total alone)."""
        if math.prod(extent for _, extent in loops) <= block:
            return self.partial(loops, body, define) if apart else _nest(loops, body)
        inner, k = 1, len(loops)
        while k and inner * loops[k - 1][1] <= block:
            inner *= loops[k - 1][1]
            k -= 1
        var, extent = loops[k - 1]
        factor = block // inner
        if factor == 1:
            return self.cascade(loops[:k], self.partial(loops[k:], body, define), define, FAN_IN)
        whole, rest = divmod(extent, factor)          # split loop k-1 to fill a block
        outer, lane = self.fresh(whole), self.fresh(factor)
        main = self.cascade(loops[:k - 1] + [(outer, whole), (lane, factor)] + loops[k:],
                            self.substituted(body, {var: Var(outer) * factor + Var(lane)}), define,
                            block, apart or bool(rest))
        if not rest:
            return main
        tail = self.fresh(rest)
        return main + self.cascade(loops[:k - 1] + [(tail, rest)] + loops[k:],
                                   self.substituted(body, {var: Const(whole * factor) + Var(tail)}, True),
                                   define, block, True)

    def partial(self, loops, body, define):
        """A partial sum of `body` over `loops`, then added into `define`'s accumulator."""
        self.partials += 1
        name = f"{define.name}_part{self.partials}"
        renamed = [ir.rewritten_statement(s, lambda e: e, {define.name: name}) for s in body]
        statements = [ir.Define(name, define.dtype, define.init, "add", define.size)]
        statements += _nest(loops, renamed)
        if define.size is None:
            statements.append(ir.Accumulate(define.name, "add", ir.Ref(name, define.dtype)))
        else:
            q = self.fresh(define.size)
            statements.append(ir.Loop(q, define.size, ir.VECTOR, [
                ir.Accumulate(define.name, "add", ir.Ref(name, define.dtype, Var(q)), Var(q))]))
        return statements

    def substituted(self, body, mapping, rename=False):
        """`body` with loop variables replaced (`mapping`); `rename`: its partial sums get new
        names (a copy of the body beside the original must not declare the same arrays)."""
        replace = Replace(mapping)
        names = {}
        for s in ir.statements(body) if rename else ():
            if isinstance(s, ir.Define):
                self.partials += 1
                names[s.name] = f"{s.name.split('_part')[0]}_part{self.partials}"
        return [ir.rewritten_statement(s, lambda e: simplify(substitute(e, replace), self.extents), names)
                for s in body]


def _target(loop):
    """The accumulator a reduction loop adds into (None unless it is a reduction loop)."""
    if loop.kind != ir.REDUCE:
        return None
    names = {s.name for s in ir.statements([loop]) if isinstance(s, ir.Accumulate)}
    return names.pop() if len(names) == 1 else None


def _chain(loop):
    """The perfectly nested reduction loops from `loop` in, as (variable, extent), and the body
    of the innermost."""
    chain = [(loop.var, loop.extent)]
    while len(loop.body) == 1 and isinstance(loop.body[0], ir.Loop) and loop.body[0].kind == ir.REDUCE:
        loop = loop.body[0]
        chain.append((loop.var, loop.extent))
    return chain, loop.body


def _only_accumulates(body, name):
    """Whether a reduction's body only adds into accumulator `name` and never reads it."""
    for s in ir.statements(body):
        if isinstance(s, (ir.Define, ir.Store, ir.Assign, ir.ScatterAccumulate)):
            return False
        if isinstance(s, ir.Accumulate) and (s.name != name or s.op != "add" or any(
                isinstance(v, ir.Ref) and v.name == name for v in ir.values(s.value))):
            return False
    return True


def _multiply_adds(body):
    """Whether every term a reduction's body adds is a product (a contraction)."""
    for s in ir.statements(body):
        if isinstance(s, ir.Accumulate):
            value = s.value.value if isinstance(s.value, ir.Guard) else s.value
            if not isinstance(value, ir.Apply) or value.op != "mul":
                return False
    return True


def _nest(loops, body):
    """`body` inside `loops`; a loop around statements that define a partial sum runs serially
    (a backend vectorises a reduction loop whose body accumulates directly)."""
    for var, extent in reversed(loops):
        defines = any(isinstance(s, ir.Define) for s in body)
        body = [ir.Loop(var, extent, ir.SERIAL if defines else ir.REDUCE, body)]
    return body
