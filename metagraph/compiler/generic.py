"""Kernels whose outermost extent is a run-time argument: a new batch size compiles nothing.

A training or inference loop over batches of another size builds the same graph with another
leading extent, and lowering gives the same kernels but for that extent. A kernel whose loop over its
output's first dimension runs over all of it, and which reads that loop's variable only as the
first dimension of tensors of that extent (i0 * stride0 + ..., or as the rows of a register tile's
group, the group's first row clamped to the last group's), computes the same way for any extent of
them: it can take the extent at run time (`RuntimeExtent`: the loop's bound and the clamp,
expressions of the extent read from the launch's arguments) and its source, and so its compiled
binary, serves every extent.

A kernel is lowered for its extent and then made generic (`generic_form`); the generic kernel is
what is compiled and run, from the first extent on. Its *form* (the kernel with that extent
abstracted) names it, so a later extent whose lowering gives the same form reuses it, in this
process or another (the kernel cache keys by source), and one whose lowering differs anywhere
else (a constant that was the extent by coincidence, a schedule chosen for another extent) is
another form. The heuristic keeps the schedule along the first dimension the same over wide ranges
of its extent (access.jam_rows), so a handful of forms serve every batch size. Anything the
structural test below refuses (a reduction over the batch, a guard along it, a scatter; and a
first extent of 1, which lowering drops) stays per extent.
"""
import hashlib
from dataclasses import dataclass

from metagraph.compiler import ir
from metagraph.expr import Binary, Const, Var, extras_used, linear_terms, variables

OUTER = "n_outer"        # the name a C-family kernel reads its run-time extent into


class RuntimeExtent(int):
    """An extent (or a last index) known only at run time: its value the one lowering saw (what
    arithmetic on it gives), written `text`, an expression of the launch's argument OUTER (the
    output's first extent), wherever a kernel is described or rendered."""

    def __new__(cls, value, text=OUTER):
        extent = super().__new__(cls, value)
        extent.text = text
        return extent

    def __repr__(self):
        return self.text


@dataclass(frozen=True, slots=True)
class RuntimeConst(Const):
    """A constant of an index expression that is an expression of the run-time extent: its value
    a RuntimeExtent. Never equal to a Const (so that a rewrite putting it in place of one is seen
    to change the expression); code generators render it as they render a Const."""


