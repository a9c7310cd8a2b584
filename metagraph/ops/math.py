"""Element-wise composites: broadcasting, type promotion and math, built only from table rows.

Operands are nodes or Python scalars; scalars are weak in type promotion, as in PyTorch.
"""
import math
import sys

import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.expr import Const, Var
from metagraph.ops import scalars
from metagraph.ops.node import Node, signature
from metagraph.ops.recorded import recorded
from metagraph.ops.table import TABLE, apply

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


# ---- operands ------------------------------------------------------------------------------

def is_node(x):
    return isinstance(x, Node)


def _promotion_operand(x):
    """What promotion sees of an operand: a scalar, a shaped node's dtype, or a 0-d node's."""
    if not is_node(x):
        return x
    return x.dtype if x.ndim else (x.dtype, 0)


def result_type(*operands):
    """PyTorch's promotion over nodes and scalars (0-d nodes rank below shaped ones)."""
    return dtypes.result_type(*[_promotion_operand(x) for x in operands])


def scalar_in(value, dtype, op="const"):
    """A Python scalar (or a 0-d array's) converted to `dtype` as a tensor element would be (ints
    wrap); anything else is an error of `op`, the operation that was given it."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        fail(DTypeError, op, f"unsupported scalar {value!r} of type {type(value).__name__}")
    if dtype == dtypes.bool_:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float) and not math.isfinite(value):
            raise DTypeError(f"cannot convert {value} to {dtype.name}")
        return int(np.array(int(value)).astype(dtype.np))
    return float(value)


_CONSTANTS = {}
CONSTANT_CACHE_SIZE = 4096


def const(value, shape, dtype):
    """`value` broadcast over `shape` (a view; no buffer). Equal small constants share one node,
    found by the value as given (its conversion to `dtype` depends on nothing else)."""
    return _constant(value, tuple(shape), dtype, False)


def scalar_operand(value, shape, dtype):
    """A Python scalar operand of an op, broadcast over `shape`: a constant, or a run-time value
    where its call site keeps changing it (the rule is in ops/scalars.py)."""
    return _constant(value, shape, dtype, True)


def run_time_scalar(value, shape, dtype):
    """`value` broadcast over `shape` from a 0-d buffer that kernels read, not a constant they fold."""
    held = Node("buffer", (), {}, (), dtype, requires_grad=False,
                buffer=np.array(scalar_in(value, dtype), dtype.np))
    return expand(held, shape)


def _constant(value, shape, dtype, operand):
    """const(), and scalar_operand() when `operand`: the shared constant if there is one, else a
    new constant, or for an operand at a varying site a run-time value."""
    kind = type(value)
    sign = 0
    if kind is not int and isinstance(value, (float, np.floating)):     # -0.0 is not 0.0
        sign = math.copysign(1.0, value)
    key = (value, kind, shape, dtype, sign)
    try:
        node = _CONSTANTS.get(key)
    except TypeError:            # unhashable (a 0-d array, or no scalar: scalar_in says so): not kept
        return apply("const", value=scalar_in(value, dtype), shape=shape, dtype=dtype)
    if node is None:
        if operand and scalars.varies(value, shape, dtype, sys._getframe(2)):    # (past this and its caller)
            return run_time_scalar(value, shape, dtype)
        node = apply("const", value=scalar_in(value, dtype), shape=shape, dtype=dtype)
        if math.prod(shape) <= 4096:
            if len(_CONSTANTS) >= CONSTANT_CACHE_SIZE:
                _CONSTANTS.pop(next(iter(_CONSTANTS)))
            _CONSTANTS[key] = node
    elif operand and scalars.Sites.varying and (shape, dtype) in scalars.Sites.varying and \
            scalars.varies(value, shape, dtype, sys._getframe(2)):
        return run_time_scalar(value, shape, dtype)
    return node


def cast(x, dtype):
    """x converted to dtype (a Python scalar becomes a 0-d constant)."""
    if not is_node(x):
        return const(x, (), dtype)
    return x if x.dtype == dtype else apply("cast", x, dtype=dtype)


def broadcast_shape(op, *shapes):
    """NumPy's broadcasting rule, with an error that names the op."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            fail(ShapeError, op, f"shapes {' and '.join(map(str, shapes))} cannot be broadcast")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def expand(x, shape):
    """x broadcast to `shape` by a reindex view (size-1 dimensions repeat)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    offset = len(shape) - x.ndim
    index_map = tuple(Var(offset + d) if size == shape[offset + d] else Const(0)
                      for d, size in enumerate(x.shape))
    return apply("reindex", x, shape=shape, index_map=index_map, fill=0, checked=False)


def operands(op, *xs, dtype=None):
    """Nodes of one broadcast shape and one dtype (promoted unless `dtype` is given)."""
    # The two common cases first, written for speed (they run at every call): `type(x) is Node`,
    # not is_node(x), and `is` for dtypes (one object per DType).
    first = xs[0]
    if type(first) is Node and (dtype is None or dtype is first.dtype):
        shape, kind = first.shape, first.dtype
        for x in xs:
            if type(x) is not Node or x.shape != shape or x.dtype is not kind:
                break
        else:
            return xs          # nothing to promote or broadcast (most operands, at every call)
    if dtype is None and len(xs) == 2:
        a, b = xs
        a_is_node = type(a) is Node
        if a_is_node is not (type(b) is Node):
            node, scalar = (a, b) if a_is_node else (b, a)
            # a weak scalar of the node's own kind (x + 1, x * 0.5): the node's dtype, as promotion says
            kind = node.dtype
            if (kind.is_float and type(scalar) in (int, float)) or (kind.is_int and type(scalar) is int):
                value = _constant(scalar, node.shape, kind, True)
                return (node, value) if a_is_node else (value, node)
    dtype = dtype or result_type(*xs)
    shapes = [x.shape for x in xs if is_node(x)]
    same = shapes and all(s == shapes[0] for s in shapes)
    shape = shapes[0] if same else broadcast_shape(op, *shapes)
    return [expand(cast(x, dtype), shape) if is_node(x) else scalar_operand(x, shape, dtype) for x in xs]


_FLOATS = frozenset(d for d in dtypes.ALL if d.is_float)
_INTEGERS = frozenset(d for d in dtypes.ALL if d.is_int)
SIGNATURE_MEMO_SIZE = 1024        # shapes and dtypes per element-wise row (math.elementwise)


def elementwise(row, op=None):
    """fn(a, b) = apply(row, *operands(op, a, b)) for a binary element-wise row, which builds the two
    common cases itself: two nodes of one shape and dtype, and a node with a Python scalar of its
    kind (`x + 1`, `x * 0.5`): neither broadcasts nor promotes, so only the row's dtype test is
    left of the checks (a chain of eager `a = a + 1` builds in 1.8 us a step, 2.85 through operands()
    and apply()). It also gives the node its signature number (node.signature), which the
    realisation's walk would look up, from a table of its own by shape and dtype; and it keeps
    the last scalar operand's constant, which a loop's `x + 1` gives again at once."""
    op = op or row
    rule = TABLE[row].dtype
    accepted, result = rule.accepted, rule.result
    numbers = {}                  # (shape, operand dtype) -> the signature of this row's node
    # (the last call's operand shape and dtype (the same tuple object along a chain), its node's
    # signature, its scalar operand and that scalar's constant): one tuple, replaced whole, so that
    # a thread reads one call's memo, never parts of two
    last = [(None, None, None, None, None)]

    def build(a, b):
        node, scalar = (a, b) if type(a) is Node else (b, a)
        if type(node) is not Node or node.dtype not in accepted:
            return apply(row, *operands(op, a, b))
        kind, given, shape = node.dtype, type(scalar), node.shape
        memo = seen = last[0]
        if shape is not memo[0] or kind is not memo[1]:
            memo = (shape, kind, numbers.get((shape, kind)), None, None)
        if given is Node:
            if scalar.dtype is not kind or scalar.shape != shape:
                return apply(row, *operands(op, a, b))
            inputs = (a, b)
        elif (given is float or given is int) and kind in _FLOATS or given is int and kind in _INTEGERS:
            # (the same object: -0.0 is not 0.0; not while some site varies, see ops/scalars.py)
            if scalar is memo[3] and not scalars.Sites.varying:
                value = memo[4]
            else:
                value = _constant(scalar, shape, kind, True)
                if value.op == "const":
                    memo = (shape, kind, memo[2], scalar, value)
            inputs = (node, value) if node is a else (value, node)
        else:
            return apply(row, *operands(op, a, b))
        built = Node(row, inputs, {}, shape, result or kind)
        number = memo[2]
        if number is None:
            if len(numbers) >= SIGNATURE_MEMO_SIZE:
                numbers.clear()
            number = numbers[shape, kind] = signature(built)
            memo = (shape, kind, number, memo[3], memo[4])
        built.signature = number
        if memo is not seen:
            last[0] = memo
        return built
    build.__name__ = op
    return build


def floating(x):
    """x itself if it is floating-point, else x cast to the default float dtype."""
    if not is_node(x):
        return const(x, (), dtypes.default_float)
    return x if x.dtype.is_float else cast(x, dtypes.default_float)


def no_bool(op, *xs):
    if any((is_node(x) and x.dtype == dtypes.bool_) or isinstance(x, bool) for x in xs):
        fail(DTypeError, op, "is not defined for bool tensors; use logical ops instead")


# ---- arithmetic ----------------------------------------------------------------------------

add = elementwise("add")


@recorded
def sub(a, b):
    no_bool("sub", a, b)
    a, b = operands("sub", a, b)
    return apply("add", a, apply("neg", b))


mul = elementwise("mul")


def neg(x):
    no_bool("neg", x)
    return apply("neg", x)


@recorded
def div(a, b, rounding_mode=None):
    """True division (integers divide as floats), or, with rounding_mode "trunc" or "floor", the
    quotient rounded as PyTorch's: trunc of the rounded quotient, the floor of the exact one.
    Their gradient is zero. An integer division by zero raises when the kernel runs."""
    if rounding_mode in ("floor", "trunc"):
        return rounded_division("div", a, b, rounding_mode)
    if rounding_mode is not None:
        fail(ArgumentError, "div", f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    dtype = result_type(a, b)
    a, b = operands("div", a, b, dtype=dtype if dtype.is_float else dtypes.default_float)
    return apply("mul", a, apply("recip", b))


@recorded
def pow(x, exponent):
    """x ** exponent as PyTorch computes it: the `pow` row, with PyTorch's shortcuts for scalar
    exponents (x ** 2 is x * x, x ** 0.5 a square root, x ** -1 a reciprocal), whose gradients
    the chain rule gives as PyTorch's formula does. x ** 0 is 1 with a zero gradient."""
    if not is_node(x):
        x = const(x, (), result_type(x, exponent))
    if not is_node(exponent) and float(exponent).is_integer() and -1 <= exponent <= 64:
        n = int(exponent)
        x = cast(x, result_type(x, exponent))
        if n == 0:
            return with_zero_gradient(const(1, x.shape, x.dtype), x)
        if n == -1:
            return recip(x) if x.dtype.is_float else _negative_power_of_integers()
        result, base = None, x
        for bit in bin(n)[2:][::-1]:
            if bit == "1":
                result = base if result is None else result * base
            base = base * base
        return result
    if not is_node(exponent) and exponent == 0.5:
        return sqrt(x)
    if not is_node(exponent) and not result_type(x, exponent).is_float and exponent < 0:
        _negative_power_of_integers()
    x, exponent = operands("pow", x, exponent)
    if not x.dtype.is_float:
        return _integer_pow(x, exponent)
    return apply("pow", x, exponent)


