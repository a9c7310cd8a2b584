"""Collectives on tensors, as torch.distributed's: all_reduce, broadcast, all_gather,
all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor.

Each one computes its tensors (a sync point), hands their realised numpy buffers to MPI and
points the output tensors at the received buffers: "in place" as metagraph's in-place operations
are (the Tensor takes a new value; tensors sharing its old value keep it). Before moving data,
the ranks compare what they were given (one small all-gather of each rank's op, shapes, dtype
and arguments), so that ranks that disagree all raise the same DistributedError naming every
rank's arguments, instead of MPI reading past a buffer or waiting forever.
"""
import time

import numpy as np

from metagraph import dtypes
from metagraph.distributed.group import DistributedError, completed_work, current_world, record
from metagraph.errors import ArgumentError, DTypeError, ShapeError
from metagraph.ops.node import Node
from metagraph.runtime.executor import allocate
from metagraph.tensor import Tensor


class ReduceOp:
    """How all_reduce and reduce_scatter combine the ranks' values (torch.distributed.ReduceOp)."""
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"


REDUCE_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT)
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor")
DTYPE_NAMES = tuple(dtype.name for dtype in dtypes.ALL)     # a signature's dtype is its position here
SIGNATURE_DIMS = 8          # dimensions a signature spells out; a longer shape is told by its numel


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """tensor takes the sum (avg, max, min, product) over the ranks of their tensors."""
    world = current_world("all_reduce", group)
    _check_tensors("all_reduce", tensor)
    reduction = _reduce_op("all_reduce", op, tensor.dtype)
    array = _realised("all_reduce", tensor)
    _agree(world, "all_reduce", [array], tensor.dtype, reduction)
    start = time.perf_counter()
    result = allocate(array.shape, array.dtype)
    _reduce(world, "allreduce", array, result, reduction)
    record("all_reduce", array.nbytes, start)
    _set_value(tensor, result)
    return completed_work() if async_op else None


