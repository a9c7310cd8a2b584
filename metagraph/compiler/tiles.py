"""Tile planning for scratchpad targets: a kernel's innermost loops become tile programs over
scratchpad buffers, and the plan says how many lanes a tile holds.

A target whose vector unit works on buffers in an on-chip scratchpad (`bang`) asks for
`Plan(kernel, scalar_ops, fused)` and spells what it says. Every decision is made here:
- a loop runs as tiles when it is innermost and defines no accumulator per iteration: its
  iterations are the lanes of a tile (`LANES` of them in the current one);
- a value varies along the tile when an index expression in it reads the tile's variable. Each
  varying value gets a buffer of one element per lane; the others are scalars, left to the
  target's scalar spelling. A varying op reads a scalar operand as it is where the target has that
  form (`scalar_ops`), else the scalar is spread over a buffer first; `fused(value)` names an op of
  the target's that computes a whole value (relu) as (op, arguments);
- an access whose index is affine in the tile's variable moves by its stride (a contiguous or
  strided copy); any other needs each lane's offset (a gather or scatter);
- a validity condition that is a conjunction of affine comparisons holds on one interval of lanes
  [first, end) (index expressions over the tile's start): a padded read copies only those lanes
  into a zeroed buffer, a guard fills the lanes outside. Other conditions are tested lane by lane,
  and so are accumulator elements and assignments that are not consecutive along the tile;
- scalars move between global memory and the scratchpad through one-element slots (one for each
  scalar load, store, scatter and reduction: their copies may overlap), made in the order the
  target's walk meets them; `lanes` sizes a tile so that every buffer fits.

A tile program is a list of steps per statement of the loop's body, each a `Step(kind, operands)`:

    copy_in        out, param, index, stride, lanes  out = param[index + stride * lane]; lanes: only
                                                     on the interval (first, end), 0 elsewhere
    gather         out, param, offsets               out = param[offsets], 0 where an offset is -1
    offsets        out, index, valid, check          out = index where valid, else -1 (and error check)
    iota           out, expr, dtype                  out = an index expression, per lane
    scalar         value                             a scalar computed (by the target's scalar spelling)
    spread         out, value                        every lane = a scalar
    compute        out, op, args, dtype, scalar, site  out = op(args) (dtype: the arguments';
                                                     scalar: the second argument is a scalar)
    fill_outside   out, inner, fill, lanes           out = inner on the interval lanes, fill elsewhere
    guard_lanes    out, inner, fill, cond, valid, check  out = inner where cond holds (or valid does
                                                     not), else fill (and error check)
    collect        out, name, index                  out = accumulator array name[index], per lane
    reduce         name, op, source, dtype, slot     accumulator name op= the reduction of source
    update         name, index, op, source, dtype    accumulator array name[index + lane] op= source
    update_lanes   name, index, op, source, dtype    name[index] op= source, per lane
    put            name, index, source, dtype        local array name[index + lane] = source
    put_lanes      name, index, source               name[index] = source, per lane
    copy_out       param, index, stride, source, dtype  param[index + stride * lane] = source
    scatter        param, source, offsets, dtype     param[offsets] = source (-1: nothing)
    scatter_update param, op, source, offsets, dtype  param[offsets] op= source, in lane order

Operands are Buffers, Slices, index expressions (`PER_LANE` kinds evaluate theirs at each lane,
the rest at the tile's start), scalars (kernel IR values that do not vary), dtypes and constants.
"""
from collections import namedtuple
from dataclasses import dataclass

from metagraph import dtypes
from metagraph.compiler import ir
from metagraph.compiler.simplify import simplify
from metagraph.errors import MetagraphError
from metagraph.expr import Binary, Const, Select, Var, linear_terms, variables

LANES = Var("lanes")     # the lanes of the current tile: TILE, fewer in the last one
ALIGN = 64               # lanes per tile are a multiple of this (a 128- or 256-byte vector on chip)
PER_LANE = frozenset({"offsets", "iota", "guard_lanes", "collect", "update_lanes", "put_lanes"})

COMMUTATIVE = frozenset({"add", "mul", "max", "min", "and", "or", "xor"})   # a op b == b op a


# a scratchpad buffer: `size` elements of dtype, or one per lane of a tile (size None)
Buffer = namedtuple("Buffer", "name dtype size", defaults=(None,))
# the elements of accumulator array `name` from `index` on, one per lane: used as a buffer
Slice = namedtuple("Slice", "name index")