def _negative_power_of_integers():
    fail(ArgumentError, "pow", "integers to negative integer powers are not allowed")


def _integer_pow(x, exponent):
    """Exact integer powers by binary exponentiation over the exponent's bits (wrapping as C does).

    A negative exponent gives the result truncated toward zero: 0 unless |x| is 1."""
    result, base = const(1, x.shape, x.dtype), x
    for bit in range(8 * x.dtype.itemsize - 1):
        result = where(ne(bitwise_and(exponent, 1 << bit), 0), result * base, result)
        base = base * base
    odd = ne(bitwise_and(exponent, 1), 0)
    one, minus_one = const(1, x.shape, x.dtype), const(-1, x.shape, x.dtype)
    truncated = where(eq(x, 1), one, where(eq(x, -1), where(odd, minus_one, one), 0))
    return where(lt(exponent, 0), truncated, result)


def recip(x):
    return apply("recip", floating(x))


# ---- transcendental ------------------------------------------------------------------------

def sqrt(x):
    return apply("sqrt", floating(x))


@recorded
def rsqrt(x):
    return recip(sqrt(x))


def exp2(x):
    return apply("exp2", floating(x))


@recorded
def exp(x):
    x = floating(x)
    return apply("exp2", x * LOG2E)


def log2(x):
    return apply("log2", floating(x))


