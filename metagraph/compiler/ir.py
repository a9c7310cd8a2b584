"""The kernel IR: one kernel is parameters, loops and statements over typed scalar values.

Index arithmetic uses the expression tree of `metagraph.expr` (loop variable k is `Var(k)`); the
values computed are small trees of table ops. Backends only render this; every transformation
(fusion, splitting a loop, marking it parallel) is a rewrite of it.
"""
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Optional

from metagraph.expr import Const

# ---- values --------------------------------------------------------------------------------


@dataclass(eq=False)
class Load:
    """param[index]; where `valid` (an index expression) is false nothing is read and 0 results."""
    param: int
    index: object            # Expr: the flat element offset
    dtype: object
    valid: Optional[object] = None


@dataclass(eq=False)
class Scalar:
    """A constant."""
    value: object
    dtype: object


@dataclass(eq=False)
class IndexValue:
    """An index expression used as a value (the `index` meta-op)."""
    expr: object
    dtype: object


@dataclass(eq=False)
class Apply:
    """An element-wise table op (or `cast`) on values."""
    op: str
    args: tuple
    dtype: object
    site: Optional[int] = None    # error site for integer division by zero


@dataclass(eq=False)
class Guard:
    """value where `cond` (an index expression) holds, else `fill`, or an error at `check`.

    Where the enclosing `valid` is false the value is not used and `cond` is not evaluated
    (it may read index tensors out of their bounds there)."""
    cond: object
    value: object
    fill: object
    valid: Optional[object] = None
    check: Optional[int] = None

    @property
    def dtype(self):
        return self.value.dtype


@dataclass(eq=False)
class Ref:
    """The value of an accumulator (of element `index` when the accumulator is an array)."""
    name: str
    dtype: object
    index: Optional[object] = None


def statements(body):
    """Every statement of `body` in order, loops and the statements inside them."""
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from statements(s.body)


def values(value):
    """Every value in a value tree, each object once (shared subtrees are visited once)."""
    seen, stack, out = set(), [value], []
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        out.append(v)
        if isinstance(v, Guard):
            stack.append(v.value)
        stack.extend(getattr(v, "args", ()))
    return out


def loads(value):
    """Every Load in a value tree."""
    return [v for v in values(value) if isinstance(v, Load)]


def replaced(value, replacements):
    """The value tree with each value whose id is a key of `replacements` replaced by its entry
    (the rest of the tree shared where nothing under it changes)."""
    memo = {}

    def walk(v):
        if id(v) in replacements:
            return replacements[id(v)]
        if id(v) not in memo:
            out = v
            if isinstance(v, Apply):
                args = tuple(walk(a) for a in v.args)
                if any(a is not b for a, b in zip(args, v.args)):
                    out = Apply(v.op, args, v.dtype, v.site)
            elif isinstance(v, Guard):
                inner = walk(v.value)
                if inner is not v.value:
                    out = Guard(v.cond, inner, v.fill, v.valid, v.check)
            memo[id(v)] = out
        return memo[id(v)]
    return walk(value)


def _unless_true(cond):
    """A condition, or None where it folded to a constant that holds (no test needed)."""
    return None if isinstance(cond, Const) and cond.value else cond


def _false(cond):
    """Whether a condition folded to a constant that does not hold."""
    return isinstance(cond, Const) and not cond.value


def rewritten(value, rewrite, keep=None):
    """A value tree with `rewrite` (expression -> expression) applied to its index expressions.
    Values it does not change stay the same objects (shared), and so does `keep`; a guard whose
    condition becomes true everywhere is dropped."""
    def index(expr):
        return None if expr is None else rewrite(expr)
    memo = {}

    def walk(v):
        if id(v) in memo:
            return memo[id(v)]
        out = v
        if isinstance(v, Load):
            parts = (index(v.index), _unless_true(index(v.valid)))
            if _false(parts[1]):            # read nowhere (a peeled border): its 0
                out = Scalar(0, v.dtype)
            elif parts != (v.index, v.valid):
                out = Load(v.param, parts[0], v.dtype, parts[1])
        elif isinstance(v, IndexValue):
            expr = index(v.expr)
            if expr != v.expr:
                out = IndexValue(expr, v.dtype)
        elif isinstance(v, Guard):
            parts = (index(v.cond), walk(v.value), index(v.valid))
            if _unless_true(parts[0]) is None:      # holds everywhere (a block's inner row)
                out = parts[1]
            elif _false(parts[0]) and v.check is None:     # holds nowhere (a peeled border)
                out = Scalar(v.fill, v.dtype)
            elif parts != (v.cond, v.value, v.valid):
                out = Guard(parts[0], parts[1], v.fill, parts[2], v.check)
        elif isinstance(v, Apply):
            args = tuple(walk(a) for a in v.args)
            if any(a is not b for a, b in zip(args, v.args)):
                out = Apply(v.op, args, v.dtype, v.site)
        elif isinstance(v, Ref) and v is not keep and v.index is not None:
            out = Ref(v.name, v.dtype, index(v.index))
        memo[id(v)] = out
        return out
    return walk(value)


def index_expressions(v):
    """The index expressions one value node uses (not those of its arguments)."""
    if isinstance(v, Load):
        parts = (v.index, v.valid)
    elif isinstance(v, Guard):
        parts = (v.cond, v.valid)
    elif isinstance(v, IndexValue):
        parts = (v.expr,)
    elif isinstance(v, Ref):
        parts = (v.index,)
    else:
        parts = ()
    return [expr for expr in parts if expr is not None]


