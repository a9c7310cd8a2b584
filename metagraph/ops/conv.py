"""Windowed operators as reindex maps: conv2d is a reindex, a multiply and a sum.

conv2d reads its padded input at "i0, g*Cg+i4, i2*s+i5*d, i3*s+i6*d" over the loop
(N, K, Ho, Wo, Cg, kh, kw). The padding is a view of x that fusion materialises as a zero-bordered
copy when it is large enough to matter; no im2col buffer exists in the graph.
"""
import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, Unsupported, fail
from metagraph.expr import Const, Extra, Select, Var, binary
from metagraph.ops import math as m
from metagraph.ops.linalg import contract
from metagraph.ops.movement import reshape, view
from metagraph.ops.node import GradMode, Node
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


def pair(op, value, name):
    """An (h, w) pair from an int or a 2-sequence."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or any(not isinstance(v, int) for v in value):
        fail(ShapeError, op, f"{name} must be an int or a pair of ints, got {value}")
    return value


def _batched(op, x, extra_dims=2):
    if x.ndim == extra_dims + 1:
        return reshape(x, (1,) + x.shape), True
    if x.ndim != extra_dims + 2:
        fail(ShapeError, op, f"expects a {extra_dims + 1}-D or {extra_dims + 2}-D input, got {x.shape}")
    return x, False


def _unbatch(x, was_unbatched):
    return reshape(x, x.shape[1:]) if was_unbatched else x


def _out_size(op, size, kernel, stride, pad_before, pad_after, dilation, ceil_mode=False):
    span = size + pad_before + pad_after - dilation * (kernel - 1) - 1
    if span < 0:
        fail(ShapeError, op, f"kernel {kernel} (dilation {dilation}) is larger than the padded "
                             f"input size {size + pad_before + pad_after}")
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_before:
        out -= 1    # the last window must start inside the input or its left padding
    return out


def _reading_taps(size, out, kernel, stride, pad, dilation):
    """(first, last) taps of one kernel axis that read the input for some output position; the
    taps outside read only padding, for every output. (0, kernel - 1) when every tap reads, or
    when none does (the output is then the bias alone and nothing is saved)."""
    reading = [t for t in range(kernel)
               if t * dilation - pad < size and (out - 1) * stride + t * dilation >= pad]
    return (reading[0], reading[-1]) if reading else (0, kernel - 1)


def _padding(op, padding, kernel, dilation, stride):
    """((top, bottom), (left, right)) from an int, a pair, 'valid' or 'same'."""
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        if stride != (1, 1):
            fail(ArgumentError, op, "padding='same' needs stride 1")
        totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in pair(op, padding, "padding"))


def _window(x, loop, lead, rows, cols, padding, fill):
    """A view of NCHW x over `loop` reading x[lead..., row, col]: rows and cols are (output axis,
    stride, tap axis, dilation) of `loop`, `padding` (top, left) how far windows start before x,
    and outside x the view gives `fill`. With padding, windows read a padded view of x, which
    fusion materialises as a copy bordered by `fill` (no bounds test per element in the kernel).
    How a strided window is read fast is the compiler's business (a channel tile vectorises along
    the output channels), not the graph's."""
    (out_row, s0, tap_row, d0), (out_col, s1, tap_col, d1) = rows, cols
    top, left = padding
    row, col = Var(out_row) * s0 + Var(tap_row) * d0, Var(out_col) * s1 + Var(tap_col) * d1
    if not top and not left:
        return view(x, loop, lead + [row, col], fill)
    height = (loop[out_row] - 1) * s0 + (loop[tap_row] - 1) * d0 + 1      # the rows windows read
    width = (loop[out_col] - 1) * s1 + (loop[tap_col] - 1) * d1 + 1
    padded = view(x, x.shape[:2] + (height, width), [Var(0), Var(1), Var(2) - top, Var(3) - left], fill)
    return view(padded, loop, lead + [row, col])


