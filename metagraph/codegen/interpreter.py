"""The `numpy` backend: interprets the meta-op graph node by node.

It defines the semantics every code generator is tested against, so it stays obvious: one small
function per table row, no fusion, no cleverness beyond freeing values nobody needs any more.
"""
import numpy as np

from metagraph import dtypes
from metagraph.errors import IndexOutOfRange, MetagraphError, OutOfMemory, at
from metagraph.expr import Const, Extra, Select, Var
from metagraph.ops.node import reported_op


class NumpyBackend:
    """The reference interpreter."""
    name = "numpy"

    def realize(self, outputs, known=None):
        """Compute `outputs` (nodes whose inputs lead down to realised buffers) as numpy arrays.

        `known` maps node ids to values already computed (they are not recomputed)."""
        values = dict(known or {})
        order = _topological(outputs, values)
        wanted = {node.id for node in outputs}
        uses = {}
        for node in order:
            for source in node.inputs:
                uses[source.id] = uses.get(source.id, 0) + 1
        with np.errstate(all="ignore"):
            for node in order:
                args = [_value(source, values) for source in node.inputs]
                try:
                    values[node.id] = _owned(RULES[node.op](node, *args), node)
                except MemoryError:
                    _fail(OutOfMemory, node, f"cannot allocate {node.numel * node.dtype.itemsize} bytes "
                                             f"for a {node.dtype.name} value of shape {node.shape}")
                for source in node.inputs:
                    uses[source.id] -= 1
                    if uses[source.id] == 0 and source.id not in wanted and source.id not in (known or {}):
                        values.pop(source.id, None)
        return [_value(node, values) for node in outputs]


def _value(node, values):
    """A node's value as a numpy array (a value on a device is copied to the host)."""
    return np.asarray(node.buffer) if node.buffer is not None else values[node.id]


def _topological(outputs, known):
    """Unrealised nodes reachable from outputs, inputs first (iterative: graphs can be deep)."""
    order, seen, stack = [], set(), [(node, False) for node in outputs]
    while stack:
        node, expanded = stack.pop()
        if node.buffer is not None or node.id in known or (node.id in seen and not expanded):
            continue
        if expanded:
            order.append(node)
            continue
        seen.add(node.id)
        stack.append((node, True))
        stack.extend((source, False) for source in node.inputs if source.id not in seen)
    return order


def _owned(array, node):
    array = np.asarray(array)
    if array.dtype != node.dtype.np:
        array = array.astype(node.dtype.np)
    if array.base is not None or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    if array.shape != node.shape:
        raise MetagraphError(f"internal: {node.op} produced {array.shape}, expected {node.shape}")
    return array


def _fail(kind, node, message):
    raise kind(f"{reported_op(node)}: {message} (node created at {at(node.location)})")


# ---- index expressions -------------------------------------------------------------------

_INDEX_OPS = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "min": np.minimum, "max": np.maximum,
    "<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal,
    "&&": lambda a, b: (a != 0) & (b != 0), "||": lambda a, b: (a != 0) | (b != 0),
}


def evaluate(expr, loop, extras, node):
    """An index expression's value over broadcastable loop-variable arrays (int64)."""
    if isinstance(expr, Var):
        return loop[expr.axis]
    if isinstance(expr, Const):
        return np.int64(expr.value)
    if isinstance(expr, Select):
        cond = evaluate(expr.cond, loop, extras, node)
        return np.where(cond != 0, evaluate(expr.a, loop, extras, node),
                        evaluate(expr.b, loop, extras, node))
    if isinstance(expr, Extra):
        table = extras[expr.index]
        args = [evaluate(arg, loop, extras, node) for arg in expr.args]
        for arg, size in zip(args, table.shape):
            if np.any((arg < 0) | (arg >= size)):
                _fail(IndexOutOfRange, node, f"extra {expr.index} read out of its bounds {table.shape}")
        return table[tuple(args)].astype(np.int64)
    a = evaluate(expr.a, loop, extras, node)
    b = evaluate(expr.b, loop, extras, node)
    if expr.op in ("//", "%"):
        if np.any(b == 0):
            _fail(MetagraphError, node, f"index expression {expr} divides by zero")
        return np.floor_divide(a, b) if expr.op == "//" else np.mod(a, b)
    return np.asarray(_INDEX_OPS[expr.op](a, b)).astype(np.int64)


def _loop_vars(shape):
    return [np.arange(n, dtype=np.int64).reshape([-1 if d == k else 1 for d in range(len(shape))])
            for k, n in enumerate(shape)]


