"""Special functions PyTorch has and transformers code calls: inverse trigonometric and hyperbolic
functions, expm1 and log1p, the elu family and other activations, floating-point tests, isclose and
norms. Each is a composite of table rows; none has a gradient of its own.

Composites that choose between formulas feed each formula its input only where it is chosen (a safe
value elsewhere): a branch not taken gets a zero gradient, and zero times its inf would be NaN.
"""
import math

import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, ShapeError, fail
from metagraph.ops import math as m, reduce as rd
from metagraph.ops.movement import reshape
from metagraph.ops.recorded import recorded

INF = math.inf
# Cephes' atan: z + z^3 P(z^2) / Q(z^2) on |z| <= 0.66 (Q monic), relative error about 1e-16
ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
          -1.228866684490136173410e2, -6.485021904942025371773e1)
ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
          4.853903996359136964868e2, 1.945506571482613964425e2)
TAN_3PI_8 = 1 + math.sqrt(2)
PI_2_LOW = 6.123233995736765886130e-17          # pi/2 - float64(pi/2)
LARGE = 2.0 ** 28                               # beyond it asinh(x) = log(2x) to float64
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _odd(x, y):
    """y (computed from |x|) with x's sign."""
    return m.where(m.lt(x, 0.0), -y, y)


def _signbit(x):
    """x < 0, -0.0 included (1 / -0.0 is -inf); comparisons carry no gradient."""
    return m.logical_or(m.lt(x, 0.0), m.lt(m.recip(x), 0.0))


# ---- inverse trigonometric -----------------------------------------------------------------

def _atan_reduced(z):
    zz = z * z
    p = zz * ATAN_P[0] + ATAN_P[1]
    for c in ATAN_P[2:]:
        p = p * zz + c
    q = zz + ATAN_Q[0]
    for c in ATAN_Q[1:]:
        q = q * zz + c
    return z + z * zz * p / q


@recorded
def atan(x):
    """Cephes' reduction of |x| to |z| <= 0.66: beyond tan(3pi/8), z = -1/|x| and pi/2 is added;
    beyond 0.66, z = (|x| - 1)/(|x| + 1) and pi/4 is added."""
    x = m.floating(x)
    a = m.magnitude(x)
    far = m.lt(TAN_3PI_8, a)
    mid = m.logical_and(m.lt(0.66, a), m.logical_not(far))
    inverse = -m.recip(m.where(far, a, 1.0))
    middle = m.where(mid, a, 0.0)
    z = m.where(far, inverse, m.where(mid, (middle - 1.0) / (middle + 1.0), a))
    y = _atan_reduced(z)
    y = m.where(far, (y + PI_2_LOW) + math.pi / 2, m.where(mid, (y + PI_2_LOW / 2) + math.pi / 4, y))
    return _odd(x, y)


def _asin_small(s):
    """asin(s) for |s| <= 1/2, where 1 - s^2 loses nothing."""
    return atan(s / m.sqrt((1.0 - s) * (1.0 + s)))


@recorded
def asin(x):
    """asin(|x|) = pi/2 - 2 asin(sqrt((1 - |x|)/2)) beyond 1/2: exact near 1, where the gradient is
    inf; NaN outside [-1, 1]."""
    x = m.floating(x)
    a = m.magnitude(x)
    far = m.lt(0.5, a)
    t = _asin_small(m.where(far, m.sqrt((1.0 - a) * 0.5), a))
    return _odd(x, m.where(far, math.pi / 2 - t * 2.0, t))


@recorded
def acos(x):
    """pi/2 - asin(x) within 1/2; beyond, 2 asin(sqrt((1 - |x|)/2)) (from pi for x < 0), exact near
    x = 1 where acos is small."""
    x = m.floating(x)
    a = m.magnitude(x)
    far = m.lt(0.5, a)
    t = _asin_small(m.where(far, m.sqrt((1.0 - a) * 0.5), x))
    far_value = m.where(m.lt(x, 0.0), math.pi - t * 2.0, t * 2.0)
    return m.where(far, far_value, math.pi / 2 - t)


@recorded
def atan2(y, x):
    """The angle of (x, y) with C's special values: atan of the smaller magnitude over the larger,
    placed in its octant and quadrant by the signs (-0.0 included). At (0, 0) the gradient is 0,
    not PyTorch's NaN."""
    dtype = m.result_type(y, x)
    y, x = m.operands("atan2", y, x, dtype=dtype if dtype.is_float else dtypes.default_float)
    a, b = m.magnitude(x), m.magnitude(y)
    swap = m.lt(a, b)
    num, den = m.where(swap, a, b), m.where(swap, b, a)
    both_inf = m.logical_and(isinf(a), isinf(b))
    usable = m.logical_and(m.ne(den, 0.0), m.logical_not(both_inf))
    theta = atan(m.where(usable, num, 0.0) / m.where(usable, den, 1.0))
    theta = m.where(both_inf, math.pi / 4, m.where(swap, math.pi / 2 - theta, theta))
    theta = m.where(_signbit(x), math.pi - theta, theta)
    theta = m.where(_signbit(y), -theta, theta)
    return m.where(m.logical_or(isnan(x), isnan(y)), x + y, theta)


