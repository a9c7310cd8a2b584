"""The gradient of a window's view as a gather over zero-bordered operands, not a scatter.

A view that reads its input through overlapping windows (a convolution's `x[n, c, i + u, j + v]`
over the loop (n, k, i, j, c, u, v)) sends its gradient back by a scatter-add: every loop point
adds its value at the input position it read. When that gradient is a product of two views (a
convolution's: the output gradient times the weights) and each input dimension is read at a
unit-stride loop variable of its own (the output row `i`, the widest of `i + u`), the same sums
are a gather: for each input position and each value of the other loop variables, the one
point that read it is `i = row - u`, and the product is read there. Where `i` falls outside its
range, the factor that reads `i` plainly reads outside its operand, so the operand is read through
a zero-bordered view, which fusion materialises as a copy; the gather is then a reduction of a
product of views, as the forward convolution is, with no bounds test per element (a 3x3 conv's
input gradient over (8, 64, 56, 56): 34 ms as a guarded gather, 17 as this, one thread). Products
of a zero border with an infinite weight give NaN there, as PyTorch's convolution backward does.

A strided window, whose row is `s * i + u + c`, is first split into the stride's phases (`_phased`):
the input row T = s * T' + p, and phase p sums only the taps u = s * w + p - c % s (mod s) that
reach it, so that T' = i + w + c // s reads i at unit stride and the gather above applies; one sum
per phase, each placed at its phase and read back at the input's positions by a view (a 3x3
stride-2 conv's input gradient over (32, 64, 32, 32): 324 ms as a scatter, 14 as one sum over
every phase with the taps past the window read as zeros, 16 products for 9; ResNet-18's three at
224^2, 45.7 ms that way and 19.5 as a sum per phase). Rows too short for phases that the gather
cannot solve, and dilated strided windows (whose tap is read at 2 * u), sum the output channels
first and scatter the taps after (`_summed_first`). Anything else (a map that is not a sum of loop
variables; a factor that is not a plain view) keeps the scatter, which lowering turns into a gather
of its own (compiler/gather.py).
"""
import itertools
import weakref
from collections import Counter

from metagraph.expr import Const, Var, linear_terms
from metagraph.ops.node import Node, signature

RECIPE_CACHE_SIZE = 4096
# A strided window's short rows are not phased: they are gathered where the taps outnumber the rows,
# else summed over the channels first and scattered (`_summed_first`; lowering makes the scatter a
# gather, which runs every output row for the ~k / s taps that add, at most this many times as
# many: compiler/gather.py). Phased, ResNet-18's 8x8, 4x4 and 2x2 planes ran 5.2 ms a step where a
# gather with the channels inside ran 4.1, phased rows too short to vectorise (a 1x1 window's input
# gradient over 2x2 planes: 1.3 ms phased, 0.05 scattered). Longer rows are phased.
GATHER_WASTE_MAX = 3
_RECIPES = {}           # the nodes' signatures and the map -> _Recipe, or None where it does not apply
_MADE = weakref.WeakKeyDictionary()     # a window gradient (its sum, or its read-back) -> (g, index_map)


def window_gradient(g, shape, index_map, apply):
    """The scatter-add of `g` (over its shape, the view's loop) into `shape` at `index_map`, as a
    reduction of a product of views (see the module docstring), or None where it does not apply.
    `apply` builds a node (ops/table.py's, which calls this from its reindex rule). The analysis
    and the checks of the nodes it builds are made once per signature (a ResNet-18 backward pass
    calls this 26 times: 0.35 ms a call when analysed every time)."""
    if g.op != "mul" or len(g.inputs) != 2 or any(f.op != "reindex" or len(f.inputs) != 1 for f in g.inputs):
        return None
    key = (signature(g), tuple(shape), tuple(index_map),
           *[(signature(f), f.inputs[0].shape, f.inputs[0].dtype) for f in g.inputs])
    recipe = _RECIPES.get(key, _RECIPES)
    if recipe is _RECIPES:
        if len(_RECIPES) >= RECIPE_CACHE_SIZE:
            _RECIPES.pop(next(iter(_RECIPES)))
        recipe = _RECIPES[key] = _recipe(g, shape, index_map, apply)
    if recipe is None:
        return None
    summed = recipe.build([f.inputs[0] for f in g.inputs])
    _MADE[summed] = (g, tuple(index_map))
    return summed


class _Recipe:
    """The nodes a window gradient builds, as apply built them the first time: each step (op,
    attrs, shape, dtype) with its inputs, by number (the factors' sources first, then the steps'
    nodes in build order); the last step's node is the gradient."""

    def __init__(self, made):
        self.made = made        # [((op, attrs, shape, dtype), input numbers)], in build order

    def build(self, sources):
        """The gradient for these factor sources (the nodes the factors viewed)."""
        values = list(sources)
        for step, inputs in self.made:
            values.append(_node(step, tuple(values[k] for k in inputs)))
        return values[-1]


