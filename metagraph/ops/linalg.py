"""matmul: reduce_add(mul(reindex(a), reindex(b))) over the shared dimension, and `contract`, the
reduction of products that matmul, the convolutions and einsum share."""
from metagraph import dtypes
from metagraph.amp.autocast import cast_arguments
from metagraph.errors import DTypeError, ShapeError, fail
from metagraph.expr import Const, Var
from metagraph.ops import math as m
from metagraph.ops.movement import reshape, view
from metagraph.ops.recorded import recorded
from metagraph.ops.table import apply


def contract(a, b, axes):
    """reduce_add(a * b) over `axes`, for operands of one dtype and shape (views of a contraction's
    loop). float16 and bfloat16 operands are multiplied in float32, where their products are exact,
    summed there and rounded once at the end, as PyTorch's kernels for them compute (and as the
    AVX-512 BF16 dot product does)."""
    dtype = a.dtype
    if dtype in dtypes.LOW_PRECISION:
        a, b = _widened(a), _widened(b)
    return m.cast(apply("reduce", apply("mul", a, b), op="add", axes=axes, keepdim=False), dtype)


def _widened(view_node):
    """A low-precision view as float32: the view of the widened source (its fill 0 is 0 in either
    type). So the gradient crosses the view in float32 (a window's input gradient sums float32
    products, then rounds once) and a padded source's copy stays low-precision (fusion.py)."""
    if view_node.op == "reindex" and len(view_node.inputs) == 1 and view_node.attrs["fill"] == 0:
        return apply("reindex", m.cast(view_node.inputs[0], dtypes.float32), **view_node.attrs)
    return m.cast(view_node, dtypes.float32)


@recorded
def matmul(a, b):
    """PyTorch's matmul: 1-D, 2-D and batched operands with broadcasting batch dimensions (in
    autocast's dtype inside `mg.autocast`: recorded calls are keyed by its state)."""
    (a, b), _ = cast_arguments("matmul", (a, b), None)
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

    result = contract(operand(a, Var(nb), Var(nb + 2)), operand(b, Var(nb + 2), Var(nb + 1)), (nb + 2,))
    if vector_a and vector_b:
        return reshape(result, batch)
    if vector_a:
        return reshape(result, batch + (p,))
    if vector_b:
        return reshape(result, batch + (n,))
    return result
