"""Plain numpy implementations of the nn composites, written for obviousness, not speed."""
import math

import numpy as np


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    s, p, d = (stride,) * 2 if isinstance(stride, int) else stride, \
        (padding,) * 2 if isinstance(padding, int) else padding, \
        (dilation,) * 2 if isinstance(dilation, int) else dilation
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    ho = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, k, ho, wo))
    kg = k // groups
    for o in range(k):
        g = o // kg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * d[0]: i * d[0] + s[0] * (ho - 1) + 1: s[0],
                           j * d[1]: j * d[1] + s[1] * (wo - 1) + 1: s[1]]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    n, cin, h, wd = x.shape
    _, cog, kh, kw = w.shape
    ho = (h - 1) * stride - 2 * padding + dilation * (kh - 1) + output_padding + 1
    wo = (wd - 1) * stride - 2 * padding + dilation * (kw - 1) + output_padding + 1
    full = np.zeros((n, cog * groups, ho + 2 * padding + stride, wo + 2 * padding + stride))
    cig = cin // groups
    for ci in range(cin):
        g = ci // cig
        for i in range(h):
            for j in range(wd):
                for r in range(kh):
                    for q in range(kw):
                        full[:, g * cog:(g + 1) * cog, i * stride + r * dilation,
                             j * stride + q * dilation] += x[:, ci, i, j, None] * w[ci, :, r, q]
    out = full[:, :, padding:padding + ho, padding:padding + wo]
    return out if b is None else out + b[None, :, None, None]


def pool2d(x, k, s, p, reduce, fill, ceil_mode=False, count_include_pad=True):
    n, c, h, w = x.shape
    size = []
    for dim in (h, w):
        span = dim + 2 * p - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= dim + p:
            out -= 1
        size.append(out)
    out = np.zeros((n, c) + tuple(size))
    for i in range(size[0]):
        for j in range(size[1]):
            r0, c0 = i * s - p, j * s - p
            rows = [r for r in range(r0, r0 + k) if 0 <= r < h]
            cols = [q for q in range(c0, c0 + k) if 0 <= q < w]
            window = x[:, :, rows][:, :, :, cols]
            if reduce == "max":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:
                if count_include_pad:
                    count = (min(r0 + k, h + p) - r0) * (min(c0 + k, w + p) - c0)
                else:
                    count = len(rows) * len(cols)
                out[:, :, i, j] = window.sum(axis=(2, 3)) / count
    return out


def adaptive_avg_pool2d(x, size):
    n, c, h, w = x.shape
    out = np.zeros((n, c) + size)
    for i in range(size[0]):
        for j in range(size[1]):
            r0, r1 = (i * h) // size[0], -(-((i + 1) * h) // size[0])
            c0, c1 = (j * w) // size[1], -(-((j + 1) * w) // size[1])
            out[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    return out


def interpolate_nearest(x, size):
    h, w = x.shape[2:]
    rows = [min(int(math.floor(i * h / size[0])), h - 1) for i in range(size[0])]
    cols = [min(int(math.floor(j * w / size[1])), w - 1) for j in range(size[1])]
    return x[:, :, rows][:, :, :, cols]


def interpolate_bilinear(x, size, align_corners=False):
    def coords(n_in, n_out):
        result = []
        for i in range(n_out):
            if align_corners:
                src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
            else:
                src = max((i + 0.5) * n_in / n_out - 0.5, 0.0)
            lo = min(int(math.floor(src)), n_in - 1)
            result.append((lo, min(lo + 1, n_in - 1), src - lo))
        return result
    h, w = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(size))
    for i, (r0, r1, a) in enumerate(coords(h, size[0])):
        for j, (c0, c1, b) in enumerate(coords(w, size[1])):
            out[:, :, i, j] = ((1 - a) * ((1 - b) * x[:, :, r0, c0] + b * x[:, :, r0, c1])
                               + a * ((1 - b) * x[:, :, r1, c0] + b * x[:, :, r1, c1]))
    return out


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    logp = log_softmax(logits, 1)
    n, c = logp.shape
    weight = np.ones(c) if weight is None else weight
    losses, weights = [], []
    for i in range(n):
        if target[i] == ignore_index:
            losses.append(0.0)
            weights.append(0.0)
            continue
        nll = -logp[i, target[i]] * weight[target[i]]
        smooth = -(logp[i] * weight).sum() / c
        losses.append((1 - label_smoothing) * nll + label_smoothing * smooth)
        weights.append(weight[target[i]])
    losses = np.array(losses)
    if reduction == "mean":
        return np.array(losses.sum() / np.sum(weights))
    return np.array(losses.sum()) if reduction == "sum" else losses


def batch_norm_train(x, weight, bias, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean) / np.sqrt(var + eps) * weight.reshape(shape) + bias.reshape(shape)


def layer_norm(x, ndims, weight, bias, eps):
    axes = tuple(range(x.ndim - ndims, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def erf(x):
    return np.vectorize(math.erf)(x)
