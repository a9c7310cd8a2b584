"""Data types and PyTorch's type-promotion rules (Python scalars are weak).

float16 and bfloat16 are storage types: arithmetic on them runs in float32 and rounds back per
operation, and reductions accumulate in float32 (`computed_in`). bfloat16 arrays are numpy arrays
of `ml_dtypes.bfloat16` (numpy has no such type).
"""
import functools
from dataclasses import dataclass

import numpy as np

from metagraph.errors import DTypeError


@dataclass(frozen=True, eq=False)
class DType:
    """A tensor element type (one instance per type: equality is identity)."""
    name: str
    kind: str        # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
    itemsize: int

    @functools.cached_property
    def np(self):
        if self.name == "bfloat16":
            import ml_dtypes                  # 60 ms to import: only when a bfloat16 array is made
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.name)

    @property
    def is_float(self):
        return self.kind == "f"

    @property
    def is_int(self):
        return self.kind in "iu"

    def __repr__(self):
        return f"metagraph.{self.name}"


bool_ = DType("bool", "b", 1)
uint8 = DType("uint8", "u", 1)
int8 = DType("int8", "i", 1)
int16 = DType("int16", "i", 2)
int32 = DType("int32", "i", 4)
int64 = DType("int64", "i", 8)
float16 = DType("float16", "f", 2)
bfloat16 = DType("bfloat16", "f", 2)
float32 = DType("float32", "f", 4)
float64 = DType("float64", "f", 8)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
LOW_PRECISION = frozenset({float16, bfloat16})     # storage types whose arithmetic runs in float32
_BY_NAME = {d.name: d for d in ALL}
_ALIASES = {"float": float32, "double": float64, "half": float16, "int": int32, "long": int64,
            "short": int16, "bool_": bool_}

default_float = float32
default_int = int64


def as_dtype(value):
    """Accept a DType, a numpy dtype, a name like 'float32', or a Python type."""
    if value is None or isinstance(value, DType):
        return value
    if value is bool:
        return bool_
    if value is int:
        return default_int
    if value is float:
        return default_float
    name = getattr(value, "name", value) if not isinstance(value, str) else value
    if isinstance(name, str):
        name = name.rsplit(".", 1)[-1]
        if name in _BY_NAME:
            return _BY_NAME[name]
        if name in _ALIASES:
            return _ALIASES[name]
    try:
        return _BY_NAME[np.dtype(value).name]
    except (TypeError, KeyError):
        raise DTypeError(f"unsupported dtype {value!r}; expected one of "
                         f"{', '.join(d.name for d in ALL)}") from None


def promote(a, b):
    """The smallest dtype that holds both (PyTorch's lattice: uint8 + int8 -> int16)."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a.is_float or b.is_float:
        if a in LOW_PRECISION and b in LOW_PRECISION:       # float16 + bfloat16: neither holds the other
            return float32
        floats = [d for d in (a, b) if d.is_float]
        return max(floats, key=lambda d: d.itemsize)
    if a.kind == b.kind:
        return max(a, b, key=lambda d: d.itemsize)
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: int16, 2: int32, 4: int64, 8: int64}[unsigned.itemsize]


def _combine(higher, lower):
    # PyTorch's combine_categories: a higher-priority operand wins within its category.
    if higher is None:
        return lower
    if higher.is_float:
        return higher
    if higher == bool_ or (lower is not None and lower.is_float):
        return promote(higher, lower)
    return higher


def scalar_dtype(value):
    """The dtype a Python scalar takes when it stands alone."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return default_int
    if isinstance(value, (float, np.floating)):
        return default_float
    raise DTypeError(f"unsupported scalar {value!r} of type {type(value).__name__}")


def result_type(*operands):
    """Promote operands given as DTypes of shaped tensors, (DType, 0) for 0-d tensors, or scalars."""
    dim_result = zero_result = scalar_result = None
    for operand in operands:
        if isinstance(operand, DType):
            dim_result = promote(dim_result, operand)
        elif isinstance(operand, tuple):
            zero_result = promote(zero_result, operand[0])
        else:
            scalar_result = promote(scalar_result, scalar_dtype(operand))
    return _combine(dim_result, _combine(zero_result, scalar_result))


def min_value(d):
    """The smallest value of a dtype (-inf for floats): the identity of max."""
    if d.is_float:
        return float("-inf")
    if d == bool_:
        return False
    return int(np.iinfo(d.np).min)


def computed_in(d):
    """The dtype arithmetic on `d` runs in and reductions of `d` accumulate in: float32 for the
    storage types float16 and bfloat16, else `d` itself."""
    return float32 if d in LOW_PRECISION else d


def finfo(d):
    """numpy's finfo for a float dtype (ml_dtypes' for bfloat16, which numpy's does not know)."""
    if d == bfloat16:
        import ml_dtypes
        return ml_dtypes.finfo(ml_dtypes.bfloat16)
    return np.finfo(d.np)
