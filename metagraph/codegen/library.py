"""The library_op path: contractions computed by the BLAS that numpy links instead of generated
code (METAGRAPH_LIBRARY=1; off by default, so that generated code and a vendor library can be
compared honestly). The compiler decides which steps qualify (compiler/contraction.py)."""
import numpy as np

from metagraph import dtypes
from metagraph.codegen import bf16_gemm


def _matmul_route(subscripts):
    """(transpose a, transpose b) when the einsum is a (batched) matmul of possibly transposed
    operands with the same batch dimensions, else None."""
    inputs, output = subscripts.split("->")
    a, b = inputs.split(",")
    contracted = (set(a) | set(b)) - set(output)
    if len(output) < 2 or len(contracted) != 1:
        return None
    batch, i, j, (k,) = output[:-2], output[-2], output[-1], contracted
    transpose_a = {batch + i + k: False, batch + k + i: True}.get(a)
    transpose_b = {batch + k + j: False, batch + j + k: True}.get(b)
    return None if transpose_a is None or transpose_b is None else (transpose_a, transpose_b)


def launcher(spec):
    """(fn(arrays, error array), a description shown where a kernel's source would be)."""
    if spec.operand_dtype == dtypes.bfloat16:
        return bf16_gemm.launcher(spec)
    route = _matmul_route(spec.subscripts)
    if route is not None:
        def launch(arrays, error):
            out, a, b = arrays
            a, b = a.reshape(spec.operand_shapes[0]), b.reshape(spec.operand_shapes[1])
            np.matmul(a.swapaxes(-1, -2) if route[0] else a, b.swapaxes(-1, -2) if route[1] else b,
                      out=out.reshape(spec.output_shape))
        return launch, f"library_op {spec.name}: numpy.matmul for {spec.subscripts!r} (BLAS)"
    stand_ins = [np.broadcast_to(np.zeros((), np.float32), shape) for shape in spec.operand_shapes]
    path, _ = np.einsum_path(spec.subscripts, *stand_ins, optimize="optimal")   # once, not per call

    def launch(arrays, error):
        out, *operands = arrays
        views = [a.reshape(shape) for a, shape in zip(operands, spec.operand_shapes)]
        # einsum writing through `out=` takes a slower route; its result is copied instead
        out.reshape(spec.output_shape)[...] = np.einsum(spec.subscripts, *views, optimize=path)
    return launch, f"library_op {spec.name}: numpy.einsum({spec.subscripts!r}) through BLAS"
