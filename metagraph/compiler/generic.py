"""Kernels whose outermost extent is a run-time argument: a new batch size compiles nothing.

A training or inference loop over batches of another size builds the same graph with another
leading extent, and lowering gives the same kernels but for that extent. A kernel whose loop over its
output's first dimension runs over all of it, and which reads that loop's variable only as the
first dimension of tensors of that extent (i0 * stride0 + ..., or as the rows of a register tile's
group, the group's first row clamped to the last group's), computes the same way for any extent of
them: it can take the extent at run time (`RuntimeExtent`: the loop's bound and the clamp,
expressions of the extent read from the launch's arguments) and its source, and so its compiled
binary, serves every extent.

A kernel that carries the data's batch (`batched`) is scheduled for NOMINAL rows whatever its
extent (lower.py: the tensors with the batch's first extent are seen with NOMINAL rows, and so are
the heuristic's choices and what fusion inlines), and made generic (`generic_form`), which checks
that it is right for every extent: the tensors taken to have NOMINAL rows are exactly those it
reads along the first dimension, each at its own row of a group. Where its rows come in groups,
a second body scheduled for FEW rows with the first dimension whole serves extents below a
group's (`with_fallback`). So one kernel serves every batch size below MANY, from the first on,
a batch of one too (its loop kept). The form names it: a later extent whose lowering gives the
same form reuses it, in this process or another (the kernel cache keys by source). A kernel the
test refuses (a reduction over the batch, a guard or shifted read along it, a scatter), one with
MANY rows or more, and one whose first extent is not the batch's are lowered for their extent,
made generic where the test allows, and stay per form (the heuristic keeps its choices along the
first dimension the same over wide ranges of extent, access.jam_rows).
"""
import hashlib
from dataclasses import dataclass

from metagraph.compiler import ir
from metagraph.compiler.simplify import value_range
from metagraph.expr import Binary, Const, Var, extras_used, linear_terms, variables

OUTER = "n_outer"        # the name a C-family kernel reads its run-time extent into
NOMINAL = 64             # the first extent a kernel that may take it at run time is scheduled for
FEW = 4                  # ... and its fallback, for fewer rows than the kernel's groups (with_fallback)
MANY = 256               # ... where it has fewer rows than this: more are scheduled for their count


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


def batched(graph):
    """The positions of the nodes that carry the data's batch: computed from the data a graph reads
    (its realised values of two or more dimensions that are not parameters: a batch of images or
    tokens, an activation computed before), with a first extent of the data's. A parameter's
    gradient, or a per-channel statistic of shape (1, C, 1, 1), is not one, even where its first
    extent is (a batch of one)."""
    carries, extents, position = [False] * len(graph.nodes), set(), graph.position
    for k, node in enumerate(graph.nodes):
        if node.buffer is not None and node.op != "const":
            carries[k] = node.ndim >= 2 and not (node.leaf and node.requires_grad)
            if carries[k]:
                extents.add(node.shape[0])
        else:
            carries[k] = any(carries[position[source.id]] for source in node.inputs)
    return frozenset(k for k, node in enumerate(graph.nodes)
                     if carries[k] and node.ndim and node.shape[0] in extents)


def nominal_applies(node):
    """Whether a kernel computing `node`, one that carries the batch (`batched`), is scheduled for
    NOMINAL rows (lower.py): an element-wise or reducing kernel (not a scatter's) whose first extent
    is below MANY (more rows are scheduled for their count: a 1024^3 matmul ran 418 GFLOP/s on two
    cores scheduled for its rows, 301 for 64). Other first extents do not change from call to call
    and are scheduled for their count too (256x256x3x3 weight gradients, 446 us a call; 653 for 64)."""
    return 0 < node.ndim and 0 < node.numel and node.shape[0] < MANY and node.op != "reindex_reduce"


