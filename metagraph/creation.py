"""Tensor creation: from data, constants, ranges and random numbers."""
import functools
import math

import numpy as np

from metagraph import backend, dtypes
from metagraph.device import CPU_NAME, name as device_name
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.ops import math as m
from metagraph.ops.node import Node
from metagraph.ops.table import apply
from metagraph.random import numpy_generator
from metagraph.runtime import pool
from metagraph.tensor import Tensor


def on_a_device(create, like=False):
    """`create` taking PyTorch's device= keyword (None: the CPU, or with `like`, the device of the
    tensor given first). On another device, data (from a list, an array or a random generator) is
    made on the host and copied there, a constant is placed there; requires_grad applies to the
    result there."""
    @functools.wraps(create)
    def created(*args, device=None, **kwargs):
        if like and device is None:
            target = args[0].node.device or CPU_NAME
        else:
            target = device_name(device)
        if target is CPU_NAME:
            return create(*args, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False)
        node = create(*args, **kwargs).node
        if node.buffer is not None:
            node = backend.to_device(node, target)
        else:
            if node.op == "const":      # (constants are shared nodes: this one is made for the device)
                node = apply("const", value=node.attrs["value"], shape=node.shape, dtype=node.dtype)
            node.device = target        # computed from constants alone, on the device
        return Tensor(node).requires_grad_() if requires_grad else Tensor(node)
    return created


def like_a_tensor(create):
    """on_a_device for the *_like functions: on the device of the tensor they are like by default."""
    return on_a_device(create, like=True)


def _size(size):
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    if any(not isinstance(s, (int, np.integer)) or s < 0 for s in size):
        fail(ShapeError, "creation", f"size must be non-negative integers, got {size}")
    return tuple(int(s) for s in size)


def from_numpy_array(array, dtype=None, requires_grad=False):
    """A realised tensor holding a copy of `array`."""
    dtype = dtypes.as_dtype(dtype) or dtypes.as_dtype(array.dtype)
    buffer = pool.aligned_empty(array.shape, dtype.np)
    buffer[...] = array
    # on the cpu device; a 0-d value, as PyTorch's, goes with tensors of any device (a number)
    tensor = Tensor(Node("buffer", (), {}, buffer.shape, dtype, requires_grad=False, buffer=buffer,
                         device=CPU_NAME if buffer.ndim else None))
    return tensor.requires_grad_() if requires_grad else tensor


@on_a_device
def tensor(data, dtype=None, requires_grad=False):
    """A tensor holding a copy of data (nested lists, scalars, numpy arrays or a Tensor)."""
    if isinstance(data, Tensor):
        array = data.numpy()
    elif isinstance(data, np.ndarray):
        array = data
    else:
        array = _from_data(data, dtypes.as_dtype(dtype))
    if array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16":     # ml_dtypes' is kind "V"
        raise DTypeError(f"tensor(): unsupported element type {array.dtype}")
    return from_numpy_array(array, dtype, requires_grad)


def _from_data(data, dtype):
    """Nested lists or a scalar as a numpy array, read as PyTorch reads them: Python floats give
    float32 (without dtype=), Python ints int64, and a value outside the range of the integer
    dtype it becomes is an error, not a wrapped or rounded number."""
    try:
        array = np.array(data, dtype=np.float64 if dtype is not None and dtype.is_float else None)
    except (ValueError, TypeError) as error:
        ragged = _ragged(data)
        if ragged is not None:
            fail(ShapeError, "tensor", f"the data is ragged: {ragged}")
        fail(DTypeError, "tensor", f"cannot make a tensor from {type(data).__name__} data: {error}")
    if array.dtype.kind == "O" or array.dtype == np.uint64:     # Python ints beyond int64
        numbers = _flattened(data)
        if any(isinstance(v, float) for v in numbers):          # a float makes it all float
            array = np.array(data, dtype=np.float64)
        elif all(isinstance(v, int) for v in numbers):
            _check_range(np.array(numbers, dtype=object), _int_dtype(dtype))
    if array.dtype.kind in "OUSV":
        fail(DTypeError, "tensor", f"cannot make a tensor from {type(data).__name__} data holding "
                                   f"{array.dtype.name} values")
    if dtype is None and array.dtype == np.float64:
        return array.astype(dtypes.default_float.np)
    if dtype is not None and dtype.is_int:
        _check_range(array, dtype)
    return array


def _int_dtype(dtype):
    return dtype if dtype is not None and dtype.is_int else dtypes.int64


def _check_range(values, dtype):
    """Fail for the first of an array's values outside an integer dtype's range. As PyTorch, an
    unsigned dtype takes negative values down to -max (they wrap)."""
    info = np.iinfo(dtype.np)
    low = -int(info.max) if dtype.kind == "u" else int(info.min)
    outside = ~((values >= low) & (values <= int(info.max)))     # NaN is outside too
    if outside.any():
        fail(ArgumentError, "tensor", f"value {values[outside].flat[0]} is outside the range of "
                                      f"{dtype.name} [{low}, {info.max}]")


def _flattened(data):
    """The numbers of nested lists, in order (iteratively: data may be deep)."""
    stack, out = [data], []
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _ragged(data):
    """Where nested sequences stop being rectangular, as a message, or None."""
    level, dim = [data], 0
    while True:
        sequences = [isinstance(v, (list, tuple)) or isinstance(v, np.ndarray) and v.ndim > 0
                     for v in level]
        if not any(sequences):
            return None
        if not all(sequences):
            return f"the entries along dimension {dim - 1} mix sequences and numbers"
        lengths = [len(v) for v in level]
        if len(set(lengths)) > 1:
            odd = next(n for n in lengths if n != lengths[0])
            return f"expected sequences of length {lengths[0]} at dimension {dim}, got one of length {odd}"
        level, dim = [item for v in level for item in v], dim + 1


