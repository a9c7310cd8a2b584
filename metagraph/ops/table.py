"""The meta-op table: every operation the graph holds, with its shape, dtype and gradient rules.

Each row is one meta-op. `shape` and `dtype` check the operands and give the result's shape and
dtype; they run when the node is built, so errors point at the user's line. `grad(g, y, *inputs)`
returns one gradient per input (None where none flows), written only in meta-ops: `g` is the
incoming gradient, `y` the op's output. Every other operation (sub, exp, matmul, conv2d, ...) is a
composition of these rows, and so is every gradient.
"""
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from metagraph import dtypes
from metagraph.errors import DTypeError, MetagraphError, ShapeError, at, user_location
from metagraph.expr import (Binary, Const, Select, Var, check_int64, extras_used, linear_terms, reshape_map,
                           variables)
from metagraph.ops.node import Node, signature
from metagraph.ops.window_gradient import shifted_window_gradient, window_gradient

SOURCE, ELEMENTWISE, REDUCE, VIEW, SCATTER, NOT_MATH = (
    "source", "elementwise", "reduce", "view", "scatter", "not-math")
LN2 = math.log(2.0)


@dataclass(frozen=True)
class MetaOp:
    """One row of the table."""
    name: str
    kind: str
    inputs: str                          # input names; '*extras' means any number of index tensors
    attrs: tuple
    shape: Callable
    dtype: Callable
    grad: Optional[Callable]
    doc: str


def apply(name, *inputs, **attrs):
    """Build the node for meta-op `name`, checking shapes and dtypes now."""
    row = TABLE[name]
    try:
        shape = row.shape(inputs, attrs)
        dtype = row.dtype(inputs, attrs)
    except MetagraphError as error:
        raise type(error)(f"{name}: {error} (at {at(user_location())})") from None
    if dtype in dtypes.LOW_PRECISION and name == "reindex_reduce" and attrs["op"] == "add":
        # a float16/bfloat16 scatter-add sums in float32 and rounds once, as a reduce does: a kernel
        # adding into its output rounded after every addition (2,000 values below 1 stopped at 256)
        wide = apply(name, apply("cast", inputs[0], dtype=dtypes.float32), *inputs[1:], **attrs)
        return apply("cast", wide, dtype=dtype)
    return Node(name, inputs, attrs, shape, dtype)


# ---- shape and dtype rules -----------------------------------------------------------------

def _show(nodes):
    return " and ".join(str(n.shape) for n in nodes)


def same_shape(inputs, attrs):
    shape = inputs[0].shape
    for n in inputs:          # a loop, not any(): this runs for every element-wise node
        if n.shape != shape:
            raise ShapeError(f"element-wise operands need equal shapes, got {_show(inputs)}")
    return shape


def attr_shape(inputs, attrs):
    shape = tuple(attrs["shape"])
    if any(not isinstance(s, int) or s < 0 for s in shape):
        raise ShapeError(f"shape must be non-negative integers, got {shape}")
    return shape


def attr_dtype(inputs, attrs):
    return attrs["dtype"]


def _dtype_rule(accept, what, result=None):
    accepted = frozenset(d for d in dtypes.ALL if accept(d))   # a set test per node, not a call

    def rule(inputs, attrs):
        dtype = inputs[0].dtype
        for n in inputs:
            if n.dtype is not dtype:          # one DType object per type
                raise DTypeError(f"operands need equal dtypes, got "
                                 f"{' and '.join(n.dtype.name for n in inputs)}")
        if dtype not in accepted:
            raise DTypeError(f"expects {what} operands, got {dtype.name}")
        return result or dtype
    rule.accepted, rule.result = accepted, result      # (what math.elementwise checks inline)
    return rule


any_dtype = _dtype_rule(lambda d: True, "any")
numeric = _dtype_rule(lambda d: d != dtypes.bool_, "numeric (not bool)")
floating = _dtype_rule(lambda d: d.is_float, "floating-point")
integer = _dtype_rule(lambda d: d.is_int, "integer")
bits = _dtype_rule(lambda d: not d.is_float, "integer or bool")
to_bool = _dtype_rule(lambda d: True, "any", result=dtypes.bool_)


def where_shape(inputs, attrs):
    return same_shape(inputs, attrs)