class _Recorder:
    """`apply` that also records each node it builds as a step of a _Recipe."""

    def __init__(self, apply, sources):
        self.apply, self.made = apply, []
        self.number = {id(source): k for k, source in enumerate(sources)}

    def __call__(self, name, *inputs, **attrs):
        node = self.apply(name, *inputs, **attrs)
        self.made.append((_step(node), tuple(self.number[id(value)] for value in inputs)))
        self.number[id(node)] = len(self.number)
        return node


def _node(step, inputs):
    op, attrs, shape, dtype = step
    return Node(op, inputs, dict(attrs), shape, dtype)


def _recipe(g, shape, index_map, apply):
    """The _Recipe of window_gradient(g, shape, index_map), or None."""
    if not all(_plain_view(f) for f in g.inputs):
        return None
    loop, scatter = tuple(g.shape), [_linear(expr) for expr in index_map]
    if any(part is None for part in scatter):
        return None
    factors = [(f.inputs[0], [_linear(expr) for expr in f.attrs["index_map"]]) for f in g.inputs]
    record = _Recorder(apply, [source for source, _ in factors])
    phased = _phased(loop, scatter, factors, shape)
    if phased is None:
        summed = _gathered(loop, scatter, factors, tuple(shape), record) or \
            _summed_first(loop, scatter, factors, tuple(shape), record)
        return None if summed is None else _Recipe(record.made)
    phases, target, back = phased
    placed = None
    for part_loop, part_scatter, part_factors, part_target, placement in phases:
        summed = _gathered(part_loop, part_scatter, part_factors, part_target, record)
        if summed is None:
            return None
        view = _view(record, summed, target, placement)
        placed = view if placed is None else record("add", placed, view)
    # read back in a kernel of its own: inlined, the view's fill and divisions made its readers
    # (batch norm's backward sums) guarded and scalar, 10 ms of ResNet-18's 32^2 training step
    record("contiguous", _view(record, placed, shape, back))
    return _Recipe(record.made)


def _gathered(loop, scatter, factors, shape, apply):
    """The sum that gathers the scatter of a product of views (`factors`: (source, linear parts of
    its map) each) over `loop` into `shape` at `scatter` (linear parts), built by `apply`; or
    None."""
    solved = _solved(scatter, loop, shape)
    if solved is None:
        return None
    free = [v for v in range(len(loop)) if v not in solved]
    position = {v: len(shape) + k for k, v in enumerate(free)}      # a free variable's new axis
    old = {v: ({position[v]: 1}, 0) for v in free}
    for v, (t, coef) in solved.items():      # target t = coef * v + sum(c * u) + const
        terms, const = scatter[t]
        expression = {t: coef}
        for u, c in terms.items():
            if u != v:
                expression[position[u]] = expression.get(position[u], 0) - c * coef
        old[v] = (expression, -const * coef)
    new_loop = tuple(shape) + tuple(loop[v] for v in free)
    # a solved variable that may leave its range must be read plainly by a factor, which then
    # reads outside its operand there (through a zero border)
    leaving = [v for v in solved if not 0 <= _range(old[v], new_loop)[0] <= _range(old[v], new_loop)[1] < loop[v]]
    if not all(any(_reads_plainly(source, parts, v, loop[v]) for source, parts in factors) for v in leaving):
        return None
    views = [_bordered_view(apply, source, new_loop, [_composed(part, old) for part in parts])
             for source, parts in factors]
    product = apply("mul", *views)
    return apply("reduce", product, op="add", axes=tuple(range(len(shape), len(new_loop))), keepdim=False)