@on_a_device
def full(size, fill_value, dtype=None, requires_grad=False):
    dtype = dtypes.as_dtype(dtype) or dtypes.scalar_dtype(fill_value)
    result = Tensor(m.const(fill_value, _size((size,) if isinstance(size, int) else size), dtype))
    return result.requires_grad_() if requires_grad else result


@on_a_device
def zeros(*size, dtype=None, requires_grad=False):
    return full(_size(size), 0, dtypes.as_dtype(dtype) or dtypes.default_float, requires_grad)


@on_a_device
def ones(*size, dtype=None, requires_grad=False):
    return full(_size(size), 1, dtypes.as_dtype(dtype) or dtypes.default_float, requires_grad)


empty = zeros


@like_a_tensor
def zeros_like(x, dtype=None, requires_grad=False):
    return full(x.shape, 0, dtype or x.dtype, requires_grad)


@like_a_tensor
def ones_like(x, dtype=None, requires_grad=False):
    return full(x.shape, 1, dtype or x.dtype, requires_grad)


@like_a_tensor
def full_like(x, fill_value, dtype=None, requires_grad=False):
    return full(x.shape, fill_value, dtype or x.dtype, requires_grad)


@on_a_device
def arange(start, end=None, step=1, dtype=None, requires_grad=False):
    """Values from start (inclusive) to end (exclusive) by step."""
    if end is None:
        start, end = 0, start
    if step == 0:
        fail(ArgumentError, "arange", "step must be nonzero")
    count = max(math.ceil((end - start) / step), 0)
    if dtype is None:
        dtype = dtypes.default_float if any(isinstance(v, float) for v in (start, end, step)) \
            else dtypes.default_int
    dtype = dtypes.as_dtype(dtype)
    position = apply("index", shape=(count,), axis=0, dtype=dtypes.int64)
    values = m.cast(position, dtypes.float64) * float(step) + float(start) if dtype.is_float \
        else position * int(step) + int(start)
    result = Tensor(m.cast(values, dtype))
    return result.requires_grad_() if requires_grad else result


@on_a_device
def linspace(start, end, steps, dtype=None, requires_grad=False):
    """`steps` values evenly spaced from start to end, both included."""
    dtype = dtypes.as_dtype(dtype) or dtypes.default_float
    if steps < 0:
        fail(ArgumentError, "linspace", f"number of steps must be non-negative, got {steps}")
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    i = m.cast(apply("index", shape=(steps,), axis=0, dtype=dtypes.int64), dtypes.float64)
    # symmetric, as PyTorch: the second half counts back from the end (one step is `start`)
    half = max(steps // 2, 1)
    values = m.where(m.lt(i, half), i * step + float(start), (i - (steps - 1)) * step + float(end))
    result = Tensor(m.cast(values, dtype))
    return result.requires_grad_() if requires_grad else result


@on_a_device
def eye(n, m_=None, dtype=None, requires_grad=False):
    shape = (n, n if m_ is None else m_)
    rows = apply("index", shape=shape, axis=0, dtype=dtypes.int64)
    cols = apply("index", shape=shape, axis=1, dtype=dtypes.int64)
    result = Tensor(m.cast(m.eq(rows, cols), dtypes.as_dtype(dtype) or dtypes.default_float))
    return result.requires_grad_() if requires_grad else result


@on_a_device
def rand(*size, generator=None, dtype=None, requires_grad=False):
    """Uniform on [0, 1), drawn from `generator` (an mg.Generator; default: the one manual_seed seeds)."""
    dtype = dtypes.as_dtype(dtype) or dtypes.default_float
    return from_numpy_array(numpy_generator("rand", generator).random(_size(size)), dtype, requires_grad)


@on_a_device
def randn(*size, generator=None, dtype=None, requires_grad=False):
    """Standard normal, drawn from `generator` as rand's."""
    dtype = dtypes.as_dtype(dtype) or dtypes.default_float
    return from_numpy_array(numpy_generator("randn", generator).standard_normal(_size(size)), dtype,
                            requires_grad)


@on_a_device
def randint(low, high=None, size=(), *, generator=None, dtype=None):
    """Integers uniform on [low, high), drawn from `generator` as rand's."""
    if high is None:
        low, high = 0, low
    if high <= low:
        fail(ArgumentError, "randint", f"high ({high}) must be greater than low ({low})")
    return from_numpy_array(numpy_generator("randint", generator).integers(low, high, _size(size)),
                            dtypes.as_dtype(dtype) or dtypes.int64)


@on_a_device
def randperm(n, *, generator=None, dtype=None):
    """A random permutation of 0 .. n-1, drawn from `generator` as rand's."""
    return from_numpy_array(numpy_generator("randperm", generator).permutation(n),
                            dtypes.as_dtype(dtype) or dtypes.int64)


@like_a_tensor
def rand_like(x, dtype=None):
    return rand(x.shape, dtype=dtype or x.dtype)


@like_a_tensor
def randn_like(x, dtype=None):
    return randn(x.shape, dtype=dtype or x.dtype)
