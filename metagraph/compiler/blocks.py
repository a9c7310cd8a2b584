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
- `pack(param, ordinal, at, loops, fixed)`: an operand is copied into a local array at the start of
  an output loop (or of the kernel), laid out in the order `loops` read it, and read from there;
- `merge(outer, inner)` and `drop_units(vars)`: neighbouring reduction loops that every index reads
  as one flat range become one loop; reduction loops of one iteration go.
"""
import math

from metagraph.compiler import ir
from metagraph.compiler.access import Replace, loop_variables, reads_flat, vector_loop
from metagraph.compiler import planes, rewrites
from metagraph.compiler.rewrites import fresh_variable
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var, linear_terms, variables

ACC, PACK = "acc", "pack"       # the names of the reduction's accumulator and of a packed operand


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


def _loops(loops):
    return [(loop.var, loop.extent, loop.kind) for loop in loops]


def _refs_to(value, name, index):
    """`value` with every reference to accumulator `name` reading element `index` (one object)."""
    refs = [v for v in ir.values(value) if isinstance(v, ir.Ref) and v.name == name]
    if not refs:
        return value
    ref = ir.Ref(name, refs[0].dtype, index)
    return ir.replaced(value, {id(r): ref for r in refs})


def _rewrite(extents, mapping):
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


def _before_next(nest, loop):
    """The statements in `loop`'s body before the next loop of the chain."""
    loops = [s for s in loop.body if isinstance(s, ir.Loop)]
    return loop.body[:loop.body.index(loops[-1])] if loops else loop.body


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
                            [(var, extent, loop.kind)], nest.accumulations, _loops(nest.store_loops),
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
    to_rows = _rewrite(extents, Replace({a: Var(a) * rows + Var(r)}))
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
    for s in ir_statements(statements):
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
    docstring): var counts groups of rows; the store loops gain the row loop outermost."""
    nest = Nest(body)
    loop = nest.outer(var)
    if not nest.block or rows < 2 or loop.extent % rows:
        raise ValueError(f"jam: no block to jam loop {var} into, or {rows} rows do not divide {loop.extent}")
    if _reading(nest.copies_inside(var), var):
        raise ValueError(f"jam: a packed copy inside loop {var} reads it (the copy would serve one row)")
    size = nest.define.size
    r = fresh_variable(extents)
    extents[var], extents[r] = extents[var] // rows, rows
    accumulations = []
    for row in range(rows):
        mapping = _rewrite(extents, Replace({var: Var(var) * rows + Const(row)}))
        accumulations += [ir.Accumulate(a.name, a.op, ir.rewritten(a.value, mapping),
                                        simplify(Const(row * size) + a.index, extents))
                          for a in nest.accumulations]
    to_rows = _rewrite(extents, Replace({var: Var(var) * rows + Var(r)}))
    old = next(v for s in nest.stores for v in ir.values(s.value) if isinstance(v, ir.Ref) and v.name == ACC)
    at = simplify(Var(r) * size + old.index, extents)
    stores = [_refs_to_statement(ir.rewritten_statement(s, to_rows), at) for s in nest.stores]
    d = nest.define
    bottom = nest.bottom_of(ir.Define(d.name, d.dtype, d.init, d.op, size * rows), nest.reductions,
                            _loops(nest.accumulating), accumulations,
                            [(r, rows, ir.SERIAL)] + _loops(nest.store_loops), stores)
    chain = [ir.Loop(o.var, extents[o.var], o.kind, None) for o in nest.chain]
    return nest.rebuilt(chain, bottom)


def operand(body, param, ordinal):
    """The `ordinal`-th distinct load of parameter `param` that the reduction accumulates."""
    nest = Nest(body)
    found = [v for a in nest.accumulations for v in ir.loads(a.value) if v.param == param]
    unique = list({id(v): v for v in found}.values())
    if ordinal >= len(unique):
        raise ValueError(f"pack: the reduction reads parameter {param} fewer than {ordinal + 1} times")
    return unique[ordinal]


def pack(body, param, ordinal, at, loops, fixed, extents):
    """The operand (`operand(param, ordinal)`) read from a local array `pack`, copied at the start
    of output loop `at` (None: the kernel's body) over `loops` ((variable, extent), renamed), in
    their row-major order; `fixed` sets variables the copy reads at one value."""
    nest, loops, fixed = Nest(body), [tuple(loop) for loop in loops], [tuple(f) for f in fixed]
    if PACK in _names(body):
        raise ValueError("pack: the kernel already packs an operand")
    load = operand(body, param, ordinal)
    chain = [loop.var for loop in nest.chain]
    if at is not None and at not in chain:
        raise ValueError(f"pack: {at} is not an output loop")
    if at is None and chain:        # (code generators may run the parallel loop as functions apart)
        raise ValueError(f"pack: a copy made before the parallel loop {chain[0]} would be shared by its "
                         "threads")
    depth = 0 if at is None else chain.index(at) + 1
    inside = {loop.var: loop.extent for loop in nest.chain[depth:] + nest.reductions + nest.accumulating}
    if any(inside.get(var) != extent for var, extent in loops) or \
            loop_variables(load) - {var for var, _ in loops} - {var for var, _ in fixed} - set(chain[:depth]):
        raise ValueError(f"pack: the operand reads loops other than {[var for var, _ in loops]} (inside "
                         f"loop {at}, at their extents) and those around it")
    first = fresh_variable(extents)
    fresh = {var: Var(first + k) for k, (var, _) in enumerate(loops)}
    extents.update({fresh[var].axis: extent for var, extent in loops})
    renamed = _rewrite(extents, Replace({**{v: Const(c) for v, c in fixed}, **fresh}))
    copy = [ir.Assign(PACK, _flat_index(loops, fresh, extents), ir.rewritten(load, renamed))]
    for var, extent in reversed(loops):
        copy = [ir.Loop(fresh[var].axis, extent, ir.SERIAL, copy)]
    statements = [ir.Define(PACK, load.dtype, None, size=math.prod(extent for _, extent in loops))] + copy
    packed = ir.Ref(PACK, load.dtype, _flat_index(loops, {var: Var(var) for var, _ in loops}, extents))
    accumulations = [ir.Accumulate(a.name, a.op, ir.replaced(a.value, {id(load): packed}), a.index)
                     for a in nest.accumulations]
    bottom = nest.bottom_of(nest.define, nest.reductions, _loops(nest.accumulating), accumulations,
                            _loops(nest.store_loops), nest.stores)
    body = nest.rebuilt(None, bottom)
    if at is None:
        return statements + body
    return _inserted(body, at, statements)


def _names(body):
    return {s.name for s in ir_statements(body) if isinstance(s, ir.Define)}


def ir_statements(body):
    """Every statement of `body`, loops and the statements inside them."""
    for s in body:
        yield s
        if isinstance(s, ir.Loop):
            yield from ir_statements(s.body)


def _inserted(body, at, statements):
    """`body` with `statements` at the start of the body of output loop `at`."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            inner = statements + s.body if s.var == at else _inserted(s.body, at, statements)
            s = ir.Loop(s.var, s.extent, s.kind, inner)
        out.append(s)
    return out


def replaced_loop(body, var, loop):
    """`body` with the output loop of `var` replaced by `loop`."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            s = loop if s.var == var else ir.Loop(s.var, s.extent, s.kind, replaced_loop(s.body, var, loop))
        out.append(s)
    return out


def _flat_index(loops, names, extents):
    index, stride = Const(0), 1
    for var, extent in reversed(loops):
        index, stride = index + names[var] * stride, stride * extent
    return simplify(index, extents)


def drop_units(body, variables, extents):
    """The reduction loops `variables`, of one iteration each, gone (not all of them), their
    variables read at 0."""
    nest, variables = Nest(body), list(variables)
    loops = [loop.var for loop in nest.reductions]
    if any(v not in loops or extents[v] != 1 for v in variables) or len(variables) >= len(loops):
        raise ValueError(f"drop_units: {variables} are not reduction loops of one iteration, or all of them")
    return _reduction_loops_replaced(nest, [loop for loop in nest.reductions if loop.var not in variables],
                                     Replace({v: Const(0) for v in variables}), extents)


def merge(body, outer, inner, extents):
    """Neighbouring reduction loops `outer` around `inner` that every index reads as one flat range
    as the loop `inner` over both ranges."""
    nest = Nest(body)
    loops = [loop.var for loop in nest.reductions]
    if outer not in loops or loops.index(outer) + 1 >= len(loops) or loops[loops.index(outer) + 1] != inner:
        raise ValueError(f"merge: {outer} is not the reduction loop around {inner}")
    width = extents[inner]
    if not all(reads_flat(expr, outer, inner, width) for a in nest.accumulations
               for v in ir.values(a.value) for expr in ir.index_expressions(v)):
        raise ValueError(f"merge: loops {outer} and {inner} are not read as one flat range")
    extents[inner] = extents[outer] * width
    kept = [ir.Loop(loop.var, extents[loop.var], loop.kind, None) for loop in nest.reductions
            if loop.var != outer]
    return _reduction_loops_replaced(nest, kept, Replace({outer: Const(0)}), extents)


def _reduction_loops_replaced(nest, reductions, mapping, extents):
    rewrite = _rewrite(extents, mapping)
    accumulations = [ir.Accumulate(a.name, a.op, ir.rewritten(a.value, rewrite), a.index)
                     for a in nest.accumulations]
    bottom = nest.bottom_of(nest.define, reductions, _loops(nest.accumulating), accumulations,
                            _loops(nest.store_loops), nest.stores)
    return nest.rebuilt(None, bottom)


def reads(body):
    """The value the reduction accumulates (its first accumulation's) and the store: what the
    heuristic decides by."""
    nest = Nest(body)
    return nest.accumulations[0].value, nest.stores[0]


def used_variables(value):
    """The loop variables every index expression of a value tree uses."""
    return set().union(*(loop_variables(v) for v in ir.values(value)))