@recorded
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation over NCHW input with (K, C/groups, kh, kw) weights."""
    x, unbatched = _batched("conv2d", x)
    stride, dilation = pair("conv2d", stride, "stride"), pair("conv2d", dilation, "dilation")
    n, c, h, w = x.shape
    if weight.ndim != 4:
        fail(ShapeError, "conv2d", f"weight must be 4-D (K, C/groups, kh, kw), got {weight.shape}")
    k, cg, kh, kw = weight.shape
    if c != cg * groups or k % groups:
        fail(ShapeError, "conv2d", f"input {x.shape} with groups={groups} does not fit weight "
                                   f"{weight.shape} (expects {cg * groups} input channels)")
    (pt, pb), (pl, pr) = _padding("conv2d", padding, (kh, kw), dilation, stride)
    ho = _out_size("conv2d", h, kh, stride[0], pt, pb, dilation[0])
    wo = _out_size("conv2d", w, kw, stride[1], pl, pr, dilation[1])
    if x.dtype != weight.dtype:
        fail(DTypeError, "conv2d", f"input ({x.dtype.name}) and weight ({weight.dtype.name}) "
                                   "need the same dtype")
    # Taps that read only padding (a 3x3 conv over a 1x1 plane reads 8 of its 9 taps from the
    # border) are dropped: the conv reads a slice of the weight, whose gradient is zero there.
    (r0, r1), (c0, c1) = (_reading_taps(*axis) for axis in ((h, ho, kh, stride[0], pt, dilation[0]),
                                                            (w, wo, kw, stride[1], pl, dilation[1])))
    if (r0, c0, r1, c1) != (0, 0, kh - 1, kw - 1) and pt >= r0 * dilation[0] and pl >= c0 * dilation[1]:
        kh, kw, pt, pl = r1 - r0 + 1, c1 - c0 + 1, pt - r0 * dilation[0], pl - c0 * dilation[1]
        weight = view(weight, (k, cg, kh, kw), [Var(0), Var(1), Var(2) + r0, Var(3) + c0])
    channel = Var(4) if groups == 1 else (Var(1) // (k // groups)) * cg + Var(4)
    loop = (n, k, ho, wo, cg, kh, kw)
    window = _window(x, loop, [Var(0), channel], (2, stride[0], 5, dilation[0]),
                     (3, stride[1], 6, dilation[1]), (pt, pl), 0)
    taps = view(weight, loop, [Var(1), Var(4), Var(5), Var(6)])
    out = contract(window, taps, (4, 5, 6))
    if bias is not None:
        out = out + reshape(bias, (k, 1, 1))          # (broadcast at every batch size: loss._channel_view)
    return _unbatch(out, unbatched)


@recorded
def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """The gradient of conv2d with respect to its input, as an operator (a gather, not a scatter)."""
    x, unbatched = _batched("conv_transpose2d", x)
    stride, dilation = pair("conv_transpose2d", stride, "stride"), pair("conv_transpose2d", dilation,
                                                                         "dilation")
    padding = pair("conv_transpose2d", padding, "padding")
    output_padding = pair("conv_transpose2d", output_padding, "output_padding")
    n, cin, h, w = x.shape
    if weight.ndim != 4 or weight.shape[0] != cin or cin % groups:
        fail(ShapeError, "conv_transpose2d", f"weight {weight.shape} does not fit input {x.shape} "
                                             f"with groups={groups}")
    _, cout_g, kh, kw = weight.shape
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        fail(ShapeError, "conv_transpose2d", "output_padding must be smaller than stride or dilation")
    sizes = [(size - 1) * s - 2 * p + d * (k - 1) + op + 1 for size, s, p, d, k, op in
             zip((h, w), stride, padding, dilation, (kh, kw), output_padding)]
    cout, cin_g = cout_g * groups, cin // groups

    def source(out_var, tap_var, s, p, d):
        t = out_var + p - tap_var * d
        return t if s == 1 else Select(binary("==", t % s, 0), t // s, Const(-1))

    channel = Var(4) if groups == 1 else (Var(1) // cout_g) * cin_g + Var(4)
    loop = (n, cout, sizes[0], sizes[1], cin_g, kh, kw)
    window = view(x, loop, [Var(0), channel, source(Var(2), Var(5), stride[0], padding[0], dilation[0]),
                            source(Var(3), Var(6), stride[1], padding[1], dilation[1])])
    taps = view(weight, loop, [channel, Var(1) % cout_g if groups > 1 else Var(1), Var(5), Var(6)])
    out = contract(window, taps, (4, 5, 6))
    if bias is not None:
        out = out + reshape(bias, (cout, 1, 1))      # (broadcast at every batch size: loss._channel_view)
    return _unbatch(out, unbatched)


def _pool_window(op, x, kernel, stride, padding, dilation, ceil_mode, fill):
    kernel = pair(op, kernel, "kernel_size")
    stride = kernel if stride is None or stride == () else pair(op, stride, "stride")
    padding, dilation = pair(op, padding, "padding"), pair(op, dilation, "dilation")
    if any(p * 2 > k for p, k in zip(padding, kernel)):
        fail(ShapeError, op, f"padding {padding} should be at most half of kernel size {kernel}")
    n, c, h, w = x.shape
    ho = _out_size(op, h, kernel[0], stride[0], padding[0], padding[0], dilation[0], ceil_mode)
    wo = _out_size(op, w, kernel[1], stride[1], padding[1], padding[1], dilation[1], ceil_mode)
    window = _window(x, (n, c, ho, wo) + kernel, [Var(0), Var(1)], (2, stride[0], 4, dilation[0]),
                     (3, stride[1], 5, dilation[1]), padding, fill)
    return window, kernel, stride, padding


@recorded
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """The maximum of each window. Its gradient goes to the window's first maximum in PyTorch's
    scan order (row by row, padding skipped; a NaN wins), not shared among ties as amax's is."""
    x, unbatched = _batched("max_pool2d", x)
    window, kernel, stride, padding = _pool_window("max_pool2d", x, kernel_size, stride, padding,
                                                   dilation, ceil_mode, dtypes.min_value(x.dtype))
    out = apply("reduce", window, op="max", axes=(4, 5), keepdim=False)
    takes_grad = GradMode.enabled and x.requires_grad
    if not return_indices and not takes_grad:
        return _unbatch(out, unbatched)
    from metagraph.ops.reduce import amin, positions
    n, c, ho, wo = out.shape
    flat = (n, c, ho, wo, kernel[0] * kernel[1])
    inside, _, _, _ = _pool_window("max_pool2d", m.const(True, x.shape, dtypes.bool_), kernel_size,
                                   stride, padding, dilation, ceil_mode, False)
    taps = reshape(window, flat)
    position = positions(flat, 4)
    best = m.logical_or(m.eq(taps, m.expand(reshape(out, flat[:4] + (1,)), flat)), m.ne(taps, taps))
    tap = amin(m.where(m.logical_and(reshape(inside, flat), best), position, flat[4]), dim=4)
    if takes_grad:      # the value read back at that tap, so that the gradient goes there only
        chosen = m.eq(position, m.expand(reshape(tap, flat[:4] + (1,)), flat))
        out = apply("reduce", m.where(chosen, taps, 0), op="add", axes=(4,), keepdim=False)
    if not return_indices:
        return _unbatch(out, unbatched)
    dilation = pair("max_pool2d", dilation, "dilation")
    tap = m.cast(tap, dtypes.int64)
    rows = apply("index", shape=out.shape, axis=2, dtype=dtypes.int64) * stride[0] + \
        apply("idiv", tap, m.const(kernel[1], tap.shape, dtypes.int64)) * dilation[0] - padding[0]
    cols = apply("index", shape=out.shape, axis=3, dtype=dtypes.int64) * stride[1] + \
        apply("mod", tap, m.const(kernel[1], tap.shape, dtypes.int64)) * dilation[1] - padding[1]
    return _unbatch(out, unbatched), _unbatch(rows * x.shape[3] + cols, unbatched)