def generic_form(kernel, kind, shape, nominal=None):
    """The kernel with its output's first extent E taken at run time, or None where the structure
    does not allow it: one loop over variable 0 (the output's first dimension, whole or in groups
    of r rows that a register tile jams), anywhere in the nest; variable 0 read only in loads and
    stores of parameters whose first dimension is E, at v * r times that dimension's stride, or at
    min(v * r, E - r) times it (a group's first row clamped, blocks.jam); no condition, guard,
    local array index or index tensor read, in the whole kernel. The loop then runs over E / r
    groups, rounded up, each group's first row clamped to E - r, both of E given at run time (also
    where r divides E: one form for both). It is named by `kind`, its shape with N first and a
    digest of its form (`kernel`'s own name is not read: lowering names only what has no form).

    `nominal`: (rows, parameters) for a kernel scheduled for NOMINAL (or FEW) rows, whatever its
    output's first extent, and the parameters (by number) it took to have as many (lower.py); the
    form is then taken only where those are exactly the parameters read along variable 0, each read
    only at rows of the group variable 0 gives (its other terms stay inside the group's rows), so
    that it is right for any extent from the group's rows on. Returns (the form, those rows) or
    None."""
    if not shape or shape[0] < 1:
        return None
    extent, nominal = (shape[0], None) if nominal is None else nominal
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
            if not shape_of or shape_of[0] != extent or nominal is not None and param not in nominal:
                return None
            terms, const = linear_terms(expr)
            (term, scale), *others = [(t, c) for t, c in terms.items() if 0 in variables(t)]
            stride = _stride(shape_of)
            found = scale // stride if term == Var(0) and scale % stride == 0 and scale > 0 else \
                _group_rows(term, extent) if scale == stride else None
            if others or not found or rows not in (None, found):
                return None
            if nominal is not None and not _inside_rows(terms, const, term, found * stride, stride, kernel.extents):
                return None
            rows = found
            indexed.add(param)
    if rows is None or -(-extent // rows) != groups or nominal is not None and misread(kernel, nominal):
        return None
    text = OUTER if rows == 1 else f"(({OUTER} + {rows - 1}) / {rows})"
    runtime = RuntimeExtent(groups, text)
    first = Binary("min", Var(0) * rows, RuntimeConst(RuntimeExtent(extent - rows, f"({OUTER} - {rows})")))
    params = [ir.Param(p.name, p.dtype, (RuntimeExtent(extent),) + tuple(p.shape[1:]), p.output,
                       p.shared) if k in indexed else p for k, p in enumerate(kernel.params)]
    body = _with_extent(kernel.body, runtime, lambda expr: _grouped(expr, rows, first))
    digest = hashlib.sha1(ir.describe((body, params)).encode()).hexdigest()[:8]
    name = f"{kind}_{'x'.join(['N', *map(str, shape[1:])])}_{digest}"
    return ir.Kernel(name, params, body, {**kernel.extents, 0: runtime}), rows


def _inside_rows(terms, const, first, span, stride, extents):
    """Whether an address's terms other than its first row's (`first`) and its constant stay in
    [0, span) (span: the group's rows times the row's `stride`), or past its end by less than a
    row: a vector loop rounded up to whole vectors reads lanes past a row that it never stores
    (heuristic.whole_vectors; kept inside what the buffer may be read to past its last row, for
    NOMINAL rows as for any), where a value read from a row past the group's would be read under
    a guard (refused above), the lowering having seen NOMINAL rows."""
    low = high = const
    for term, coef in terms.items():
        if term != first:
            reach = [coef * bound for bound in value_range(term, extents)]
            low, high = low + min(reach), high + max(reach)
    return 0 <= low and high < span + stride


def misread(kernel, nominal):
    """The parameters of `nominal` that some load or store reads without variable 0."""
    return {param for s in ir.statements(kernel.body) if not isinstance(s, ir.Loop)
            for param, expr in _addresses(s)
            if param in nominal and (expr is None or 0 not in variables(expr))}


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
    clamps a guarded strided load to its buffer's size, which would be the extent's), or tests
    the first dimension's variable (a guard that gives a constant where a test of the other
    variables fails, a window's padding, holds for every extent)."""
    for v in ir.values(getattr(s, "value", None)):
        if isinstance(v, ir.Guard) and (0 in variables(v.cond) or extras_used(v.cond) or
                                        any(isinstance(u, ir.Load) for u in ir.values(v.value))):
            return True
        if isinstance(v, ir.Load) and (v.valid is not None or extras_used(v.index)):
            return True
    return isinstance(s, ir.ScatterAccumulate)


def same_params(a, b):
    """Whether two generic forms take the same parameters (a run-time first extent matching one,
    whatever rows each was scheduled for)."""
    def key(p):
        runtime = bool(p.shape) and isinstance(p.shape[0], RuntimeExtent)
        return p.name, p.dtype, p.output, p.shared, runtime, tuple(p.shape[runtime:])
    return [key(p) for p in a.params] == [key(p) for p in b.params]


def with_fallback(kernel, fallback, least):
    """One kernel of two generic forms of the same parameters: `kernel`'s, which serves first extents
    from `least` on (its groups of rows), and `fallback`'s, which serves every one (scheduled with
    the first dimension whole) and runs below `least`. A kernel scheduled for NOMINAL rows then
    serves every batch size, however few rows it has."""
    digest = hashlib.sha1(ir.describe((kernel.body, fallback.body, least, kernel.params)).encode()).hexdigest()[:8]
    name = kernel.name.rsplit("_", 1)[0] + "_" + digest
    return ir.Kernel(name, kernel.params, kernel.body, kernel.extents, (least, *fallback.body))
