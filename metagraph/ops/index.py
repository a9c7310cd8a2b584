"""Indexing: getitem/setitem, gather/scatter, one_hot, cumsum and the Jittor-style reindex API.

Basic indexing (ints, slices, None, ...) is one reindex view. Integer-tensor indices are read
inside the index map as extras (`@e0(...)`), with out-of-range indices an error.
"""
import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, IndexOutOfRange, MetagraphError, ShapeError, DTypeError, fail
from metagraph.expr import Extra, Select, Var, binary, lift, parse
from metagraph.ops import math as m
from metagraph.ops.movement import normalize_dim, unsqueeze, view
from metagraph.ops.node import Node
from metagraph.ops.table import apply


def _wrap_negative(index, size):
    """Python's negative indexing inside an index map."""
    return Select(binary("<", index, 0), index + size, index)


def _index_node(value):
    """An integer index tensor from a node, a list or an array."""
    if isinstance(value, Node):
        if value.dtype.is_float:
            fail(IndexOutOfRange, "getitem", f"tensors used as indices must be integer or bool, "
                                             f"got {value.dtype.name}")
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "iub":
        fail(IndexOutOfRange, "getitem", f"index {value!r} is not integer or bool")
    dtype = dtypes.bool_ if array.dtype.kind == "b" else dtypes.int64
    return Node("buffer", (), {}, array.shape, dtype, buffer=np.ascontiguousarray(array, dtype.np))


def _expand_key(x, key, realize):
    """The key as a list with Ellipsis expanded and bool masks turned into integer indices."""
    key = list(key) if isinstance(key, tuple) else [key]
    expanded = []
    for k in key:
        if isinstance(k, np.integer):
            k = int(k)
        if not isinstance(k, (int, slice, type(None), type(Ellipsis))) or isinstance(k, bool):
            k = _index_node(k)
        if isinstance(k, Node) and k.dtype == dtypes.bool_:
            realize([k])       # a mask's shape depends on its values: a sync point
            expanded.extend(_index_node(i) for i in np.nonzero(k.buffer))
        else:
            expanded.append(k)
    consumed = sum(1 for k in expanded if k is not None and k is not Ellipsis)
    if expanded.count(Ellipsis) > 1:
        fail(IndexOutOfRange, "getitem", "an index can only have a single ellipsis")
    if consumed > x.ndim:
        fail(IndexOutOfRange, "getitem", f"too many indices for a tensor of {x.ndim} dimensions")
    if Ellipsis not in expanded:
        expanded.append(Ellipsis)
    at = expanded.index(Ellipsis)
    expanded[at:at + 1] = [slice(None)] * (x.ndim - consumed)
    return expanded


def index_map_for(x, key, realize):
    """(region shape, index map, extras) such that x[key] = reindex(x, shape, map, extras)."""
    key = _expand_key(x, key, realize)
    tensors = [k for k in key if isinstance(k, Node)]
    batch = m.broadcast_shape("getitem", *[t.shape for t in tensors]) if tensors else ()
    positions = [p for p, k in enumerate(key) if isinstance(k, Node)]
    adjacent = bool(positions) and positions == list(range(positions[0], positions[-1] + 1))
    shape, index_map, extras, dim = [], [], [], 0
    batch_at = None
    if tensors and not adjacent:
        batch_at = 0
        shape.extend(batch)
    for k in key:
        if k is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, int):
            if not -size <= k < size:
                fail(IndexOutOfRange, "getitem", f"index {k} is out of bounds for dimension {dim} "
                                                 f"with size {size}")
            index_map.append(k % size)
        elif isinstance(k, slice):
            start, stop, step = k.indices(size)
            index_map.append(start + Var(len(shape)) * step)
            shape.append(len(range(start, stop, step)))
        else:
            if batch_at is None:
                batch_at = len(shape)
                shape.extend(batch)
            batch_vars = tuple(Var(batch_at + d) for d in range(len(batch)))
            extras.append(m.expand(k, batch))
            index_map.append(_wrap_negative(Extra(len(extras) - 1, batch_vars), size))
        dim += 1
    return tuple(shape), [lift(e) for e in index_map], extras


def getitem(x, key, realize):
    shape, index_map, extras = index_map_for(x, key, realize)
    return apply("reindex", x, *extras, shape=shape, index_map=tuple(index_map), fill=0,
                 checked=bool(extras))


def setitem(x, key, value, realize):
    """x with x[key] replaced by value (broadcast), as a new node."""
    shape, index_map, extras = index_map_for(x, key, realize)
    value = m.cast(value, x.dtype)
    if m.broadcast_shape("setitem", value.shape, shape) != shape:
        fail(ShapeError, "setitem", f"value of shape {value.shape} does not fit region {shape}")
    value = m.expand(value, shape)
    scatter = dict(shape=x.shape, index_map=tuple(index_map), checked=True)
    written = apply("reindex_reduce", value, *extras, op="add", **scatter)
    covered = apply("reindex_reduce", m.const(True, shape, dtypes.bool_), *extras, op="max",
                    **scatter)
    return apply("where", covered, written, x)


def _axis_map(ndim, dim, expr):
    return tuple(expr if d == dim else Var(d) for d in range(ndim))


def _check_index(op, index):
    if not index.dtype.is_int:
        fail(DTypeError, op, f"index must be an integer tensor, got {index.dtype.name}")