def where_dtype(inputs, attrs):
    cond, a, b = inputs
    if cond.dtype != dtypes.bool_:
        raise DTypeError(f"condition must be bool, got {cond.dtype.name}")
    if a.dtype != b.dtype:
        raise DTypeError(f"branches need equal dtypes, got {a.dtype.name} and {b.dtype.name}")
    return a.dtype


def reduce_shape(inputs, attrs):
    (x,), axes = inputs, attrs["axes"]
    if attrs["op"] not in ("add", "mul", "max"):
        raise MetagraphError(f"op must be add, mul or max, got {attrs['op']!r}")
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"axes {axes} invalid for a tensor of shape {x.shape}")
    if attrs["keepdim"]:
        return tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    return tuple(s for d, s in enumerate(x.shape) if d not in axes)


def _check_map(index_map, num_dims, extents, num_extras):
    """The map has an expression per dimension, over loop variables in [0, extents[k]), reading
    extras that exist, and no index arithmetic that can leave int64."""
    if len(index_map) != num_dims:
        raise ShapeError(f"index map has {len(index_map)} expressions for {num_dims} dimensions")
    for expr in index_map:
        if any(v >= len(extents) for v in variables(expr)):
            raise ShapeError(f"index expression {expr} reads a loop variable beyond i{len(extents) - 1}")
        if any(e >= num_extras for e in extras_used(expr)):
            raise ShapeError(f"index expression {expr} reads an extra that was not given")
        check_int64(expr, extents)


def _check_extras(extras):
    if any(not e.dtype.is_int for e in extras):
        raise DTypeError("index extras must be integer tensors")


def reindex_shape(inputs, attrs):
    x, extras = inputs[0], inputs[1:]
    shape = attr_shape(inputs, attrs)
    _check_map(attrs["index_map"], x.ndim, shape, len(extras))
    _check_extras(extras)
    return shape


def reindex_reduce_shape(inputs, attrs):
    x, extras = inputs[0], inputs[1:]
    if attrs["op"] not in ("add", "max"):
        raise MetagraphError(f"op must be add or max, got {attrs['op']!r}")
    shape = attr_shape(inputs, attrs)
    _check_map(attrs["index_map"], len(shape), x.shape, len(extras))
    _check_extras(extras)
    return shape


def first_dtype(inputs, attrs):
    return inputs[0].dtype


# ---- gradient helpers (each builds only table ops) ------------------------------------------

def full(value, like):
    return apply("const", value=value, shape=like.shape, dtype=like.dtype)


def where(cond, a, b, dtype=None):
    """where() whose scalar branches take cond's shape and the other branch's dtype (or `dtype`)."""
    dtype = dtype or (a.dtype if isinstance(a, Node) else b.dtype)
    a = a if isinstance(a, Node) else apply("const", value=a, shape=cond.shape, dtype=dtype)
    b = b if isinstance(b, Node) else apply("const", value=b, shape=cond.shape, dtype=dtype)
    return apply("where", cond, a, b)


def cmpne(a, b):
    return apply("cmpne", a, b if isinstance(b, Node) else full(b, a))


def cmplt(a, b):
    return apply("cmplt", a, b)


# copy nodes without a value yet, by id (a weak reference each): backend.realize makes them. A dict,
# not a WeakSet, whose every truth test at a realisation ran Python (0.3 us)
PENDING_COPIES = {}


def copy(x, device):
    """x's value on `device` (a device name: metagraph/device.py), as a node whose value the backend
    moves there."""
    node = apply("copy", x, device=device)
    node.device = device
    PENDING_COPIES[node.id] = weakref.ref(node, lambda _, key=node.id: PENDING_COPIES.pop(key, None))
    return node


def unreduce(g, x_shape, axes, keepdim):
    """Broadcast a reduction's result (or its gradient) back to the input's shape."""
    if keepdim:
        index_map = [Const(0) if axis in axes else Var(axis) for axis in range(len(x_shape))]
    else:
        index_map = [Var(axis) for axis in range(len(x_shape)) if axis not in axes]
    return apply("reindex", g, shape=x_shape, index_map=tuple(index_map), fill=0, checked=False)


def reduce_like(x, op, attrs):
    return apply("reduce", x, op=op, axes=attrs["axes"], keepdim=attrs["keepdim"])


def max_grad(g, y, a, b):
    share_a = where(cmplt(b, a), 1.0, where(cmpne(a, b), 0.0, 0.5, a.dtype))   # ties split
    return g * share_a, g * (1 - share_a)


