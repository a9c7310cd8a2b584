"""Indexing: getitem/setitem, gather/scatter, one_hot, cumsum and the Jittor-style reindex API.

Basic indexing (ints, slices, None, ...) is one reindex view. Integer-tensor indices are read
inside the index map as extras (`@e0(...)`), with out-of-range indices an error when the graph
runs (a checked reindex, labelled with the op that error names: node.labelled). As in PyTorch,
indexing with a tensor wraps negative indices; gather, scatter_add, index_select, index_add and
one_hot do not: a negative index is out of bounds there.
"""
import numpy as np

from metagraph import dtypes
from metagraph.errors import (ArgumentError, DTypeError, IndexOutOfRange, MetagraphError, ShapeError,
                              Unsupported, fail)
from metagraph.expr import Extra, Select, Var, binary, lift, parse
from metagraph.ops import math as m
from metagraph.ops.movement import normalize_dim, view
from metagraph.ops.node import Node, labelled
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


def _dims(k):
    """How many dimensions of the indexed tensor an index item consumes."""
    if k is None or k is Ellipsis:
        return 0
    return k.ndim if isinstance(k, Node) and k.dtype == dtypes.bool_ else 1


def _expand_key(x, key, realize):
    """The key as a list with Ellipsis expanded and bool masks turned into integer indices."""
    key = list(key) if isinstance(key, tuple) else [key]
    items = []
    for k in key:
        if isinstance(k, np.integer):
            k = int(k)
        if not isinstance(k, (int, slice, type(None), type(Ellipsis))) or isinstance(k, bool):
            k = _index_node(k)
        items.append(k)
    if items.count(Ellipsis) > 1:
        fail(IndexOutOfRange, "getitem", "an index can only have a single ellipsis")
    consumed = sum(_dims(k) for k in items)
    if consumed > x.ndim:
        fail(IndexOutOfRange, "getitem", f"too many indices for a tensor of {x.ndim} dimensions")
    if Ellipsis not in items:
        items.append(Ellipsis)
    at = items.index(Ellipsis)
    items[at:at + 1] = [slice(None)] * (x.ndim - consumed)
    expanded, dim = [], 0
    for k in items:
        if isinstance(k, Node) and k.dtype == dtypes.bool_:
            expanded.extend(_mask_indices(x, k, dim, realize))
        else:
            expanded.append(k)
        dim += _dims(k)
    return expanded


def _mask_indices(x, mask, dim, realize):
    """The integer indices that a bool mask over x's dimensions from `dim` on selects."""
    if mask.ndim == 0:            # x[True] adds a dimension of size 1, as None does
        realize([mask])
        if not np.asarray(mask.buffer):
            fail(Unsupported, "getitem", "a 0-d False mask (an empty new dimension) is not supported")
        return [None]
    if mask.shape != x.shape[dim:dim + mask.ndim]:
        fail(IndexOutOfRange, "getitem", f"the shape of the mask {list(mask.shape)} at index {dim} does "
                                         f"not match the shape of the indexed tensor {list(x.shape)}")
    realize([mask])       # a mask's shape depends on its values: a sync point
    return [_index_node(i) for i in np.nonzero(np.asarray(mask.buffer))]


def index_map_for(x, key, realize):
    """(region shape, index map, extras) such that x[key] = reindex(x, shape, map, extras)."""
    key = _expand_key(x, key, realize)
    # index tensors of at least one dimension; a 0-d one selects as an int does (PyTorch's rule)
    tensors = [k for k in key if isinstance(k, Node) and k.ndim]
    try:
        batch = np.broadcast_shapes(*[t.shape for t in tensors])
    except ValueError:          # PyTorch's IndexError
        shapes = " and ".join(str(t.shape) for t in tensors)
        fail(IndexOutOfRange, "getitem", f"index tensors of shapes {shapes} cannot be broadcast together")
    # the tensors' dimensions take their place where nothing but ints separates them (PyTorch
    # selects with ints, and 0-d tensors, first); a slice or None between them puts them first
    not_selecting = [k for k in key if not isinstance(k, int) and not (isinstance(k, Node) and not k.ndim)]
    positions = [p for p, k in enumerate(not_selecting) if isinstance(k, Node)]
    adjacent = bool(positions) and positions == list(range(positions[0], positions[-1] + 1))
    shape, index_map, extras, dim = [], [], [], 0
    scalars = []         # (a 0-d index tensor, the dimension it selects, its size)
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
        elif not k.ndim:
            scalars.append((k, dim, size))
            extras.append(k)
            index_map.append(_wrap_negative(Extra(len(extras) - 1, ()), size))
        else:
            if batch_at is None:
                batch_at = len(shape)
                shape.extend(batch)
            batch_vars = tuple(Var(batch_at + d) for d in range(len(batch)))
            extras.append(m.expand(k, batch))
            index_map.append(_wrap_negative(Extra(len(extras) - 1, batch_vars), size))
        dim += 1
    if 0 in shape and scalars:
        _check_unread(scalars, realize)
    return tuple(shape), [lift(e) for e in index_map], extras


