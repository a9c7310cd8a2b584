"""Ops a backend does not render, written with rows it does: exact rewrites of kernel-IR values.

A code generator declares the table rows it renders (`CompiledBackend.renders`); lowering asks
here for the others. Each rule is exact (same bits, same NaN and overflow behaviour, same error
on a zero divisor), so a backend that leaves one out still matches the oracle. Rows with no exact
composition from the others (sqrt, exp2, log2, sin, cos, pow, recip, cmplt, cmpne, where, cast,
and, or, xor, idiv) have no rule: a backend must render them.

float16 and bfloat16 are storage types, for every backend alike (`widened`): an op on them is the
op in float32 between a widening and a narrowing cast, so each op rounds once, as the oracle's
does, and a backend renders only their loads, stores, constants and casts to and from float32
(bfloat16's other casts pass through float32, as ml_dtypes' and PyTorch's do). A load that is
widened is a float32 `Load` of the low-precision parameter, converted as it is read: the loop-nest
rules see a load (a conv's weights still pack into a channel tile, converted once there; as a
cast of a load, ResNet-18's bfloat16 input gradients ran 67 times slower than float32's).
"""
import numpy as np

from metagraph import dtypes
from metagraph.compiler import ir
from metagraph.errors import MetagraphError

LOW = dtypes.LOW_PRECISION


def _neg(x, dtype, site):
    return ir.Apply("mul", (x, ir.Scalar(-1, dtype)), dtype)


def _max(a, b, dtype, site):
    """a where b < a or a is NaN, else b: the table's max (NaN wins, the second operand on ties)."""
    greater = ir.Apply("cmplt", (b, a), dtypes.bool_)
    if dtype.is_float:
        greater = ir.Apply("or", (greater, ir.Apply("cmpne", (a, a), dtypes.bool_)), dtypes.bool_)
    return ir.Apply("where", (greater, a, b), dtype)


def _mod(a, b, dtype, site):
    """a - floor(a / b) * b, with the division's zero-divisor error."""
    product = ir.Apply("mul", (ir.Apply("idiv", (a, b), dtype, site), b), dtype)
    return ir.Apply("add", (a, ir.Apply("mul", (product, ir.Scalar(-1, dtype)), dtype)), dtype)


RULES = {"neg": _neg, "max": _max, "mod": _mod}


def apply(op, args, dtype, site, renders):
    """The IR value of table op `op` on `args`, decomposed when the backend does not render it
    (and computed in float32 when it involves float16 or bfloat16)."""
    if dtype in LOW or any(arg.dtype in LOW for arg in args):
        return _widened(op, args, dtype, site, renders)
    if renders is None or op in renders:
        return ir.Apply(op, args, dtype, site)
    if op not in RULES:
        raise MetagraphError(f"the backend does not render the table op {op!r}, and {op!r} has no exact "
                             f"decomposition into other rows; a backend must render it")
    return _check(RULES[op](*args, dtype, site), renders)


def _check(value, renders):
    """Every op a rule uses must be one the backend renders (rules use no decomposable op)."""
    if isinstance(value, ir.Apply):
        if value.op not in renders:
            raise MetagraphError(f"decomposing for this backend needs the table op {value.op!r}, "
                                 f"which it does not render")
        for arg in value.args:
            _check(arg, renders)
    return value


def widen(value):
    """A float16 or bfloat16 value as float32 (exact); any other value as it is."""
    if value.dtype not in LOW:
        return value
    if isinstance(value, ir.Load):
        return ir.Load(value.param, value.index, dtypes.float32, value.valid)
    if isinstance(value, ir.Scalar):
        return ir.Scalar(float(np.array(value.value, value.dtype.np)), dtypes.float32)
    return ir.Apply("cast", (value,), dtypes.float32)


def narrow(value, dtype):
    """A float32 value rounded to the storage type `dtype` (float16 or bfloat16)."""
    return ir.Apply("cast", (value,), dtype)


def index_value(expr, dtype):
    """The `index` meta-op's value: an integer loop index as `dtype` (through float32 for the
    storage types, exact below 2^24)."""
    if dtype not in LOW:
        return ir.IndexValue(expr, dtype)
    return narrow(ir.IndexValue(expr, dtypes.float32), dtype)


def _widened(op, args, dtype, site, renders):
    """An op on float16 or bfloat16 values: computed in float32 and rounded back once. A cast
    between a storage type and float32 is what backends render; bfloat16's casts to and from
    any other type pass through float32 (float16's stay direct: numpy rounds float64 to float16
    once)."""
    if op == "cast":
        source = args[0].dtype
        if dtypes.float32 in (source, dtype) or source == dtype:
            return ir.Apply("cast", args, dtype)
        if dtypes.bfloat16 in (source, dtype):
            inner = widen(args[0]) if source in LOW else ir.Apply("cast", args, dtypes.float32)
            return ir.Apply("cast", (inner,), dtype)
        return ir.Apply("cast", args, dtype)
    result = apply(op, tuple(widen(arg) for arg in args), dtypes.computed_in(dtype), site, renders)
    return narrow(result, dtype) if dtype in LOW else result
