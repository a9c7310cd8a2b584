"""Kernels whose outermost extent is a run-time argument: a new batch size compiles nothing.

A training or inference loop over batches of another size builds the same graph with another
leading extent, and lowering gives the same kernels but for that extent. A kernel whose loop over its
output's first dimension runs over all of it, and which reads that loop's variable only as the
first dimension of tensors of that extent (i0 * stride0 + ...), computes the same way for any
extent of them: it can take the extent at run time (`RuntimeExtent`: the loop's bound, and the
first dimension of those parameters, read from the launch's arguments) and its source, and so its
compiled binary, serves every extent.

Which extents a kernel depends on cannot be read from one lowering (the 64 of a batch and of a
conv's channels look alike), so a kernel goes generic only when its *form* (the kernel with that
extent abstracted) has been lowered at two different extents (`Forms`): everything else in it was
then the same at both, and the first extent of the loop is all that varied. A first batch size
compiles the kernels for itself; the second compiles the generic ones, once; every later size,
in this process or another (the kernel cache keys by source), compiles nothing. Kernels the
heuristic schedules differently at another extent (a batch jammed into register rows once it is
large enough) differ in form and stay per extent; so does anything the structural test below
refuses (a reduction over the batch, a guard along it, a scatter).
"""
import hashlib

from metagraph.compiler import ir
from metagraph.expr import Var, extras_used, linear_terms, variables

FORMS_MAX = 1 << 14      # kernel forms a process remembers the extents of


class RuntimeExtent(int):
    """An extent known only at run time: its value the one lowering saw (what arithmetic on it
    gives), written `N` where a kernel is described or named, and read from the launch's
    arguments where a code generator renders it (`OUTER`)."""

    def __repr__(self):
        return "N"


OUTER = "n_outer"        # the name a C-family kernel reads its run-time extent into


class Forms:
    """The extents each kernel form has been lowered at (a pipeline's, kept across graphs)."""

    def __init__(self):
        self.seen = {}       # generic kernel name -> the extents it was lowered at

    def generic(self, kernel, kind, shape):
        """(kernel, its outer extent) for `kernel` (of output `shape`, named with `kind`): its
        generic form where that form has been lowered at another extent before, else the kernel as
        it is and None."""
        form = generic_form(kernel, kind, shape)
        if form is None:
            return kernel, None
        extent = int(form.extents[0])          # (the loop's: the output's over jammed rows)
        extents = self.seen.get(form.name)
        if extents is None:
            if len(self.seen) >= FORMS_MAX:
                self.seen = {}
            extents = self.seen[form.name] = set()
        extents.add(extent)
        return (form, extent) if len(extents) > 1 else (kernel, None)


def generic_form(kernel, kind, shape):
    """The kernel with its output's first extent taken at run time, or None where the structure
    does not allow it: one loop over variable 0 (the output's first dimension, whole or in blocks
    of r rows that a register tile jams: its extent is the dimension's over r), anywhere in the
    nest; variable 0 read only linearly, in loads and stores of parameters whose first dimension
    has the output's extent, with r times that dimension's stride; no condition, guard, local
    array index or index tensor read, in the whole kernel. The loop runs to the extent over r,
    given at run time."""
    if not shape or shape[0] < 1:
        return None
    extent = shape[0]
    loops = [s for s in _statements(kernel.body) if isinstance(s, ir.Loop) and s.var == 0]
    if len(loops) != 1 or loops[0].kind == ir.REDUCE or extent % loops[0].extent:
        return None
    rows = extent // loops[0].extent
    indexed = set()
    for s in _statements(kernel.body):
        if isinstance(s, ir.Loop):
            continue
        if _reads_along(s):
            return None
        for param, expr in _addresses(s):
            if expr is None or 0 not in variables(expr):
                continue
            if param is None:
                return None
            terms, _ = linear_terms(expr)
            shape_of = kernel.params[param].shape
            if not shape_of or shape_of[0] != extent or terms.get(Var(0)) != rows * _stride(shape_of) or \
                    any(0 in variables(t) for t in terms if t != Var(0)):
                return None
            indexed.add(param)
    runtime = RuntimeExtent(loops[0].extent)
    params = [ir.Param(p.name, p.dtype, (RuntimeExtent(extent),) + tuple(p.shape[1:]), p.output,
                       p.shared) if k in indexed else p for k, p in enumerate(kernel.params)]
    body = _with_extent(kernel.body, runtime)
    digest = hashlib.sha1(ir.describe((body, params)).encode()).hexdigest()[:8]
    name = f"{kind}_{'x'.join(['N', *map(str, shape[1:])])}_{digest}"
    return ir.Kernel(name, params, body, {**kernel.extents, 0: runtime})


def runtime_loop(loop):
    """The loop of a run-time extent in a loop nest (itself or inside it), or None."""
    return next((s for s in _statements([loop])
                 if isinstance(s, ir.Loop) and isinstance(s.extent, RuntimeExtent)), None)


def _with_extent(body, runtime):
    """`body` with the loop over variable 0 running to `runtime`."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop):
            s = ir.Loop(s.var, runtime if s.var == 0 else s.extent, s.kind, _with_extent(s.body, runtime))
        out.append(s)
    return out


def _statements(body):
    for s in body:
        yield s
        if isinstance(s, ir.Loop):
            yield from _statements(s.body)


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
