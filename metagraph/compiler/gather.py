"""Lowering a `reindex_reduce`: a gather where its map solves for the source, else a scatter.

A scatter-add whose every output index is a sum of source variables, with coefficient +-1 on the
longest of them, is the same sum as a reduction over each output element's sources: a stride-1
convolution's input gradient is then a convolution, blocked like one (kernels `g_`). Any other
`reindex_reduce` is a scatter (kernels `s_`): a clearing loop, then a loop over its source.
Both run inside a `lower._Lowering` (`lowering`), whose values, parameters and loop nest they use.
"""
import math

from metagraph import dtypes
from metagraph.compiler import decompose, ir
from metagraph.compiler.access import Replace
from metagraph.compiler.simplify import simplify, value_range
from metagraph.errors import IndexOutOfRange
from metagraph.expr import Const, Var, linear_terms
from metagraph.ops.window_gradient import GATHER_WASTE_MAX


def gathered(lowering, node, out):
    """A scatter-add whose map can be solved for its source: the same sum as a reduction over
    each output element's sources (a stride-1 convolution's input gradient is then a
    convolution, register-blocked like the forward one). None when the map does not solve:
    every output index must be a sum of source variables with a coefficient +-1 on the
    longest one, which no other index uses; gathers from index tensors and checked maps stay
    scatters. The reduction runs over the source variables the output does not determine."""
    x = node.inputs[0]
    if node.attrs["op"] != "add" or node.attrs["checked"] or len(node.inputs) > 1 or not x.ndim:
        return None
    solved, used = {}, set()
    for t, expr in enumerate(node.attrs["index_map"]):
        terms, const = linear_terms(expr)
        if any(not isinstance(term, Var) for term in terms):
            return None
        coefficients = {term.axis: c for term, c in terms.items()}
        if used & coefficients.keys() or (not coefficients and node.shape[t] != 1):
            return None
        used |= coefficients.keys()
        if not coefficients:
            continue
        pick = _solved_variable(coefficients, x.shape)
        if pick is None:
            return None
        solved[pick] = (t, coefficients, const)
    free = [v for v in range(x.ndim) if v not in solved]
    renamed = Replace({v: Var(node.ndim + j) for j, v in enumerate(free)})
    lowering.extents = {d: size for d, size in enumerate(node.shape)}
    lowering.extents.update({node.ndim + j: x.shape[v] for j, v in enumerate(free)})
    source = []
    for v in range(x.ndim):
        if v not in solved:
            source.append(renamed[v])
            continue
        t, coefficients, const = solved[v]
        rest = Const(const)
        for u, c in coefficients.items():
            if u != v:
                rest = rest + renamed[u] * c
        source.append(simplify((Var(t) - rest) * coefficients[v], lowering.extents))
    valid = lowering.inside(tuple(source), x.shape)
    value = lowering.value(x, tuple(source), valid)
    if valid is not None:       # no contribution where no source maps here
        value = ir.Guard(valid, unguarded_reads(lowering, value), 0)
    loops = [(node.ndim + j, x.shape[v]) for j, v in enumerate(free)]
    result = lowering.accumulate(node.dtype, 0, "add", loops, value)
    outer = tuple(Var(d) for d in range(node.ndim))
    return lowering.loop_nest(node, ir.Store(out, lowering.flat(node.shape, outer), result))


def _solved_variable(coefficients, shape):
    """The source variable an output index is solved for: the longest one if its coefficient is
    +-1. Else (a strided conv's input gradient, y = 2*oy + ky - 1) the longest with coefficient
    +-1, if the others are short enough: the gather then runs over every oy and adds where ky
    is in range, about kh/stride of them per y; more than GATHER_WASTE_MAX times that many steps,
    and the scatter, which wastes none, is kept."""
    longest = max(coefficients, key=lambda v: shape[v])
    if abs(coefficients[longest]) == 1:
        return longest
    units = [v for v in coefficients if abs(coefficients[v]) == 1]
    if not units:
        return None
    pick = max(units, key=lambda v: shape[v])
    steps = math.prod(shape[v] for v in coefficients if v != pick)
    adding = math.prod(max(1.0, shape[pick] / abs(c)) for v, c in coefficients.items() if v != pick)
    return pick if steps <= GATHER_WASTE_MAX * adding else None


def unguarded_reads(lowering, value):
    """The value with the validity test dropped from loads that cannot leave their tensor (a
    conv weight read for an input gradient). Only under a guard that zeroes what the test
    excluded: an address inside the tensor can still be outside a dimension."""
    def walk(v):
        if isinstance(v, ir.Load) and v.valid is not None:
            low, high = value_range(v.index, lowering.extents)
            inside = 0 <= low and high < math.prod(lowering.params[v.param][1].shape)
            return ir.Load(v.param, v.index, v.dtype) if inside else v
        if isinstance(v, ir.Apply):
            return ir.Apply(v.op, tuple(walk(a) for a in v.args), v.dtype, v.site)
        if isinstance(v, ir.Guard):
            return ir.Guard(v.cond, walk(v.value), v.fill, v.valid, v.check)
        return v
    return walk(value)


def scatter(lowering, node, out):
    x = node.inputs[0]
    init = 0 if node.attrs["op"] == "add" else dtypes.min_value(node.dtype)
    outer = tuple(Var(d) for d in range(node.ndim))
    for d, size in enumerate(node.shape):
        lowering.extents[d] = size
    clear = [ir.Store(out, lowering.flat(node.shape, outer), ir.Scalar(init, node.dtype))]
    for d in reversed(range(node.ndim)):
        clear = [ir.Loop(d, node.shape[d], ir.PARALLEL if d == 0 else ir.SERIAL, clear)]
    lowering.extents = {d: size for d, size in enumerate(x.shape)}
    source = tuple(Var(d) for d in range(x.ndim))
    target = tuple(simplify(lowering.extras(node, e), lowering.extents) for e in node.attrs["index_map"])
    inside = lowering.inside(target, node.shape)
    check = lowering.site(IndexOutOfRange, f"index out of bounds for shape {node.shape}", node) \
        if node.attrs["checked"] else None
    # a float16 or bfloat16 output adds a float32 value and rounds per addition (decompose.widen)
    body = [ir.ScatterAccumulate(out, lowering.flat(node.shape, target), node.attrs["op"],
                                 decompose.widen(lowering.value(x, source, None)), inside, check)]
    # Parallel only over a source variable that alone picks an output row: no two threads
    # then write the same element. Otherwise serial: a race would corrupt gradients silently.
    injective = {e.axis for e in target[:1] if isinstance(e, Var)}
    for d in reversed(range(x.ndim)):
        kind = ir.PARALLEL if d == 0 and d in injective else ir.SERIAL
        body = [ir.Loop(d, x.shape[d], kind, body)]
    return clear + body