def broadcast(tensor, src, group=None, async_op=False):
    """tensor takes rank src's value on every rank."""
    world = current_world("broadcast", group)
    _check_tensors("broadcast", tensor)
    if not 0 <= src < world.size:
        raise ArgumentError(f"broadcast: src={src} is not a rank of this world of {world.size} process(es)")
    array = _realised("broadcast", tensor)
    _agree(world, "broadcast", [array], tensor.dtype, src)
    start = time.perf_counter()
    buffer = allocate(array.shape, array.dtype)
    if world.rank == src:
        np.copyto(buffer, array)
    world.broadcast(_as_bytes(buffer), src)
    record("broadcast", array.nbytes, start)
    if world.rank != src:
        _set_value(tensor, buffer)
    return completed_work() if async_op else None


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[r] takes rank r's tensor (tensor_list: one tensor per rank, each of tensor's
    shape and dtype)."""
    world = current_world("all_gather", group)
    _check_tensors("all_gather", tensor)
    _check_list("all_gather", "tensor_list", tensor_list, world.size, tensor)
    array = _realised("all_gather", tensor)
    _agree(world, "all_gather", [array], tensor.dtype)
    gathered = _gather(world, "all_gather", array)
    for rank, target in enumerate(tensor_list):
        _set_value(target, gathered[rank, ...])
    return completed_work() if async_op else None


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """output_tensor takes the ranks' input tensors, concatenated along dim 0 (output of shape
    (world size * n, ...)) or stacked (shape (world size, n, ...))."""
    world = current_world("all_gather_into_tensor", group)
    _check_tensors("all_gather_into_tensor", output_tensor, input_tensor)
    _check_whole("all_gather_into_tensor", output_tensor, input_tensor, world.size)
    array = _realised("all_gather_into_tensor", input_tensor)
    _agree(world, "all_gather_into_tensor", [array], input_tensor.dtype)
    gathered = _gather(world, "all_gather_into_tensor", array)
    _set_value(output_tensor, gathered.reshape(output_tensor.shape))
    return completed_work() if async_op else None


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """output takes the sum (avg, ...) over the ranks of their input_list[this rank]
    (input_list: one tensor per rank, each of output's shape and dtype)."""
    world = current_world("reduce_scatter", group)
    _check_tensors("reduce_scatter", output)
    _check_list("reduce_scatter", "input_list", input_list, world.size, output)
    reduction = _reduce_op("reduce_scatter", op, output.dtype)
    arrays = [_realised("reduce_scatter", t) for t in input_list]
    _agree(world, "reduce_scatter", arrays, output.dtype, reduction)
    send = allocate((world.size,) + output.shape, output.dtype.np)
    for row, array in zip(send, arrays):
        np.copyto(row, array)
    _scatter(world, send, output, reduction)
    return completed_work() if async_op else None


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """output takes the sum (avg, ...) over the ranks of this rank's block of input: input is
    world size blocks of output's shape, concatenated along dim 0 or stacked."""
    world = current_world("reduce_scatter_tensor", group)
    _check_tensors("reduce_scatter_tensor", output, input)
    _check_whole("reduce_scatter_tensor", input, output, world.size)
    reduction = _reduce_op("reduce_scatter_tensor", op, output.dtype)
    array = _realised("reduce_scatter_tensor", input)
    _agree(world, "reduce_scatter_tensor", [array], output.dtype, reduction)
    _scatter(world, array.reshape((world.size,) + output.shape), output, reduction)
    return completed_work() if async_op else None


# ---- buffers ---------------------------------------------------------------------------------------

def _realised(op, tensor):
    """tensor's value as a C-contiguous numpy array (computing it: a sync point)."""
    array = tensor.numpy()
    return array if array.flags.c_contiguous else array.copy(order="C")


def _set_value(tensor, array):
    """Point tensor at a realised array (in place, as Tensor.assign)."""
    node = Node("buffer", (), {}, array.shape, tensor.dtype, requires_grad=False, buffer=array)
    tensor.assign(Tensor(node))


def _as_bytes(array):
    """A contiguous array's memory as a flat uint8 array: broadcast and all-gather only move bytes,
    so every dtype (bfloat16, which MPI has no type for, included) travels as bytes."""
    return array.reshape(-1).view(np.uint8)


def reduce_buffers(world, send, receive, op):
    """receive = op over the ranks of send (numpy arrays of one shape and dtype; send may be
    receive). AVG divides the sum by the world size; booleans combine as PyTorch's (sum and max:
    any; min and product: all); 16-bit floats are summed in float32."""
    _reduce(world, "allreduce", send, receive, op)


def _reduce(world, method, send, receive, op):
    """world.<method>(send, receive, op), with AVG, bool and 16-bit floats handled."""
    if receive.dtype == np.bool_:
        op = "or" if op in (ReduceOp.SUM, ReduceOp.MAX) else "and"
    mpi_op = ReduceOp.SUM if op == ReduceOp.AVG else op
    if receive.dtype.itemsize == 2 and receive.dtype.kind not in "iu":     # float16, bfloat16
        wide_receive = np.empty(receive.shape, np.float32)
        wide_send = wide_receive if send is receive else send.astype(np.float32)
        if send is receive:
            np.copyto(wide_receive, send, casting="unsafe")
        getattr(world, method)(wide_send, wide_receive, mpi_op)
        if op == ReduceOp.AVG:
            np.divide(wide_receive, world.size, out=wide_receive)
        np.copyto(receive, wide_receive, casting="unsafe")
        return
    getattr(world, method)(send, receive, mpi_op)
    if op == ReduceOp.AVG:
        np.divide(receive, world.size, out=receive)


def _gather(world, op, array):
    """Every rank's array, stacked along a new leading axis."""
    start = time.perf_counter()
    gathered = allocate((world.size,) + array.shape, array.dtype)
    world.allgather(_as_bytes(array), _as_bytes(gathered))
    record(op, gathered.nbytes, start)
    return gathered


def _scatter(world, send, output, op):
    """output = op over the ranks of send[this rank] (send: world size blocks of output's shape)."""
    start = time.perf_counter()
    receive = allocate(output.shape, output.dtype.np)
    _reduce(world, "reduce_scatter", send, receive, op)
    record("reduce_scatter", send.nbytes, start)
    _set_value(output, receive)


# ---- checks ----------------------------------------------------------------------------------------

def _check_tensors(op, *tensors):
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise ArgumentError(f"{op}: expected a metagraph Tensor, got {type(tensor).__name__}")


def _reduce_op(op, reduction, dtype):
    """A ReduceOp's name, checked against the dtype it combines."""
    name = reduction.lower() if isinstance(reduction, str) else reduction
    if name not in REDUCE_OPS:
        raise ArgumentError(f"{op}: op must be one of ReduceOp.SUM, AVG, MAX, MIN, PRODUCT; "
                            f"got {reduction!r}")
    if name == ReduceOp.AVG and not dtype.is_float:
        raise DTypeError(f"{op}: ReduceOp.AVG of a {dtype.name} tensor would round; reduce with SUM and "
                         "divide, or reduce a floating-point tensor")
    return name


def _check_list(op, name, tensors, size, like):
    """tensors: a list of world size tensors of like's shape and dtype."""
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Tensor) for t in tensors):
        raise ArgumentError(f"{op}: {name} must be a list of Tensors, one per rank")
    if len(tensors) != size:
        raise ArgumentError(f"{op}: {name} holds {len(tensors)} tensor(s) but the world has {size} rank(s); "
                            "give one tensor per rank")
    for k, t in enumerate(tensors):
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ShapeError(f"{op}: {name}[{k}] is {t.dtype.name} {t.shape}, but every entry must be "
                             f"{like.dtype.name} {like.shape}")


