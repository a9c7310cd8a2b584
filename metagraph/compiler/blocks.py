"""Schedule primitives of a reduction's loop nest: rewrites of the kernel IR that decide which output
elements a reduction accumulates at once and where its operands are read from.

A reduction kernel is lowered as the plain nest (`plain_nest`): its output loops, the first the
parallel one, around an accumulator, the reduction's loops and the store:

    for n (parallel): for k: for h: for w:
        acc = 0;  for c: for u: for v: acc += x[...] * w[...];  out[n, k, h, w] = f(acc)

Each primitive below is one legal rewrite of such a nest (raising ValueError where it does not
apply); none knows which operator the reduction came from. `split` and `interchange` are in
rewrites.py, the lane split in lanes.py.
- `reorder(order)`: the output loops in another order (kinds stay with positions: the first is the
  parallel one);
- `block(vars)`: the innermost output loops move inside the reduction, their elements accumulated
  at once in a local array (the innermost that runs more than once is the vector loop), stored
  after it: `acc[w] += ...` for a row of w;
- `round_up(var, extent)`: a block of one loop computes `extent` elements and stores the first ones
  only (whole vectors instead of a tail); its loads then read past the row, which the caller must
  know to be readable (heuristic.whole_vectors: inside the buffer or the slack allocated past it);
- `flatten_plane(a, b, pitch, rows)`: a block of one short row b computes `rows` rows of a as one
  flat range of addresses (pitch * a + b), storing only the lanes inside a row;
- `jam(var, rows)`: an output loop around the block is unrolled `rows` times into it: each
  accumulation repeated per row (a register tile of rows x the block), reading once what does not
  vary along the loop;
packing.py has the primitives on the reduction's operands and loops (`pack`, `merge`,
`drop_units`).
"""

from metagraph.compiler import ir, planes, rewrites
from metagraph.compiler.access import Replace, loop_variables, vector_loop
from metagraph.compiler.rewrites import fresh_variable
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var, binary, linear_terms, variables

ACC = "acc"         # the name of the reduction's accumulator


def plain_nest(shape, extents, define, reductions, accumulate, store):
    """The plain nest of a reduction into an output of `shape`: its loops (variables 0..ndim-1,
    the first parallel) around `define`, the REDUCE loops (`reductions`: (variable, extent)) around
    `accumulate`, and `store`."""
    body = [accumulate]
    for var, extent in reversed(reductions):
        body = [ir.Loop(var, extent, ir.REDUCE, body)]
    body = [define] + body + [store]
    for d in reversed(range(len(shape))):
        body = [ir.Loop(d, extents[d], ir.PARALLEL if d == 0 else ir.SERIAL, body)]
    return body