def generic_form(kernel, kind, shape):
    """The kernel with its output's first extent E taken at run time, or None where the structure
    does not allow it: one loop over variable 0 (the output's first dimension, whole or in groups
    of r rows that a register tile jams), anywhere in the nest; variable 0 read only in loads and
    stores of parameters whose first dimension is E, at v * r times that dimension's stride, or at
    min(v * r, E - r) times it (a group's first row clamped, blocks.jam); no condition, guard,
    local array index or index tensor read, in the whole kernel. The loop then runs over E / r
    groups, rounded up, each group's first row clamped to E - r, both of E given at run time (also
    where r divides E: one form for both). It is named by `kind`, its shape with N first and a
    digest of its form (`kernel`'s own name is not read: lowering names only what has no form)."""
    if not shape or shape[0] < 1:
        return None
    extent = shape[0]
    loops = [s for s in ir.statements(kernel.body) if isinstance(s, ir.Loop) and s.var == 0]
    if len(loops) != 1 or loops[0].kind == ir.REDUCE:
        return None
    groups, rows, indexed = loops[0].extent, None, set()
    for s in ir.statements(kernel.body):
        if isinstance(s, ir.Loop):
            continue
        if _reads_along(s):
            return None
        for param, expr in _addresses(s):
            if expr is None or 0 not in variables(expr):
                continue
            shape_of = None if param is None else kernel.params[param].shape
            if not shape_of or shape_of[0] != extent:
                return None
            terms, _ = linear_terms(expr)
            (term, scale), *others = [(t, c) for t, c in terms.items() if 0 in variables(t)]
            stride = _stride(shape_of)
            found = scale // stride if term == Var(0) and scale % stride == 0 else \
                _group_rows(term, extent) if scale == stride else None
            if others or not found or rows not in (None, found):
                return None
            rows = found
            indexed.add(param)
    if rows is None or -(-extent // rows) != groups:
        return None
    text = OUTER if rows == 1 else f"(({OUTER} + {rows - 1}) / {rows})"
    runtime = RuntimeExtent(groups, text)
    first = Binary("min", Var(0) * rows, RuntimeConst(RuntimeExtent(extent - rows, f"({OUTER} - {rows})")))
    params = [ir.Param(p.name, p.dtype, (RuntimeExtent(extent),) + tuple(p.shape[1:]), p.output,
                       p.shared) if k in indexed else p for k, p in enumerate(kernel.params)]
    body = _with_extent(kernel.body, runtime, lambda expr: _grouped(expr, rows, first))
    digest = hashlib.sha1(ir.describe((body, params)).encode()).hexdigest()[:8]
    name = f"{kind}_{'x'.join(['N', *map(str, shape[1:])])}_{digest}"
    return ir.Kernel(name, params, body, {**kernel.extents, 0: runtime})


def _group_rows(term, extent):
    """r where an address term is the first row of a group of r clamped, min(v * r, extent - r)
    (blocks.jam, r not dividing the extent); else None."""
    if not (isinstance(term, Binary) and term.op == "min" and isinstance(term.b, Const)):
        return None
    terms, const = linear_terms(term.a)
    rows = terms.get(Var(0))
    return rows if rows and len(terms) == 1 and not const and term.b == Const(extent - rows) else None


def runtime_loop(loop):
    """The loop of a run-time extent in a loop nest (itself or inside it), or None."""
    return next((s for s in ir.statements([loop])
                 if isinstance(s, ir.Loop) and isinstance(s.extent, RuntimeExtent)), None)


def _with_extent(body, runtime, rewrite):
    """`body` with the loop over variable 0 running to `runtime`, `rewrite` applied to its
    statements' index expressions."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop):
            s = ir.Loop(s.var, runtime if s.var == 0 else s.extent, s.kind, _with_extent(s.body, runtime, rewrite))
        else:
            s = ir.rewritten_statement(s, rewrite)
        out.append(s)
    return out


def _grouped(expr, rows, first):
    """An index expression reading variable 0 (as generic_form found it: v * r * stride, or a
    group's first row clamped times the stride) with the group's first row `first` instead, clamped
    to a last group's first row given at run time, and its terms in one order: a kernel whose rows
    divide the extent and one whose rows do not have one generic form. Others unchanged."""
    if rows == 1 or 0 not in variables(expr):
        return expr
    terms, const = linear_terms(expr)
    scaled = {}
    for term, scale in terms.items():
        if term == Var(0):
            term, scale = first, scale // rows
        elif 0 in variables(term):
            term = first
        scaled[term] = scale
    result = Const(const)
    for term in sorted(scaled, key=repr):
        result = result + term * scaled[term]
    return result


def _stride(shape):
    stride = 1
    for size in shape[1:]:
        stride *= size
    return stride if shape else None


def _addresses(s):
    """(parameter, index expression) of every load and store of a statement; (None, expr) for every
    other index (a local array's, an index value's, a condition)."""
    found = []
    if isinstance(s, ir.Store):
        found.append((s.param, s.index))
    elif isinstance(s, ir.ScatterAccumulate):
        found.append((None, s.index))
    elif isinstance(s, (ir.Accumulate, ir.Assign)) and s.index is not None:
        found.append((None, s.index))
    for v in ir.values(getattr(s, "value", None)):
        if isinstance(v, ir.Load):
            found.append((v.param, v.index))
        elif isinstance(v, ir.IndexValue):
            found.append((None, v.expr))
        elif isinstance(v, ir.Ref) and v.index is not None:
            found.append((None, v.index))
    return found


def _reads_along(s):
    """Whether a statement reads under a condition, or an index tensor, anywhere (the C family
    clamps a guarded strided load to its buffer's size, which would be the extent's)."""
    for v in ir.values(getattr(s, "value", None)):
        if isinstance(v, ir.Guard):
            return True
        if isinstance(v, ir.Load) and (v.valid is not None or extras_used(v.index)):
            return True
    return isinstance(s, ir.ScatterAccumulate)
