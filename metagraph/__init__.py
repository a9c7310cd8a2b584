"""metagraph: a deep-learning framework built from a small table of meta-operators.

Every Tensor operation appends a node to a lazy graph; values are computed when asked for
(`numpy()`, `item()`, `tolist()`, `print`, `sync()`), by the active backend.
"""
from metagraph.backend import empty_cache, get_backend, realize as _realize, set_backend
from metagraph.creation import (arange, empty, eye, full, full_like, linspace, ones, ones_like, rand,
                                rand_like, randint, randn, randn_like, randperm, tensor, zeros,
                                zeros_like)
from metagraph.dtypes import (bool_ as bool, bfloat16, float16, float32, float64, int8, int16, int32,
                              int64, uint8)
from metagraph.errors import (ArgumentError, CompileError, DeviceError, DTypeError, ExprError,
                              IndexOutOfRange, MetagraphError, OutOfMemory, ShapeError, Unsupported)
from metagraph.grad import enable_grad, grad, inference_mode, no_grad, set_grad_enabled
from metagraph import amp
from metagraph.amp import autocast
from metagraph.device import device
from metagraph.ops import index as _ix, linalg as _linalg, math as _m, movement as _mv
from metagraph.ops import einsum as _einsum
from metagraph.ops import reduce as _rd
from metagraph.ops import special as _sp
from metagraph.ops import sorting as _sort
from metagraph import backend, flags
from metagraph.random import Generator, manual_seed
from metagraph.runtime.profiler import profile
from metagraph.serialization import CheckpointError, load, save
from metagraph.tensor import Tensor, lift as _lift

half, double, long = float16, float64, int64


def sync(*tensors):
    """Compute all the given tensors now, in one realisation."""
    _realize([t.node for t in tensors])


add, sub, mul, div, true_divide = _lift(_m.add), _lift(_m.sub), _lift(_m.mul), _lift(_m.div), \
    _lift(_m.div)
floor_divide, remainder, pow = _lift(_m.floor_divide), _lift(_m.remainder), _lift(_m.pow)
neg, abs, reciprocal = _lift(_m.neg), _lift(_m.abs_), _lift(_m.recip)
exp, exp2, log, log2, sqrt, rsqrt = _lift(_m.exp), _lift(_m.exp2), _lift(_m.log), _lift(_m.log2), \
    _lift(_m.sqrt), _lift(_m.rsqrt)
sin, cos, tan, tanh, sigmoid, erf = _lift(_m.sin), _lift(_m.cos), _lift(_m.tan), _lift(_m.tanh), \
    _lift(_m.sigmoid), _lift(_m.erf)
relu, gelu, silu, softplus = _lift(_m.relu), _lift(_m.gelu), _lift(_m.silu), _lift(_m.softplus)
floor, ceil, round, trunc, sign = _lift(_m.floor), _lift(_m.ceil), _lift(_m.round), \
    _lift(_m.trunc), _lift(_m.sign)
clamp = clip = _lift(_m.clamp)
maximum, minimum, where = _lift(_m.maximum), _lift(_m.minimum), _lift(_m.where)
lt, le, gt, ge, eq, ne = _lift(_m.lt), _lift(_m.le), _lift(_m.gt), _lift(_m.ge), _lift(_m.eq), \
    _lift(_m.ne)
logical_not, logical_and, logical_or, logical_xor = _lift(_m.logical_not), _lift(_m.logical_and), \
    _lift(_m.logical_or), _lift(_m.logical_xor)
bitwise_not, bitwise_and, bitwise_or, bitwise_xor = _lift(_m.bitwise_not), \
    _lift(_m.bitwise_and), _lift(_m.bitwise_or), _lift(_m.bitwise_xor)

sum, mean, prod, var, std = _lift(_rd.sum), _lift(_rd.mean), _lift(_rd.prod), _lift(_rd.var), \
    _lift(_rd.std)
max, min, amax, amin = _lift(_rd.max), _lift(_rd.min), _lift(_rd.amax), _lift(_rd.amin)
argmax, argmin, logsumexp = _lift(_rd.argmax), _lift(_rd.argmin), _lift(_rd.logsumexp)
any, all = _lift(_rd.any), _lift(_rd.all)

reshape, flatten, squeeze, unsqueeze = _lift(_mv.reshape), _lift(_mv.flatten), \
    _lift(_mv.squeeze), _lift(_mv.unsqueeze)