def gather(x, dim, index):
    """out[i][j][k] = x[i][index[i][j][k]][k] for dim=1."""
    dim = normalize_dim("gather", x.ndim, dim)
    _check_index("gather", index)
    if index.ndim != x.ndim or any(index.shape[d] > x.shape[d] for d in range(x.ndim) if d != dim):
        fail(ShapeError, "gather", f"index {index.shape} does not fit input {x.shape} at dim {dim}")
    read = _wrap_negative(Extra(0, tuple(Var(d) for d in range(x.ndim))), x.shape[dim])
    return apply("reindex", x, index, shape=index.shape, index_map=_axis_map(x.ndim, dim, read),
                 fill=0, checked=True)


def scatter_add(x, dim, index, src):
    """x with src[i][j][k] added at x[i][index[i][j][k]][k] (dim=1)."""
    dim = normalize_dim("scatter_add", x.ndim, dim)
    _check_index("scatter_add", index)
    if index.ndim != x.ndim or any(index.shape[d] > src.shape[d] for d in range(x.ndim)):
        fail(ShapeError, "scatter_add", f"index {index.shape} does not fit src {src.shape}")
    src = view(m.cast(src, x.dtype), index.shape, [Var(d) for d in range(x.ndim)])
    target = _wrap_negative(Extra(0, tuple(Var(d) for d in range(x.ndim))), x.shape[dim])
    added = apply("reindex_reduce", src, index, op="add", shape=x.shape,
                  index_map=_axis_map(x.ndim, dim, target), checked=True)
    return apply("add", x, added)


def index_select(x, dim, index):
    dim = normalize_dim("index_select", x.ndim, dim)
    _check_index("index_select", index)
    if index.ndim != 1:
        fail(ShapeError, "index_select", f"index must be 1-D, got {index.shape}")
    read = _wrap_negative(Extra(0, (Var(dim),)), x.shape[dim])
    shape = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    return apply("reindex", x, index, shape=shape, index_map=_axis_map(x.ndim, dim, read),
                 fill=0, checked=True)


def index_add(x, dim, index, source, alpha=1):
    dim = normalize_dim("index_add", x.ndim, dim)
    _check_index("index_add", index)
    expected = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    if index.ndim != 1 or source.shape != expected:
        fail(ShapeError, "index_add", f"source {source.shape} and index {index.shape} do not fit "
                                      f"input {x.shape} at dim {dim}")
    source = m.cast(source * alpha if alpha != 1 else source, x.dtype)
    target = _wrap_negative(Extra(0, (Var(dim),)), x.shape[dim])
    added = apply("reindex_reduce", source, index, op="add", shape=x.shape,
                  index_map=_axis_map(x.ndim, dim, target), checked=True)
    return apply("add", x, added)


def one_hot(x, num_classes, realize):
    _check_index("one_hot", x)
    if num_classes < 0:
        realize([x])
        num_classes = int(x.buffer.max()) + 1 if x.buffer.size else 0
    shape = x.shape + (num_classes,)
    classes = apply("index", shape=shape, axis=x.ndim, dtype=dtypes.int64)
    return m.cast(m.eq(m.expand(unsqueeze(x, -1), shape), classes), dtypes.int64)


def cumsum(x, dim, dtype=None):
    """Running sum along dim (log2(n) shifted adds)."""
    dim = normalize_dim("cumsum", x.ndim, dim)
    if dtype is None and not x.dtype.is_float:
        dtype = dtypes.int64
    x = m.cast(x, dtypes.as_dtype(dtype) or x.dtype)
    step = 1
    while x.ndim and step < x.shape[dim]:
        shifted = view(x, x.shape, _axis_map(x.ndim, dim, Var(dim) - step))
        x = apply("add", x, shifted)
        step *= 2
    return x


def masked_fill(x, mask, value):
    return m.where(mask, m.cast(value, x.dtype), x)


# ---- Jittor-style reindex with index expressions as strings --------------------------------

def reindex(x, shape, indexes, overflow_value=0, extras=()):
    """out[i0, i1, ...] = x[indexes...], overflow_value where an index falls outside x."""
    shape = tuple(shape)
    if len(indexes) != x.ndim:
        fail(ShapeError, "reindex", f"{len(indexes)} index expressions for a {x.ndim}-D input")
    try:
        index_map = tuple(parse(e, len(shape), len(extras)) for e in indexes)
    except MetagraphError as error:
        fail(type(error), "reindex", str(error))
    return apply("reindex", x, *extras, shape=shape, index_map=index_map,
                 fill=m.scalar_in(overflow_value, x.dtype, "reindex"), checked=False)


_REDUCE_OPS = {"add": "add", "sum": "add", "max": "max", "maximum": "max",
               "min": "min", "minimum": "min"}


def reindex_reduce(x, op, shape, indexes, extras=()):
    """out[indexes...] op= x[i0, i1, ...]; indexes are over x's loop variables."""
    shape = tuple(shape)
    if op not in _REDUCE_OPS:
        fail(ArgumentError, "reindex_reduce", f"op must be one of {', '.join(_REDUCE_OPS)}, got {op!r}")
    if len(indexes) != len(shape):
        fail(ShapeError, "reindex_reduce", f"{len(indexes)} index expressions for a "
                                           f"{len(shape)}-D output")
    try:
        index_map = tuple(parse(e, x.ndim, len(extras)) for e in indexes)
    except MetagraphError as error:
        fail(type(error), "reindex_reduce", str(error))
    kind = _REDUCE_OPS[op]
    flip = kind == "min"
    if flip:
        x = -x if x.dtype.is_float else m.bitwise_not(x)
    out = apply("reindex_reduce", x, *extras, op="add" if kind == "add" else "max", shape=shape,
                index_map=index_map, checked=False)
    if flip:
        out = -out if x.dtype.is_float else m.bitwise_not(out)
    return out
