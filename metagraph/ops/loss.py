"""Softmax, losses and normalisation layers as compositions of meta-ops."""
from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.expr import Extra, Var
from metagraph.ops import math as m
from metagraph.ops import reduce as rd
from metagraph.ops.index import gather
from metagraph.ops.linalg import matmul
from metagraph.ops.movement import normalize_dim, reshape, squeeze, unsqueeze, T
from metagraph.ops.node import detach, labelled
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


@recorded
def softmax(x, dim):
    x = m.floating(x)
    shifted = x - rd.peak(x, dim)
    e = m.exp(shifted)
    return e / rd.sum(e, dim, keepdim=True)


@recorded
def log_softmax(x, dim):
    x = m.floating(x)
    shifted = x - rd.peak(x, dim)
    return shifted - m.log(rd.sum(m.exp(shifted), dim, keepdim=True))


def _reduce_loss(op, loss, reduction):
    if reduction == "mean":
        return rd.mean(loss)
    if reduction == "sum":
        return rd.sum(loss)
    if reduction == "none":
        return loss
    fail(ArgumentError, op, f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _class_weights(weight, target, op):
    """weight[target] per sample; a target outside the classes is an error when the graph runs."""
    return labelled(apply("reindex", weight, target, shape=target.shape, fill=0, checked=True,
                          index_map=(Extra(0, tuple(Var(d) for d in range(target.ndim))),)), op)


@recorded
def nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    """-logp[target] per sample, weighted; targets equal to ignore_index count for nothing."""
    if target.dtype.is_float or target.dtype == dtypes.bool_:
        fail(DTypeError, "nll_loss", f"target must hold class indices (integers), got {target.dtype.name}")
    unbatched = logp.ndim == 1
    if unbatched:
        logp, target = unsqueeze(logp, 0), unsqueeze(target, 0)
    if logp.ndim < 2 or target.shape != logp.shape[:1] + logp.shape[2:]:
        fail(ShapeError, "nll_loss", f"input {logp.shape} and target {target.shape} do not match "
                                     "(expected input (N, C, ...) and target (N, ...))")
    classes = logp.shape[1]
    valid = m.ne(target, ignore_index)
    safe = m.where(valid, target, 0)
    picked = squeeze(gather(logp, 1, unsqueeze(safe, 1)), 1)
    if weight is None:
        w = m.cast(valid, logp.dtype)
    else:
        if weight.shape != (classes,):
            fail(ShapeError, "nll_loss", f"weight must have shape ({classes},), got {weight.shape}")
        w = m.where(valid, _class_weights(weight, safe, "nll_loss"), 0.0)
    loss = -picked * w
    if unbatched:
        loss, w = squeeze(loss, 0), squeeze(w, 0)
    if reduction == "mean":
        return rd.sum(loss) / rd.sum(w)
    return _reduce_loss("nll_loss", loss, reduction)


@recorded
def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """log_softmax over the class dimension (1, or 0 unbatched) followed by nll_loss."""
    class_dim = 0 if logits.ndim == 1 else 1
    logp = log_softmax(logits, class_dim)
    classes = logp.shape[class_dim]
    weight_b = None
    if weight is not None:
        weight_b = reshape(weight, (classes,) + (1,) * (logp.ndim - class_dim - 1))
    if target.dtype.is_float:                         # class probabilities
        if target.shape != logp.shape:
            fail(ShapeError, "cross_entropy", f"probability target {target.shape} must match input "
                                              f"{logp.shape}")
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / classes
        terms = logp * target if weight_b is None else logp * target * weight_b
        loss = -rd.sum(terms, class_dim)
        return _reduce_loss("cross_entropy", loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return nll
    valid = m.ne(target, ignore_index)
    smooth = -rd.sum(logp if weight_b is None else logp * weight_b, class_dim)
    smooth = m.where(valid, smooth, 0.0)
    if reduction == "mean":
        if weight is None:
            smooth = rd.sum(smooth) / rd.sum(m.cast(valid, logp.dtype))
        else:
            w = _class_weights(weight, m.where(valid, target, 0), "cross_entropy")
            smooth = rd.sum(smooth) / rd.sum(m.where(valid, w, 0.0))
    else:
        smooth = _reduce_loss("cross_entropy", smooth, reduction)
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / classes)


@recorded
def mse_loss(x, target, reduction="mean"):
    diff = x - target
    return _reduce_loss("mse_loss", diff * diff, reduction)


@recorded
def l1_loss(x, target, reduction="mean"):
    return _reduce_loss("l1_loss", m.abs_(x - target), reduction)


@recorded
def binary_cross_entropy_with_logits(x, target, weight=None, reduction="mean", pos_weight=None):
    """Sigmoid and binary cross-entropy in one stable formula."""
    softplus_neg = m.log(m.exp(-m.abs_(x)) + 1.0) + m.maximum(-x, 0.0)    # log(1 + e^-x)
    if pos_weight is None:
        loss = (1.0 - target) * x + softplus_neg
    else:
        loss = (1.0 - target) * x + ((pos_weight - 1.0) * target + 1.0) * softplus_neg
    if weight is not None:
        loss = loss * weight
    return _reduce_loss("binary_cross_entropy_with_logits", loss, reduction)


@recorded
def binary_cross_entropy(p, target, weight=None, reduction="mean"):
    """On probabilities; each log is clamped at -100 as PyTorch does."""
    log_p = m.maximum(m.log(p), -100.0)
    log_q = m.maximum(m.log(1.0 - p), -100.0)
    loss = -(target * log_p + (1.0 - target) * log_q)
    if weight is not None:
        loss = loss * weight
    return _reduce_loss("binary_cross_entropy", loss, reduction)


@recorded
def linear(x, weight, bias=None):
    out = matmul(x, T(weight))
    return out if bias is None else out + bias


def _channel_view(v, ndim):
    """A per-channel vector as (C, 1, ...), which broadcasting reads for every row of an (N, C, ...)
    input. Not (1, C, 1, ...): at a batch of one that shape is the input's own, no broadcast is made,
    and the graph (so its kernels) would differ from every other batch size's."""
    return reshape(v, (v.shape[0],) + (1,) * (ndim - 2))


@recorded
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Returns (output, new running_mean, new running_var); the stats are None if not given."""
    if x.ndim < 2:
        fail(ShapeError, "batch_norm", f"expects (N, C, ...) input, got {x.shape}")
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        count = x.numel // x.shape[1]
        if count <= 1:
            fail(ArgumentError, "batch_norm", f"expected more than 1 value per channel when training, "
                                           f"got input {x.shape}")
        mean = rd.mean(x, axes, keepdim=True)
        var = rd.mean((x - mean) * (x - mean), axes, keepdim=True)
        if running_mean is not None:
            batch_mean = detach(reshape(mean, (x.shape[1],)))
            batch_var = detach(reshape(var, (x.shape[1],))) * (count / (count - 1))
            running_mean = running_mean * (1 - momentum) + batch_mean * momentum
            running_var = running_var * (1 - momentum) + batch_var * momentum
    else:
        if running_mean is None or running_var is None:
            fail(ArgumentError, "batch_norm", "running_mean and running_var are needed in eval mode")
        mean, var = _channel_view(running_mean, x.ndim), _channel_view(running_var, x.ndim)
    out = (x - mean) * m.rsqrt(var + eps)
    if weight is not None:
        out = out * _channel_view(weight, x.ndim)
    if bias is not None:
        out = out + _channel_view(bias, x.ndim)
    return out, running_mean, running_var


@recorded
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape):] != shape:
        fail(ShapeError, "layer_norm", f"normalized_shape {shape} does not match the end of {x.shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = rd.mean(x, axes, keepdim=True)
    centered = x - mean
    out = centered * m.rsqrt(rd.mean(centered * centered, axes, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


@recorded
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    n, c = x.shape[:2]
    if c % num_groups:
        fail(ShapeError, "group_norm", f"{c} channels do not split into {num_groups} groups")
    grouped = reshape(x, (n, num_groups, -1))
    mean = rd.mean(grouped, 2, keepdim=True)
    centered = grouped - mean
    out = reshape(centered * m.rsqrt(rd.mean(centered * centered, 2, keepdim=True) + eps), x.shape)
    if weight is not None:
        out = out * _channel_view(weight, x.ndim)
    return out if bias is None else out + _channel_view(bias, x.ndim)


@recorded
def dropout(x, p, uniform):
    """Zero where uniform < p and scale the rest by 1/(1-p); `uniform` holds U[0,1) samples."""
    if not 0 <= p <= 1:
        fail(ArgumentError, "dropout", f"probability must be in [0, 1], got {p}")
    if p == 1:
        return x * 0.0
    return m.where(m.lt(uniform, p), 0.0, x * (1.0 / (1.0 - p)))


@recorded
def embedding(indices, weight, padding_idx=None):
    """Rows of weight picked by integer indices; the padding row gets no gradient."""
    if indices.dtype.is_float:
        fail(DTypeError, "embedding", f"indices must be integers, got {indices.dtype.name}")
    if weight.ndim != 2:
        fail(ShapeError, "embedding", f"weight must be 2-D, got {weight.shape}")
    rows = tuple(Var(d) for d in range(indices.ndim))
    out = labelled(apply("reindex", weight, indices, shape=indices.shape + (weight.shape[1],), fill=0,
                         checked=True, index_map=(Extra(0, rows), Var(indices.ndim))), "embedding")
    if padding_idx is None:
        return out
    padding_idx = normalize_dim("embedding", weight.shape[0], padding_idx)
    is_padding = m.expand(unsqueeze(m.eq(indices, padding_idx), -1), out.shape)
    return m.where(is_padding, detach(out), out)
