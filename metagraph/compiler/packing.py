"""Schedule primitives on a reduction's operands and loops (blocks.py has the ones that shape its
block of outputs): `pack` an operand into a local array at the start of an output loop, read from
there; `merge` neighbouring reduction loops that every index reads as one flat range; `drop_units`,
reduction loops of one iteration. Each is a rewrite of the kernel IR that checks its own legality
and raises ValueError where it does not apply.
"""
import math

from metagraph.compiler import blocks, ir
from metagraph.compiler.access import Replace, loop_variables, reads_flat
from metagraph.compiler.rewrites import fresh_variable, row_major
from metagraph.expr import Const, Var, linear_terms

PACK = "pack"       # the name of a packed operand's local array
LINE_BYTES = 64     # a cache line: what a copy reads whole from a strided source


def operand(body, param, ordinal):
    """The `ordinal`-th distinct load of parameter `param` that the reduction accumulates."""
    nest = blocks.Nest(body)
    found = [v for a in nest.accumulations for v in ir.loads(a.value) if v.param == param]
    unique = list({id(v): v for v in found}.values())
    if ordinal >= len(unique):
        raise ValueError(f"pack: the reduction reads parameter {param} fewer than {ordinal + 1} times")
    return unique[ordinal]


def pack(body, param, ordinal, at, loops, fixed, extents):
    """The operand (`operand(param, ordinal)`) read from a local array `pack`, copied at the start
    of output loop `at` (None: the kernel's body) over `loops` ((variable, extent), renamed), in
    their row-major order; `fixed` sets variables the copy reads at one value."""
    nest, loops, fixed = blocks.Nest(body), [tuple(loop) for loop in loops], [tuple(f) for f in fixed]
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
    renamed = blocks.rewrite(extents, Replace({**{v: Const(c) for v, c in fixed}, **fresh}))
    copy = _copy(ir.Assign(PACK, row_major(loops, fresh, extents), ir.rewritten(load, renamed)),
                 [(fresh[var].axis, extent) for var, extent in loops], extents)
    statements = [ir.Define(PACK, load.dtype, None, size=math.prod(extent for _, extent in loops))] + copy
    packed = ir.Ref(PACK, load.dtype, row_major(loops, {var: Var(var) for var, _ in loops}, extents))
    accumulations = [ir.Accumulate(a.name, a.op, ir.replaced(a.value, {id(load): packed}), a.index)
                     for a in nest.accumulations]
    bottom = nest.bottom_of(nest.define, nest.reductions, blocks.loops_of(nest.accumulating), accumulations,
                            blocks.loops_of(nest.store_loops), nest.stores)
    body = nest.rebuilt(None, bottom)
    if at is None:
        return statements + body
    return _inserted(body, at, statements)


def _copy(assign, loops, extents):
    """The loop nest of a pack's copy: its loops in the array's row-major order (the stores
    contiguous), except where the innermost reads its source with a stride and another loop reads
    it contiguously: that loop is then cut into cache lines, the line's loop innermost, so that a
    source line is read whole while it is in cache. A transposed panel's copy (a linear layer's
    weight read along its rows) read one float of 64 rows 4 KiB apart per step, rows that share
    the first-level cache's sets: 2 ms for a 1024x1024 weight, 0.3 ms by lines."""
    terms, _ = linear_terms(assign.value.index) if isinstance(assign.value, ir.Load) else ({}, None)
    line = LINE_BYTES // assign.value.dtype.itemsize
    unit = next((var for var, extent in loops if terms.get(Var(var)) == 1 and extent % line == 0 and
                 extent > line), None)
    if loops and unit is not None and terms.get(Var(loops[-1][0])) != 1:
        lines, within = fresh_variable(extents), None
        extents[lines] = extents[unit] // line
        within = fresh_variable(extents)
        extents[within] = line
        cut = blocks.rewrite(extents, Replace({unit: Var(lines) * line + Var(within)}))
        assign = ir.Assign(assign.name, cut(assign.index), ir.rewritten(assign.value, cut))
        loops = [(lines, extents[lines]) if var == unit else (var, extent) for var, extent in loops]
        loops.append((within, line))
    copy = [assign]
    for var, extent in reversed(loops):
        copy = [ir.Loop(var, extent, ir.SERIAL, copy)]
    return copy


def _names(body):
    return {s.name for s in ir.statements(body) if isinstance(s, ir.Define)}


def _inserted(body, at, statements):
    """`body` with `statements` at the start of the body of output loop `at`."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop) and s.kind != ir.REDUCE:
            inner = statements + s.body if s.var == at else _inserted(s.body, at, statements)
            s = ir.Loop(s.var, s.extent, s.kind, inner)
        out.append(s)
    return out


def drop_units(body, variables, extents):
    """The reduction loops `variables`, of one iteration each, gone (not all of them), their
    variables read at 0."""
    nest, variables = blocks.Nest(body), list(variables)
    loops = [loop.var for loop in nest.reductions]
    if any(v not in loops or extents[v] != 1 for v in variables) or len(variables) >= len(loops):
        raise ValueError(f"drop_units: {variables} are not reduction loops of one iteration, or all of them")
    return _reduction_loops_replaced(nest, [loop for loop in nest.reductions if loop.var not in variables],
                                     Replace({v: Const(0) for v in variables}), extents)


def merge(body, outer, inner, extents):
    """Neighbouring reduction loops `outer` around `inner` that every index reads as one flat range
    as the loop `inner` over both ranges."""
    nest = blocks.Nest(body)
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
    rewrite = blocks.rewrite(extents, mapping)
    accumulations = [ir.Accumulate(a.name, a.op, ir.rewritten(a.value, rewrite), a.index)
                     for a in nest.accumulations]
    bottom = nest.bottom_of(nest.define, reductions, blocks.loops_of(nest.accumulating), accumulations,
                            blocks.loops_of(nest.store_loops), nest.stores)
    return nest.rebuilt(None, bottom)
