"""matmul: reduce_add(mul(reindex(a), reindex(b))) over the shared dimension."""
from metagraph.errors import DTypeError, ShapeError, fail
from metagraph.expr import Const, Var
from metagraph.ops import math as m
from metagraph.ops.movement import reshape, view
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


@recorded
def matmul(a, b):
    """PyTorch's matmul: 1-D, 2-D and batched operands with broadcasting batch dimensions."""
    if a.ndim == 0 or b.ndim == 0:
        fail(ShapeError, "matmul", f"both operands need at least 1 dimension, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        fail(DTypeError, "matmul", f"operands need the same dtype, got {a.dtype.name} and {b.dtype.name}")
    vector_a, vector_b = a.ndim == 1, b.ndim == 1
    if vector_a:
        a = reshape(a, (1,) + a.shape)
    if vector_b:
        b = reshape(b, b.shape + (1,))
    (n, k), (k2, p) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        fail(ShapeError, "matmul", f"shapes {a.shape} and {b.shape} cannot be multiplied ({k} != {k2})")
    batch = m.broadcast_shape("matmul", a.shape[:-2], b.shape[:-2])
    nb = len(batch)
    loop = batch + (n, p, k)      # loop variables: batch..., row, column, shared

    def operand(x, rows, cols):
        offset = nb - (x.ndim - 2)
        index_map = [Var(offset + d) if size != 1 or batch[offset + d] == 1 else Const(0)
                     for d, size in enumerate(x.shape[:-2])]
        return view(x, loop, index_map + [rows, cols])

    product = m.mul(operand(a, Var(nb), Var(nb + 2)), operand(b, Var(nb + 2), Var(nb + 1)))
    result = apply("reduce", product, op="add", axes=(nb + 2,), keepdim=False)
    if vector_a and vector_b:
        return reshape(result, batch)
    if vector_a:
        return reshape(result, batch + (p,))
    if vector_b:
        return reshape(result, batch + (n,))
    return result