@recorded
def log(x):
    return log2(x) * LN2


def sin(x):
    return apply("sin", floating(x))


def cos(x):
    return apply("cos", floating(x))


@recorded
def tan(x):
    return sin(x) / cos(x)


@recorded
def sigmoid(x):
    """1 / (1 + e^-x), computed from e^-|x| so that neither branch overflows."""
    x = floating(x)
    e = exp(-magnitude(x))
    return where(lt(x, 0.0), e / (e + 1.0), recip(e + 1.0))


@recorded
def tanh(x):
    """tanh from e^-2|x|; a Taylor polynomial near 0 keeps small values exact (it reads x only
    there: far out its powers overflow, and their zero gradient times inf would be NaN)."""
    x = floating(x)
    e = exp(magnitude(x) * -2.0)
    t = (1.0 - e) / (1.0 + e)
    large = where(lt(x, 0.0), -t, t)
    near = lt(magnitude(x), 0.1)
    small = where(near, x, 0.0)
    x2 = small * small
    poly = small * (1.0 + x2 * (-1 / 3 + x2 * (2 / 15 + x2 * (-17 / 315 + x2 * (62 / 2835
                    + x2 * (-1382 / 155925 + x2 * (21844 / 6081075)))))))
    return where(near, poly, large)


@recorded
def erfc(x):
    """Complementary error function (a Chebyshev fit with relative error below 1.2e-7)."""
    x = floating(x)
    z = magnitude(x)
    z = where(lt(30.0, z), 30.0, z)         # erfc(30) is 0 even in float64; z * z must stay finite
    t = recip(z * 0.5 + 1.0)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
            + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223
            + t * 0.17087277))))))))
    tail = t * exp(poly - z * z)
    return where(lt(x, 0.0), 2.0 - tail, tail)