def _check_unread(scalars, realize):
    """A 0-d index tensor selects as an int does, and PyTorch checks it as one, even where the
    region has no elements; the checked reindex checks only what it reads, which is nothing
    there: such indices are checked here, at once (an index tensor of a dimension or more is
    not checked for an empty region, in PyTorch either)."""
    realize([k for k, _, _ in scalars])
    for k, dim, size in scalars:
        value = int(np.asarray(k.buffer))
        if not -size <= value < size:
            fail(IndexOutOfRange, "getitem", f"index {value} is out of bounds for dimension {dim} "
                                             f"with size {size}")


def getitem(x, key, realize):
    shape, index_map, extras = index_map_for(x, key, realize)
    if not extras:
        return apply("reindex", x, shape=shape, index_map=tuple(index_map), fill=0, checked=False)
    return labelled(apply("reindex", x, *extras, shape=shape, index_map=tuple(index_map), fill=0,
                          checked=True), "getitem")


def setitem(x, key, value, realize):
    """x with x[key] replaced by value (broadcast), as a new node."""
    shape, index_map, extras = index_map_for(x, key, realize)
    value = m.cast(value, x.dtype)
    if m.broadcast_shape("setitem", value.shape, shape) != shape:
        fail(ShapeError, "setitem", f"value of shape {value.shape} does not fit region {shape}")
    value = m.expand(value, shape)
    scatter = dict(shape=x.shape, index_map=tuple(index_map), checked=True)
    written = labelled(apply("reindex_reduce", value, *extras, op="add", **scatter), "setitem")
    covered = labelled(apply("reindex_reduce", m.const(True, shape, dtypes.bool_), *extras, op="max",
                             **scatter), "setitem")
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
    read = Extra(0, tuple(Var(d) for d in range(x.ndim)))
    return labelled(apply("reindex", x, index, shape=index.shape, index_map=_axis_map(x.ndim, dim, read),
                          fill=0, checked=True), "gather")


def scatter_add(x, dim, index, src):
    """x with src[i][j][k] added at x[i][index[i][j][k]][k] (dim=1)."""
    dim = normalize_dim("scatter_add", x.ndim, dim)
    _check_index("scatter_add", index)
    if index.ndim != x.ndim or any(index.shape[d] > src.shape[d] for d in range(x.ndim)):
        fail(ShapeError, "scatter_add", f"index {index.shape} does not fit src {src.shape}")
    src = view(m.cast(src, x.dtype), index.shape, [Var(d) for d in range(x.ndim)])
    target = Extra(0, tuple(Var(d) for d in range(x.ndim)))
    added = labelled(apply("reindex_reduce", src, index, op="add", shape=x.shape,
                           index_map=_axis_map(x.ndim, dim, target), checked=True), "scatter_add")
    return apply("add", x, added)


def index_select(x, dim, index):
    dim = normalize_dim("index_select", x.ndim, dim)
    _check_index("index_select", index)
    if index.ndim != 1:
        fail(ShapeError, "index_select", f"index must be 1-D, got {index.shape}")
    shape = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    read = _axis_map(x.ndim, dim, Extra(0, (Var(dim),)))
    return labelled(apply("reindex", x, index, shape=shape, index_map=read, fill=0, checked=True),
                    "index_select")


def index_add(x, dim, index, source, alpha=1):
    dim = normalize_dim("index_add", x.ndim, dim)
    _check_index("index_add", index)
    expected = x.shape[:dim] + index.shape + x.shape[dim + 1:]
    if index.ndim != 1 or source.shape != expected:
        fail(ShapeError, "index_add", f"source {source.shape} and index {index.shape} do not fit "
                                      f"input {x.shape} at dim {dim}")
    source = m.cast(source * alpha if alpha != 1 else source, x.dtype)
    target = _axis_map(x.ndim, dim, Extra(0, (Var(dim),)))
    added = labelled(apply("reindex_reduce", source, index, op="add", shape=x.shape, index_map=target,
                           checked=True), "index_add")
    return apply("add", x, added)


def one_hot(x, num_classes, realize):
    """Row x of the num_classes x num_classes identity per element: a class outside
    [0, num_classes) is an error when the graph runs (num_classes < 0 reads the largest: a sync)."""
    _check_index("one_hot", x)
    if num_classes < 0:
        realize([x])
        if not x.numel:
            fail(ArgumentError, "one_hot", "cannot infer the number of classes from an empty tensor; "
                                           "pass num_classes")
        num_classes = int(np.asarray(x.buffer).max()) + 1
    square = (num_classes, num_classes)
    identity = m.cast(m.eq(apply("index", shape=square, axis=0, dtype=dtypes.int64),
                           apply("index", shape=square, axis=1, dtype=dtypes.int64)), dtypes.int64)
    row = Extra(0, tuple(Var(d) for d in range(x.ndim)))
    return labelled(apply("reindex", identity, x, shape=x.shape + (num_classes,), fill=0, checked=True,
                          index_map=(row, Var(x.ndim))), "one_hot")


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