permute, transpose, broadcast_to = _lift(_mv.permute), _lift(_mv.transpose), \
    _lift(_mv.broadcast_to)
flip, cat, concat, stack = _lift(_mv.flip), _lift(_mv.cat), _lift(_mv.cat), _lift(_mv.stack)
split, chunk, unbind, narrow = _lift(_mv.split), _lift(_mv.chunk), _lift(_mv.unbind), \
    _lift(_mv.narrow)
tril, triu = _lift(_mv.tril), _lift(_mv.triu)

gather, scatter_add = _lift(_ix.gather), _lift(_ix.scatter_add)
index_select, index_add = _lift(_ix.index_select), _lift(_ix.index_add)
cumsum, masked_fill = _lift(_ix.cumsum), _lift(_ix.masked_fill)
reindex, reindex_reduce = _lift(_ix.reindex), _lift(_ix.reindex_reduce)
matmul = mm = bmm = _lift(_linalg.matmul)
einsum = _lift(_einsum.einsum)
sort, argsort, topk = _lift(_sort.sort), _lift(_sort.argsort), _lift(_sort.topk)
cumprod, cummax, cummin = _lift(_sort.cumprod), _lift(_sort.cummax), _lift(_sort.cummin)
logcumsumexp = _lift(_sort.logcumsumexp)
scatter, scatter_reduce = _lift(_sort.scatter), _lift(_sort.scatter_reduce)


def nonzero(x, as_tuple=False):
    """Indices of the non-zero elements (their count depends on the values: a sync)."""
    return _lift(_sort.nonzero)(x, _realize, as_tuple)


asin, acos, atan, atan2 = _lift(_sp.asin), _lift(_sp.acos), _lift(_sp.atan), _lift(_sp.atan2)
sinh, cosh, asinh, acosh, atanh = _lift(_sp.sinh), _lift(_sp.cosh), _lift(_sp.asinh), _lift(_sp.acosh), \
    _lift(_sp.atanh)
arcsin, arccos, arctan, arctan2 = asin, acos, atan, atan2
expm1, log1p = _lift(_sp.expm1), _lift(_sp.log1p)
isnan, isinf, isfinite = _lift(_sp.isnan), _lift(_sp.isinf), _lift(_sp.isfinite)
isposinf, isneginf, nan_to_num = _lift(_sp.isposinf), _lift(_sp.isneginf), _lift(_sp.nan_to_num)
isclose, norm = _lift(_sp.isclose), _lift(_sp.norm)


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """Whether every element of a is close to b's (isclose), as a Python bool: a sync point."""
    return all(isclose(a, b, rtol, atol, equal_nan)).item()        # a Python bool


def from_numpy(array):
    """A tensor holding a copy of the numpy array (PyTorch's shares its memory; this one does not)."""
    return tensor(array)


def as_tensor(data, dtype=None, device=None):
    """data itself if it is a Tensor of that dtype on that device, else a tensor holding a copy of it."""
    if isinstance(data, Tensor):
        return data.to(*[option for option in (device, dtype) if option is not None])
    return tensor(data, dtype=dtype, device=device)


def one_hot(x, num_classes=-1):
    """Integer class indices as int64 one-hot vectors (num_classes=-1 reads the maximum: a sync)."""
    return Tensor(_ix.one_hot(x.node, num_classes, _realize))


from metagraph import data, datasets, models, nn, optim, utils, viz  # noqa: E402  (they build on all above)
from metagraph.data import LoaderTimeout  # noqa: E402
# mg.nn.parallel.DistributedDataParallel; it imports metagraph.distributed, which imports no mpi4py
from metagraph.nn import parallel as _parallel  # noqa: E402,F401
from metagraph.distributed import DistributedError  # noqa: E402


def __getattr__(name):
    """Jittor's mg.rank, mg.world_size and mg.in_mpi, read when asked for: importing metagraph
    starts no MPI; the process group is made (from the MPI launcher's environment) on first use."""
    from metagraph import distributed
    if name == "rank":
        return distributed.get_rank()
    if name == "world_size":
        return distributed.get_world_size()
    if name == "in_mpi":
        return distributed.in_mpi()
    raise AttributeError(f"module 'metagraph' has no attribute {name!r}")

