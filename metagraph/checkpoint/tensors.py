"""Storages and tensors as a checkpoint's pickle describes them.

Unpickling only records them. Once the storages' bytes are read (and their sizes checked against
the element counts the pickle declares), materialize() checks every tensor against its storage
(element type, offset, size, stride, the largest element it reaches) before it makes a view, and
copies the view into a metagraph tensor. A checkpoint is untrusted input: no number in it reaches
numpy unchecked."""
import math

import numpy as np

from metagraph import dtypes
from metagraph.checkpoint.names import SUPPORTED, TorchName, refuse, refuse_build
from metagraph.creation import from_numpy_array

_MAX_BYTES = np.iinfo(np.intp).max
_MAX_DIMS = 64          # numpy's limit (32 before numpy 2, whose error then says so)


def is_count(value):
    """A non-negative Python int: an offset, a size, a stride or an element count (bool is not)."""
    return type(value) is int and value >= 0


def counts(value):
    """value as a tuple, if it is a tuple or list of counts; else None."""
    if isinstance(value, (tuple, list)) and all(is_count(v) for v in value):
        return tuple(value)
    return None


def short(value):
    """A checkpoint's value for an error message: its repr, cut short (a malicious one may be huge)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def contiguous_strides(size):
    """The strides, in elements, of a C-contiguous tensor of this size."""
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class Storage:
    """One storage of a checkpoint: its element type, its element count and, once read, its elements."""

    __setstate__ = refuse_build

    def __init__(self, key, kind, numel):
        self.key, self.type, self.numel = key, kind, numel
        self.values = None

    @property
    def nbytes(self):
        return self.numel * self.type.itemsize

    def fill(self, data, byteorder):
        """Take the storage's bytes (the reader has checked there are nbytes), in byteorder '<' or '>'."""
        if self.type.dtype == "bool":
            # Any non-zero byte is True; metagraph's kernels assume a bool is 0 or 1.
            self.values = np.frombuffer(data, np.uint8) != 0
        elif self.type.dtype == "bfloat16":        # ml_dtypes' type has no byte order: read its bits
            bits = np.frombuffer(data, np.dtype(np.uint16).newbyteorder(byteorder))
            self.values = bits.astype(np.uint16, copy=False).view(dtypes.bfloat16.np)
        else:
            self.values = np.frombuffer(data, np.dtype(self.type.dtype).newbyteorder(byteorder))

    def __repr__(self):
        return f"storage {self.key!r}"


class PendingTensor:
    """A tensor the pickle asks for, built once its storage is read. The arguments are copied at once
    (the pickle may still append to a list it passed) and checked when the tensor is built."""

    __setstate__ = refuse_build
    __hash__ = None     # never a set member or a dict key, where materialize() would not find it

    def __init__(self, storage, offset, size, stride, metadata=None, dtype=None):
        self.storage, self.offset, self.dtype = storage, offset, dtype
        self.size = tuple(size) if isinstance(size, (tuple, list)) else size
        self.stride = tuple(stride) if isinstance(stride, (tuple, list)) else stride
        self.metadata = dict(metadata) if isinstance(metadata, dict) else metadata

    def __repr__(self):
        return f"tensor over {self.storage!r}"

    def build(self, path, where):
        """The metagraph tensor, after every check; `where` names it in the checkpoint's structure."""
        name = f"tensor {where}" if where else "tensor"
        storage = self.storage
        if not isinstance(storage, Storage):
            refuse(path, f"holds a {name} whose storage is {type(storage).__name__}, not a storage")
        dtype = storage.type.dtype if self.dtype is None else self.dtype
        if dtype not in SUPPORTED:
            refuse(path, f"holds a {name} of dtype {dtype}, which metagraph does not support")
        offset, size, stride = self.offset, counts(self.size), counts(self.stride)
        if not is_count(offset):
            refuse(path, f"holds a {name} with storage offset {short(offset)}; expected an integer >= 0")
        if size is None:
            refuse(path, f"holds a {name} of size {short(self.size)}; expected a tuple of integers >= 0")
        if len(size) > _MAX_DIMS:
            refuse(path, f"holds a {name} of {len(size)} dimensions; expected at most {_MAX_DIMS}")
        if stride is None or len(stride) != len(size):
            refuse(path, f"holds a {name} of size {short(size)} with stride {short(self.stride)}; "
                         f"expected {len(size)} integers >= 0")
        numel, itemsize = math.prod(size), storage.type.itemsize
        if numel * itemsize > _MAX_BYTES:
            refuse(path, f"holds a {name} of size {short(size)}, more elements than memory can hold")
        negate = self.negative_bit(path, name)
        if numel == 0:
            return from_numpy_array(np.empty(size, storage.values.dtype), dtype)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.numel:
            refuse(path, f"holds a {name} (offset {offset}, size {short(size)}, stride {short(stride)}) "
                         f"that reaches element {last} of {storage!r}, which holds {storage.numel} elements")
        # numpy checks the bounds again: a second line of defence, not the first.
        view = np.ndarray(size, storage.values.dtype, buffer=storage.values, offset=offset * itemsize,
                          strides=tuple(s * itemsize for s in stride))
        try:
            return from_numpy_array(np.negative(view) if negate else view, dtype)
        except MemoryError:
            refuse(path, f"holds a {name} of size {short(size)}, which does not fit in memory")

    def negative_bit(self, path, name):
        """Whether PyTorch marked the tensor as a negated view (its metadata {'neg': True})."""
        metadata = self.metadata or {}
        if not isinstance(metadata, dict) or set(metadata) - {"neg", "conj"} or metadata.get("conj"):
            refuse(path, f"holds a {name} with tensor metadata {short(metadata)}; metagraph reads only the "
                         "negative bit ('neg') of real tensors")
        return bool(metadata.get("neg"))


def rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    """torch._utils._rebuild_tensor_v2: a tensor over a typed storage."""
    return PendingTensor(storage, offset, size, stride, metadata)


def rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    """torch._utils._rebuild_tensor_v3: a tensor over bytes, with a dtype metagraph does not have."""
    return PendingTensor(storage, offset, size, stride, metadata,
                         dtype.name if isinstance(dtype, TorchName) else short(dtype))


def rebuild_parameter(data, requires_grad=True, hooks=None, state=None):
    """torch._utils._rebuild_parameter(_with_state): a Parameter is kept as its tensor."""
    return data


def materialize(obj, path):
    """obj with every PendingTensor replaced by its checked metagraph tensor. Containers are rebuilt
    once each (a shared or self-containing one stays so); `where` says which key holds a tensor."""
    built = {}

    def walk(node, where):
        if id(node) in built:
            return built[id(node)]
        if isinstance(node, PendingTensor):
            result = node.build(path, where)
        elif isinstance(node, (Storage, TorchName)):
            refuse(path, f"holds {node!r} at {where or 'its top level'}, where metagraph loads only "
                         "tensors and plain data")
        elif isinstance(node, (dict, list)):
            result = built[id(node)] = type(node)()     # before the items, which may contain it
            if isinstance(node, list):
                result.extend(walk(item, f"{where}[{i}]") for i, item in enumerate(node))
            else:
                result.update((key, walk(item, f"{where}[{key!r}]")) for key, item in node.items())
        elif isinstance(node, tuple):
            result = tuple(walk(item, f"{where}[{i}]") for i, item in enumerate(node))
        else:
            return node
        built[id(node)] = result
        return result

    return walk(obj, "")