# ---- statements ------------------------------------------------------------------------------

PARALLEL, SERIAL, REDUCE, VECTOR = "parallel", "serial", "reduce", "vector"
# A loop whose iterations write nothing but add into accumulators defined before it: threads may
# share it, each adding into its own copy of them (from 0), the copies added in after it. A backend
# that does not run it on threads runs it as a serial loop, in the same order.
SHARED_SUM = "shared sum"


@dataclass
class Loop:
    var: int
    extent: int
    kind: str
    body: list


@dataclass
class Define:
    """An accumulator for reduction `op` (an array of `size` when given), initialised (not when
    `init` is None: an array each element of which is assigned before it is read)."""
    name: str
    dtype: object
    init: object
    op: str = "add"
    size: Optional[int] = None


@dataclass
class Accumulate:
    name: str
    op: str
    value: object
    index: Optional[object] = None


@dataclass
class Assign:
    """name[index] = value, in a local array (a row of values kept for a later loop)."""
    name: str
    index: object
    value: object


@dataclass
class Store:
    param: int
    index: object
    value: object


@dataclass
class ScatterAccumulate:
    """param[index] op= value where valid (a race unless the loop over it is serial or injective)."""
    param: int
    index: object
    op: str
    value: object
    valid: Optional[object] = None
    check: Optional[int] = None


@dataclass
class Param:
    name: str
    dtype: object
    shape: tuple
    output: bool
    shared: bool = False    # its memory may be another parameter's (an output written over an input
                            # it reads only at its own index: runtime/donation.py): no restrict/noalias


@dataclass
class Kernel:
    name: str
    params: list
    body: list
    extents: dict = field(default_factory=dict)    # loop variable -> extent (for simplification)
    fallback: tuple = ()    # (least, statements...): run instead of `body` for a run-time first extent
                            # below `least` (compiler/generic.py)


def extra_offset(param, args):
    """The flat element offset, in row-major `param`, of an index-tensor read at `args`."""
    offset, stride = Const(0), 1
    for arg, size in reversed(list(zip(args, param.shape))):
        if size != 1:
            offset = offset + arg * stride
        stride *= size
    return offset


def rewritten_statement(s, rewrite, rename=None):
    """A statement (and the loops inside it) with `rewrite` applied to every index expression and
    accumulators renamed by `rename` (old name -> new name)."""
    rename = rename or {}

    def index(expr):
        return None if expr is None else rewrite(expr)

    def value(v):
        v = rewritten(v, rewrite)
        refs = {id(r): Ref(rename[r.name], r.dtype, r.index) for r in values(v)
                if isinstance(r, Ref) and r.name in rename}
        return replaced(v, refs) if refs else v
    if isinstance(s, Loop):
        return Loop(s.var, s.extent, s.kind, [rewritten_statement(b, rewrite, rename) for b in s.body])
    if isinstance(s, Define):
        return Define(rename.get(s.name, s.name), s.dtype, s.init, s.op, s.size)
    if isinstance(s, Accumulate):
        return Accumulate(rename.get(s.name, s.name), s.op, value(s.value), index(s.index))
    if isinstance(s, Assign):
        return Assign(rename.get(s.name, s.name), index(s.index), value(s.value))
    if isinstance(s, Store):
        return Store(s.param, index(s.index), value(s.value))
    return ScatterAccumulate(s.param, index(s.index), s.op, value(s.value), index(s.valid), s.check)


def describe(obj):
    """A text that tells kernels apart (their names hash it), linear in the size of the IR: a value
    or expression that several places share is written once and referred to by number after
    (repr() writes a shared subtree at every place, exponential in its depth: an exact rounded
    division's DAG never finished). Iterative: a 60-op relu chain nests deeper than Python's
    recursion limit."""
    memo, shared, stack = {}, [], [(obj, False)]
    while stack:
        o, expanded = stack.pop()
        if id(o) in memo:
            continue
        parts = _parts(o)
        if parts is None:
            memo[id(o)] = repr(o)
        elif not expanded:
            stack.append((o, True))
            stack.extend([(part, False) for part in reversed(parts) if id(part) not in memo])
        else:
            inner = ",".join(memo[id(part)] for part in parts)
            if isinstance(o, dict):
                text = "{" + ",".join(f"{k}:{memo[id(v)]}" for k, v in o.items()) + "}"
            elif isinstance(o, (list, tuple)):
                text = f"[{inner}]"
            else:
                text = f"{type(o).__name__}({inner})"
                if len(text) > 48:
                    shared.append(text)
                    text = f"#{len(shared) - 1}"
            memo[id(o)] = text
    return "\n".join(shared + [memo[id(obj)]])


_FIELD_NAMES = {}      # type -> its dataclass field names, or None (not a dataclass)


def _parts(o):
    """The parts describe() writes inside `o`, or None for a value written as its repr."""
    kind = type(o)
    if kind is list or kind is tuple:
        return o
    if kind is dict:
        return list(o.values())
    if kind not in _FIELD_NAMES:
        _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind)) if is_dataclass(kind) else None
    names = _FIELD_NAMES[kind]
    return None if names is None else [getattr(o, name) for name in names]