def _check_whole(op, whole, block, size):
    """whole holds `size` blocks of block's shape: (size * n, ...) or (size, n, ...); same dtype."""
    if whole.dtype != block.dtype:
        raise DTypeError(f"{op}: tensors of different dtypes, {whole.dtype.name} and {block.dtype.name}")
    concatenated = block.shape and whole.shape == (size * block.shape[0],) + block.shape[1:]
    if not (concatenated or whole.shape == (size,) + block.shape):
        expected = f"({size * block.shape[0]}, ...)" if block.shape else f"({size},)"
        raise ShapeError(f"{op}: a tensor of shape {whole.shape} cannot hold {size} rank(s) x {block.shape}; "
                         f"expected {expected} or {(size,) + block.shape}")


def _agree(world, op, arrays, dtype, argument=None):
    """Raise the same DistributedError on every rank unless every rank called `op` with arrays of
    the same shapes and dtype and the same argument (reduce op, source rank)."""
    if world.size == 1:
        return
    mine = signature(op, arrays, dtype, argument)
    everyone = np.empty((world.size, mine.size), np.int64)
    world.allgather(mine, everyone)
    if (everyone == mine).all():
        return
    described = "; ".join(f"rank {rank}: {describe(row)}" for rank, row in enumerate(everyone))
    raise DistributedError(f"{op}: the ranks called collectives that do not match ({described}); every rank "
                           "must call the same collective with tensors of the same shape and dtype")


def signature(op, arrays, dtype, argument=None):
    """An int64 vector naming a collective call: op, argument, dtype, the number of arrays and the
    first array's shape (and every array's size, folded into a checksum)."""
    shape = arrays[0].shape
    arguments = list(REDUCE_OPS) + [None]
    argument_code = arguments.index(argument) if argument in arguments else 100 + int(argument)
    sizes = [a.size for a in arrays]
    dims = list(shape[:SIGNATURE_DIMS]) + [-1] * (SIGNATURE_DIMS - min(len(shape), SIGNATURE_DIMS))
    checksum = sum((k + 1) * size for k, size in enumerate(sizes)) + sum(1000003 ** k * d for k, d in
                                                                           enumerate(shape)) % (1 << 61)
    return np.array([COLLECTIVES.index(op), argument_code, _dtype_code(dtype), len(arrays),
                     len(shape), checksum] + dims, np.int64)


def describe(row):
    """A signature as text: 'all_reduce(sum) float32 (4, 3)'."""
    op, argument, dtype, count, ndim = (int(v) for v in row[:5])
    arguments = list(REDUCE_OPS)
    argument_text = arguments[argument] if argument < len(arguments) else (
        f"src={argument - 100}" if argument >= 100 else "")
    shape = tuple(int(d) for d in row[6:6 + min(ndim, SIGNATURE_DIMS)])
    shape_text = str(shape) if ndim <= SIGNATURE_DIMS else f"{ndim}-d {shape[:SIGNATURE_DIMS]}..."
    listed = f", {count} tensors" if count > 1 else ""
    name = COLLECTIVES[op] if op < len(COLLECTIVES) else f"collective #{op}"
    dtype_text = DTYPE_NAMES[dtype] if dtype < len(DTYPE_NAMES) else "another dtype"
    return f"{name}({argument_text}) {dtype_text} {shape_text}{listed}"


def _dtype_code(dtype):
    return DTYPE_NAMES.index(dtype.name) if dtype.name in DTYPE_NAMES else len(DTYPE_NAMES)

