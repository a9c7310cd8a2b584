"""Convolutions over one and three spatial dimensions, built on conv2d's reindex + mul + sum.

conv1d and conv_transpose1d are their 2-D counterparts over a plane of height 1 (a reshape, which
shares the buffer), so they get conv2d's fast path. conv3d reads its input at
"i0, g*Cg+i5, i2*s+i6*d-p, i3*s+i7*d-p, i4*s+i8*d-p" over the loop (N, K, Do, Ho, Wo, Cg, kd, kh,
kw), reading 0 outside the input, and sums over the last four loop axes; conv_transpose3d gathers
as conv_transpose2d does. interpolate resamples one spatial axis at a time, each output a sum of
1 (nearest), 2 (linear) or 4 (cubic) taps read through index tables, times weights. Their
gradients come from the table like every other composite's.
"""
import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, Unsupported, fail
from metagraph.expr import Const, Extra, Select, Var, binary
from metagraph.ops import conv, math as m
from metagraph.ops.linalg import contract
from metagraph.ops.movement import reshape, view
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


def ntuple(op, value, n, name):
    """An n-tuple of ints from an int or an n-sequence."""
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n or any(not isinstance(v, int) for v in value):
        fail(ShapeError, op, f"{name} must be an int or {n} ints, got {value}")
    return value


def _as_2d(x):
    """(N, C, L) or (C, L) as a plane of height 1."""
    return reshape(x, x.shape[:-1] + (1, x.shape[-1]))


def _from_2d(out):
    return reshape(out, out.shape[:-2] + (out.shape[-1],))


@recorded
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation over NCL input with (K, C/groups, k) weights: conv2d at height 1."""
    if x.ndim not in (2, 3) or weight.ndim != 3:
        fail(ShapeError, "conv1d", f"expects (N, C, L) or (C, L) input and (K, C/groups, k) weight, "
                                   f"got {x.shape} and {weight.shape}")
    if isinstance(padding, str):
        if padding == "same" and ntuple("conv1d", stride, 1, "stride") != (1,):
            fail(ArgumentError, "conv1d", "padding='same' needs stride 1")
    else:
        padding = (0,) + ntuple("conv1d", padding, 1, "padding")
    out = conv.conv2d(_as_2d(x), _as_2d(weight), bias, (1,) + ntuple("conv1d", stride, 1, "stride"),
                      padding, (1,) + ntuple("conv1d", dilation, 1, "dilation"), groups)
    return _from_2d(out)


@recorded
def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The gradient of conv1d with respect to its input, as an operator: conv_transpose2d at height 1."""
    if x.ndim not in (2, 3) or weight.ndim != 3:
        fail(ShapeError, "conv_transpose1d", f"expects (N, C, L) or (C, L) input and (C, K/groups, k) "
                                             f"weight, got {x.shape} and {weight.shape}")
    one = lambda value, name: (1,) + ntuple("conv_transpose1d", value, 1, name)  # noqa: E731
    out = conv.conv_transpose2d(_as_2d(x), _as_2d(weight), bias, one(stride, "stride"),
                                (0,) + ntuple("conv_transpose1d", padding, 1, "padding"),
                                (0,) + ntuple("conv_transpose1d", output_padding, 1, "output_padding"),
                                groups, one(dilation, "dilation"))
    return _from_2d(out)


def _padding3d(padding, kernel, dilation, stride):
    """((before, after),) * 3 from an int, a triple, 'valid' or 'same'."""
    if padding == "valid":
        return ((0, 0),) * 3
    if padding == "same":
        if stride != (1, 1, 1):
            fail(ArgumentError, "conv3d", "padding='same' needs stride 1")
        totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in ntuple("conv3d", padding, 3, "padding"))