class Nest:
    """A view of a reduction's nest for the primitives: the output loops from the kernel's body
    down (`chain`), the body holding the accumulator (`bottom`), and in it the accumulator's
    Define, the reduction's loops (`reductions`, outermost first), the loops of a block under them
    (`accumulating`), the Accumulate statements and the store loops and Stores."""

    def __init__(self, body):
        self.chain, self.keeps, statements = [], [], body
        while not any(isinstance(s, ir.Define) and s.name == ACC for s in statements):
            loops = [s for s in statements if isinstance(s, ir.Loop)]
            if not loops:
                raise ValueError("not a reduction's nest: no accumulator")
            self.chain.append(loops[-1])        # (packed copies' loops come before it)
            self.keeps.append(statements[:statements.index(loops[-1])])
            statements = loops[-1].body
        self.bottom = statements
        self.define = next(s for s in statements if isinstance(s, ir.Define) and s.name == ACC)
        start = statements.index(self.define)
        self.reductions, self.accumulating = [], []
        inner = statements[start + 1]
        while isinstance(inner, ir.Loop) and inner.kind == ir.REDUCE:
            self.reductions.append(inner)
            inner = inner.body[0] if len(inner.body) == 1 else None
        body = self.reductions[-1].body if self.reductions else [statements[start + 1]]
        while len(body) == 1 and isinstance(body[0], ir.Loop):
            self.accumulating.append(body[0])
            body = body[0].body
        self.accumulations = body
        self.stores, self.store_loops = statements[start + 2:], []
        while len(self.stores) == 1 and isinstance(self.stores[0], ir.Loop):
            self.store_loops.append(self.stores[0])
            self.stores = self.stores[0].body
        self.prefix = statements[:start]        # (a packed copy made in the innermost output loop)

    @property
    def block(self):
        """The block's loop variables, outermost first (empty: one element at a time)."""
        return [loop.var for loop in self.accumulating]

    def copies_inside(self, var):
        """The statements of their own (packed copies) that the loops inside output loop `var`
        hold, with var's own."""
        level = [loop.var for loop in self.chain].index(var) + 1
        return [s for keep in self.keeps[level:] for s in keep] + self.prefix

    def outer(self, var):
        """The output loop of `var` around the block."""
        found = [loop for loop in self.chain if loop.var == var]
        if not found:
            raise ValueError(f"loop {var} is not an output loop around the reduction")
        return found[0]

    def rebuilt(self, chain=None, bottom=None):
        """The kernel body with the output loops `chain` (headers: var, extent, kind; default: as
        they are) around `bottom` (default: as it is). A chain shorter than the nest's drops its
        inner loops (a block took them), which must hold nothing but the next loop."""
        chain = self.chain if chain is None else chain
        depth = len(chain)
        if any(self.keeps[depth + 1:]):
            raise ValueError("a loop taken into a block holds statements of its own (a packed copy)")
        inner = self.bottom if bottom is None else bottom
        if depth < len(self.chain):
            inner = self.keeps[depth] + inner
        for loop, keep in zip(reversed(chain), reversed(self.keeps[:depth])):
            inner = keep + [ir.Loop(loop.var, loop.extent, loop.kind, inner)]
        return inner

    def bottom_of(self, define, reductions, accumulating, accumulations, store_loops, stores):
        """The statements holding the accumulator, built from its parts (loops as (var, extent, kind))."""
        inner = accumulations
        for var, extent, kind in reversed(accumulating):
            inner = [ir.Loop(var, extent, kind, inner)]
        for loop in reversed(reductions):
            inner = [ir.Loop(loop.var, loop.extent, ir.REDUCE, inner)]
        out = stores
        for var, extent, kind in reversed(store_loops):
            out = [ir.Loop(var, extent, kind, out)]
        return self.prefix + [define] + inner + out


def loops_of(loops):
    return [(loop.var, loop.extent, loop.kind) for loop in loops]


def _refs_to(value, name, index):
    """`value` with every reference to accumulator `name` reading element `index` (one object)."""
    refs = [v for v in ir.values(value) if isinstance(v, ir.Ref) and v.name == name]
    if not refs:
        return value
    ref = ir.Ref(name, refs[0].dtype, index)
    return ir.replaced(value, {id(r): ref for r in refs})


def rewrite(extents, mapping):
    return lambda expr: simplify(substitute(expr, mapping), extents)


def _offset(block, extents):
    """(elements, flat offset) of a block's variables in row-major order."""
    size, offset = 1, Const(0)
    for d in block:
        size, offset = size * extents[d], offset * extents[d] + Var(d)
    return size, offset


# ---- primitives --------------------------------------------------------------------------------

def reorder(body, order, extents):
    """The output loops in `order` (variables, outermost first); kinds stay with positions."""
    nest = Nest(body)
    order = list(order)
    if sorted(order) != sorted(loop.var for loop in nest.chain):
        raise ValueError(f"reorder: {order} is not an order of the output loops "
                         f"{[loop.var for loop in nest.chain]}")
    if any(nest.keeps[1:]):
        raise ValueError("reorder: a loop holds statements of its own (a packed copy)")
    by_var = {loop.var: loop for loop in nest.chain}
    chain = [ir.Loop(var, by_var[var].extent, old.kind, None) for var, old in zip(order, nest.chain)]
    return nest.rebuilt(chain)


def split(body, var, factor, extents):
    """rewrites.split of the output loop `var`: var counts groups of `factor`, a loop of a new
    variable right inside it runs over the group."""
    return replaced_loop(body, var, rewrites.split(Nest(body).outer(var), factor, extents))


