"""Loop-invariant statements moved out of their loop: a value computed the same way in every
iteration is computed once, before the loop.

A reduction whose terms do not read an output loop around it (the gradient of `y.sum()` through a
linear layer: every row of the weight's gradient sums the same column of the layer's input against
a gradient of ones) is otherwise summed again for each iteration of that loop: a transformer
block's backward summed one 8 x 128 x 1024 operand 256 times over (16 ms for a 1 ms sum).
`hoist(loop, count)` is the primitive; `hoisted` the rule that applies it wherever it holds, from
the innermost loops out, so that a sum invariant along several loops leaves all of them.
"""
from metagraph.compiler import ir
from metagraph.expr import Binary, Extra, Select, variables


def hoist(loop, count, params):
    """(the first `count` statements of `loop`'s body, the loop without them), where `movable`
    allows it; raises ValueError otherwise."""
    if not movable(loop, count, params):
        raise ValueError(f"hoist: the first {count} statements of loop i{loop.var} do not compute the same "
                         "values in every iteration (they read its variable or memory it writes, write "
                         "memory, or share local arrays with the statements after them)")
    return loop.body[:count], ir.Loop(loop.var, loop.extent, loop.kind, loop.body[count:])


def movable(loop, count, params):
    """Whether the first `count` statements of `loop`'s body (not all of it) compute the same values
    in every iteration: none reads the loop's variable, writes memory (a Store or a scatter), or
    reads an output parameter or one that shares another's memory; each local array or
    accumulator they write is defined among them, and the statements after them write none that
    they read or write."""
    reads = _invariant_reads(loop, params, count)
    return 0 < count <= len(reads) and _movable(loop, count, reads)


def invariant_prefix(loop, params):
    """The most leading statements of `loop`'s body that `movable` allows to move (0: none). Only a
    body that starts with a Define can have any: what moves writes only arrays defined in it."""
    if len(loop.body) < 2 or not isinstance(loop.body[0], ir.Define):
        return 0
    reads = _invariant_reads(loop, params)
    return next((count for count in range(len(reads), 0, -1) if _movable(loop, count, reads)), 0)


def hoisted(body, params):
    """The body with every loop's invariant prefix moved before the loop, innermost loops first
    (a prefix moved out of one loop may then be invariant along the loop around it too)."""
    out = []
    for s in body:
        if not isinstance(s, ir.Loop):
            out.append(s)
            continue
        loop = ir.Loop(s.var, s.extent, s.kind, hoisted(s.body, params))
        count = invariant_prefix(loop, params)
        out.extend(loop.body[:count])
        out.append(ir.Loop(loop.var, loop.extent, loop.kind, loop.body[count:]) if count else loop)
    return out


def _invariant_reads(loop, params, most=None):
    """`_Reads` of the leading statements (at most `most`, and not the whole body) that read
    neither the loop's variable nor memory a kernel writes, and write no memory."""
    most = len(loop.body) - 1 if most is None else min(most, len(loop.body) - 1)
    found = []
    for statement in loop.body[:most]:
        reads = _Reads(statement, loop.var, params)
        if not reads.invariant:
            break
        found.append(reads)
    return found


_WRITES = (ir.Define, ir.Accumulate, ir.Assign)


def _movable(loop, count, reads):
    """Whether the prefix of `count` statements (each invariant on its own; `reads`, theirs) writes
    only arrays it defines and shares none with the statements after it."""
    defined, used = set(), set()
    for statement, read in zip(loop.body[:count], reads):
        defined |= _names(statement, (ir.Define,))
        written = _names(statement, _WRITES)
        if not written <= defined:
            return False
        used |= read.refs | written
    after = set().union(*(_names(s, _WRITES) for s in loop.body[count:]))
    return not used & after


def _names(statement, kinds):
    """The local arrays and accumulators that statements of `kinds` inside `statement` name (a
    Define initialises its own)."""
    found, stack = set(), [statement]
    while stack:
        s = stack.pop()
        if isinstance(s, ir.Loop):
            stack.extend(s.body)
        elif isinstance(s, kinds):
            found.add(s.name)
    return found


class _Reads:
    """What one statement (a loop: everything inside it) reads, from one walk over its statements
    and values (each value once): the local arrays (`refs`), and whether it is `invariant` along
    loop variable `var` (reads neither it nor an output or shared parameter, writes no memory; the
    walk stops where it is not)."""

    def __init__(self, statement, var, params):
        self.refs, self.invariant, self.var, self.params = set(), True, var, params
        seen, statements = set(), [statement]
        while statements and self.invariant:
            s = statements.pop()
            if isinstance(s, ir.Loop):
                statements.extend(s.body)
                continue
            if isinstance(s, (ir.Store, ir.ScatterAccumulate)):
                self.invariant = False
                break
            self.indices([getattr(s, "index", None), getattr(s, "valid", None)], ())
            stack = [getattr(s, "value", None)] if not isinstance(s, ir.Define) else []
            while stack and self.invariant:
                v = stack.pop()
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                if isinstance(v, ir.Ref):
                    self.refs.add(v.name)
                self.indices(ir.index_expressions(v), (v.param,) if isinstance(v, ir.Load) else ())
                stack.extend((v.value,) if isinstance(v, ir.Guard) else getattr(v, "args", ()))

    def indices(self, expressions, params):
        """Take account of index expressions and the parameters read with them."""
        read = set(params)
        for expr in expressions:
            if expr is not None:
                read |= _extra_params(expr)
                self.invariant &= self.var not in variables(expr)
        self.invariant &= not any(self.params[p].output or self.params[p].shared for p in read)


def _extra_params(expr):
    if isinstance(expr, Extra):
        return {expr.index}.union(*(_extra_params(arg) for arg in expr.args))
    if isinstance(expr, Binary):
        return _extra_params(expr.a) | _extra_params(expr.b)
    if isinstance(expr, Select):
        return _extra_params(expr.cond) | _extra_params(expr.a) | _extra_params(expr.b)
    return set()