@recorded
def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D cross-correlation over NCDHW input with (K, C/groups, kd, kh, kw) weights."""
    x, unbatched = conv._batched("conv3d", x, 3)
    stride, dilation = ntuple("conv3d", stride, 3, "stride"), ntuple("conv3d", dilation, 3, "dilation")
    if weight.ndim != 5:
        fail(ShapeError, "conv3d", f"weight must be 5-D (K, C/groups, kd, kh, kw), got {weight.shape}")
    n, c = x.shape[:2]
    k, cg = weight.shape[:2]
    kernel = weight.shape[2:]
    if c != cg * groups or k % groups:
        fail(ShapeError, "conv3d", f"input {x.shape} with groups={groups} does not fit weight "
                                   f"{weight.shape} (expects {cg * groups} input channels)")
    if x.dtype != weight.dtype:
        fail(DTypeError, "conv3d", f"input ({x.dtype.name}) and weight ({weight.dtype.name}) "
                                   "need the same dtype")
    pads = _padding3d(padding, kernel, dilation, stride)
    sizes = tuple(conv._out_size("conv3d", size, kk, s, before, after, d) for size, kk, s, (before, after), d
                  in zip(x.shape[2:], kernel, stride, pads, dilation))
    channel = Var(5) if groups == 1 else (Var(1) // (k // groups)) * cg + Var(5)
    loop = (n, k) + sizes + (cg,) + tuple(kernel)
    # Padding that the windows read but the input does not cover gives 0 (the view's fill).
    window = view(x, loop, [Var(0), channel] + [Var(2 + a) * stride[a] + Var(6 + a) * dilation[a] - pads[a][0]
                                                for a in range(3)], 0)
    taps = view(weight, loop, [Var(1), Var(5), Var(6), Var(7), Var(8)])
    out = contract(window, taps, (5, 6, 7, 8))
    if bias is not None:
        out = out + reshape(bias, (k, 1, 1, 1))       # (broadcast at every batch size: loss._channel_view)
    return conv._unbatch(out, unbatched)


@recorded
def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The gradient of conv3d with respect to its input, as an operator (a gather, not a scatter)."""
    op = "conv_transpose3d"
    x, unbatched = conv._batched(op, x, 3)
    stride, dilation = ntuple(op, stride, 3, "stride"), ntuple(op, dilation, 3, "dilation")
    padding = ntuple(op, padding, 3, "padding")
    output_padding = ntuple(op, output_padding, 3, "output_padding")
    n, cin = x.shape[:2]
    if weight.ndim != 5 or weight.shape[0] != cin or cin % groups:
        fail(ShapeError, op, f"weight {weight.shape} does not fit input {x.shape} with groups={groups}")
    cout_g, kernel = weight.shape[1], weight.shape[2:]
    if any(o >= max(s, d) for o, s, d in zip(output_padding, stride, dilation)):
        fail(ShapeError, op, "output_padding must be smaller than stride or dilation")
    sizes = tuple((size - 1) * s - 2 * p + d * (kk - 1) + o + 1 for size, s, p, d, kk, o in
                  zip(x.shape[2:], stride, padding, dilation, kernel, output_padding))
    cout, cin_g = cout_g * groups, cin // groups

    def source(axis):
        """The input position output position `axis` reads at its tap, or -1 (fill 0) between strides."""
        t = Var(2 + axis) + padding[axis] - Var(6 + axis) * dilation[axis]
        s = stride[axis]
        return t if s == 1 else Select(binary("==", t % s, 0), t // s, Const(-1))

    channel = Var(5) if groups == 1 else (Var(1) // cout_g) * cin_g + Var(5)
    loop = (n, cout) + sizes + (cin_g,) + tuple(kernel)
    window = view(x, loop, [Var(0), channel] + [source(a) for a in range(3)])
    taps = view(weight, loop, [channel, Var(1) % cout_g if groups > 1 else Var(1), Var(6), Var(7), Var(8)])
    out = contract(window, taps, (5, 6, 7, 8))
    if bias is not None:
        out = out + reshape(bias, (cout, 1, 1, 1))   # (broadcast at every batch size: loss._channel_view)
    return conv._unbatch(out, unbatched)


# ---- interpolation: one pass of a few weighted taps per spatial axis --------------------------

_MODES = {"nearest": None, "nearest-exact": None, "linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}
CUBIC_A = -0.75         # PyTorch's (and OpenCV's) cubic convolution coefficient


def _source(size, out, scale_factor, align_corners, mode):
    """Per output position: the source coordinate along one axis, as PyTorch computes it."""
    dst = np.arange(out, dtype=np.float64)
    scale = 1.0 / scale_factor if scale_factor else size / out
    if mode == "nearest":
        return np.minimum(np.floor(dst * scale), size - 1)
    if mode == "nearest-exact":
        return np.minimum(np.floor((dst + 0.5) * scale), size - 1)
    if align_corners:
        return dst * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    src = (dst + 0.5) * scale - 0.5
    return src if mode == "bicubic" else np.maximum(src, 0.0)     # cubic reads left of 0, clamped


def _cubic_weights(t):
    """The four weights of taps floor(src) - 1 .. floor(src) + 2 at fraction t (Keys, A = -0.75)."""
    a = CUBIC_A

    def near(d):                # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):                 # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(size, src, mode):
    """[(source index per output position, weight per output position)] along one axis."""
    if mode in ("nearest", "nearest-exact"):
        return [(src, None)]
    low = np.floor(src)
    if mode == "bicubic":
        return [(np.clip(low - 1 + k, 0, size - 1), w) for k, w in enumerate(_cubic_weights(src - low))]
    low = np.minimum(low, size - 1)
    lam = src - low
    return [(low, 1.0 - lam), (np.minimum(low + 1, size - 1), lam)]


def _resample(x, axis, taps):
    """sum_k x read at taps[k]'s index along axis, times its weight (broadcast over later axes)."""
    out_size = len(taps[0][0])
    shape = x.shape[:axis] + (out_size,) + x.shape[axis + 1:]
    index_map = tuple(Extra(0, (Var(axis),)) if d == axis else Var(d) for d in range(x.ndim))
    total = None
    for index, weight in taps:
        tap = apply("reindex", x, conv._table(index), shape=shape, index_map=index_map, fill=0, checked=True)
        if weight is not None:
            tap = m.mul(tap, conv._weights(weight.reshape((out_size,) + (1,) * (x.ndim - 1 - axis)), x.dtype))
        total = tap if total is None else m.add(total, tap)
    return total


# not recorded: its index tables are buffers it makes, as conv.interpolate's
def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resize the spatial dimensions of (N, C, ...) input as torch.nn.functional.interpolate: modes
    nearest, nearest-exact (3-D to 5-D), linear (3-D), bilinear and bicubic (4-D), trilinear (5-D).
    Each axis is one pass of 1, 2 or 4 weighted taps; 4-D nearest and bilinear are conv's."""
    if mode not in _MODES:
        fail(Unsupported, "interpolate", f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    if antialias:
        fail(Unsupported, "interpolate", "antialias=True is not supported")
    expected = (3, 4, 5) if _MODES[mode] is None else (_MODES[mode],)
    if x.ndim not in expected:
        fail(ShapeError, "interpolate", f"mode {mode!r} does not take a {x.ndim}-D input {x.shape}")
    if _MODES[mode] is None and align_corners is not None:
        fail(ArgumentError, "interpolate", "align_corners only applies to linear, bilinear, bicubic and "
                                           "trilinear modes")
    if (size is None) == (scale_factor is None):
        fail(ArgumentError, "interpolate", "give exactly one of size and scale_factor")
    spatial = x.shape[2:]
    if scale_factor is None:
        scales = [None] * len(spatial)
    elif isinstance(scale_factor, (tuple, list)):
        scales = list(scale_factor)
        if len(scales) != len(spatial):
            fail(ShapeError, "interpolate", f"scale_factor {scale_factor} does not fit input {x.shape}")
    else:
        scales = [scale_factor] * len(spatial)
    if size is None:
        size = tuple(int(np.floor(s * f)) for s, f in zip(spatial, scales))
    size = ntuple("interpolate", size, len(spatial), "size")
    if recompute_scale_factor:
        scales = [None] * len(spatial)
    if mode in ("nearest", "bilinear") and x.ndim == 4:
        if scales[0] is None:
            return conv.interpolate(x, size, None, mode, align_corners)
        return conv.interpolate(x, None, tuple(scales), mode, align_corners)
    if mode != "nearest" and mode != "nearest-exact":
        if x.dtype == dtypes.uint8:
            fail(Unsupported, "interpolate", f"mode {mode!r} on uint8 input is not supported")
        x = m.floating(x)
    for axis in reversed(range(2, x.ndim)):         # the last axis first, as PyTorch's bilinear
        src = _source(x.shape[axis], size[axis - 2], scales[axis - 2], bool(align_corners), mode)
        x = _resample(x, axis, _taps(x.shape[axis], src, mode))
    return x
