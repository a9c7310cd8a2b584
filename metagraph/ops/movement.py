"""Movement: every reshape, permutation, slice, pad or tiling is a `reindex` view (no copy)."""
from metagraph import dtypes
from metagraph.errors import ArgumentError, IndexOutOfRange, ShapeError, Unsupported, fail
from metagraph.expr import Const, Var, binary, reshape_map
from metagraph.ops import math as m
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


def normalize_dim(op, ndim, dim):
    """A dimension index in [0, ndim), accepting negatives as PyTorch does."""
    size = max(ndim, 1)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -size <= dim < size:
        fail(IndexOutOfRange, op, f"dimension out of range (expected to be in range of "
                                  f"[{-size}, {size - 1}], but got {dim})")
    return dim % size


def normalize_dims(op, ndim, dim):
    """Sorted axes for dim given as None (all), an int, or a sequence."""
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    axes = sorted({normalize_dim(op, ndim, d) for d in dims})
    if len(axes) != len(dims):
        fail(IndexOutOfRange, op, f"dim {dim} repeats a dimension")
    return tuple(a for a in axes if a < ndim)


def view(x, shape, index_map, fill=0):
    """reindex x to `shape`: input dimension d is read at index_map[d] (fill outside)."""
    return apply("reindex", x, shape=tuple(shape), index_map=tuple(index_map), fill=fill,
                 checked=False)