def block(body, variables, extents):
    """The innermost output loops `variables` (outermost first) accumulated at once (see the module
    docstring): `acc` becomes an array of their elements."""
    nest, variables = Nest(body), list(variables)
    chain = nest.chain
    if nest.block or [loop.var for loop in chain[len(chain) - len(variables):]] != variables:
        raise ValueError(f"block: {variables} are not the innermost output loops of an unblocked nest")
    if nest.copies_inside(variables[0]):
        raise ValueError(f"block: loop {variables[0]} or one inside it holds statements of its own (a packed "
                         "copy), which cannot move into the reduction")
    inner = vector_loop(variables, extents)
    size, offset = _offset(variables, extents)
    offset = simplify(offset, extents)
    loops = [(d, extents[d], ir.VECTOR if d == inner else ir.SERIAL) for d in variables]
    (accumulate,) = nest.accumulations
    accumulate = ir.Accumulate(accumulate.name, accumulate.op, accumulate.value, offset)
    stores = [ir.Store(s.param, s.index, _refs_to(s.value, ACC, offset)) for s in nest.stores]
    d = nest.define
    bottom = nest.bottom_of(ir.Define(d.name, d.dtype, d.init, d.op, size), nest.reductions, loops,
                            [accumulate], loops, stores)
    return nest.rebuilt(chain[:len(chain) - len(variables)], bottom)


def round_up(body, var, extent, extents):
    """A block of the one loop `var` computing `extent` elements, its store loop the ones it had
    (the accumulator's elements are indexed by var alone, so nothing else moves)."""
    nest = Nest(body)
    if nest.block != [var] or len(nest.accumulations) != 1 or extent < extents[var]:
        raise ValueError(f"round_up: {var} is not the one loop of an unjammed block, or {extent} is short")
    if any(var in loop_variables(v) and not (isinstance(v, ir.Load) and v.valid is None)
           for v in ir.values(nest.accumulations[0].value)):
        raise ValueError(f"round_up: a value other than a plain load varies along {var} (a guard, an index "
                         "value, a packed operand), which the lanes past the row could break")
    extents[var] = extent
    d, (loop,) = nest.define, nest.accumulating
    bottom = nest.bottom_of(ir.Define(d.name, d.dtype, d.init, d.op, extent), nest.reductions,
                            [(var, extent, loop.kind)], nest.accumulations, loops_of(nest.store_loops),
                            nest.stores)
    return nest.rebuilt(None, bottom)


def flatten_plane(body, a, b, pitch, rows, extents):
    """A block of the one row b, whose every load reads the plane (a, b) at pitch * a + b, as
    `rows` rows of a computed in one flat loop p over (rows - 1) * pitch + width addresses; the
    store runs over (r, b) and reads the block at r * pitch + b."""
    nest = Nest(body)
    if nest.block != [b] or [loop.var for loop in nest.store_loops] != [b] or len(nest.accumulations) != 1 \
            or not nest.chain or nest.chain[-1].var != a or extents[a] % rows:
        raise ValueError(f"flatten_plane: the block is not row {b} inside loop {a}, or {rows} rows do "
                         "not divide it")
    if _reading(nest.copies_inside(a), a):
        raise ValueError(f"flatten_plane: a packed copy inside loop {a} reads it")
    if planes.plane_pitch(nest.accumulations[0].value, a, b) != pitch or pitch < extents[b]:
        raise ValueError(f"flatten_plane: the loads do not read the plane ({a}, {b}) at pitch {pitch}, "
                         f"at least the row's {extents[b]}")
    height, width = extents[a], extents[b]
    p = fresh_variable(extents)
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
    (accumulate,) = nest.accumulations
    value = ir.rewritten(accumulate.value, lambda expr: simplify(fold(expr), extents))
    accumulate = ir.Accumulate(accumulate.name, accumulate.op, value, simplify(Var(p), extents))
    to_rows = rewrite(extents, Replace({a: Var(a) * rows + Var(r)}))
    at = simplify(Var(r) * pitch + Var(b), extents)
    stores = [_refs_to_statement(ir.rewritten_statement(s, to_rows), at) for s in nest.stores]
    d = nest.define
    bottom = nest.bottom_of(ir.Define(d.name, d.dtype, d.init, d.op, extents[p]), nest.reductions,
                            [(p, extents[p], ir.VECTOR)], [accumulate],
                            [(r, rows, ir.SERIAL), (b, width, ir.VECTOR)], stores)
    chain = [ir.Loop(loop.var, extents[loop.var], loop.kind, None) for loop in nest.chain]
    return nest.rebuilt(chain, bottom)