@recorded
def erf(x):
    """Error function: a Taylor series near 0 (exact in float32; it reads x only there, as tanh's
    polynomial), 1 - erfc elsewhere."""
    x = floating(x)
    near = lt(magnitude(x), 0.5)
    small = where(near, x, 0.0)
    x2 = small * small
    series = small * (2 / math.sqrt(math.pi)) * (1.0 + x2 * (-1 / 3 + x2 * (1 / 10 + x2 * (-1 / 42
                      + x2 * (1 / 216 + x2 * (-1 / 1320 + x2 * (1 / 9360 - x2 / 75600)))))))
    return where(near, series, 1.0 - erfc(x))


@recorded
def relu(x):
    """max(x, 0) as PyTorch's: NaN stays NaN (with gradient 1), the gradient at 0 is 0."""
    passes = lt(0, x)
    if x.dtype.is_float:
        passes = logical_or(passes, ne(x, x))
    return where(passes, x, 0)


@recorded
def gelu(x, approximate="none"):
    x = floating(x)
    if approximate == "tanh":
        return x * 0.5 * (tanh((x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)) + 1.0)
    if approximate != "none":
        fail(ArgumentError, "gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * erfc(x * (-1 / math.sqrt(2)))     # erfc keeps the negative tail accurate


@recorded
def silu(x):
    x = floating(x)
    return x * sigmoid(x)


@recorded
def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + e^(beta x)) / beta, linear above threshold as in PyTorch: max(bx, 0) + log1p(e^-|bx|),
    the two sides of 0 taken alike (so that the gradient there is 1/2)."""
    x = floating(x)
    bx = x * beta
    smooth = (where(lt(bx, 0.0), 0.0, bx) + _log1p(exp(-magnitude(bx)))) / beta
    return where(lt(threshold, bx), x, smooth)


def _log1p(u):
    """log(1 + u) for u >= 0, accurate where 1 + u rounds (log(w) * u / (w - 1), w = 1 + u)."""
    w = u + 1.0
    rounded = ne(w, 1.0)
    return where(rounded, log(w) * (u / where(rounded, w - 1.0, 1.0)), u)


# ---- sign and magnitude --------------------------------------------------------------------

@recorded
def sign(x):
    if x.dtype == dtypes.bool_:
        return x
    s = sub(cast(lt(0, x), x.dtype), cast(lt(x, 0), x.dtype))
    return with_zero_gradient(where(ne(x, x), x * 0.0, s), x) if x.dtype.is_float else s


@recorded
def abs_(x):
    """|x| as PyTorch's: +0 at -0, and a gradient sign(x) that is 0 at 0 and at NaN."""
    if not x.dtype.is_float:
        return magnitude(x)
    zero_or_nan = x * 0.0 + 0.0       # +0 at +-0, NaN at NaN, and no gradient
    return where(lt(x, 0), -x, where(lt(0, x), x, zero_or_nan))