def reduce_grad(g, y, x):
    attrs = y.attrs
    back = lambda node: unreduce(node, x.shape, attrs["axes"], attrs["keepdim"])  # noqa: E731
    if attrs["op"] == "add":
        return (back(g),)
    if attrs["op"] == "max":                                       # shared among the maxima
        not_max = cmpne(x, back(y))
        count = reduce_like(where(not_max, 0.0, 1.0, x.dtype), "add", attrs)
        return (where(not_max, 0.0, back(g / count)),)
    nonzero = cmpne(x, 0)                                          # mul: exact with zeros
    safe_x = where(nonzero, x, 1.0)
    zeros = back(reduce_like(where(nonzero, 0.0, 1.0, x.dtype), "add", attrs))
    others = back(reduce_like(safe_x, "mul", attrs))
    one_zero = where(cmpne(zeros, 1), 0.0, where(nonzero, 0.0, back(g) * others))
    return (where(cmpne(zeros, 0), one_zero, back(g) * back(y) / safe_x),)


def reindex_grad(g, y, x, *extras):
    """A scatter back; for a reshape, a broadcast or an injective affine view, a cheaper view; for
    a window read by a product, a gather (ops/window_gradient.py). A checked read's scatter is
    checked too: the gradient may run without the forward value, and an
    index out of range must raise there as well, not drop its gradient."""
    index_map, checked = y.attrs["index_map"], y.attrs["checked"]
    inverse = None if extras or checked else inverse_view(g, x.shape, y)
    if inverse is None and not extras and not checked:
        inverse = window_gradient(g, x.shape, index_map, apply)
    if inverse is not None:
        return (inverse,)
    scatter = apply("reindex_reduce", g, *extras, op="add", shape=x.shape, index_map=index_map,
                    checked=checked)
    return (scatter,) + (None,) * len(extras)


_MISSING = object()
_INVERSES = {}          # (a view's signature, its input's shape) -> _inverse(...) of them
_SHIFTED = {}           # (a scatter's signature, its input's shape, that key) -> its shifted map
INVERSE_CACHE_SIZE = 4096


def _cached(table, key, make):
    """table[key], made by make() the first time (the tables are bounded, oldest dropped first)."""
    found = table.get(key, _MISSING)
    if found is _MISSING:
        if len(table) >= INVERSE_CACHE_SIZE:
            table.pop(next(iter(table)))
        found = table[key] = make()
    return found


def inverse_view(g, x_shape, y):
    """The gradient g of y = reindex(x, y_shape, index_map) as a sum over broadcast dimensions and
    a gather, when every input dimension reads `a*i_v + b` of its own loop variable i_v (a
    permutation, slice, flip, pad or broadcast), or when the map is a reshape; else None. The
    analysis of the map is made once per view signature (linear_terms over every expression
    was most of a ResNet backward pass's rules; their other nodes are replayed: recorded_rule)."""
    key = (y.signature or signature(y), x_shape)
    found = _cached(_INVERSES, key, lambda: _inverse(x_shape, y.shape, y.attrs["index_map"]))
    if found is None:
        return None
    unused, inverse, shifts = found
    if unused == "reshape":
        return apply("reindex", g, shape=x_shape, index_map=inverse, fill=0, checked=False)
    if unused:
        g = apply("reduce", g, op="add", axes=unused, keepdim=False)
    return _shifted_scatter(g, x_shape, shifts, key) or \
        (shifts is not None and shifted_window_gradient(g, x_shape, shifts, apply)) or \
        apply("reindex", g, shape=x_shape, index_map=inverse, fill=0, checked=False)


