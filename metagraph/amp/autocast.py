"""Automatic mixed precision on the CPU, as PyTorch's `torch.autocast("cpu")`.

Inside `autocast(dtype=mg.bfloat16)` (or float16), the ops on PyTorch's CPU lower-precision list
(matmul, linear, the convolutions, attention) cast their floating arguments to that dtype and so
compute and return it; the ops on its float32 list (the losses) cast theirs to float32. Every other
op runs in its arguments' dtype, as PyTorch's do: softmax, the norms, reductions, exp and log of a
float32 value stay float32, and of a bfloat16 one compute in float32 registers (every float16 and
bfloat16 op does) and return bfloat16. Float64 values are never cast, as in PyTorch.

The decision is `cast_arguments`, which those ops call; the lists are `LOWER_PRECISION` and
`FLOAT32`, PyTorch's CPU lists (torch 2.x, aten/src/ATen/autocast_mode.cpp) restricted to the ops
metagraph has, under metagraph's names. The state is process-wide, like `no_grad`'s; composites
recorded for replay (ops/recorded.py) are keyed by it.
"""
import functools

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError
from metagraph.ops.node import Node

LOWER_PRECISION = frozenset({
    "matmul",            # also mm, bmm and the @ operator, which are the same op here
    "einsum",            # PyTorch's einsum runs as bmm, which is on the list
    "linear",
    "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "scaled_dot_product_attention",
    "prelu",
})
FLOAT32 = frozenset({
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits",
})
DTYPES = (dtypes.bfloat16, dtypes.float16)


class AutocastMode:
    """The low dtype autocast casts to, or None outside autocast (and inside enabled=False)."""
    dtype = None


def cast_arguments(op, args, kwargs):
    """(args, kwargs) of a call of `op` with their floating tensors (graph nodes) cast as autocast
    decides: to its dtype for an op on the lower-precision list, to float32 for one on the float32
    list. Float64 and non-float values, and every value outside autocast, pass unchanged."""
    target = AutocastMode.dtype
    if target is None:
        return args, kwargs
    if op in FLOAT32:
        target = dtypes.float32
    elif op not in LOWER_PRECISION:
        return args, kwargs
    return (tuple(_cast(a, target) for a in args),
            {key: _cast(value, target) for key, value in kwargs.items()} if kwargs else kwargs)


def _cast(value, target, wide=False):
    """value cast to `target` if it is a floating node (not float64, unless `wide`)."""
    if type(value) is not Node or not value.dtype.is_float or value.dtype == target or \
            (value.dtype == dtypes.float64 and not wide):
        return value
    from metagraph.ops.math import cast         # ops import this module: imported when first used
    return cast(value, target)


def in_float32(composite):
    """`composite` (softmax, a norm: a function of graph nodes whose first argument is its input)
    computed in float32 when its input is float16 or bfloat16, its float results rounded back to
    that dtype once, as PyTorch's kernels for these ops compute (its parameters may be float32:
    PyTorch's norms take a bfloat16 input with float32 weights and return bfloat16). Without it
    each op of the composite would round (it computes in float32 registers, per op)."""
    @functools.wraps(composite)
    def call(x, *args, **kwargs):
        low = getattr(x, "dtype", None)
        if type(x) is not Node or low not in dtypes.LOW_PRECISION:
            return composite(x, *args, **kwargs)
        args, kwargs = (tuple(_cast(a, dtypes.float32, wide=True) for a in args),
                        {key: _cast(value, dtypes.float32, wide=True) for key, value in kwargs.items()})
        result = composite(_cast(x, dtypes.float32, wide=True), *args, **kwargs)
        if isinstance(result, tuple):
            return (_cast(result[0], low, wide=True),) + result[1:]
        return _cast(result, low, wide=True)
    return call


def autocasting(op, composite):
    """`composite` (a function of graph nodes) with its arguments cast by `cast_arguments(op, ...)`
    first."""
    @functools.wraps(composite)
    def call(*args, **kwargs):
        args, kwargs = cast_arguments(op, args, kwargs)
        return composite(*args, **kwargs)
    return call


class autocast:
    """A block (or decorator) in which matmul, linear, the convolutions and attention compute in
    `dtype` (bfloat16 by default, or float16) and the losses in float32; PyTorch's signature
    (`autocast("cpu", dtype=...)`, `device_type=`, `enabled=`, `cache_enabled=`, accepted and
    ignored: nothing is cached, a cast is a lazy node). Blocks nest; `enabled=False` turns it off
    inside an enclosing block."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        if device_type != "cpu":
            raise ArgumentError(f"autocast: device_type must be 'cpu' (metagraph's one device), "
                                f"got {device_type!r}")
        dtype = dtypes.as_dtype(dtype) if dtype is not None else dtypes.bfloat16
        if dtype not in DTYPES:
            raise DTypeError(f"autocast: dtype must be bfloat16 or float16, got {dtype.name}")
        if not isinstance(enabled, bool):
            raise ArgumentError(f"autocast: enabled must be a bool, got {enabled!r}")
        self.device_type, self.fast_dtype, self.enabled = device_type, dtype, enabled
        self._saved = []

    def __enter__(self):
        self._saved.append(AutocastMode.dtype)
        AutocastMode.dtype = self.fast_dtype if self.enabled else None
        return self

    def __exit__(self, *exc):
        AutocastMode.dtype = self._saved.pop()
        return False

    def __call__(self, function):
        @functools.wraps(function)
        def inside(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self.enabled):
                return function(*args, **kwargs)
        return inside


def is_autocast_enabled(device_type="cpu"):
    """Whether autocast is on (PyTorch's torch.is_autocast_enabled)."""
    return AutocastMode.dtype is not None


def get_autocast_dtype(device_type="cpu"):
    """The dtype autocast casts to when on (bfloat16 unless a block chose float16)."""
    return AutocastMode.dtype or dtypes.bfloat16