# ---- exponential and hyperbolic ------------------------------------------------------------

@recorded
def expm1(x):
    """e^x - 1: within |x| < 1 Kahan's (u - 1) x / log(u), u = e^x, whose rounding of u cancels;
    beyond, e^x - 1, where nothing cancels."""
    x = m.floating(x)
    near = m.lt(m.magnitude(x), 1.0)
    small = m.where(near, x, 0.5)
    u = m.exp(small)
    one = m.eq(u, 1.0)
    safe_u = m.where(one, 2.0, u)
    kahan = m.where(one, small, (safe_u - 1.0) * (small / m.log(safe_u)))
    return m.where(near, kahan, m.exp(m.where(near, 0.0, x)) - 1.0)


@recorded
def log1p(x):
    """log(1 + x) as log(w) * x / (w - 1), w = 1 + x (Goldberg's: the rounding of w cancels); x where
    w rounds to 1, log(w) where w is 0 or inf."""
    x = m.floating(x)
    w = x + 1.0
    usable = m.logical_and(m.logical_and(m.lt(0.0, w), m.lt(w, INF)), m.ne(w, 1.0))
    ratio = m.where(usable, m.where(usable, x, 1.0) / (m.where(usable, w, 2.0) - 1.0), 1.0)
    return m.where(m.eq(w, 1.0), x, m.log(w) * ratio)


@recorded
def sinh(x):
    """From expm1 within |x| < 1 ((E + E/(E+1))/2, no cancellation); beyond, e^|x|/2 - e^-|x|/2
    with e^|x|/2 as (h/2) h, h = e^(|x|/2), finite up to the largest sinh."""
    x = m.floating(x)
    a = m.magnitude(x)
    near = m.lt(a, 1.0)
    e = expm1(m.where(near, a, 0.0))
    h = m.exp(m.where(near, 1.0, a) * 0.5)
    return _odd(x, m.where(near, (e + e / (e + 1.0)) * 0.5, (h * 0.5) * h - 0.5 / h / h))


@recorded
def cosh(x):
    """e^|x|/2 + e^-|x|/2, the first as (h/2) h with h = e^(|x|/2), finite up to the largest cosh."""
    x = m.floating(x)
    h = m.exp(m.magnitude(x) * 0.5)
    return (h * 0.5) * h + 0.5 / h / h


@recorded
def asinh(x):
    """log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), exact near 0; log(2|x|) beyond 2^28, where x^2 could
    overflow."""
    x = m.floating(x)
    a = m.magnitude(x)
    large = m.lt(LARGE, a)
    s = m.where(large, 0.0, a)
    near = log1p(s + s * s / (m.sqrt(s * s + 1.0) + 1.0))
    return _odd(x, m.where(large, m.log(m.where(large, a, 1.0)) + math.log(2.0), near))


@recorded
def acosh(x):
    """log1p(t + sqrt(t) sqrt(t + 2)), t = x - 1 (exact near 1, where the gradient is inf); log(2x)
    beyond 2^28; NaN below 1."""
    x = m.floating(x)
    large = m.lt(LARGE, x)
    t = m.where(large, 2.0, x) - 1.0
    near = log1p(t + m.sqrt(t) * m.sqrt(t + 2.0))       # sqrt(t): NaN below 1, an inf gradient at 1
    return m.where(large, m.log(m.where(large, x, 1.0)) + math.log(2.0), near)


@recorded
def atanh(x):
    """log1p(2|x| / (1 - |x|)) / 2 within 1/2; beyond, (log(1 + |x|) - log(1 - |x|)) / 2, whose
    1 - |x| is exact, inf at 1 (with an inf gradient) and NaN beyond."""
    x = m.floating(x)
    a = m.magnitude(x)
    near = m.lt(a, 0.5)
    s = m.where(near, a, 0.0)
    far = m.where(near, 0.75, a)
    y = m.where(near, log1p(s * 2.0 / (1.0 - s)), m.log(far + 1.0) - m.log(1.0 - far))
    return _odd(x, y * 0.5)


# ---- activations ---------------------------------------------------------------------------

@recorded
def elu(x, alpha=1.0):
    """x above 0, alpha (e^x - 1) at and below (PyTorch's gradient at 0 is alpha)."""
    x = m.floating(x)
    positive = m.lt(0.0, x)
    return m.where(positive, x, expm1(m.where(positive, 0.0, x)) * alpha)


@recorded
def selu(x):
    return elu(x, SELU_ALPHA) * SELU_SCALE