def _inverse(x_shape, y_shape, index_map):
    """(axes of y to sum, the map that reads the sum back at x's positions, each dimension's shift
    when that map is a pure shift (else None)) for inverse_view, ("reshape", the map back, None)
    for a reshape, or None."""
    if math.prod(x_shape) == math.prod(y_shape) and index_map == reshape_map(x_shape, y_shape):
        return ("reshape", reshape_map(y_shape, x_shape), None)
    placed, fixed = {}, []
    for d, expr in enumerate(index_map):
        terms, const = linear_terms(expr)
        if not terms:
            fixed.append((d, const))
            continue
        if len(terms) != 1:
            return None
        ((term, scale),) = terms.items()
        if not isinstance(term, Var) or term.axis in placed:
            return None
        placed[term.axis] = (d, scale, const)
    fixed = [(d, c) for d, c in fixed if not (x_shape[d] == 1 and c == 0)]
    if fixed and not placed:
        return None
    unused = tuple(v for v in range(len(y_shape)) if v not in placed)
    inverse = []
    for v in sorted(placed):
        d, scale, const = placed[v]
        offset = Var(d) - const if const else Var(d)
        if scale == 1:
            inverse.append(offset)
        elif scale == -1:
            inverse.append(const - Var(d))
        else:
            inverse.append(Select(Binary("==", offset % scale, Const(0)), offset // scale, Const(-1)))
    for d, c in fixed:      # an input dimension read at one index gets gradient only there
        inverse[0] = Select(Binary("==", Var(d), Const(c)), inverse[0], Const(-1))
    shifts = []
    for d, expr in enumerate(inverse):
        terms, const = linear_terms(expr)
        if terms != {Var(d): 1}:
            shifts = None
            break
        shifts.append(const)
    return unused, tuple(inverse), shifts


def _shifted_scatter(g, shape, shifts, key):
    """A scatter-add read back at a shifted sub-box (a padded view's gradient, after the gradient
    of the window that read it) as the same scatter shifted straight into the sub-box: a conv's
    input gradient is then summed over the input's shape, not its padded copy's (4x4, not 6x6). A
    cast of such a scatter (element-wise) is the cast of the shifted one. None unless g is such a
    scatter and the map back a pure shift (`shifts`, from _inverse, whose
    cache `key` names it)."""
    if shifts is not None and g.op == "cast":     # (a float16 scatter-add is one in float32, cast)
        inner = _shifted_scatter(g.inputs[0], shape, shifts, key)
        return None if inner is None else apply("cast", inner, dtype=g.dtype)
    if shifts is None or g.op != "reindex_reduce" or g.attrs["op"] != "add" or g.attrs["checked"] or \
            len(g.inputs) > 1:
        return None
    source = g.inputs[0]

    def shifted():      # checked by apply once per signature; later nodes are built as it built them
        index_map = tuple(e - c if c else e for e, c in zip(g.attrs["index_map"], shifts))
        return apply("reindex_reduce", source, op="add", shape=tuple(shape), checked=False,
                     index_map=index_map).attrs
    attrs = _cached(_SHIFTED, (g.signature or signature(g), source.shape, source.dtype, key), shifted)
    return Node("reindex_reduce", (source,), dict(attrs), attrs["shape"], source.dtype)


def reindex_reduce_grad(g, y, x, *extras):
    """A gather back (checked where the scatter is, as in reindex_grad)."""
    attrs = y.attrs
    gather = lambda node, fill: apply("reindex", node, *extras, shape=x.shape,  # noqa: E731
                                      index_map=attrs["index_map"], fill=fill, checked=attrs["checked"])
    if attrs["op"] == "add":
        return (gather(g, 0),) + (None,) * len(extras)
    inside = gather(apply("const", value=True, shape=y.shape, dtype=dtypes.bool_), False)
    not_max = where(inside, cmpne(x, gather(y, 0)), True)
    count = apply("reindex_reduce", where(not_max, 0.0, 1.0, x.dtype), *extras, op="add", shape=y.shape,
                  index_map=attrs["index_map"], checked=attrs["checked"])
    return (where(not_max, 0.0, gather(g / count, 0)),) + (None,) * len(extras)


def pow_grad(g, y, x, e):
    """PyTorch's: e * x ** (e - 1), zero where e is 0; y * ln(x), zero where x is 0 and e >= 0."""
    dx = where(cmpne(e, 0), g * e * apply("pow", x, e - 1.0), 0.0)
    de = g * y * apply("log2", x) * LN2
    at_zero = where(cmplt(full(0, e), e), 0.0, where(cmpne(e, 0), de, 0.0))     # 0 where e >= 0
    return dx, where(cmpne(x, 0), de, at_zero)


def unary(name, dtype_rule, grad, doc):
    return MetaOp(name, ELEMENTWISE, "x", (), same_shape, dtype_rule, grad, doc)


def binary(name, dtype_rule, grad, doc):
    return MetaOp(name, ELEMENTWISE, "a b", (), same_shape, dtype_rule, grad, doc)


ROWS = [
    MetaOp("const", SOURCE, "", ("value", "shape", "dtype"), attr_shape, attr_dtype, None,
           "value repeated over shape: a view, never a buffer"),
    MetaOp("index", SOURCE, "", ("shape", "axis", "dtype"), attr_shape, attr_dtype, None,
           "the loop variable along axis (iota)"),
    unary("neg", numeric, lambda g, y, x: (-g,), "-x"),
    unary("recip", floating, lambda g, y, x: (-g * y * y,), "1/x"),
    unary("sqrt", floating, lambda g, y, x: (g / (y * 2),), "square root"),
    unary("exp2", floating, lambda g, y, x: (g * y * LN2,), "2**x"),
    unary("log2", floating, lambda g, y, x: (g / (x * LN2),), "log base 2"),
    unary("sin", floating, lambda g, y, x: (g * apply("cos", x),), "sine"),
    MetaOp("cast", ELEMENTWISE, "x", ("dtype",), same_shape, attr_dtype,
           lambda g, y, x: (apply("cast", g, dtype=x.dtype) if x.dtype.is_float else None,),
           "convert to dtype (float to int truncates toward zero)"),
    binary("add", any_dtype, lambda g, y, a, b: (g, g), "a + b"),
    binary("mul", any_dtype, lambda g, y, a, b: (g * b, g * a), "a * b"),
    binary("max", any_dtype, max_grad, "larger of a and b; NaN if either is NaN"),
    binary("cmplt", to_bool, None, "a < b"),
    binary("cmpne", to_bool, None, "a != b (True for NaN)"),
    MetaOp("where", ELEMENTWISE, "cond a b", (), where_shape, where_dtype,
           lambda g, y, c, a, b: (None, where(c, g, 0.0), where(c, 0.0, g)), "a where cond else b"),
    MetaOp("reduce", REDUCE, "x", ("op", "axes", "keepdim"), reduce_shape, first_dtype,
           reduce_grad, "add, mul or max over axes (float16 accumulates in float32)"),
    MetaOp("reindex", VIEW, "x *extras", ("shape", "index_map", "fill", "checked"),
           reindex_shape, first_dtype, reindex_grad,
           "out[i] = x[index_map(i)], or fill where an index is out of bounds "
           "(an error instead when checked)"),
    MetaOp("reindex_reduce", SCATTER, "x *extras", ("op", "shape", "index_map", "checked"),
           reindex_reduce_shape, first_dtype, reindex_reduce_grad,
           "out[index_map(i)] op= x[i] (add from 0, max from the dtype's minimum); "
           "out-of-bounds targets are skipped (an error when checked)"),
    # Rows beyond the core, each for a reason:
    unary("cos", floating, lambda g, y, x: (-g * apply("sin", x),),
          "cosine: sin(x + pi/2) rounds x + pi/2 (0.03 off at |x| = 1e6 in float32, not even in x); "
          "libm's cos reduces the argument exactly"),
    binary("pow", floating, pow_grad,
           "x ** e with C's special values (exact integer powers of negative bases, 0 ** -0.3 = inf, "
           "(-inf) ** 0.3 = inf), which exp2(e * log2 |x|) does not give, nor, by the chain rule, "
           "PyTorch's gradients at 0 and inf"),
    binary("idiv", integer, None,
           "integer floor division: exact for int64, which no float composition gives"),
    binary("mod", integer, None, "integer remainder with the divisor's sign, exact as idiv"),
    binary("and", bits, None, "bitwise and: integer bit logic has no arithmetic composition"),
    binary("or", bits, None, "bitwise or, for the same reason"),
    binary("xor", bits, None, "bitwise xor, for the same reason"),
    # Nodes that are not math:
    MetaOp("buffer", NOT_MATH, "", (), lambda i, a: (), lambda i, a: None, None,
           "realised data"),
    MetaOp("contiguous", NOT_MATH, "x", (), same_shape, first_dtype, lambda g, y, x: (g,),
           "the same value, materialised: forces a kernel boundary"),
    MetaOp("copy", NOT_MATH, "x", ("device",), same_shape, first_dtype,
           lambda g, y, x: (copy(g, x.device or "cpu"),),
           "the same value on another device (a transfer; backend.realize makes it, kernels never see it)"),
]

TABLE = {row.name: row for row in ROWS}