def _reading(statements, var):
    """Whether any of `statements` (and the loops inside them) reads loop variable `var`."""
    for s in ir.statements(statements):
        for part in ("index", "valid"):
            expr = getattr(s, part, None)
            if expr is not None and not isinstance(expr, (int, str)) and var in variables(expr):
                return True
        value = getattr(s, "value", None)
        if value is not None and var in used_variables(value):
            return True
    return False


def _refs_to_statement(store, index):
    return ir.Store(store.param, store.index, _refs_to(store.value, ACC, index))


def jam(body, var, rows, extents):
    """The output loop `var` around a block unrolled `rows` times into it (see the module
    docstring): var counts groups of rows, ceil(E / rows) of them over the loop's extent E; the
    store loops gain the row loop outermost. A group's first row is clamped to E - rows, in every
    read and store: where `rows` does not divide E the last group overlaps the one before it,
    computing rows it computed from the same values and storing the same bits over them (on
    another thread, perhaps; a block is never computed in place: lower.py donates no input to a
    kernel that defines one); where it divides, the clamp never binds. One clamp a group keeps
    each row's address a constant offset from the group's first, and the same kernel serves
    extents that divide and that do not (generic.py)."""
    nest = Nest(body)
    loop = nest.outer(var)
    if not nest.block or rows < 2 or rows > loop.extent:
        raise ValueError(f"jam: no block to jam loop {var} into, or {rows} rows exceed {loop.extent}")
    if _reading(nest.copies_inside(var), var):
        raise ValueError(f"jam: a packed copy inside loop {var} reads it (the copy would serve one row)")
    size = nest.define.size
    r = fresh_variable(extents)
    extents[var], extents[r] = -(-loop.extent // rows), rows
    first = binary("min", Var(var) * rows, Const(loop.extent - rows))     # (folds where one group)

    def row(offset):
        """The row of group `var` at `offset` (a constant or the row loop's variable)."""
        return first + offset
    accumulations = []
    for k in range(rows):
        mapping = rewrite(extents, Replace({var: row(Const(k))}))
        accumulations += [ir.Accumulate(a.name, a.op, ir.rewritten(a.value, mapping),
                                        simplify(Const(k * size) + a.index, extents))
                          for a in nest.accumulations]
    to_rows = rewrite(extents, Replace({var: row(Var(r))}))
    old = next(v for s in nest.stores for v in ir.values(s.value) if isinstance(v, ir.Ref) and v.name == ACC)
    at = simplify(Var(r) * size + old.index, extents)
    stores = [_refs_to_statement(ir.rewritten_statement(s, to_rows), at) for s in nest.stores]
    d = nest.define
    bottom = nest.bottom_of(ir.Define(d.name, d.dtype, d.init, d.op, size * rows), nest.reductions,
                            loops_of(nest.accumulating), accumulations,
                            [(r, rows, ir.SERIAL)] + loops_of(nest.store_loops), stores)
    chain = [ir.Loop(o.var, extents[o.var], o.kind, None) for o in nest.chain]
    return nest.rebuilt(chain, bottom)


def replaced_loop(body, var, loop):
    """`body` with the output loop of `var` replaced by `loop`."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            s = loop if s.var == var else ir.Loop(s.var, s.extent, s.kind, replaced_loop(s.body, var, loop))
        out.append(s)
    return out


def reads(body):
    """The value the reduction accumulates (its first accumulation's) and the store: what the
    heuristic decides by."""
    nest = Nest(body)
    return nest.accumulations[0].value, nest.stores[0]


def used_variables(value):
    """The loop variables every index expression of a value tree uses."""
    return set().union(*(loop_variables(v) for v in ir.values(value)))