@recorded
def celu(x, alpha=1.0):
    """x above 0, alpha (e^(x/alpha) - 1) at and below."""
    if alpha == 0:
        fail(ArgumentError, "celu", "alpha must not be 0")
    x = m.floating(x)
    positive = m.lt(0.0, x)
    return m.where(positive, x, expm1(m.where(positive, 0.0, x) / alpha) * alpha)


@recorded
def mish(x):
    x = m.floating(x)
    return x * m.tanh(m.softplus(x))


@recorded
def hardswish(x):
    """x (x + 3)/6 inside (-3, 3), 0 at and below -3, x at and above 3 (PyTorch's gradient at the
    edges: 0 at -3, 1 at 3)."""
    x = m.floating(x)
    inside = m.logical_and(m.lt(-3.0, x), m.lt(x, 3.0))
    s = m.where(inside, x, 0.0)
    return m.where(inside, s * (s + 3.0) / 6.0, m.where(m.le(x, -3.0), x * 0.0, x))    # -0, NaN at -inf


@recorded
def hardsigmoid(x):
    """(x + 3)/6 clamped to [0, 1]; as PyTorch's, the gradient is 0 at -3 and 3, and NaN stays NaN."""
    x = m.floating(x)
    inside = m.logical_and(m.lt(-3.0, x), m.lt(x, 3.0))
    y = m.where(inside, (x + 3.0) / 6.0, m.where(m.lt(x, 0.0), 0.0, 1.0))
    return m.where(isnan(x), x, y)


@recorded
def prelu(x, weight):
    """x above 0, weight * x at and below; weight has one value or one per channel (dimension 1)."""
    if weight.numel == 1:
        weight = reshape(weight, ())
    elif x.ndim < 2 or x.shape[1] != weight.numel:
        fail(ShapeError, "prelu", f"weight of {weight.numel} values does not match the channels of "
                                  f"an input of shape {x.shape}")
    else:
        weight = reshape(weight, (weight.numel,) + (1,) * (x.ndim - 2))
    return m.where(m.lt(0.0, x), x, x * weight)


# ---- floating-point tests ------------------------------------------------------------------

def _all(x, value):
    return m.const(value, x.shape, dtypes.bool_)


def isnan(x):
    return m.ne(x, x) if x.dtype.is_float else _all(x, False)


def isinf(x):
    return m.logical_or(m.eq(x, INF), m.eq(x, -INF)) if x.dtype.is_float else _all(x, False)


def isposinf(x):
    return m.eq(x, INF) if x.dtype.is_float else _all(x, False)


def isneginf(x):
    return m.eq(x, -INF) if x.dtype.is_float else _all(x, False)


def isfinite(x):
    """x * 0 is 0 unless x is inf or NaN."""
    return m.eq(x * 0.0, 0.0) if x.dtype.is_float else _all(x, True)


@recorded
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    """NaN, inf and -inf replaced (by default by 0 and the dtype's largest and lowest values); the
    gradient flows only where x is finite."""
    if not x.dtype.is_float:
        return x
    info = dtypes.finfo(x.dtype)
    posinf = float(info.max) if posinf is None else posinf
    neginf = float(info.min) if neginf is None else neginf
    return m.where(isnan(x), nan, m.where(isposinf(x), posinf, m.where(isneginf(x), neginf, x)))


@recorded
def isclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """|a - b| <= atol + rtol |b| where that is finite, and a == b (so inf is close to itself)."""
    a, b = m.operands("isclose", a, b)
    close = m.eq(a, b)
    if not a.dtype.is_float:
        return close
    if equal_nan:
        close = m.logical_or(close, m.logical_and(isnan(a), isnan(b)))
    error = m.abs_(a - b)
    within = m.logical_and(isfinite(error), m.le(error, m.abs_(b) * rtol + atol))
    return m.logical_or(close, within)


# ---- norms ---------------------------------------------------------------------------------

@recorded
def norm(x, p="fro", dim=None, keepdim=False):
    """The vector norm over dim (all elements by default): p = 2 or 'fro', 1, inf or -inf. The
    2-norm's gradient at 0 is 0, as PyTorch's (sqrt's inf there would make it NaN)."""
    x = m.floating(x)
    if p == "fro" or p == 2:
        squares = rd.sum(x * x, dim, keepdim)
        zero = m.eq(squares, 0.0)
        return m.where(zero, 0.0, m.sqrt(m.where(zero, 1.0, squares)))
    if p == 1:
        return rd.sum(m.abs_(x), dim, keepdim)
    if p == INF:
        return rd.amax(m.abs_(x), dim, keepdim)
    if p == -INF:
        return rd.amin(m.abs_(x), dim, keepdim)
    fail(ArgumentError, "norm", f"p must be 2, 'fro', 1, inf or -inf, got {p!r}")


@recorded
def normalize(x, p=2.0, dim=1, eps=1e-12):
    """x divided by its p-norm over dim, the norm at least eps."""
    return x / m.clamp(norm(x, p, dim, keepdim=True), min=eps)
