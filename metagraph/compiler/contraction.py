"""Contractions a library can compute (the optional `library_op` path, METAGRAPH_LIBRARY=1).

A contraction here is `reduce(add)` of `mul(A', B')` where A' and B' are views of materialised
values whose every index is a plain loop variable (permutes, broadcasts, diagonals: matmul,
batched matmul, linear, 1x1 convolution, a user's own einsum-like reindex + sum). Such a reduction
is an einsum, and numpy's einsum hands it to the BLAS numpy links. Windows (convolutions wider
than 1x1, padding) are not plain variables; they stay generated code.
"""
import string
from dataclasses import dataclass

from metagraph import dtypes
from metagraph.compiler.simplify import simplify, substitute
from metagraph.expr import Const, Var

LETTERS = string.ascii_letters


@dataclass
class LibraryContraction:
    """out = einsum(subscripts, *operands): operand k is parameter k + 1 (output first), viewed
    with `operand_shapes[k]` (broadcast dimensions of size 1 dropped)."""
    name: str
    subscripts: str
    operand_shapes: list
    output_shape: tuple       # the einsum's output (the reduction's shape without kept 1s)


class NotMaterialised(Exception):
    """An operand leads to a value computed inside the kernel: materialise `position` first."""

    def __init__(self, position):
        self.position = position


def find(graph, chosen, k):
    """(LibraryContraction, operand positions) when node k is a library contraction, else None.
    Raises NotMaterialised when it would be one once an operand is materialised."""
    node = graph.nodes[k]
    if node.op != "reduce" or node.attrs["op"] != "add" or node.dtype not in (dtypes.float32, dtypes.float64):
        return None
    product = node.inputs[0]
    if product.op != "mul" or product.buffer is not None or graph.position[product.id] in chosen:
        return None
    space = product.shape
    extents = dict(enumerate(space))
    operands, positions, shapes, missing = [], [], [], []
    for x in product.inputs:
        index = tuple(Const(0) if size == 1 else Var(d) for d, size in enumerate(space))
        while x.buffer is None and graph.position[x.id] not in chosen and x.op == "reindex" \
                and len(x.inputs) == 1:
            index = tuple(simplify(substitute(e, index), extents) for e in x.attrs["index_map"])
            x = x.inputs[0]
        if x.dtype != node.dtype:
            return None
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
    if any(LETTERS[d] not in used and space[d] != 1 for d in kept):
        return None          # an output dimension that only broadcasts: not an einsum
    if missing:              # only once both operands qualify: otherwise nothing is gained by it
        raise NotMaterialised(missing[0])
    output = "".join(LETTERS[d] for d in kept if LETTERS[d] in used)
    output_shape = tuple(space[d] for d in kept if LETTERS[d] in used)
    subscripts = f"{operands[0]},{operands[1]}->{output}"
    shape = "x".join(map(str, node.shape)) or "scalar"
    name = f"lib_{shape}_" + subscripts.replace(",", "_").replace("->", "_")
    return LibraryContraction(name, subscripts, shapes, output_shape), positions
