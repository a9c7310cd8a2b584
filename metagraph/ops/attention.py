"""Scaled dot-product attention: softmax(q @ k^T * scale + mask) @ v, from matmul, where and the
pieces of softmax (no kernel of its own: the scores are a register-tiled contraction with the
scale as its epilogue, the softmax's row max and sum are row prologues)."""
import math

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.expr import Var
from metagraph.ops import math as m
from metagraph.ops import reduce as rd
from metagraph.ops.linalg import matmul
from metagraph.ops.loss import dropout, softmax
from metagraph.ops.movement import transpose, view
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply

OP = "scaled_dot_product_attention"


def weights_shape(query, key, attn_mask=None, enable_gqa=False):
    """The shape of the attention weights softmax(q @ k^T + mask): the shape dropout's random
    numbers are drawn in."""
    _check(query, key, key, attn_mask, False, enable_gqa)
    return _weights_shape(query, _grouped(key, query, enable_gqa), attn_mask)


@recorded
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, uniform=None):
    """PyTorch's F.scaled_dot_product_attention. A bool mask is True where a key takes part, a
    float mask is added to the scores; is_causal keeps the lower triangle anchored at the top
    left (key j for query i when j <= i, also when L != S). A row whose every score is -inf
    (fully masked) gives zeros, as PyTorch's safe softmax does. Dropout of the weights reads
    `uniform` (U[0,1) samples in weights_shape) and is applied only when dropout_p > 0."""
    _check(query, key, value, attn_mask, is_causal, enable_gqa)
    if not 0 <= dropout_p <= 1:
        fail(ArgumentError, OP, f"dropout_p must be in [0, 1], got {dropout_p}")
    weights = attention_weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    if dropout_p > 0:
        if uniform is None or uniform.shape != weights.shape:
            fail(ArgumentError, OP, f"dropout needs uniform samples of shape {weights.shape}")
        weights = dropout(weights, dropout_p, uniform)
    return matmul(weights, _grouped(value, query, enable_gqa))


@recorded
def attention_weights(query, key, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                      zero_masked_rows=True):
    """softmax(q @ k^T * scale + mask) over the keys. zero_masked_rows: a fully masked row gives
    zeros (scaled_dot_product_attention), else NaN (MultiheadAttention's need_weights path)."""
    _check(query, key, key, attn_mask, is_causal, enable_gqa)
    key = _grouped(key, query, enable_gqa)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    scores = matmul(query, transpose(key, -2, -1)) * scale
    if is_causal:
        length, source = query.shape[-2], key.shape[-2]
        row = apply("index", shape=(length, source), axis=0, dtype=dtypes.int64)
        column = apply("index", shape=(length, source), axis=1, dtype=dtypes.int64)
        scores = m.where(m.le(column, row), scores, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == dtypes.bool_:
            scores = m.where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    if not zero_masked_rows:
        return softmax(scores, -1)
    # Every select is element-wise over the scores and reads the row's max and sum through a
    # broadcast, as softmax's subtraction and division do: a select of the per-row values would be
    # a node between two row reductions, and the softmax would no longer fuse into one kernel.
    # In a fully masked row, exp(-inf - 0) = 0 and 0 / 1: no NaN forward or backward.
    peak = m.expand(rd.peak(scores, -1), scores.shape)
    masked = m.eq(peak, float("-inf"))            # every score of the row is -inf
    shifted = m.exp(scores - m.where(masked, 0.0, peak))
    total = m.expand(rd.sum(shifted, -1, keepdim=True), scores.shape)
    return shifted / m.where(masked, 1.0, total)


def _check(query, key, value, attn_mask, is_causal, enable_gqa):
    """Fail, naming the op and the shapes, where the operands do not fit."""
    shapes = f"query {query.shape}, key {key.shape}, value {value.shape}"
    if min(query.ndim, key.ndim, value.ndim) < 2:
        fail(ShapeError, OP, f"query, key and value need at least 2 dimensions, got {shapes}")
    if not (query.dtype == key.dtype == value.dtype) or not query.dtype.is_float:
        fail(DTypeError, OP, f"query, key and value need one floating-point dtype, got "
                             f"{query.dtype.name}, {key.dtype.name} and {value.dtype.name}")
    if query.shape[-1] != key.shape[-1]:
        fail(ShapeError, OP, f"query and key need the same embedding size (last dimension), got {shapes}")
    if key.shape[-2] != value.shape[-2]:
        fail(ShapeError, OP, f"key and value need the same sequence length (dimension -2), got {shapes}")
    if enable_gqa:
        for name, x in (("key", key), ("value", value)):
            if min(query.ndim, x.ndim) < 3 or query.shape[-3] % x.shape[-3]:
                fail(ShapeError, OP, f"enable_gqa needs the query's heads (dimension -3) to be a "
                                     f"multiple of the {name}'s, got {shapes}")
        key, value = (_grouped(x, query, True) for x in (key, value))
    m.broadcast_shape(OP, query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if attn_mask is not None:
        if is_causal:
            fail(ArgumentError, OP, "an explicit attn_mask should not be given with is_causal=True")
        if attn_mask.dtype != dtypes.bool_ and attn_mask.dtype != query.dtype:
            fail(DTypeError, OP, f"attn_mask must be bool or of the query's dtype "
                                 f"({query.dtype.name}), got {attn_mask.dtype.name}")
        _weights_shape(query, key, attn_mask)


def _weights_shape(query, key, attn_mask):
    scores = m.broadcast_shape(OP, query.shape[:-2], key.shape[:-2]) + (query.shape[-2], key.shape[-2])
    if attn_mask is None:
        return scores
    shape = m.broadcast_shape(OP, scores, attn_mask.shape)
    if shape[-2:] != scores[-2:]:
        fail(ShapeError, OP, f"attn_mask {attn_mask.shape} does not broadcast to the attention "
                             f"weights' shape {scores}")
    return shape


def _grouped(x, query, enable_gqa):
    """Key or value with each of its heads (dimension -3) repeated for its group of query heads
    (repeat_interleave as a view), when enable_gqa and the head counts differ."""
    if not enable_gqa or x.shape[-3] == query.shape[-3]:
        return x
    group = query.shape[-3] // x.shape[-3]
    shape = x.shape[:-3] + (query.shape[-3],) + x.shape[-2:]
    index_map = [Var(d) if d != x.ndim - 3 else Var(d) // group for d in range(x.ndim)]
    return view(x, shape, index_map)
