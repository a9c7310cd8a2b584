"""Sorting, running scans, scatter_reduce and nonzero, built from table ops.

sort ranks each element by a sum of comparisons along the dim (O(n^2) work per row, no n^2
buffer: the comparisons fuse into the reduction), scatters the positions by rank and gathers the
values, so the gradient is the gather's, from the table. The scans (cumprod, cummax, cummin,
logcumsumexp) are Hillis-Steele scans like cumsum: log2(n) steps, each combining an element with
the one `step` places before it. scatter_reduce compares every output position with every index
along the dim (O(numel(x) * index.shape[dim]) work) and reduces with the `reduce` row, whose
gradients are exact with zeros (prod) and shared among ties (amax, amin), as PyTorch's.
"""
from collections import namedtuple

import numpy as np

from metagraph import dtypes
from metagraph.errors import ArgumentError, DTypeError, ShapeError, fail
from metagraph.expr import Const, Extra, Var
from metagraph.ops import math as m
from metagraph.ops import reduce as rd
from metagraph.ops.index import _axis_map, _check_index, _index_node
from metagraph.ops.movement import normalize_dim, view
from metagraph.ops.node import detach, labelled
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


ValuesIndices = namedtuple("ValuesIndices", "values indices")     # as torch.return_types


def _is_nan(x):
    return m.ne(x, x) if x.dtype.is_float else m.const(False, x.shape, dtypes.bool_)


def _before(a, b, descending):
    """a strictly precedes b in the sort order; NaN is the largest value, as in PyTorch."""
    if descending:
        a, b = b, a
    return m.logical_or(m.lt(a, b), m.logical_and(_is_nan(b), m.logical_not(_is_nan(a))))


def _position(shape, axis):
    return apply("index", shape=shape, axis=axis, dtype=dtypes.int64)


def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices) along dim, ties in index order (stable or not). The rank of element i is
    sum_j [x_j before x_i, or x_j equal to x_i and j < i]: O(n^2) comparisons per row, fine for
    rows up to a few thousand."""
    return ValuesIndices(*_sort(x, dim, descending))


@recorded
def _sort(x, dim, descending):
    """sort's (values, indices), recorded per call signature."""
    if x.ndim == 0:
        return x, m.const(0, (), dtypes.int64)
    dim = normalize_dim("sort", x.ndim, dim)
    keys = m.cast(x, dtypes.int64) if x.dtype == dtypes.bool_ else x
    pairs = x.shape + (x.shape[dim],)              # (..., i, ..., j): element i against element j
    mine = view(keys, pairs, [Var(d) for d in range(x.ndim)])
    other = view(keys, pairs, _axis_map(x.ndim, dim, Var(x.ndim)))
    tied = m.logical_not(m.logical_or(_before(other, mine, descending), _before(mine, other, descending)))
    earlier = m.lt(_position(pairs, x.ndim), _position(pairs, dim))
    ahead = m.logical_or(_before(other, mine, descending), m.logical_and(tied, earlier))
    rank = apply("reduce", m.cast(ahead, dtypes.int64), op="add", axes=(x.ndim,), keepdim=False)
    along = _axis_map(x.ndim, dim, Extra(0, tuple(Var(d) for d in range(x.ndim))))    # dim at extra 0
    # ranks are a permutation along dim, so a scatter-add of the positions places each exactly once
    indices = apply("reindex_reduce", _position(x.shape, dim), rank, op="add", shape=x.shape,
                    index_map=along, checked=False)
    values = apply("reindex", x, indices, shape=x.shape, index_map=along, fill=0, checked=False)
    return values, indices


def argsort(x, dim=-1, descending=False, stable=False):
    """The indices that sort x along dim (see sort)."""
    return _sort(x, dim, descending)[1]