def _summed_first(loop, scatter, factors, shape, apply):
    """The scatter the gather above cannot solve (a strided window's short rows, a dilated strided
    window), the loop variables no target dimension reads (a convolution's output channels) summed
    first: a contraction with no tap wasted, then a scatter of k / s taps per input row, which
    lowering makes a gather (compiler/gather.py). Summed inside the scatter, each input element
    ran every output row and channel for the taps that add (ResNet-18's 3x3 stride-2 input
    gradient over 8x8 planes: 2.1 ms a step, bs 32); summed first, (n, c, taps, oh, ow) is written
    once and read back k^2 / s^2 times. The sum is laid out as a convolution's output, the output
    rows last (each window dimension's variable read at the stride), so that it is scheduled as
    one: the plane along the vector. None where every loop variable is read by the target."""
    read = {v for terms, _ in scatter for v in terms if loop[v] > 1}     # (a 1-wide one is 0)
    free = [v for v in range(len(loop)) if v not in read]
    if not any(loop[v] > 1 for v in free):
        return None
    rows = set()        # each window dimension's row: its variable of the largest coefficient (the
    for terms, _ in scatter:        # stride), the widest of those
        kept = [v for v in terms if v in read]
        if len(kept) > 1:
            rows.add(max(kept, key=lambda v: (abs(terms[v]), loop[v])))
    order = sorted(read, key=lambda v: (v in rows, v)) + free
    at = {v: k for k, v in enumerate(order)}
    old = {v: ({at[v]: 1}, 0) for v in range(len(loop))}
    ordered = [loop[v] for v in order]
    views = [_view(apply, source, ordered, [_expression(_composed(part, old)) for part in parts])
             for source, parts in factors]
    summed = apply("reduce", apply("mul", *views), op="add", axes=tuple(range(len(read), len(loop))),
                   keepdim=False)
    index_map = tuple(_expression(({at[v]: c for v, c in terms.items() if v in read}, const))
                      for terms, const in scatter)
    return apply("reindex_reduce", summed, op="add", shape=shape, index_map=index_map, checked=False)