def _window_count(shape, loop, index_map, dtype):
    """How many in-range elements each window covers (a sum over a reindexed constant)."""
    ones = view(m.const(1, shape, dtype), loop, index_map)
    return apply("reduce", ones, op="add", axes=(2, 3), keepdim=False)


@recorded
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    x, unbatched = _batched("avg_pool2d", x)
    x = m.floating(x)
    window, kernel, stride, padding = _pool_window("avg_pool2d", x, kernel_size, stride, padding,
                                                   1, ceil_mode, 0)
    total = apply("reduce", window, op="add", axes=(4, 5), keepdim=False)
    if divisor_override:
        return _unbatch(total / divisor_override, unbatched)
    h, w = x.shape[2:]
    ho, wo = total.shape[2:]
    loop = (ho, wo) + kernel
    if count_include_pad:       # windows count padding, but not what lies past it (ceil_mode)
        count = _window_count((h + 2 * padding[0], w + 2 * padding[1]), loop,
                              [Var(0) * stride[0] + Var(2), Var(1) * stride[1] + Var(3)], x.dtype)
    else:
        count = _window_count((h, w), loop, [Var(0) * stride[0] + Var(2) - padding[0],
                                             Var(1) * stride[1] + Var(3) - padding[1]], x.dtype)
    return _unbatch(total / count, unbatched)