def magnitude(x):
    """|x| with gradient 1 at 0: the composites that pair it with a branch chosen by x < 0
    (sigmoid, tanh, softplus) are one-sided there, and need the side x >= 0 consistently."""
    if x.dtype == dtypes.bool_:
        return x
    return where(lt(x, 0), -x, x)


def with_zero_gradient(value, *sources):
    """`value`, keeping each source's autograd history with a zero gradient: PyTorch's results
    of floor, sign, x ** 0 and division with a rounding mode require grad, and their gradient is 0."""
    for source in sources:
        if is_node(source) and source.requires_grad:
            keep = const(True, value.shape, dtypes.bool_)
            value = apply("where", keep, value, expand(cast(source, value.dtype), value.shape))
    return value


# ---- comparison and selection --------------------------------------------------------------

lt = elementwise("cmplt", "lt")


def gt(a, b):
    return lt(b, a)


ne = elementwise("cmpne", "ne")


def eq(a, b):
    return logical_not(ne(a, b))


def le(a, b):
    return logical_or(lt(a, b), eq(a, b))


def ge(a, b):
    return le(b, a)


@recorded
def maximum(a, b):
    return apply("max", *operands("maximum", a, b))


@recorded
def minimum(a, b):
    a, b = operands("minimum", a, b)
    if a.dtype.is_float:
        return -apply("max", -a, -b)
    return bitwise_not(apply("max", bitwise_not(a), bitwise_not(b)))   # exact for every int


@recorded
def where(cond, a, b):
    """a where cond else b, broadcasting all three."""
    dtype = result_type(a, b)
    shape = broadcast_shape("where", *[x.shape for x in (cond, a, b) if is_node(x)])
    cond = cond if is_node(cond) else const(cond, (), dtypes.bool_)
    cond = expand(cast(cond, dtypes.bool_), shape)
    a, b = operands("where", a, b, dtype=dtype)
    return apply("where", cond, expand(a, shape), expand(b, shape))


@recorded
def clamp(x, min=None, max=None):
    """x limited to [min, max]; the gradient passes where x is inside, boundaries included, and
    not at NaN (PyTorch's)."""
    if min is None and max is None:
        fail(ArgumentError, "clamp", "at least one of min and max must be given")
    if is_node(x) and x.dtype.is_float:
        x = where(ne(x, x), x * 0.0, x)        # the same values; no gradient through NaN
    if min is not None:
        x = where(lt(x, min), min, x)
    if max is not None:
        x = where(lt(max, x), max, x)
    return x


# ---- logic ---------------------------------------------------------------------------------

def _bits(op, a, b):
    for x in (a, b):
        if (is_node(x) and x.dtype.is_float) or isinstance(x, float):
            fail(DTypeError, op, "is only defined for integer and bool tensors")
    return apply(op, *operands(op, a, b))


def bitwise_and(a, b):
    return _bits("and", a, b)


def bitwise_or(a, b):
    return _bits("or", a, b)


def bitwise_xor(a, b):
    return _bits("xor", a, b)


def bitwise_not(x):
    if x.dtype.is_float:
        fail(DTypeError, "bitwise_not", "is only defined for integer and bool tensors")
    return apply("xor", x, const(True if x.dtype == dtypes.bool_ else -1, x.shape, x.dtype))


def logical_not(x):
    return apply("xor", cast(x, dtypes.bool_), const(True, x.shape, dtypes.bool_))


def logical_and(a, b):
    return bitwise_and(cast(a, dtypes.bool_), cast(b, dtypes.bool_))


def logical_or(a, b):
    return bitwise_or(cast(a, dtypes.bool_), cast(b, dtypes.bool_))


def logical_xor(a, b):
    return bitwise_xor(cast(a, dtypes.bool_), cast(b, dtypes.bool_))


# Rounding and exact division build on the operations above; their module imports this one, so it
# is imported last, and its functions are this module's too (m.floor, m.remainder, ...).
from metagraph.ops.rounding import (ceil, floor, floor_divide, remainder, round,  # noqa: E402, F401
                                    rounded_division, trunc)
