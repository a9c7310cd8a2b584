"""Rounding and exact division: floor, ceil, trunc, round, floor division and the remainder, with
PyTorch's special values. Their gradient is zero (the remainder's is PyTorch's).

True division is a * recip(b), which can be a unit off: floor and trunc of it would then be 1 off
wherever a / b is (nearly) an integer. Dekker's exact product gives the exact residual a - q * b,
which rounds the quotient correctly and decides the floor.
"""
import math

import numpy as np

from metagraph import dtypes
from metagraph.ops.math import (cast, eq, logical_and, logical_or, lt, magnitude, ne, no_bool, operands,
                                recip, where, with_zero_gradient)
from metagraph.ops.node import detach
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


def _exact_limit(dtype):
    return {2: 2.0 ** 10, 4: 2.0 ** 23, 8: 2.0 ** 52}[dtype.itemsize]


def floor(x):
    """Largest integer <= x; values too large to have a fraction pass through (so do inf, NaN)."""
    if not x.dtype.is_float:
        return x
    whole = cast(cast(x, dtypes.int64), x.dtype)
    floored = where(lt(x, whole), whole - 1.0, whole)
    floored = where(eq(floored, 0), x * 0.0, floored)        # -0 stays -0
    return with_zero_gradient(where(lt(magnitude(x), _exact_limit(x.dtype)), floored, detach(x)), x)


def ceil(x):
    return x if not x.dtype.is_float else -floor(-x)


def trunc(x):
    return x if not x.dtype.is_float else where(lt(x, 0.0), ceil(x), floor(x))


@recorded
def round(x, decimals=0):
    """Round half to even, as PyTorch and NumPy do."""
    if not x.dtype.is_float:
        return x
    if decimals:
        scale = 10.0 ** decimals
        return round(x * scale) / scale
    low = floor(x)
    diff = x - low
    odd = ne(remainder(low, 2.0), 0.0)
    up = logical_or(lt(0.5, diff), logical_and(eq(diff, 0.5), odd))
    return where(up, low + 1.0, low)


@recorded
def floor_divide(a, b):
    """The floor of a / b, exact as Python's and PyTorch's (1.0 // 0.1 is 9); a zero gradient."""
    return rounded_division("floor_divide", a, b, "floor")


@recorded
def remainder(a, b):
    """a mod b with the divisor's sign (Python's %), exact for floats as PyTorch's."""
    no_bool("remainder", a, b)
    a, b = operands("remainder", a, b)
    if not a.dtype.is_float:
        return apply("mod", a, b)
    if a.dtype in dtypes.LOW_PRECISION:     # computed in float32, as PyTorch computes half and bfloat16
        return cast(remainder(cast(a, dtypes.float32), cast(b, dtypes.float32)), a.dtype)
    return _floor_division(a, b)[1]


def rounded_division(op, a, b, mode):
    """a / b rounded down ("floor") or toward zero ("trunc") for `op`, with a zero gradient."""
    return with_zero_gradient(_rounded(op, a, b, mode), a, b)


def _rounded(op, a, b, mode):
    """a / b rounded: idiv for integers, exact arithmetic for floats."""
    no_bool(op, a, b)
    a, b = operands(op, a, b)
    if not a.dtype.is_float:
        quotient = apply("idiv", a, b)
        if mode == "floor":
            return quotient
        inexact = ne(apply("mod", a, b), 0)
        return where(logical_and(inexact, ne(lt(a, 0), lt(b, 0))), quotient + 1, quotient)
    if a.dtype in dtypes.LOW_PRECISION:
        return cast(_rounded(op, cast(a, dtypes.float32), cast(b, dtypes.float32), mode), a.dtype)
    if mode == "trunc":         # trunc of the rounded quotient, as PyTorch: trunc(0.3 / 0.1) is 3
        return trunc(_quotient(a, b)[0])
    return _floor_division(a, b)[0]


_SPLIT = {4: 2.0 ** 12 + 1, 8: 2.0 ** 27 + 1}       # Veltkamp's splitter, 2^ceil(p/2) + 1


def _two_product(a, b):
    """(p, e) with p + e == a * b exactly (Dekker; without overflow or underflow)."""
    split = _SPLIT[a.dtype.itemsize]
    halves = []
    for x in (a, b):
        scaled = x * split
        high = scaled - (scaled - x)
        halves.append((high, x - high))
    (ah, al), (bh, bl) = halves
    p = a * b
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _residual(a, b, q):
    """a - q * b, rounded once, for q within a few units of a / b (then a - p is exact, Sterbenz)."""
    p, e = _two_product(q, b)
    return (a - p) - e


def _quotient(a, b):
    """(a / b correctly rounded, where that refinement is valid): one Newton step on an exact
    residual, for finite a and finite non-zero b whose splits cannot overflow."""
    q = a * recip(b)
    limit = float(np.finfo(a.dtype.np).max) / _SPLIT[a.dtype.itemsize] / 4
    valid = logical_and(logical_and(lt(magnitude(a), math.inf), lt(magnitude(b), limit)),
                        logical_and(ne(b, 0), lt(magnitude(q), limit)))
    safe_q, safe_b = where(valid, q, 0.0), where(valid, b, 1.0)
    residual = _residual(where(valid, a, 0.0), safe_b, safe_q)
    refined = where(eq(residual, 0), safe_q, safe_q + residual * recip(safe_b))   # keeps -0
    return where(valid, refined, q), valid


def _floor_division(a, b):
    """(floor(a / b), a - floor(a / b) * b) for floats, with PyTorch's special values: a zero
    quotient has the sign of a / b and a zero remainder a's; an infinite a gives NaN; an infinite
    b gives 0 or -1 and a or b. The remainder's gradient is PyTorch's: 1 and -floor(a / b)."""
    quotient, valid = _quotient(a, b)
    safe_a, safe_b = where(valid, a, 0.0), where(valid, b, 1.0)
    floored = floor(where(valid, quotient, 0.0))
    over = _residual(safe_a, safe_b, floored)
    passed = where(lt(b, 0), lt(0, over), lt(over, 0))      # the rounded quotient reached the next integer
    floored = where(passed, floored - 1.0, floored)
    p, e = _two_product(floored, safe_b)
    rest = where(lt(a, 0), -((p - safe_a) + e), (safe_a - p) - e)    # a zero rest takes a's sign
    floored = where(valid, where(eq(floored, 0), quotient * 0.0, floored), floor(quotient))
    rest = where(valid, where(eq(a, 0), a, rest), a - floored * b)
    finite_a = lt(magnitude(a), math.inf)
    infinite_b = logical_and(finite_a, eq(magnitude(b), math.inf))
    opposite = logical_and(ne(a, 0), ne(lt(a, 0), lt(b, 0)))
    floored = where(infinite_b, where(opposite, -1.0, quotient), where(finite_a, floored, math.nan))
    floored = where(eq(b, 0), quotient, floored)              # a / 0, as PyTorch
    rest = where(infinite_b, where(opposite, b, a), where(finite_a, rest, math.nan))
    return floored, rest