def resolve_shape(op, numel, shape):
    """A shape with at most one -1, checked against the element count."""
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if any(not isinstance(s, int) or s < -1 for s in shape) or shape.count(-1) > 1:
        fail(ShapeError, op, f"invalid shape {shape}")
    known = 1
    for s in shape:
        known *= s if s != -1 else 1
    if -1 in shape:
        if known == 0 or numel % known:
            fail(ShapeError, op, f"shape {shape} is invalid for input of size {numel}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    elif known != numel:
        fail(ShapeError, op, f"shape {shape} is invalid for input of size {numel}")
    return shape


@recorded
def reshape(x, *shape):
    """The same elements in row-major order under a new shape."""
    shape = resolve_shape("reshape", x.numel, shape)
    if shape == x.shape:
        return x
    return view(x, shape, reshape_map(x.shape, shape))


@recorded
def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, (1,))
    start = normalize_dim("flatten", x.ndim, start_dim)
    end = normalize_dim("flatten", x.ndim, end_dim)
    if start > end:
        fail(ShapeError, "flatten", f"start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(x, x.shape[:start] + (-1,) + x.shape[end + 1:])


@recorded
def unflatten(x, dim, sizes):
    dim = normalize_dim("unflatten", x.ndim, dim)
    sizes = resolve_shape("unflatten", x.shape[dim], sizes)
    return reshape(x, x.shape[:dim] + sizes + x.shape[dim + 1:])


@recorded
def squeeze(x, dim=None):
    axes = normalize_dims("squeeze", x.ndim, dim)
    return reshape(x, tuple(s for d, s in enumerate(x.shape) if not (d in axes and s == 1)))


@recorded
def unsqueeze(x, dim):
    dim = normalize_dim("unsqueeze", x.ndim + 1, dim)
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


@recorded
def permute(x, *dims):
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    if len(dims) != x.ndim:
        fail(ShapeError, "permute", f"got {len(dims)} dims for a tensor of {x.ndim} dimensions")
    order = [normalize_dim("permute", x.ndim, d) for d in dims]
    if sorted(order) != list(range(x.ndim)):
        fail(ShapeError, "permute", f"dims {dims} are not a permutation of {x.ndim} dimensions")
    if order == list(range(x.ndim)):
        return x
    index_map = [Var(order.index(d)) for d in range(x.ndim)]
    return view(x, tuple(x.shape[d] for d in order), index_map)


@recorded
def transpose(x, dim0, dim1):
    order = list(range(x.ndim))
    a, b = normalize_dim("transpose", x.ndim, dim0), normalize_dim("transpose", x.ndim, dim1)
    order[a], order[b] = order[b], order[a]
    return permute(x, order)


@recorded
def T(x):
    return permute(x, list(range(x.ndim))[::-1])


@recorded
def expand(x, *sizes):
    """Broadcast size-1 dimensions (and new leading ones) to `sizes`; -1 keeps a size."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    if len(sizes) < x.ndim:
        fail(ShapeError, "expand", f"cannot expand {x.shape} to fewer dimensions {sizes}")
    offset = len(sizes) - x.ndim
    shape = []
    for axis, size in enumerate(sizes):
        own = x.shape[axis - offset] if axis >= offset else None
        if size == -1 and own is None:
            fail(ShapeError, "expand", f"-1 is not allowed for a new leading dimension: {sizes}")
        size = own if size == -1 else size
        if own not in (None, 1, size):
            fail(ShapeError, "expand", f"cannot expand size {own} to {size} in {x.shape} -> {sizes}")
        shape.append(size)
    return m.expand(x, shape)


@recorded
def broadcast_to(x, shape):
    return expand(x, tuple(shape))


@recorded
def flip(x, dims):
    axes = normalize_dims("flip", x.ndim, dims)
    index_map = [(x.shape[d] - 1) - Var(d) if d in axes else Var(d) for d in range(x.ndim)]
    return view(x, x.shape, index_map)


@recorded
def narrow(x, dim, start, length):
    return slice_dim(x, dim, start, start + length, 1)


@recorded
def slice_dim(x, dim, start, stop, step=1):
    """x[..., start:stop:step, ...] along one dimension (Python slice rules)."""
    dim = normalize_dim("slice", x.ndim, dim)
    start, stop, step = slice(start, stop, step).indices(x.shape[dim])
    length = len(range(start, stop, step))
    index_map = [Var(d) if d != dim else start + Var(d) * step for d in range(x.ndim)]
    return view(x, x.shape[:dim] + (length,) + x.shape[dim + 1:], index_map)


def _reflect(i, n):
    # n-1 - |n-1 - |i||: mirrors without repeating the edge, as PyTorch's 'reflect'
    def absolute(e):
        return binary("max", e, -e)
    return (n - 1) - absolute((n - 1) - absolute(i))


@recorded
def pad(x, pad, mode="constant", value=0.0):
    """PyTorch's F.pad: `pad` lists (before, after) pairs from the last dimension backwards."""
    pad = tuple(pad)
    if mode not in ("constant", "reflect", "replicate", "circular"):
        fail(Unsupported, "pad", f"unknown mode {mode!r}; expected constant, reflect, replicate or "
                                 "circular")
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        fail(ShapeError, "pad", f"padding {pad} must be pairs for at most {x.ndim} dimensions")
    pairs = {x.ndim - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}
    shape, index_map = [], []
    for d, size in enumerate(x.shape):
        before, after = pairs.get(d, (0, 0))
        out = size + before + after
        if out < 0:
            fail(ShapeError, "pad", f"padding {pad} makes dimension {d} of {x.shape} negative")
        i = Var(d) - before if before else Var(d)
        if mode != "constant" and (before or after):
            if mode == "reflect":
                if before >= size or after >= size:
                    fail(ShapeError, "pad", f"reflect padding {pad} must be smaller than {x.shape}")
                i = _reflect(i, size)
            elif mode == "replicate":
                i = binary("min", binary("max", i, 0), size - 1)
            else:
                if before > size or after > size:
                    fail(ShapeError, "pad", f"circular padding {pad} wraps around dimension {d} of "
                                            f"{x.shape} more than once")
                i = i % size
        shape.append(out)
        index_map.append(i)
    return view(x, shape, index_map, fill=m.scalar_in(value, x.dtype, "pad"))


@recorded
def cat(xs, dim=0):
    """Concatenate along dim: each part is a padded view, selected by position."""
    xs = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0)] or list(xs)[:1]
    if not xs:
        fail(ShapeError, "cat", "expected a non-empty sequence of tensors")
    dim = normalize_dim("cat", xs[0].ndim, dim)
    dtype = m.result_type(*[x.dtype for x in xs])
    for x in xs:
        if x.ndim != xs[0].ndim or x.shape[:dim] + x.shape[dim + 1:] != xs[0].shape[:dim] + \
                xs[0].shape[dim + 1:]:
            fail(ShapeError, "cat", f"shapes {' and '.join(str(x.shape) for x in xs)} differ "
                                    f"outside dimension {dim}")
    total = sum(x.shape[dim] for x in xs)
    shape = xs[0].shape[:dim] + (total,) + xs[0].shape[dim + 1:]
    position = apply("index", shape=shape, axis=dim, dtype=dtypes.int64)
    result, offset = None, 0
    for x in xs:
        index_map = [Var(d) - offset if d == dim and offset else Var(d) for d in range(x.ndim)]
        part = view(m.cast(x, dtype), shape, index_map)
        result = part if result is None else m.where(m.lt(position, offset), result, part)
        offset += x.shape[dim]
    return result


