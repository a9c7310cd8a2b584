"""Contractions a library can compute (the optional `library_op` path, METAGRAPH_LIBRARY=1), and
bfloat16 matmuls, which a host kernel computes with the AVX-512 BF16 dot product where the CPU
has it (codegen/bf16_gemm.py; `Target.bf16_dot`), on by default.

A contraction here is `reduce(add)` of `mul(A', B')` where A' and B' are views of materialised
values whose every index is a plain loop variable (permutes, broadcasts, diagonals: matmul,
batched matmul, linear, 1x1 convolution, a user's own einsum-like reindex + sum). Such a reduction
is an einsum, and numpy's einsum hands it to the BLAS numpy links. Windows (convolutions wider
than 1x1, padding) are not plain variables; they stay generated code. A bfloat16 contraction is
a float32 one over bfloat16 operands widened by a cast (ops/linalg.py, `contract`); it qualifies
when it is a (batched) matmul (`gemm`).
"""
import string
from dataclasses import dataclass

from metagraph import dtypes
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var

LETTERS = string.ascii_letters
# A bfloat16 product the host kernel takes: at least half its 32-column tile wide, and enough work to
# pay for packing (a strided conv's weight gradient seen as 262,144 products of 1x2x32 took 480 ms
# there; generated code does it in a few)
GEMM_MIN_COLUMNS = 16
GEMM_MIN_WORK = 16 ** 3


@dataclass
class LibraryContraction:
    """out = einsum(subscripts, *operands): operand k is parameter k + 1 (output first), viewed
    with `operand_shapes[k]` (broadcast dimensions of size 1 dropped)."""
    name: str
    subscripts: str
    operand_shapes: list
    output_shape: tuple       # the einsum's output (the reduction's shape without kept 1s)
    operand_dtype: object = dtypes.float32      # bfloat16: the operands' own type, widened by the sum


class NotMaterialised(Exception):
    """An operand leads to a value computed inside the kernel: materialise `position` first."""

    def __init__(self, position):
        self.position = position


def find(graph, chosen, k, wanted=(dtypes.float32, dtypes.float64)):
    """(LibraryContraction, operand positions) when node k is a contraction of operands of a dtype
    in `wanted`, else None (bfloat16 ones only where `gemm` computes them). Raises
    NotMaterialised when it would be one once an operand is materialised."""
    node = graph.nodes[k]
    if node.op != "reduce" or node.attrs["op"] != "add" or node.dtype not in (dtypes.float32, dtypes.float64):
        return None
    product = node.inputs[0]
    if product.op != "mul" or product.buffer is not None or graph.position[product.id] in chosen:
        return None
    space = product.shape
    extents = dict(enumerate(space))
    operands, positions, shapes, missing, kinds = [], [], [], [], set()
    for x in product.inputs:
        index = tuple(Const(0) if size == 1 else Var(d) for d, size in enumerate(space))
        while x.buffer is None and graph.position[x.id] not in chosen and len(x.inputs) == 1:
            if x.op == "reindex":
                index = tuple(simplify(substitute(e, index), extents) for e in x.attrs["index_map"])
            elif not (x.op == "cast" and x.inputs[0].dtype == dtypes.bfloat16 and
                      node.dtype == dtypes.float32):
                break               # (a cast of bfloat16 operands: widened under the view, ops/linalg.py)
            x = x.inputs[0]
        if x.dtype not in (node.dtype, dtypes.bfloat16) or x.dtype not in wanted:
            return None
        kinds.add(x.dtype)
        letters, shape = "", []
        for expr, size in zip(index, x.shape):
            if isinstance(expr, Var) and space[expr.axis] == size:
                letters += LETTERS[expr.axis]
                shape.append(size)
            elif not (isinstance(expr, Const) and expr.value == 0 and size == 1):
                return None
        if x.buffer is None and graph.position[x.id] not in chosen:
            missing.append(graph.position[x.id])
        operands.append(letters)
        positions.append(graph.position[x.id])
        shapes.append(tuple(shape))
    axes, used = node.attrs["axes"], set("".join(operands))
    kept = [d for d in range(len(space)) if d not in axes]
    if len(kinds) != 1 or any(LETTERS[d] not in used and space[d] != 1 for d in kept):
        return None          # mixed operands, or an output dimension that only broadcasts: not an einsum
    output = "".join(LETTERS[d] for d in kept if LETTERS[d] in used)
    output_shape = tuple(space[d] for d in kept if LETTERS[d] in used)
    subscripts = f"{operands[0]},{operands[1]}->{output}"
    shape = "x".join(map(str, node.shape)) or "scalar"
    (kind,) = kinds
    name = f"lib_{shape}_" + subscripts.replace(",", "_").replace("->", "_")
    spec = LibraryContraction(name if kind != dtypes.bfloat16 else "bf16" + name[3:], subscripts, shapes,
                              output_shape, kind)
    if kind == dtypes.bfloat16 and gemm(spec) is None:
        return None
    if missing:              # only once both operands qualify: otherwise nothing is gained by it
        raise NotMaterialised(missing[0])
    return spec, positions


@dataclass
class Gemm:
    """A contraction as `batch` independent matmuls C[m, n] = sum over k of A[m, k] B[k, n], with C
    contiguous (batch..., m, n) and the operands read at strides (in elements, 0 along a
    dimension an operand does not have): `a_batch`/`b_batch` per batch dimension, then A's (m,
    k) and B's (k, n) strides. `swapped`: A is the contraction's second operand (C^T = B^T A^T)."""
    batch: tuple
    m: int
    n: int
    k: int
    a_batch: tuple
    b_batch: tuple
    a_strides: tuple
    b_strides: tuple
    swapped: bool


def gemm(spec):
    """The Gemm a contraction is, or None: one summed letter in both operands, the output's last
    letter (its columns) only in one operand and the one before it (its rows) only in the other
    (or absent: a vector), every other output letter a batch dimension of either; and each product
    big enough (GEMM_MIN_COLUMNS, GEMM_MIN_WORK)."""
    inputs, output = spec.subscripts.split("->")
    a, b = inputs.split(",")
    summed = (set(a) | set(b)) - set(output)
    if len(summed) != 1 or not output:
        return None
    (k,) = summed
    if k not in a or k not in b:
        return None
    swapped = output[-1] in a and output[-1] not in b       # C^T = B^T A^T: the operands' roles swap
    shapes = spec.operand_shapes[::-1] if swapped else spec.operand_shapes
    if swapped:
        a, b = b, a
    sizes = {letter: size for letters, shape in zip((a, b), shapes) for letter, size in zip(letters, shape)}
    col = output[-1]
    row = output[-2] if len(output) > 1 and output[-2] in a and output[-2] not in b else None
    batch = output[:-2] if row else output[:-1]
    if col in a or col not in b or any(x not in batch + k + (row or "") for x in a) or \
            any(x not in batch + k + col for x in b) or len(set(batch)) != len(batch):
        return None

    def strides(letters, shape, wanted):
        step, found = 1, {}
        for letter, size in reversed(list(zip(letters, shape))):
            found[letter] = step if size != 1 else 0
            step *= size
        return tuple(found.get(letter, 0) if letter else 0 for letter in wanted)
    m, n = sizes[row] if row else 1, sizes[col]
    if n < GEMM_MIN_COLUMNS or m * n * sizes[k] < GEMM_MIN_WORK:
        return None
    return Gemm(tuple(sizes[x] for x in batch), m, n, sizes[k], strides(a, shapes[0], batch),
                strides(b, shapes[1], batch), strides(a, shapes[0], (row, k)),
                strides(b, shapes[1], (k, col)), swapped)