def _phased(loop, scatter, factors, shape):
    """The scatter with each target dimension that a loop variable reads at a stride s > 1 (a
    strided window's row, s * i + u + c) split into phases: T = s * T' + p. In phase p the window's
    taps are those with u = s * w + b_p, b_p = p - c % s modulo s, so that T' = i + w + const reads
    i at unit stride and every tap is one of the window's: one sum per phase (per combination of
    phases of the split dimensions), each summing exactly its taps, placed at its phase in a target
    (..., phases, ..., T', ...) and read back at the input's positions. A row with no tap (a strided
    1x1 window) has the one phase c % s, the others zero. (the phases as (loop, scatter, factors,
    target shape, the map placing the phase's sum in the target) each, the target's shape, the map
    that reads the target back), or None where no dimension is strided, a strided one is not of
    that form, or every strided row is short (GATHER_WASTE_MAX)."""
    occurs = Counter(v for terms, _ in scatter for v in terms)
    split = {}                                     # target dimension -> (stride, row, tap or None)
    for t, (terms, const) in enumerate(scatter):
        if not terms:
            continue
        row = max(terms, key=lambda v: loop[v])
        stride, taps = terms[row], [v for v in terms if v != row and loop[v] > 1]     # (a 1-wide tap is 0)
        if stride in (1, -1):
            continue
        if stride < 0 or occurs[row] != 1 or len(taps) > 1 or taps and (
                terms[taps[0]] != 1 or occurs[taps[0]] != 1 or
                not any(_reads_plainly(source, parts, taps[0], loop[taps[0]]) for source, parts in factors)):
            return None
        split[t] = (stride, row, taps[0] if taps else None)
    if all(loop[row] <= GATHER_WASTE_MAX * max(1.0, (1 if tap is None else loop[tap]) / stride)
           for stride, row, tap in split.values()):
        return None
    first = min(split)
    phase_at = {t: first + k for k, t in enumerate(split)}
    target = list(shape[:first]) + [stride if tap is not None else 1 for stride, _, tap in split.values()]
    back = [Var(t) for t in range(first)] + [None] * len(split)
    for t in range(first, len(shape)):
        if t not in split:
            target.append(shape[t])
            back.append(Var(t))
            continue
        stride, _, tap = split[t]
        target.append(-(-shape[t] // stride))
        back.append(Var(t) // stride)
        back[phase_at[t]] = Var(t) % stride - (scatter[t][1] % stride if tap is None else 0)
    part_target = tuple(target[:first] + target[first + len(split):])
    tapped = [t for t, (_, _, tap) in split.items() if tap is not None]
    phases = []
    for chosen in itertools.product(*[range(split[t][0]) for t in tapped]):
        part_loop, old, part_scatter = list(loop), {}, list(scatter)
        placement = [Var(d) for d in range(first)]
        for t in range(first, len(shape)):
            at = len(split) + t                   # T' (or the dimension) in the target
            placement.append(Var(at))
            if t not in split:
                continue
            stride, row, tap = split[t]
            terms, const = scatter[t]
            if tap is None:
                part_scatter[t] = ({row: 1}, const // stride)
                continue
            p = chosen[tapped.index(t)]
            low = -((p - const % stride) // stride)           # the phase's first w: 0 or 1
            base = stride * low + p - const % stride            # its tap, u = stride * w + base
            part_loop[tap] = max(0, (loop[tap] - 1 - base) // stride + 1)
            old[tap] = ({tap: stride}, base)
            part_scatter[t] = ({row: 1, tap: 1}, low + const // stride)
            placement[-1] = Var(at) + (Var(phase_at[t]) - p) * target[at]    # outside it in other phases
        if 0 in part_loop:
            continue                              # a phase no tap reaches adds nothing
        old.update((v, ({v: 1}, 0)) for v in range(len(loop)) if v not in old)
        part_factors = [(source, [_composed(part, old) for part in parts]) for source, parts in factors]
        phases.append((tuple(part_loop), part_scatter, part_factors, part_target, placement))
    return phases, tuple(target), back


def _step(node):
    return node.op, node.attrs, node.shape, node.dtype


def shifted_window_gradient(g, shape, shifts, apply):
    """A window gradient `g` read back at a shifted sub-box (a padded view's gradient: `shifts`
    per dimension) as the window gradient summed straight into the sub-box, so that a padded
    conv's input gradient is summed over the input's plane, not its padded copy's; a cast of one
    as the cast of the shifted one. None unless g is one (made by window_gradient)."""
    if g.op == "cast":
        inner = shifted_window_gradient(g.inputs[0], shape, shifts, apply)
        return None if inner is None else apply("cast", inner, dtype=g.dtype)
    made = _MADE.get(g)
    if made is None:
        return None
    product, index_map = made
    return window_gradient(product, shape, [e - c if c else e for e, c in zip(index_map, shifts)], apply)


def _plain_view(node):
    return node.op == "reindex" and len(node.inputs) == 1 and not node.attrs["checked"] and \
        node.attrs["fill"] == 0 and all(_linear(e) is not None for e in node.attrs["index_map"])


def _linear(expr):
    """({loop variable: coefficient}, constant) of a sum of scaled loop variables, else None."""
    terms, const = linear_terms(expr)
    if not isinstance(const, int) or any(not isinstance(term, Var) for term in terms):
        return None
    return {term.axis: coef for term, coef in terms.items()}, const


def _solved(scatter, loop, shape):
    """For each target dimension, the loop variable it is solved for: {variable: (dimension,
    coefficient +-1)}, the widest variable of the dimension, read there only, at unit stride; None
    where a dimension has none (a stride: the widest reads 2 * i) other than a size-1 one at 0."""
    occurs = Counter(v for terms, _ in scatter for v in terms)
    solved = {}
    for t, (terms, const) in enumerate(scatter):
        if not terms:
            if shape[t] != 1 or const != 0:
                return None
            continue
        widest = max(terms, key=lambda v: loop[v])
        if abs(terms[widest]) != 1 or occurs[widest] != 1:
            return None
        solved[widest] = (t, terms[widest])
    return solved


def _composed(part, old):
    """A linear map's part with each old loop variable replaced by its linear expression in the
    new loop's variables (`old`: variable -> (terms, constant))."""
    terms, const = part
    out = {}
    for v, coef in terms.items():
        inner, inner_const = old[v]
        for u, c in inner.items():
            out[u] = out.get(u, 0) + coef * c
        const += coef * inner_const
    return {u: c for u, c in out.items() if c}, const


def _reads_plainly(source, parts, v, extent):
    """Whether a factor reading `source` at linear `parts` reads loop variable v as a whole
    dimension of it (so that it reads outside the operand exactly where v leaves its range)."""
    return any(part == ({v: 1}, 0) and source.shape[d] == extent for d, part in enumerate(parts))


def _bordered_view(apply, source, loop, parts):
    """The view over `loop` reading each dimension of `source` at its linear part, through a
    zero-bordered view of it just wide enough where some read falls outside it."""
    ranges = [_range(part, loop) for part in parts]
    low = [min(lo, 0) for lo, _ in ranges]
    high = [max(hi, size - 1) for (_, hi), size in zip(ranges, source.shape)]
    if any(low) or any(h >= size for h, size in zip(high, source.shape)):
        bordered = tuple(h - lo + 1 for lo, h in zip(low, high))
        source = _view(apply, source, bordered,
                                [Var(d) + lo if lo else Var(d) for d, lo in enumerate(low)])
        parts = [(terms, const - lo) for (terms, const), lo in zip(parts, low)]
    return _view(apply, source, loop, [_expression(part) for part in parts])


def _view(apply, source, shape, index_map):
    return apply("reindex", source, shape=tuple(shape), index_map=tuple(index_map), fill=0, checked=False)


def _range(part, loop):
    terms, const = part
    low = const + sum(c * (loop[v] - 1) for v, c in terms.items() if c < 0)
    high = const + sum(c * (loop[v] - 1) for v, c in terms.items() if c > 0)
    return low, high


def _expression(part):
    terms, const = part
    expr = None
    for v, coef in sorted(terms.items()):
        term = Var(v) if coef == 1 else Var(v) * coef
        expr = term if expr is None else expr + term
    if expr is None:
        return Const(const)
    return expr + const if const else expr