@dataclass
class Step:
    """One operation of a tile program (see the module's docstring for the kinds)."""
    kind: str
    operands: dict


def stride(expr, var):
    """The coefficient of loop variable `var` when expr = coefficient * var + (terms without var),
    else None."""
    terms, _ = linear_terms(expr)
    coefficient = 0
    for term, coef in terms.items():
        if isinstance(term, Var) and term.axis == var:
            coefficient += coef
        elif var in variables(term):
            return None
    return coefficient


def tileable(loop):
    """Whether a loop's iterations can be the lanes of a tile: no inner loops and no accumulator
    defined per iteration."""
    return not any(isinstance(s, (ir.Loop, ir.Define)) for s in loop.body)


def interval(cond, var, extents):
    """(first, end): the lanes where `cond` holds are [first, end) (none where end <= first), when
    it is a conjunction of affine comparisons in `var`; else None. A comparison is difference(lane)
    = difference(tile start) + coef * lane < 0. `extents`: the loop variables' and LANES'."""
    first, end = Const(0), LANES
    for part in _conjuncts(cond):
        if not isinstance(part, Binary) or part.op not in ("<", "<="):
            return None
        difference = part.a - part.b if part.op == "<" else part.a - part.b - 1
        coef = stride(difference, var)
        if coef is None:
            return None
        if coef > 0:
            end = Binary("min", end, simplify((Const(-1) - difference) // coef + 1, extents))
        elif coef < 0:
            first = Binary("max", first, simplify(difference // -coef + 1, extents))
        else:
            end = Select(simplify(Binary("<", difference, Const(0)), extents), end, Const(0))
    return first, end


def _conjuncts(cond):
    if isinstance(cond, Binary) and cond.op == "&&":
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _loads(value, seen):
    """The loads of a value tree not in `seen`, arguments left to right, each once."""
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, ir.Load):
        return [value]
    inner = [value.value] if isinstance(value, ir.Guard) else getattr(value, "args", ())
    return [load for arg in inner for load in _loads(arg, seen)]


def loops(statements):
    """Every loop in a list of statements, outer ones first."""
    for s in statements:
        if isinstance(s, ir.Loop):
            yield s
            yield from loops(s.body)


class Plan:
    """The tiles of one kernel: a tile program per tiled loop, every scratchpad buffer and slot."""

    def __init__(self, kernel, scalar_ops=frozenset(), fused=None):
        self.kernel, self.scalar_ops, self.fused = kernel, scalar_ops, fused or (lambda value: None)
        self.buffers, self.slots, self.programs, self.accumulators = [], {}, {}, {}
        self.extent = max([1] + [loop.extent for loop in loops(kernel.body) if tileable(loop)])
        self.extents = dict(kernel.extents, **{LANES.axis: self.extent + 1})    # what LANES can be
        for s in kernel.body:
            self._visit(s)

    def program(self, loop):
        """The tile program of a tiled loop (a list of steps per statement); None: not tiled."""
        return self.programs.get(id(loop))

    def slot(self, node, part="value"):
        """The slot of a scalar Load, or of a Store, ScatterAccumulate (part "value" or "offset")
        or reduction outside a tile."""
        return self.slots[id(node), part]

    def lanes(self, capacity):
        """Lanes per tile: every buffer fits `capacity` bytes, no more than the longest tiled loop
        rounded up to ALIGN."""
        fixed = sum(b.dtype.itemsize * b.size for b in self.buffers if b.size is not None)
        per_lane = sum(b.dtype.itemsize for b in self.buffers if b.size is None)
        if fixed + per_lane > capacity:
            raise MetagraphError(f"bang: kernel {self.kernel.name} needs {fixed + per_lane} bytes of NRAM "
                                 f"for a single lane; METAGRAPH_BANG_NRAM is {capacity}")
        lanes = (capacity - fixed) // max(per_lane, 1)
        if lanes >= ALIGN:
            lanes = lanes // ALIGN * ALIGN
        return max(1, min(lanes, -(-self.extent // ALIGN) * ALIGN))

    def new(self, dtype, size=None, stem="nram"):
        """A new buffer of the kernel."""
        self.buffers.append(Buffer(f"{stem}{len(self.buffers)}", dtype, size))
        return self.buffers[-1]

    def reserve(self, node, dtype, part="value"):
        """The slot of `node` (see `slot`), made on first use."""
        if (id(node), part) not in self.slots:
            self.slots[id(node), part] = self.new(dtype, 1, "slot")
        return self.slots[id(node), part]

    def scalar_loads(self, value):
        """Slots for the loads in a scalar value, in the order a walk evaluates them."""
        for load in _loads(value, set()):
            self.reserve(load, self.kernel.params[load.param].dtype)

    def _visit(self, s):
        if isinstance(s, ir.Loop) and tileable(s):
            self.programs[id(s)] = [_Tile(self, s.var).lower(inner) for inner in s.body]
        elif isinstance(s, ir.Loop):
            for inner in s.body:
                self._visit(inner)
        elif isinstance(s, ir.Define):
            self.accumulators[s.name] = s
            if s.size is not None:
                self.buffers.append(Buffer(s.name, s.dtype, s.size))
        else:           # a scalar statement: a store's slot is made before its value is computed
            if isinstance(s, ir.Store):
                self.reserve(s, self.kernel.params[s.param].dtype)
            self.scalar_loads(s.value)
            if isinstance(s, ir.ScatterAccumulate):
                self.reserve(s, self.kernel.params[s.param].dtype)
                self.reserve(s, dtypes.int64, "offset")


class _Tile:
    """Lowers one statement of a tiled loop to steps; each varying value is computed once."""

    def __init__(self, plan, var):
        self.plan, self.var, self.steps, self.known, self.spreads = plan, var, [], {}, {}
        self.varying = set()

    def lower(self, s):
        """The steps of statement `s`."""
        tree = ir.values(s.value)
        reading = {id(v) for v in tree if any(self.var in variables(e) for e in ir.index_expressions(v))}
        self.varying = {id(v) for v in tree if any(id(inner) in reading for inner in ir.values(v))}
        if isinstance(s, ir.Store):
            memory = self.plan.kernel.params[s.param].dtype
            source, coef = self.buffer(self.operand(s.value), memory), stride(s.index, self.var)
            if coef:
                self.step("copy_out", param=s.param, index=s.index, stride=coef, source=source, dtype=memory)
            else:       # no stride, or the same element on every lane: the last lane's value is kept
                offsets = self.offsets(s.index)
                self.step("scatter", param=s.param, source=source, offsets=offsets, dtype=memory)
        elif isinstance(s, ir.Accumulate):
            dtype = self.plan.accumulators[s.name].dtype
            source = self.converted(self.buffer(self.operand(s.value), s.value.dtype), s.value.dtype, dtype)
            if s.index is None:
                slot = self.plan.reserve(s, dtype)
                self.step("reduce", name=s.name, op=s.op, source=source, dtype=dtype, slot=slot)
            elif stride(s.index, self.var) == 1:
                self.step("update", name=s.name, index=s.index, op=s.op, source=source, dtype=dtype)
            else:
                self.step("update_lanes", name=s.name, index=s.index, op=s.op, source=source, dtype=dtype)
        elif isinstance(s, ir.Assign):
            source = self.buffer(self.operand(s.value), s.value.dtype)
            if stride(s.index, self.var) == 1:
                self.step("put", name=s.name, index=s.index, source=source, dtype=s.value.dtype)
            else:
                self.step("put_lanes", name=s.name, index=s.index, source=source)
        else:       # a scatter into float16 or bfloat16 memory adds in float32 and rounds back
            memory = self.plan.kernel.params[s.param].dtype
            source = self.converted(self.buffer(self.operand(s.value), s.value.dtype), s.value.dtype, memory)
            offsets = self.offsets(s.index, s.valid, s.check)
            self.step("scatter_update", param=s.param, op=s.op, source=source, offsets=offsets, dtype=memory)
        return self.steps

    def step(self, kind, **operands):
        self.steps.append(Step(kind, operands))

    def operand(self, value):
        """A value along the tile: a Buffer or Slice where it varies, else the value (a scalar,
        computed where the walk first meets it: a step of its own)."""
        if id(value) not in self.varying:
            if id(value) not in self.known and not isinstance(value, ir.Scalar):
                self.known[id(value)] = value
                self.plan.scalar_loads(value)
                self.step("scalar", value=value)
            return value
        if id(value) not in self.known:
            if isinstance(value, ir.Ref):
                self.known[id(value)] = self.accumulator(value)
            elif isinstance(value, ir.Load):
                self.known[id(value)] = self.load(value)
            elif isinstance(value, ir.Guard):
                self.known[id(value)] = self.guard(value)
            elif isinstance(value, ir.IndexValue):
                self.known[id(value)] = out = self.plan.new(value.dtype)
                self.step("iota", out=out, expr=value.expr, dtype=value.dtype)
            else:
                self.known[id(value)] = self.compute(value)
        return self.known[id(value)]

    def buffer(self, operand, dtype):
        """An operand as a buffer: a scalar is spread over one (once per statement)."""
        if isinstance(operand, (Buffer, Slice)):
            return operand
        key = (operand.value, dtype) if isinstance(operand, ir.Scalar) else (id(operand), dtype)
        if key not in self.spreads:
            self.spreads[key] = self.plan.new(dtype)
            self.step("spread", out=self.spreads[key], value=operand, dtype=dtype)
        return self.spreads[key]

    def converted(self, buffer, source, target):
        """A buffer of `source` values as `target` (the same buffer when they are one type)."""
        if source is target:
            return buffer
        out = self.plan.new(target)
        self.step("compute", out=out, op="cast", args=(buffer,), dtype=source, scalar=False, site=None)
        return out

    def offsets(self, index, valid=None, check=None):
        out = self.plan.new(dtypes.int64, stem="offsets")
        self.step("offsets", out=out, index=index, valid=valid, check=check)
        return out

    def accumulator(self, ref):
        """An accumulator array's elements along the tile: a slice, or collected lane by lane."""
        if stride(ref.index, self.var) == 1:
            return Slice(ref.name, ref.index)
        out = self.plan.new(ref.dtype)
        self.step("collect", out=out, name=ref.name, index=ref.index)
        return out

    def load(self, value):
        """Copied (its valid lanes only, when they are an interval) or gathered; float16 and
        bfloat16 memory moves as it is, then is converted."""
        stored, out = self.plan.kernel.params[value.param].dtype, self.plan.new(value.dtype)
        moved = out if stored is value.dtype else self.plan.new(stored)
        coef, lanes = stride(value.index, self.var), None
        if value.valid is not None and coef is not None:
            lanes = interval(value.valid, self.var, self.plan.extents)
        if coef is None or (value.valid is not None and lanes is None):
            offsets = self.offsets(value.index, value.valid)
            self.step("gather", out=moved, param=value.param, offsets=offsets, dtype=stored)
        else:
            self.step("copy_in", out=moved, param=value.param, index=value.index, stride=coef, lanes=lanes,
                      dtype=stored)
        if moved is not out:
            self.step("compute", out=out, op="cast", args=(moved,), dtype=stored, scalar=False, site=None)
        return out

    def guard(self, value):
        out = self.plan.new(value.dtype)
        inner = self.buffer(self.operand(value.value), value.dtype)
        fill = ir.Scalar(value.fill, value.dtype)
        lanes = None if value.check is not None else interval(value.cond, self.var, self.plan.extents)
        if lanes is None:       # tested per lane, and each lane that fails a check reports it
            self.step("guard_lanes", out=out, inner=inner, fill=fill, cond=value.cond, valid=value.valid,
                      check=value.check, dtype=value.dtype)
        else:
            self.step("fill_outside", out=out, inner=inner, fill=fill, lanes=lanes, dtype=value.dtype)
        return out

    def compute(self, value):
        op, args = self.plan.fused(value) or (value.op, value.args)
        source, out = args[0].dtype, self.plan.new(value.dtype)
        operands = [self.operand(arg) for arg in args]
        scalars = [not isinstance(operand, (Buffer, Slice)) for operand in operands]
        # a scalar form takes the buffer first: a scalar on the left only where the op commutes
        scalar = op in self.plan.scalar_ops and source != dtypes.bool_ and any(scalars) and \
            (not scalars[0] or op in COMMUTATIVE)
        if scalar:
            operands = operands[::-1] if scalars[0] else operands
        else:
            operands = [self.buffer(operand, arg.dtype) for operand, arg in zip(operands, args)]
        self.step("compute", out=out, op=op, args=tuple(operands), dtype=source, scalar=scalar,
                  site=value.site)
        return out