@recorded
def stack(xs, dim=0):
    xs = list(xs)
    if not xs:
        fail(ShapeError, "stack", "expected a non-empty sequence of tensors")
    if any(x.shape != xs[0].shape for x in xs):
        fail(ShapeError, "stack", f"shapes {' and '.join(str(x.shape) for x in xs)} differ")
    dim = normalize_dim("stack", xs[0].ndim + 1, dim)
    return cat([unsqueeze(x, dim) for x in xs], dim)


@recorded
def split(x, split_size_or_sections, dim=0):
    dim = normalize_dim("split", x.ndim, dim)
    size = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            fail(ArgumentError, "split", f"split size must be positive, got {step}")
        sections = [min(step, size - start) for start in range(0, size, step)] or [0]
    else:
        sections = list(split_size_or_sections)
        if sum(sections) != size:
            fail(ShapeError, "split", f"sections {sections} do not sum to dimension size {size}")
    parts, start = [], 0
    for length in sections:
        parts.append(slice_dim(x, dim, start, start + length))
        start += length
    return tuple(parts)


@recorded
def chunk(x, chunks, dim=0):
    dim = normalize_dim("chunk", x.ndim, dim)
    if chunks <= 0:
        fail(ArgumentError, "chunk", f"chunks must be positive, got {chunks}")
    step = -(-x.shape[dim] // chunks)
    return split(x, max(step, 1), dim)


@recorded
def unbind(x, dim=0):
    dim = normalize_dim("unbind", x.ndim, dim)
    return tuple(squeeze(slice_dim(x, dim, k, k + 1), dim) for k in range(x.shape[dim]))


@recorded
def repeat(x, *sizes):
    """Tile x `sizes` times along each dimension (new leading dimensions as needed)."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    if len(sizes) < x.ndim:
        fail(ShapeError, "repeat", f"needs at least {x.ndim} sizes, got {sizes}")
    offset = len(sizes) - x.ndim
    shape = tuple(sizes[:offset]) + tuple(s * r for s, r in zip(x.shape, sizes[offset:]))
    index_map = [Var(offset + d) % size if sizes[offset + d] != 1 and size != 1
                 else (Const(0) if size == 1 else Var(offset + d)) for d, size in enumerate(x.shape)]
    return view(x, shape, index_map)


def _triangle(x, diagonal, keep_upper):
    if x.ndim < 2:
        fail(ShapeError, "tril" if not keep_upper else "triu", f"needs at least 2-D input, got {x.shape}")
    row = apply("index", shape=x.shape, axis=x.ndim - 2, dtype=dtypes.int64)
    col = apply("index", shape=x.shape, axis=x.ndim - 1, dtype=dtypes.int64)
    offset = col - row
    keep = m.ge(offset, diagonal) if keep_upper else m.le(offset, diagonal)
    return m.where(keep, x, m.const(0, (), x.dtype))


@recorded
def tril(x, diagonal=0):
    return _triangle(x, diagonal, keep_upper=False)


@recorded
def triu(x, diagonal=0):
    return _triangle(x, diagonal, keep_upper=True)


def contiguous(x):
    """The same value, materialised on its own (a kernel boundary)."""
    return apply("contiguous", x)