def _adaptive_axis(var, tap, size, out):
    start = (var * size) // out
    end = ((var + 1) * size + out - 1) // out
    width = max(((i + 1) * size + out - 1) // out - (i * size) // out for i in range(out))
    return Select(binary("<", tap, end - start), start + tap, Const(-1)), width


@recorded
def adaptive_avg_pool2d(x, output_size):
    """Average over windows [floor(i*H/Ho), ceil((i+1)*H/Ho)) as PyTorch."""
    x, unbatched = _batched("adaptive_avg_pool2d", x)
    x = m.floating(x)
    n, c, h, w = x.shape
    output_size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    ho, wo = (h if output_size[0] is None else output_size[0]), (w if output_size[1] is None
                                                                 else output_size[1])
    if ho <= 0 or wo <= 0:
        fail(ShapeError, "adaptive_avg_pool2d", f"output size must be positive, got {output_size}")
    rows, kh = _adaptive_axis(Var(2), Var(4), h, ho)
    cols, kw = _adaptive_axis(Var(3), Var(5), w, wo)
    window = view(x, (n, c, ho, wo, kh, kw), [Var(0), Var(1), rows, cols])
    total = apply("reduce", window, op="add", axes=(4, 5), keepdim=False)
    count_rows, _ = _adaptive_axis(Var(0), Var(2), h, ho)
    count_cols, _ = _adaptive_axis(Var(1), Var(3), w, wo)
    count = _window_count((h, w), (ho, wo, kh, kw), [count_rows, count_cols], x.dtype)
    return _unbatch(total / count, unbatched)


def _table(values):
    array = np.ascontiguousarray(values, dtype=np.int64)
    return Node("buffer", (), {}, array.shape, dtypes.int64, buffer=array)


def _weights(values, dtype):
    array = np.ascontiguousarray(values, dtype=dtype.np)
    return Node("buffer", (), {}, array.shape, dtype, buffer=array)


def _source_positions(size, out, scale_factor, align_corners, nearest):
    """Per output position: the source coordinate along one axis (PyTorch's conventions)."""
    dst = np.arange(out, dtype=np.float64)
    if nearest:
        scale = 1.0 / scale_factor if scale_factor else size / out
        return np.minimum(np.floor(dst * scale), size - 1)
    if align_corners:
        return dst * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    scale = 1.0 / scale_factor if scale_factor else size / out
    return np.maximum((dst + 0.5) * scale - 0.5, 0.0)


# not @recorded: its index tables are buffers it makes, so no call of it could be replayed
def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Resize the last two dimensions of NCHW input (nearest or bilinear)."""
    if x.ndim != 4:
        fail(ShapeError, "interpolate", f"expects 4-D NCHW input, got {x.shape}")
    if (size is None) == (scale_factor is None):
        fail(ArgumentError, "interpolate", "give exactly one of size and scale_factor")
    if mode not in ("nearest", "bilinear"):
        fail(Unsupported, "interpolate", f"mode must be 'nearest' or 'bilinear', got {mode!r}")
    if mode == "nearest" and align_corners is not None:
        fail(ArgumentError, "interpolate", "align_corners only applies to bilinear mode")
    n, c, h, w = x.shape
    scales = (None, None) if scale_factor is None else (
        (scale_factor, scale_factor) if not isinstance(scale_factor, (tuple, list)) else scale_factor)
    if size is None:
        size = (int(np.floor(h * scales[0])), int(np.floor(w * scales[1])))
    size = (size, size) if isinstance(size, int) else tuple(size)
    src = [_source_positions(s, o, f, bool(align_corners), mode == "nearest")
           for s, o, f in zip((h, w), size, scales)]
    shape = (n, c) + size
    if mode == "nearest":
        tables = [_table(s) for s in src]
        return apply("reindex", x, *tables, shape=shape, fill=0, checked=True,
                     index_map=(Var(0), Var(1), Extra(0, (Var(2),)), Extra(1, (Var(3),))))
    if x.dtype == dtypes.uint8:
        return _bilinear_uint8(x, size, scales, bool(align_corners))
    x = m.floating(x)
    low = [np.minimum(np.floor(s), size_in - 1) for s, size_in in zip(src, (h, w))]
    high = [np.minimum(lo + 1, size_in - 1) for lo, size_in in zip(low, (h, w))]
    tables = [_table(t) for t in (low[0], high[0], low[1], high[1])]
    lam_h = reshape(_weights(src[0] - low[0], x.dtype), (size[0], 1))
    lam_w = _weights(src[1] - low[1], x.dtype)

    def corner(row_table, col_table):
        return apply("reindex", x, *tables, shape=shape, fill=0, checked=True,
                     index_map=(Var(0), Var(1), Extra(row_table, (Var(2),)), Extra(col_table, (Var(3),))))
    top = corner(0, 2) * (1.0 - lam_w) + corner(0, 3) * lam_w
    bottom = corner(1, 2) * (1.0 - lam_w) + corner(1, 3) * lam_w
    return top * (1.0 - lam_h) + bottom * lam_h


def _bilinear_uint8(x, size, scales, align_corners):
    """PyTorch's bilinear resize of uint8 images, to the same bytes: a pass along the width, then
    one along the height (each only where the size changes), each a two-tap sum with weights in
    fixed point, rounded half up and clamped to [0, 255]."""
    out = m.cast(x, dtypes.int64)
    for axis in (3, 2):
        if size[axis - 2] != x.shape[axis]:
            out = _fixed_point_pass(out, axis, size[axis - 2], scales[axis - 2], align_corners)
    return m.cast(out, dtypes.uint8)


def _fixed_point_pass(x, axis, size, scale_factor, align_corners):
    taps, weights, precision = _fixed_point_taps(x.shape[axis], size, scale_factor, align_corners)
    shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
    index_map = tuple(Extra(0, (Var(axis),)) if d == axis else Var(d) for d in range(x.ndim))
    total = m.const(1 << (precision - 1), (), dtypes.int64)       # rounds half up
    for k in range(2):
        tap = apply("reindex", x, _table(taps[:, k]), shape=shape, index_map=index_map, fill=0,
                    checked=True)
        weight = _weights(weights[:, k].reshape((size,) + (1,) * (x.ndim - 1 - axis)), dtypes.int64)
        total = total + tap * weight
    return m.clamp(m.floor_divide(total, 1 << precision), 0, 255)


def _fixed_point_taps(size, out, scale_factor, align_corners):
    """(taps (out, 2), their weights as integers, precision p: a weight w is round(w * 2^p), p as
    large as int16 weights allow), as PyTorch's uint8 kernels compute them."""
    if align_corners:
        scale, delta = ((size - 1) / (out - 1) if out > 1 else 0.0), 0.5
    else:
        scale, delta = (1.0 / scale_factor if scale_factor else size / out), 0.0
    center = scale * (np.arange(out) + 0.5 - delta)
    first = np.maximum((center - 0.5 + delta).astype(np.int64), 0)     # truncated toward zero
    end = np.minimum((center + 1.5 + delta).astype(np.int64), size)
    taps = first[:, None] + np.arange(2)
    weights = np.maximum(1 - np.abs(taps - center[:, None] + 0.5 - delta), 0) * (taps < end[:, None])
    total = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, total, out=weights, where=total != 0)
    precision = 0
    while precision < 22 and int(0.5 + weights.max() * (1 << (precision + 1))) < 1 << 15:
        precision += 1
    return np.minimum(taps, size - 1), np.floor(0.5 + weights * (1 << precision)), precision