def _indices(node, index_map, loop_shape, target_shape, extras):
    """Evaluate an index map; returns (indices clipped into range, validity mask)."""
    loop = _loop_vars(loop_shape)
    indices = [np.broadcast_to(evaluate(e, loop, extras, node), loop_shape) for e in index_map]
    valid = np.ones(loop_shape, dtype=bool)
    for index, size in zip(indices, target_shape):
        valid &= (index >= 0) & (index < size)
    if node.attrs["checked"] and not valid.all():
        bad = tuple(int(i[~valid].flat[0]) for i in indices)
        _fail(IndexOutOfRange, node, f"index {bad} is out of bounds for shape {tuple(target_shape)}")
    clipped = tuple(np.clip(index, 0, max(size - 1, 0)) for index, size in zip(indices, target_shape))
    return clipped, valid


# ---- one rule per table row ------------------------------------------------------------------

def _accumulator(dtype):
    return dtypes.computed_in(dtype).np        # float16 and bfloat16 accumulate in float32


def _reduce(node, x):
    axes, keepdim, op = node.attrs["axes"], node.attrs["keepdim"], node.attrs["op"]
    acc = _accumulator(node.dtype)
    if op == "add":
        return np.sum(x, axis=axes, keepdims=keepdim, dtype=acc)
    if op == "mul":
        return np.prod(x, axis=axes, keepdims=keepdim, dtype=acc)
    return np.max(x, axis=axes, keepdims=keepdim, initial=dtypes.min_value(node.dtype))


def _reindex(node, x, *extras):
    shape = node.attrs["shape"]
    fill = np.array(node.attrs["fill"]).astype(x.dtype)
    if x.size == 0:
        if node.attrs["checked"] and np.prod(shape) > 0:
            _fail(IndexOutOfRange, node, f"reads from an empty tensor of shape {x.shape}")
        return np.full(shape, fill, dtype=x.dtype)
    indices, valid = _indices(node, node.attrs["index_map"], shape, x.shape, extras)
    return np.where(valid, x[indices], fill)


def _reindex_reduce(node, x, *extras):
    shape, op = node.attrs["shape"], node.attrs["op"]
    acc = _accumulator(node.dtype)
    init = 0 if op == "add" else dtypes.min_value(node.dtype)
    out = np.full(shape, init, dtype=acc)
    indices, valid = _indices(node, node.attrs["index_map"], x.shape, shape, extras)
    ufunc = np.add if op == "add" else np.maximum
    ufunc.at(out, tuple(index[valid] for index in indices), x[valid].astype(acc))
    return out


def _integer_division(ufunc):
    def rule(node, a, b):
        if np.any(b == 0):
            _fail(MetagraphError, node, "integer division by zero")
        return ufunc(a, b)
    return rule


RULES = {
    "const": lambda node: np.broadcast_to(np.array(node.attrs["value"], node.dtype.np), node.shape),
    "index": lambda node: np.broadcast_to(
        np.arange(node.shape[node.attrs["axis"]], dtype=node.dtype.np).reshape(
            [-1 if d == node.attrs["axis"] else 1 for d in range(node.ndim)]), node.shape),
    "neg": lambda node, x: np.negative(x),
    "recip": lambda node, x: np.reciprocal(x),
    "sqrt": lambda node, x: np.sqrt(x),
    "exp2": lambda node, x: np.exp2(x),
    "log2": lambda node, x: np.log2(x),
    "sin": lambda node, x: np.sin(x),
    "cos": lambda node, x: np.cos(x),
    "cast": lambda node, x: x.astype(node.dtype.np),
    "add": lambda node, a, b: np.add(a, b),
    "mul": lambda node, a, b: np.multiply(a, b),
    "max": lambda node, a, b: np.maximum(a, b),
    "cmplt": lambda node, a, b: np.less(a, b),
    "cmpne": lambda node, a, b: np.not_equal(a, b),
    "where": lambda node, c, a, b: np.where(c, a, b),
    "reduce": _reduce,
    "reindex": _reindex,
    "reindex_reduce": _reindex_reduce,
    "pow": lambda node, a, b: np.power(a, b),
    "idiv": _integer_division(np.floor_divide),
    "mod": _integer_division(np.mod),
    "and": lambda node, a, b: np.bitwise_and(a, b),
    "or": lambda node, a, b: np.bitwise_or(a, b),
    "xor": lambda node, a, b: np.bitwise_xor(a, b),
    "contiguous": lambda node, x: x,
    "copy": lambda node, x: x,
}