def topk(x, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) elements along dim and their indices, in sorted order."""
    if x.ndim == 0:
        if k not in (0, 1):
            fail(ArgumentError, "topk", f"k ({k}) is out of range for a 0-d tensor")
        return sort(x)
    dim = normalize_dim("topk", x.ndim, dim)
    if not 0 <= k <= x.shape[dim]:
        fail(ArgumentError, "topk", f"k ({k}) is out of range for dimension {dim} of size {x.shape[dim]}")
    values, indices = _sort(x, dim, largest)
    shape = x.shape[:dim] + (k,) + x.shape[dim + 1:]
    first = [Var(d) for d in range(x.ndim)]
    return ValuesIndices(view(values, shape, first), view(indices, shape, first))


def _shifted(x, dim, step, fill):
    return view(x, x.shape, _axis_map(x.ndim, dim, Var(dim) - step), fill)


def _scan(x, dim, combine, fill):
    """Hillis-Steele scan: after the step of size s, each element combines the 2s elements up to it."""
    step = 1
    while step < x.shape[dim]:
        x = combine(_shifted(x, dim, step, fill), x)
        step *= 2
    return x


def cumprod(x, dim, dtype=None):
    """Running product along dim: a scan of multiplications, exact with zeros (no division) in
    value and gradient."""
    dim = normalize_dim("cumprod", x.ndim, dim)
    if dtype is None and not x.dtype.is_float:
        dtype = dtypes.int64
    x = m.cast(x, dtypes.as_dtype(dtype) or x.dtype)
    return x if x.ndim == 0 else _scan(x, dim, m.mul, 1)


def _cum_extreme(op, x, dim, greater):
    """(values, indices) of the running maximum (greater) or minimum: the index is the last
    position of the extreme so far, or of the last NaN once one is seen, as in PyTorch; the
    values are x read there, so the gradient goes to that element."""
    dim = normalize_dim(op, x.ndim, dim)
    if x.ndim == 0:
        return ValuesIndices(x, m.const(0, (), dtypes.int64))
    keys = m.cast(x, dtypes.int64) if x.dtype == dtypes.bool_ else detach(x)
    position = _position(x.shape, dim)
    _, where_best = _scan_pairs(keys, position, dim, greater)
    read = _axis_map(x.ndim, dim, Extra(0, tuple(Var(d) for d in range(x.ndim))))
    values = apply("reindex", x, where_best, shape=x.shape, index_map=read, fill=0, checked=False)
    return ValuesIndices(values, where_best)


def _scan_pairs(keys, position, dim, greater):
    """The scan of (key, position) pairs: the later pair wins unless the earlier is strictly
    better (a NaN is better than any number)."""
    step = 1
    while step < keys.shape[dim]:
        early_key, early_pos = _shifted(keys, dim, step, 0), _shifted(position, dim, step, -1)
        better = m.gt(early_key, keys) if greater else m.lt(early_key, keys)
        wins = m.logical_or(better, m.logical_and(_is_nan(early_key), m.logical_not(_is_nan(keys))))
        wins = m.logical_and(wins, m.ge(early_pos, 0))        # before the start there is no pair
        keys, position = m.where(wins, early_key, keys), m.where(wins, early_pos, position)
        step *= 2
    return keys, position


def cummax(x, dim):
    """(values, indices) of the running maximum along dim."""
    return _cum_extreme("cummax", x, dim, True)


def cummin(x, dim):
    """(values, indices) of the running minimum along dim."""
    return _cum_extreme("cummin", x, dim, False)


def logcumsumexp(x, dim):
    """log(cumsum(exp(x))) along dim, each step a log-add-exp shifted by the larger operand
    (detached: the shift cancels in value, so it carries no gradient) so that nothing overflows
    or underflows."""
    dim = normalize_dim("logcumsumexp", x.ndim, dim)
    x = m.floating(x)
    if x.ndim == 0:
        return x

    def log_add_exp(a, b):
        top = detach(m.maximum(a, b))
        top = m.where(m.eq(top, float("-inf")), 0.0, top)      # -inf - -inf would be NaN
        return top + m.log(m.exp(a - top) + m.exp(b - top))
    return _scan(x, dim, log_add_exp, float("-inf"))


_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _scatter_loop(op, x, dim, index, src):
    """(hit, src_at, slot) over the loop x.shape + (index.shape[dim] + 1,): slot j < m reads
    index and src at x's position with dim replaced by j, hit where that index is the position
    along dim; slot m reads nothing (a place for x itself)."""
    dim = normalize_dim(op, x.ndim, dim)
    _check_index(op, index)
    if index.ndim != x.ndim or src.ndim != x.ndim or \
            any(index.shape[d] > src.shape[d] or (d != dim and index.shape[d] > x.shape[d])
                for d in range(x.ndim)):
        fail(ShapeError, op, f"index {index.shape} does not fit src {src.shape} and input {x.shape} "
                             f"at dim {dim}")
    loop = x.shape + (index.shape[dim] + 1,)
    read = _axis_map(x.ndim, dim, Var(x.ndim))
    # every index read through a checked gather of the positions 0..n-1 (itself, where it is one):
    # an index outside [0, n) raises when the graph runs, as PyTorch's does, instead of matching none
    positions = apply("index", shape=(x.shape[dim],), axis=0, dtype=dtypes.int64)
    index = labelled(apply("reindex", positions, m.cast(index, dtypes.int64), shape=index.shape, fill=0,
                           checked=True,
                           index_map=(Extra(0, tuple(Var(d) for d in range(index.ndim))),)), op)
    # outside the index (past its shape in any dim, or the last slot) -1 matches no position
    index_at = view(index, loop, read, -1)
    src_at = view(m.cast(src, x.dtype), loop, read)
    hit = m.eq(index_at, _position(loop, dim))
    slot = _position(loop, x.ndim)
    return dim, hit, src_at, slot


@recorded
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    """x with src reduced into it at index along dim ('sum', 'prod', 'mean', 'amax', 'amin'), as
    torch.scatter_reduce: each output position reduces over all index.shape[dim] candidates
    (O(numel(x) * index.shape[dim]) work). Positions no index names keep x. An index outside
    [0, x.shape[dim]) raises when the graph runs."""
    if reduce not in _REDUCTIONS:
        fail(ArgumentError, "scatter_reduce", f"reduce must be one of {_REDUCTIONS}, got {reduce!r}")
    if x.dtype == dtypes.bool_:
        fail(DTypeError, "scatter_reduce", "bool tensors are not supported")
    dim, hit, src_at, slot = _scatter_loop("scatter_reduce", x, dim, index, src)
    last = x.ndim
    own = m.eq(slot, index.shape[dim])
    identity = {"sum": 0, "mean": 0, "prod": 1, "amax": dtypes.min_value(x.dtype)}.get(reduce)
    if reduce == "amin":
        identity = float("inf") if x.dtype.is_float else int(np.iinfo(x.dtype.np).max)
    mine = view(x, hit.shape, [Var(d) for d in range(x.ndim)])
    taken = m.logical_or(hit, own) if include_self else hit
    values = m.where(hit, src_at, m.where(own, mine, identity) if include_self else identity)
    count = rd.sum(taken, last)
    if reduce in ("sum", "mean"):
        out = rd.sum(values, last)
        if reduce == "mean":
            divisor = m.maximum(count, 1)
            if x.dtype.is_float:
                out = m.div(out, m.cast(divisor, x.dtype))
            else:                       # PyTorch floors an integer mean
                out = m.div(out, divisor, "floor")
    elif reduce == "prod":
        out = rd.prod(values, last)
    else:
        extreme = rd.amax if reduce == "amax" else rd.amin
        if not include_self:
            # PyTorch shares the gradient among the tied values and x too when x ties with the
            # result, though x is left out: a detached x in its slot, only where it ties, does so
            best = view(detach(extreme(values, last, True)), hit.shape, _axis_map(hit.ndim, last, Const(0)))
            mine = detach(mine)
            values = m.where(m.logical_and(own, m.eq(mine, best)), mine, values)
        out = extreme(values, last)
    return m.where(m.gt(count, 0), m.cast(out, x.dtype), x)


@recorded
def scatter(x, dim, index, src):
    """x with src (a tensor or a number) written at index along dim; where indices repeat, the
    last one along dim wins (PyTorch leaves that undefined)."""
    if not hasattr(src, "shape"):
        src = m.const(m.scalar_in(src, x.dtype, "scatter"), index.shape, x.dtype)
    dim, hit, src_at, slot = _scatter_loop("scatter", x, dim, index, src)
    last = rd.amax(m.where(hit, slot, -1), x.ndim)
    chosen = m.logical_and(hit, m.eq(slot, view(last, slot.shape, [Var(d) for d in range(x.ndim)])))
    written = rd.sum(m.where(chosen, src_at, 0), x.ndim)
    return m.where(m.ge(last, 0), m.cast(written, x.dtype), x)


def nonzero(x, realize, as_tuple=False):
    """The indices of the non-zero elements, (count, ndim) int64 or one 1-D tensor per dim: its shape
    depends on x's values, so this is a sync point."""
    realize([x])
    values = np.asarray(x.buffer).reshape(x.shape)
    if x.ndim == 0:             # as PyTorch: one (empty) index row if the scalar is non-zero
        found = np.zeros((int(values != 0), 0), np.int64)
        return (_index_node(np.zeros(int(values != 0), np.int64)),) if as_tuple else _index_node(found)
    found = np.nonzero(values)
    if as_tuple:
        return tuple(_index_node(np.asarray(i, np.int64)) for i in found)
    return _index_node(np.stack(found, axis=1).astype(np.int64).reshape(-1, x.ndim))
